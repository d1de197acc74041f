// Typed views of a model's weight tensors inside the mapped GGUF file (no copies). Each field's comment gives its
// shape in ggml order: [ne0, ne1] where ne0 is contiguous, so a matrix [in, out] holds `out` rows of `in` values
// and y = W x is one dot product per row.
#pragma once
#include <cstdint>
#include <vector>

#include "gguf/ggml_types.h"

namespace tandem {

class GgufFile;
struct ModelConfig;

struct WeightView {
    const void* data = nullptr;
    GgmlType type = GgmlType::F32;
    int64_t cols = 0;  // ne0: elements per row (the input dimension of a matrix)
    int64_t rows = 0;  // ne1: number of rows (the output dimension); 1 for vectors
    size_t row_bytes() const { return ggml_row_bytes(type, static_cast<uint64_t>(cols)); }
    const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(data) + r * row_bytes(); }
    uint64_t n_bytes() const { return row_bytes() * static_cast<uint64_t>(rows); }
};

// A file with a fused attn_qkv (or a fused gate+up ffn_up, as phi3 writes them) is viewed as the separate
// matrices: rows are stored one after another, so wq, wk and wv are consecutive row ranges of attn_qkv.
// Optional tensors (biases, the block variations' norms) have data == nullptr where the model has none.
struct LayerWeights {
    WeightView attn_norm;      // [dim] f32
    WeightView wq;             // [dim, n_heads * head_dim]
    WeightView wk;             // [dim, n_kv_heads * head_dim]
    WeightView wv;             // [dim, n_kv_heads * head_dim]
    WeightView bq;             // [n_heads * head_dim] f32 (ModelConfig::qkv_bias)
    WeightView bk;             // [n_kv_heads * head_dim] f32
    WeightView bv;             // [n_kv_heads * head_dim] f32
    WeightView q_norm;         // [head_dim] f32 (ModelConfig::qk_norm)
    WeightView k_norm;         // [head_dim] f32
    WeightView wo;             // [n_heads * head_dim, dim]
    WeightView post_attn_norm; // [dim] f32 (ModelConfig::post_norms)
    WeightView ffn_norm;       // [dim] f32
    WeightView w_gate;         // [dim, hidden_dim]
    WeightView w_up;           // [dim, hidden_dim]
    WeightView w_down;         // [hidden_dim, dim]
    WeightView post_ffn_norm;  // [dim] f32 (ModelConfig::post_norms)
};

struct Weights {
    WeightView token_embd;   // [dim, n_vocab]: row t is the embedding of token t
    WeightView output_norm;  // [dim] f32
    WeightView output;       // [dim, n_vocab]; the same view as token_embd when the file ties them
    bool tied_output = false;
    std::vector<LayerWeights> layers;

    // Looks up and checks every tensor the architecture needs (presence, shape, a type the CPU kernels support);
    // errors name the tensor.
    static Weights from_gguf(const GgufFile& file, const ModelConfig& config);
    // Bytes of weights read to produce one token (every matrix once, plus one embedding row): the figure behind
    // the GB/s statistic.
    uint64_t bytes_per_token() const;
};

}  // namespace tandem
