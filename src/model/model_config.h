// Hyperparameters of a model, read from GGUF metadata and checked for consistency. Nothing is guessed: a missing
// required key or an inconsistent value is a tandem::Error naming the file and the key. The only defaults are the
// ones the GGUF format itself defines (head_count_kv = head_count, rope.dimension_count = head size,
// rope.freq_base = 10000).
#pragma once
#include <cstdint>
#include <string>

namespace tandem {

class GgufFile;

enum class RopeStyle {
    AdjacentPairs,  // rotates (x[2i], x[2i+1]): llama-architecture GGUF files (ggml's "normal" rope)
    Neox,           // rotates (x[i], x[i + d/2]): qwen2 and others (ggml's "neox" rope)
};

struct ModelConfig {
    std::string arch;          // general.architecture: "llama" or "qwen2"
    std::string name;          // general.name, for logs
    int n_vocab = 0;           // rows of token_embd
    int dim = 0;               // embedding_length
    int hidden_dim = 0;        // feed_forward_length
    int n_layers = 0;          // block_count
    int n_heads = 0;           // attention.head_count
    int n_kv_heads = 0;        // attention.head_count_kv (grouped-query attention when < n_heads)
    int head_dim = 0;          // dim / n_heads
    int rope_dim = 0;          // rope.dimension_count: leading dims of each head that are rotated
    int context_length = 0;    // the model's trained context
    float rms_eps = 0;         // attention.layer_norm_rms_epsilon
    float rope_theta = 10000;  // rope.freq_base
    RopeStyle rope_style = RopeStyle::AdjacentPairs;
    bool qkv_bias = false;  // Q, K and V projections carry a bias (qwen2)

    int q_dim() const { return n_heads * head_dim; }
    int kv_dim() const { return n_kv_heads * head_dim; }

    static ModelConfig from_gguf(const GgufFile& file);
};

}  // namespace tandem
