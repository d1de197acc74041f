// Tests of the model registry (src/model_registry.*): the embedded list agrees with models/manifest.json, the
// models directory follows the fetch script's rule, and installed_path / the --list-models table see a file only
// when it has the exact size.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "app/model_registry.h"
#include "test_paths.h"

namespace fs = std::filesystem;

namespace {

// The repository root: TANDEM_TEST_DATA is <repo>/tests/data.
fs::path repo_root() { return fs::path(TANDEM_TEST_DATA).parent_path().parent_path(); }

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    REQUIRE_MESSAGE(in.good(), "cannot open " << p);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

struct TempDir {
    fs::path path;
    TempDir() {
        std::string tmpl = (fs::temp_directory_path() / "tandem-registry-XXXXXX").string();
        REQUIRE(mkdtemp(tmpl.data()) != nullptr);
        path = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

// The value of the first `"key": value` in `text` (a string without its quotes, or a bare number); "" if absent.
// Plain string scanning: the manifest's layout is simple, and std::regex trips GCC 12 warnings under ASan.
std::string json_value(const std::string& text, const std::string& key, size_t* where = nullptr) {
    const size_t k = text.find("\"" + key + "\"");
    if (k == std::string::npos) return "";
    size_t i = text.find(':', k + key.size() + 2);
    if (i == std::string::npos) return "";
    i = text.find_first_not_of(" \t\r\n", i + 1);
    if (i == std::string::npos) return "";
    if (where) *where = k;
    if (text[i] == '"') return text.substr(i + 1, text.find('"', i + 1) - i - 1);
    return text.substr(i, text.find_first_of(",}\r\n ", i) - i);
}

void make_file(const fs::path& p, uint64_t size) {
    { std::ofstream(p, std::ios::binary).put('x'); }
    fs::resize_file(p, size);  // sparse: costs no disk space even for the 1.1 GB model
}

}  // namespace

TEST_CASE("registry: the embedded list agrees with models/manifest.json") {
    const std::string manifest = slurp(repo_root() / "models" / "manifest.json");
    // Each model object starts at its "name" key; its fields lie between that and the next model's name.
    std::vector<std::pair<std::string, size_t>> names;
    for (size_t from = 0;;) {
        size_t at = 0;
        const std::string rest = manifest.substr(from);
        const std::string name = json_value(rest, "name", &at);
        if (name.empty()) break;
        names.emplace_back(name, from + at);
        from += at + 1;
    }
    const auto& known = tandem::known_models();
    REQUIRE(names.size() == known.size());
    for (size_t i = 0; i < known.size(); ++i) {
        const tandem::KnownModel& m = known[i];
        CAPTURE(m.name);
        CHECK(names[i].first == m.name);
        const size_t end = i + 1 < names.size() ? names[i + 1].second : manifest.size();
        const std::string obj = manifest.substr(names[i].second, end - names[i].second);
        CHECK(json_value(obj, "file") == m.file);
        CHECK(json_value(obj, "role") == m.role);
        CHECK(json_value(obj, "size") == std::to_string(m.size));
        CHECK(json_value(obj, "sha256") == m.sha256);
        CHECK(m.file == m.name + ".gguf");
        CHECK(m.sha256.size() == 64);
    }
}

TEST_CASE("registry: defaults are the 1.5B target and the 0.5B draft") {
    const tandem::KnownModel* t = tandem::find_known_model(tandem::default_target());
    const tandem::KnownModel* d = tandem::find_known_model(tandem::default_draft());
    REQUIRE(t);
    REQUIRE(d);
    CHECK(t->role == "target");
    CHECK(d->role == "draft");
    CHECK(t->name == "qwen2.5-coder-1.5b-instruct-q4_k_m");
    CHECK(d->name == "qwen2.5-coder-0.5b-instruct-q4_k_m");
    CHECK(tandem::find_known_model("smollm2-135m-instruct-q4_1.gguf") != nullptr);  // the file name works too
    // Gemma 3 270M is listed, but as neither default (the only "target" and "draft" roles are the Qwen models).
    const tandem::KnownModel* gemma = tandem::find_known_model("gemma-3-270m-q4_k_m");
    REQUIRE(gemma);
    CHECK(gemma->role == "small");
    for (const tandem::KnownModel& m : tandem::known_models()) {
        CAPTURE(m.name);
        if (m.role == "target") CHECK(m.name == tandem::default_target());
        if (m.role == "draft") CHECK(m.name == tandem::default_draft());
    }
    CHECK(tandem::find_known_model("no-such-model") == nullptr);
}

TEST_CASE("registry: installed_path needs the file with its exact size") {
    TempDir dir;
    const std::string d = dir.path.string();
    const tandem::KnownModel& small = *tandem::find_known_model("smollm2-135m-instruct-q4_1");
    CHECK_FALSE(tandem::installed_path(small.name, d));
    make_file(dir.path / small.file, small.size - 1);  // truncated copy
    CHECK_FALSE(tandem::installed_path(small.name, d));
    fs::resize_file(dir.path / small.file, small.size);
    REQUIRE(tandem::installed_path(small.name, d));
    CHECK(*tandem::installed_path(small.name, d) == (dir.path / small.file).string());
    CHECK_FALSE(tandem::installed_path("no-such-model", d));

    CHECK_FALSE(tandem::installed_path(tandem::default_target(), d).has_value());

    const std::string table = tandem::list_installed_table(d);
    CHECK(table.find(small.name) != std::string::npos);
    CHECK(table.find((dir.path / small.file).string()) != std::string::npos);
    CHECK(table.find("not installed:") != std::string::npos);
    CHECK(table.find(tandem::default_target()) != std::string::npos);  // named among the missing
}

TEST_CASE("registry: the table says when nothing is installed") {
    TempDir dir;
    const std::string table = tandem::list_installed_table(dir.path.string());
    CHECK(table.find("no models installed") != std::string::npos);
    CHECK(table.find("scripts/fetch-models") != std::string::npos);
}
