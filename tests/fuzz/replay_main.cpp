// main() of the fuzz targets built without libFuzzer: runs inputs through LLVMFuzzerTestOneInput, so that the
// committed corpus (inputs campaigns found) and the seeds run as ordinary tests, and writes the seeds for a campaign.
//   fuzz-replay-NAME [PATH...]            the target's seeds, then each file, and each file in each directory
//   fuzz-replay-NAME --write-seeds DIR    write the seeds into DIR
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz_target.h"

namespace fs = std::filesystem;

namespace {

void run(const std::string& bytes) {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
    const std::vector<std::string> args(argv + 1, argv + argc);
    if (args.size() == 2 && args[0] == "--write-seeds") {
        fs::create_directories(args[1]);
        for (const auto& [name, bytes] : tandem::fuzz::fuzz_seeds()) {
            std::ofstream out(fs::path(args[1]) / name, std::ios::binary);
            out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
            if (!out) {
                std::fprintf(stderr, "fuzz-replay: cannot write %s\n", name.c_str());
                return 2;
            }
        }
        return 0;
    }
    int inputs = 0;
    for (const auto& [name, bytes] : tandem::fuzz::fuzz_seeds()) {
        std::fprintf(stderr, "seed %s\n", name.c_str());
        run(bytes);
        ++inputs;
    }
    for (const std::string& arg : args) {
        std::vector<fs::path> files;
        if (fs::is_directory(arg)) {
            for (const auto& entry : fs::directory_iterator(arg))
                if (entry.is_regular_file()) files.push_back(entry.path());
            std::sort(files.begin(), files.end());
        } else {
            files.push_back(arg);
        }
        for (const fs::path& file : files) {
            std::fprintf(stderr, "input %s\n", file.c_str());
            run(tandem::fuzz::read_file(file.string()));
            ++inputs;
        }
    }
    std::fprintf(stderr, "fuzz-replay: %d inputs, no failure\n", inputs);
    return 0;
}
