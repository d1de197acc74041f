// The embedded list of real models and the lookups over the model cache directory (see model_registry.h).
// Keep kKnown in sync with models/manifest.json: tests/unit/test_registry.cpp compares the two.
#include "app/model_registry.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>

#include "app/environment.h"

namespace tandem {

namespace {

const std::vector<KnownModel> kKnown = {
    {"qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "target", 1117320768ULL,
     "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"},
    {"qwen2.5-coder-0.5b-instruct-q4_k_m", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "draft", 491400064ULL,
     "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"},
    {"smollm2-135m-instruct-q4_1", "smollm2-135m-instruct-q4_1.gguf", "small", 98362432ULL,
     "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"},
    // Gemma 3 270M (base), a second model family; the Gemma Terms of Use apply. Not a default: default_target()
    // and default_draft() name their models, and "small" is no default role.
    {"gemma-3-270m-q4_k_m", "gemma-3-270m-q4_k_m.gguf", "small", 253113024ULL,
     "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"},
};

std::string human_size(uint64_t bytes) {
    char buf[32];
    if (bytes >= 1000000000ULL)
        std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
    else
        std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
    return buf;
}

}  // namespace

const std::vector<KnownModel>& known_models() { return kKnown; }

const KnownModel* find_known_model(const std::string& name) {
    for (const KnownModel& m : kKnown)
        if (m.name == name || m.file == name) return &m;
    return nullptr;
}

std::optional<std::string> installed_path(const std::string& name, const std::string& dir) {
    const KnownModel* m = find_known_model(name);
    if (!m) return std::nullopt;
    const std::string path = dir + "/" + m->file;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
    if (static_cast<uint64_t>(st.st_size) != m->size) return std::nullopt;
    return path;
}

std::optional<std::string> installed_path(const std::string& name) {
    return installed_path(name, environment().models_dir);
}

std::string default_target() { return "qwen2.5-coder-1.5b-instruct-q4_k_m"; }
std::string default_draft() { return "qwen2.5-coder-0.5b-instruct-q4_k_m"; }

std::string list_installed_table(const std::string& dir) {
    struct Row {
        std::string name, role, size, path;
    };
    std::vector<Row> rows = {{"NAME", "ROLE", "SIZE", "PATH"}};
    std::vector<std::string> missing;
    for (const KnownModel& m : kKnown) {
        if (auto p = installed_path(m.name, dir))
            rows.push_back({m.name, m.role, human_size(m.size), *p});
        else
            missing.push_back(m.name);
    }
    std::string out;
    if (rows.size() == 1) {
        out = "no models installed in " + dir + "\n";
    } else {
        size_t w[3] = {0, 0, 0};
        for (const Row& r : rows) {
            w[0] = std::max(w[0], r.name.size());
            w[1] = std::max(w[1], r.role.size());
            w[2] = std::max(w[2], r.size.size());
        }
        auto pad = [](const std::string& s, size_t n) { return s + std::string(n - s.size() + 2, ' '); };
        for (const Row& r : rows) out += pad(r.name, w[0]) + pad(r.role, w[1]) + pad(r.size, w[2]) + r.path + "\n";
    }
    if (!missing.empty()) {
        out += "not installed:";
        for (const std::string& n : missing) out += " " + n;
        out += " (fetch with scripts/fetch-models)\n";
    }
    return out;
}

std::string list_installed_table() { return list_installed_table(environment().models_dir); }

}  // namespace tandem
