// Weights::from_gguf: finds each tensor by its llama.cpp name and checks shape and type.
#include "model/weights.h"

#include <string>

#include "error.h"
#include "gguf/gguf.h"
#include "model/model_config.h"

namespace tandem {
namespace {

WeightView view(const GgufFile& f, const std::string& name, int64_t cols, int64_t rows, bool must_be_f32) {
    const GgufTensorInfo* t = f.find_tensor(name);
    if (!t) throw Error(f.path() + ": tensor '" + name + "' is missing");
    const bool is_vector = rows == 1;
    const bool shape_ok = is_vector ? (t->n_dims == 1 && static_cast<int64_t>(t->ne[0]) == cols)
                                    : (t->n_dims == 2 && static_cast<int64_t>(t->ne[0]) == cols &&
                                       static_cast<int64_t>(t->ne[1]) == rows);
    if (!shape_ok) {
        const std::string expected = is_vector ? "[" + std::to_string(cols) + "]"
                                               : "[" + std::to_string(cols) + ", " + std::to_string(rows) + "]";
        throw Error(f.path() + ": tensor '" + name + "' has shape " + t->shape_string() + ", expected " + expected);
    }
    if (must_be_f32 && t->type != GgmlType::F32)
        throw Error(f.path() + ": tensor '" + name + "' has type " + ggml_type_name(t->type) +
                    "; norm weights and biases must be f32");
    if (!ggml_type_info(t->type).supported)
        throw Error(f.path() + ": tensor '" + name + "' has type " + ggml_type_name(t->type) +
                    ", which tandem does not support yet (supported: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, "
                    "q8_0, q2_K, q3_K, q4_K, q5_K, q6_K)");
    return WeightView{t->data, t->type, cols, rows};
}

}  // namespace

Weights Weights::from_gguf(const GgufFile& f, const ModelConfig& c) {
    Weights w;
    w.token_embd = view(f, "token_embd.weight", c.dim, c.n_vocab, false);
    w.output_norm = view(f, "output_norm.weight", c.dim, 1, true);
    w.tied_output = f.find_tensor("output.weight") == nullptr;
    w.output = w.tied_output ? w.token_embd : view(f, "output.weight", c.dim, c.n_vocab, false);
    for (int l = 0; l < c.n_layers; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        LayerWeights L;
        L.attn_norm = view(f, p + "attn_norm.weight", c.dim, 1, true);
        L.wq = view(f, p + "attn_q.weight", c.dim, c.q_dim(), false);
        L.wk = view(f, p + "attn_k.weight", c.dim, c.kv_dim(), false);
        L.wv = view(f, p + "attn_v.weight", c.dim, c.kv_dim(), false);
        if (c.qkv_bias) {
            L.bq = view(f, p + "attn_q.bias", c.q_dim(), 1, true);
            L.bk = view(f, p + "attn_k.bias", c.kv_dim(), 1, true);
            L.bv = view(f, p + "attn_v.bias", c.kv_dim(), 1, true);
        }
        L.wo = view(f, p + "attn_output.weight", c.q_dim(), c.dim, false);
        L.ffn_norm = view(f, p + "ffn_norm.weight", c.dim, 1, true);
        L.w_gate = view(f, p + "ffn_gate.weight", c.dim, c.hidden_dim, false);
        L.w_up = view(f, p + "ffn_up.weight", c.dim, c.hidden_dim, false);
        L.w_down = view(f, p + "ffn_down.weight", c.hidden_dim, c.dim, false);
        w.layers.push_back(L);
    }
    return w;
}

uint64_t Weights::bytes_per_token() const {
    uint64_t total = output.n_bytes() + output_norm.n_bytes() + token_embd.row_bytes();
    for (const LayerWeights& L : layers)
        for (const WeightView* v : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.bq, &L.bk, &L.bv, &L.wo, &L.ffn_norm,
                                    &L.w_gate, &L.w_up, &L.w_down})
            if (v->data) total += v->n_bytes();
    return total;
}

}  // namespace tandem
