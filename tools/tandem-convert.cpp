// tandem-convert: llama2.c checkpoints (.bin: legacy fp32, version 1 fp32, version 2 int8) plus their
// sentencepiece tokenizer → a llama-architecture GGUF with f32, f16, q8_0 or q4_0 weight matrices.
// The reading and the mapping live in src/llama2c.*; this file is flags, messages and the exit status.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <string>

#include "error.h"
#include "convert/llama2c.h"
#include "convert/quantize_model.h"

namespace {

int run(const std::string& in_path, const std::string& out_path, const std::string& tokenizer_path,
        const std::string& type_name, std::string name) {
    const std::optional<tandem::GgmlType> type = tandem::parse_output_type(type_name);
    if (!type)
        throw tandem::Error("unknown --type '" + type_name + "' (can: " + tandem::output_type_names() + ")");
    if (std::filesystem::exists(out_path) && std::filesystem::equivalent(in_path, out_path))
        throw tandem::Error("the output would overwrite the input " + in_path);

    const tandem::Llama2cCheckpoint ck = tandem::read_llama2c(in_path);
    const tandem::Llama2cConfig& c = ck.config;
    static const char* kLayouts[] = {"legacy fp32", "version 1 fp32", "version 2 int8"};
    std::fprintf(stderr,
                 "tandem-convert: %s: llama2.c %s%s: dim %d, hidden %d, %d layers, %d heads (%d kv), vocab %d, "
                 "seq_len %d, classifier %s\n",
                 in_path.c_str(), kLayouts[c.version],
                 c.version == 2 ? (" (groups of " + std::to_string(c.group_size) + ")").c_str() : "", c.dim,
                 c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len,
                 c.shared_classifier ? "shared with the embedding" : "separate");
    const tandem::SpmVocab vocab = tandem::load_spm_vocab(tokenizer_path);

    if (name.empty()) name = std::filesystem::path(in_path).stem().string();
    std::vector<tandem::ConvertNote> notes;
    const tandem::GgufWriter writer = tandem::llama2c_to_gguf(ck, vocab, *type, name, &notes);

    const tandem::ConvertNote* first_fallback = nullptr;
    int n_fallback = 0;
    for (const auto& n : notes)
        if (n.fell_back && n_fallback++ == 0) first_fallback = &n;
    if (first_fallback) {
        std::fprintf(stderr, "tandem-convert: %d of %zu matrices fell back to %s (row length not a multiple of the "
                             "%s block size):",
                     n_fallback, notes.size(), tandem::ggml_type_name(first_fallback->type),
                     tandem::ggml_type_name(*type));
        for (const auto& n : notes)
            if (n.fell_back) std::fprintf(stderr, " %s", n.tensor.c_str());
        std::fprintf(stderr, "\n");
    }
    writer.write(out_path);
    std::fprintf(stderr, "tandem-convert: wrote %s (%s matrices, %ju bytes)\n", out_path.c_str(),
                 tandem::ggml_type_name(*type), static_cast<uintmax_t>(std::filesystem::file_size(out_path)));
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::string in_path, out_path, tokenizer_path, type_name = "f32", name;
    CLI::App app{"tandem-convert: convert a llama2.c checkpoint (.bin) and its sentencepiece tokenizer to GGUF"};
    app.add_option("input", in_path, "llama2.c checkpoint (.bin)")->required()->check(CLI::ExistingFile);
    app.add_option("output", out_path, "GGUF file to write")->required();
    app.add_option("-t,--tokenizer", tokenizer_path, "sentencepiece tokenizer (.model) of the checkpoint")
        ->required()->check(CLI::ExistingFile);
    app.add_option("--type", type_name, "type of the weight matrices: f32, f16, q8_0, q4_0 (norms stay f32)")
        ->capture_default_str();
    app.add_option("--name", name, "general.name (default: the input file's name)");
    CLI11_PARSE(app, argc, argv);
    try {
        return run(in_path, out_path, tokenizer_path, type_name, name);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "tandem-convert: error: %s\n", e.what());
        return 1;
    }
}
