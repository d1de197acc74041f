// Synthetic llama (and qwen2) models: GGUF files of any shape and weight type with random weights and a made-up
// sentencepiece vocabulary, so speed can be measured on model sizes that no real file here has (e.g. a 1B or 7B
// llama in q4_0) and the loader can be tested on every type. The text they generate is meaningless.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "ggml_types.h"

namespace tandem {

struct SyntheticShape {
    std::string name;
    int dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, n_vocab = 0, context_length = 0;
    bool tied_output = false;
    // "llama", or "qwen2": Q/K/V biases, NEOX RoPE (the loader's rule for the architecture), Qwen2.5's RoPE base
    // (1e6) and RMSNorm epsilon (1e-6).
    std::string arch = "llama";
    uint64_t n_params() const;
};

// Named presets: "tiny" (a few MB, for tests), "1b" (TinyLlama-1.1B's shape), "7b" (Llama-2-7B's shape),
// "qwen1.5b" / "qwen0.5b" (Qwen2.5-Coder-1.5B / 0.5B's shapes and architecture, the default speculative pair: a
// lent GPU times the pair's steps on them, as the real files are too large to travel there).
std::optional<SyntheticShape> synthetic_preset(const std::string& name);

// Writes a model of `shape` whose 2-D matrices are of `type` (norms f32; rows whose length is not a multiple of
// the type's block size fall back to f16): random values quantized for the types tandem can write, random codes
// with scales fitted to the same RMS for the others (the k-quants). Deterministic for a given seed.
void write_synthetic_model(const std::string& path, const SyntheticShape& shape, GgmlType type, uint64_t seed = 1);

}  // namespace tandem
