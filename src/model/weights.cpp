// Weights::from_gguf: finds each tensor by its llama.cpp name and checks shape and type.
#include "model/weights.h"

#include <set>
#include <string>

#include "error.h"
#include "gguf/gguf.h"
#include "model/model_config.h"

namespace tandem {
namespace {

// The names of the tensors the loader has read, to refuse a file that holds one it would ignore.
using UsedTensors = std::set<std::string>;

WeightView view(const GgufFile& f, const std::string& name, int64_t cols, int64_t rows, bool must_be_f32,
                UsedTensors& used) {
    used.insert(name);
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

// Rows [first, first + count) of a matrix: a view of the same data.
WeightView row_range(const WeightView& m, int64_t first, int64_t count) {
    WeightView v = m;
    v.data = m.row(first);
    v.rows = count;
    return v;
}

}  // namespace

Weights Weights::from_gguf(const GgufFile& f, const ModelConfig& c) {
    Weights w;
    UsedTensors used{"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"};  // ModelConfig's
    w.token_embd = view(f, "token_embd.weight", c.dim, c.n_vocab, false, used);
    w.output_norm = view(f, "output_norm.weight", c.dim, 1, true, used);
    w.tied_output = f.find_tensor("output.weight") == nullptr;
    w.output = w.tied_output ? w.token_embd : view(f, "output.weight", c.dim, c.n_vocab, false, used);
    for (int l = 0; l < c.n_layers; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        LayerWeights L;
        L.attn_norm = view(f, p + "attn_norm.weight", c.dim, 1, true, used);
        // Q, K and V: separate, or one fused matrix (llama.cpp accepts either for every architecture here).
        if (f.find_tensor(p + "attn_qkv.weight")) {
            const WeightView qkv = view(f, p + "attn_qkv.weight", c.dim, c.q_dim() + 2 * c.kv_dim(), false, used);
            if (f.find_tensor(p + "attn_qkv.bias"))
                throw Error(f.path() + ": tensor '" + p + "attn_qkv.bias' (a fused Q/K/V bias) is not supported yet");
            L.wq = row_range(qkv, 0, c.q_dim());
            L.wk = row_range(qkv, c.q_dim(), c.kv_dim());
            L.wv = row_range(qkv, c.q_dim() + c.kv_dim(), c.kv_dim());
        } else {
            L.wq = view(f, p + "attn_q.weight", c.dim, c.q_dim(), false, used);
            L.wk = view(f, p + "attn_k.weight", c.dim, c.kv_dim(), false, used);
            L.wv = view(f, p + "attn_v.weight", c.dim, c.kv_dim(), false, used);
        }
        if (c.qkv_bias) {
            L.bq = view(f, p + "attn_q.bias", c.q_dim(), 1, true, used);
            L.bk = view(f, p + "attn_k.bias", c.kv_dim(), 1, true, used);
            L.bv = view(f, p + "attn_v.bias", c.kv_dim(), 1, true, used);
        }
        if (c.qk_norm) {
            L.q_norm = view(f, p + "attn_q_norm.weight", c.head_dim, 1, true, used);
            L.k_norm = view(f, p + "attn_k_norm.weight", c.head_dim, 1, true, used);
        }
        L.wo = view(f, p + "attn_output.weight", c.q_dim(), c.dim, false, used);
        L.ffn_norm = view(f, p + "ffn_norm.weight", c.dim, 1, true, used);
        // Gate and up: separate, or fused in ffn_up (gate first, as ggml_swiglu splits it) when ffn_gate is absent.
        if (!f.find_tensor(p + "ffn_gate.weight") && f.find_tensor(p + "ffn_up.weight") &&
            f.find_tensor(p + "ffn_up.weight")->n_dims == 2 &&
            f.find_tensor(p + "ffn_up.weight")->ne[1] == 2 * static_cast<uint64_t>(c.hidden_dim)) {
            const WeightView gate_up = view(f, p + "ffn_up.weight", c.dim, 2 * c.hidden_dim, false, used);
            L.w_gate = row_range(gate_up, 0, c.hidden_dim);
            L.w_up = row_range(gate_up, c.hidden_dim, c.hidden_dim);
        } else {
            L.w_gate = view(f, p + "ffn_gate.weight", c.dim, c.hidden_dim, false, used);
            L.w_up = view(f, p + "ffn_up.weight", c.dim, c.hidden_dim, false, used);
        }
        L.w_down = view(f, p + "ffn_down.weight", c.hidden_dim, c.dim, false, used);
        if (c.post_norms) {
            L.post_attn_norm = view(f, p + "post_attention_norm.weight", c.dim, 1, true, used);
            L.post_ffn_norm = view(f, p + "post_ffw_norm.weight", c.dim, 1, true, used);
        }
        w.layers.push_back(L);
    }
    // A tensor nothing reads would be part of another model than the one computed (an output bias, an FFN bias, a
    // block variation of another architecture): refused, naming it, rather than silently dropped.
    for (const GgufTensorInfo& t : f.tensors())
        if (!used.count(t.name))
            throw Error(f.path() + ": tensor '" + t.name + "' is not part of the " + c.arch +
                        " block as tandem computes it (not supported)");
    return w;
}

uint64_t Weights::bytes_per_token() const {
    uint64_t total = output.n_bytes() + output_norm.n_bytes() + token_embd.row_bytes();
    for (const LayerWeights& L : layers)
        for (const WeightView* v : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.bq, &L.bk, &L.bv, &L.q_norm, &L.k_norm,
                                    &L.wo, &L.post_attn_norm, &L.ffn_norm, &L.w_gate, &L.w_up, &L.w_down,
                                    &L.post_ffn_norm})
            if (v->data) total += v->n_bytes();
    return total;
}

}  // namespace tandem
