// Hyperparameters of a model, read from GGUF metadata and checked for consistency, and the description of its block:
// which variations of the pre-norm transformer block the architecture uses (QK-norm, norms after the sublayers,
// the FFN's activation, embedding scale, RoPE style and frequencies, a sliding window or no RoPE per layer). Both
// backends compute the block from this description alone, so an architecture is a row of the table in
// model_config.cpp, not a forward pass of its own.
//
// Nothing is guessed: a missing required key or an inconsistent value is a tandem::Error naming the file and the key.
// The defaults are the ones llama.cpp applies when a key is absent (head_count_kv = head_count, key_length = dim /
// heads, rope.dimension_count = head size, rope.freq_base = 10000, the architecture's sliding-window pattern).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

class GgufFile;

enum class RopeStyle {
    AdjacentPairs,  // rotates (x[2i], x[2i+1]): llama-architecture GGUF files (ggml's "normal" rope)
    Neox,           // rotates (x[i], x[i + d/2]): qwen2 and others (ggml's "neox" rope)
};

// The gate's activation in the gated FFN: down(act(gate(x)) * up(x)).
enum class FfnActivation {
    Silu,      // SwiGLU (llama, qwen, phi3)
    GeluTanh,  // GeGLU with the tanh approximation of GELU (gemma)
};

// How one layer attends.
struct LayerAttention {
    // > 0: a query at position p sees the keys at positions p' with p - p' < window (itself and window - 1 before
    // it; llama.cpp's LLAMA_SWA_TYPE_STANDARD); 0: every earlier key.
    int window = 0;
    // Which of ModelConfig::rope_inv_freq rotates this layer's Q and K; -1: none (smollm3's every fourth layer).
    int rope_table = 0;
};

struct ModelConfig {
    std::string arch;          // general.architecture: one of supported_architectures()
    std::string name;          // general.name, for logs
    int n_vocab = 0;           // rows of token_embd
    int dim = 0;               // embedding_length
    int hidden_dim = 0;        // feed_forward_length
    int n_layers = 0;          // block_count
    int n_heads = 0;           // attention.head_count
    int n_kv_heads = 0;        // attention.head_count_kv (grouped-query attention when < n_heads)
    int head_dim = 0;          // attention.key_length (= value_length), dim / n_heads by default
    int rope_dim = 0;          // rope.dimension_count: leading dims of each head that are rotated
    int context_length = 0;    // the model's trained context
    float rms_eps = 0;         // attention.layer_norm_rms_epsilon
    float rope_theta = 10000;  // rope.freq_base (of the layers without a sliding window)
    RopeStyle rope_style = RopeStyle::AdjacentPairs;

    // ---- The block's variations (set from the architecture's row and the file) ----
    bool qkv_bias = false;     // Q, K and V projections carry a bias (attn_q.bias ...: qwen2, and where a file has them)
    bool qk_norm = false;      // RMSNorm of every Q and K head (attn_q_norm / attn_k_norm, [head_dim]) before RoPE
    bool post_norms = false;   // RMSNorm of the attention and FFN outputs before each residual add (post_attention_norm,
                               // post_ffw_norm: gemma)
    FfnActivation activation = FfnActivation::Silu;
    float embedding_scale = 1.0f;  // token embeddings are multiplied by this (gemma: sqrt(dim))
    float attention_scale = 0.0f;  // scores = scale * q.k (1 / sqrt(head_dim) unless the architecture says otherwise)
    // Soft-capping (gemma2), 0: none. Attention scores s become cap * tanh(s / cap) before the softmax (with
    // s = attention_scale * q.k), and so do the output logits with logit_softcap.
    float attention_softcap = 0.0f;
    float logit_softcap = 0.0f;
    // The rotated dims of Q and K are multiplied by this with the rotation (ggml's mscale: rope.scaling.attn_factor).
    float rope_amplitude = 1.0f;
    // Per-pair inverse frequencies, one table per distinct RoPE of the model ([table][rope_dim / 2]): the base's
    // theta^(-2i / rope_dim), divided by the file's per-dimension factors (rope_freqs) and times the linear scaling
    // factor's inverse, computed in double and rounded once.
    std::vector<std::vector<float>> rope_inv_freq;
    std::vector<LayerAttention> layers;  // [n_layers]
    // LongRoPE (phi3's rope_factors_short / rope_factors_long): table 0 holds the short factors, and where the context
    // is longer than long_rope_context (rope.scaling.original_context_length), rope_inv_freq[long_rope_table] with the
    // long ones replaces it: llama.cpp's rule, by the context size a cache is made for. -1: none.
    int long_rope_table = -1;
    int long_rope_context = 0;

    // The RoPE table of `layer` in a cache of n_ctx positions (-1: the layer is not rotated).
    int rope_table(int layer, int n_ctx) const {
        const int table = layers[static_cast<size_t>(layer)].rope_table;
        return table == 0 && long_rope_table >= 0 && n_ctx > long_rope_context ? long_rope_table : table;
    }
    int q_dim() const { return n_heads * head_dim; }
    int kv_dim() const { return n_kv_heads * head_dim; }
    // Whether some layer has a sliding window.
    bool has_sliding_window() const;
    // Whether the block is the plain llama/qwen2 one (no variation beyond biases and the RoPE style, one RoPE table,
    // every layer rotated, no window): what the CUDA backend's fused kernels compute.
    bool is_plain_block() const;

    // The block in words, for -v: "gemma3 block: QK-norm, post-norms, GeGLU, sqrt(dim) embeddings, window 512 on 15
    // of 18 layers", or "llama block" for the plain one.
    std::string describe_block() const;

    static ModelConfig from_gguf(const GgufFile& file);
    static std::vector<std::string> supported_architectures();
};

}  // namespace tandem
