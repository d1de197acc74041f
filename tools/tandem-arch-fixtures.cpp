// tandem-arch-fixtures: writes the architecture fixtures (tools/common/architecture_fixtures.h) into a folder, the
// files tests/data/arch/ holds. Deterministic; scripts/make-arch-references runs it and then llama.cpp on the files.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "common/architecture_fixtures.h"
#include "error.h"

int main(int argc, char** argv) {
    CLI::App app{"Writes tiny random-weight GGUF files, one per supported architecture, every variation on"};
    std::string dir;
    app.add_option("dir", dir, "folder to write NAME.gguf into")->required();
    CLI11_PARSE(app, argc, argv);
    try {
        std::filesystem::create_directories(dir);
        for (const std::string& name : tandem::architecture_fixture_names()) {
            const std::string path = (std::filesystem::path(dir) / (name + ".gguf")).string();
            tandem::write_architecture_fixture(name, path);
            std::fprintf(stderr, "tandem-arch-fixtures: wrote %s\n", path.c_str());
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tandem-arch-fixtures: %s\n", e.what());
        return 1;
    }
    return 0;
}
