// The registry of tandem's real models: which ones exist (the same list as models/manifest.json, embedded so the
// binary needs no file at run time), where scripts/fetch-models puts them, and which of them are installed.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tandem {

struct KnownModel {
    std::string name;    // e.g. "qwen2.5-coder-1.5b-instruct-q4_k_m"; what users type
    std::string file;    // file name inside the models directory, "<name>.gguf"
    std::string role;    // "target" (the default model), "draft" (the default draft) or "small"
    uint64_t size = 0;   // exact file size in bytes
    std::string sha256;  // of the whole file (lowercase hex), checked by scripts/fetch-models
};

// Every model the manifest lists, in manifest order.
const std::vector<KnownModel>& known_models();
// The entry named `name` (or whose file name is `name`), nullptr when unknown.
const KnownModel* find_known_model(const std::string& name);

// The path of model `name` when its file is in `dir` (default: environment().models_dir, the rule
// scripts/fetch-models follows) with the expected size; the size
// check is cheap and catches partial or truncated copies. The sha256 is the fetch script's job (it only ever
// renames a file into place after verifying it).
std::optional<std::string> installed_path(const std::string& name);
std::optional<std::string> installed_path(const std::string& name, const std::string& dir);

// The default target and draft model names.
std::string default_target();
std::string default_draft();

// A table for `tandem --list-models`: the installed models (name, role, size, path), then a line naming the ones
// that are missing and how to fetch them.
std::string list_installed_table();
std::string list_installed_table(const std::string& dir);

}  // namespace tandem
