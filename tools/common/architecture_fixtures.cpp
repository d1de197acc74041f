// write_architecture_fixture: the fixtures' shapes and weights. F32 weights throughout, so that the references
// (llama.cpp) and tandem differ only in the order of their sums and their transcendental functions, and the tests
// can hold logits to a tight tolerance.
#include "common/architecture_fixtures.h"

#include <cmath>
#include <cstring>
#include <functional>

#include "common/splitmix.h"
#include "common/synthetic_model.h"
#include "error.h"
#include "gguf/gguf_writer.h"

namespace tandem {
namespace {

constexpr int kVocab = 320;  // <unk> <s> </s>, 256 byte pieces, 61 made-up pieces
constexpr int kDim = 64;
constexpr int kHidden = 128;
constexpr int kHeads = 4;

struct Fixture {
    std::string arch;
    int n_layers = 3, n_kv_heads = 2, head_dim = kDim / kHeads, rope_dim = 0, context = 256;
    bool tied = false, qkv_bias = false, qk_norm = false, post_norms = false, fused_qkv = false, fused_gate_up = false;
    float rms_eps = 1e-5f;
    std::function<void(GgufWriter&, const std::string& a)> keys;  // the family's own keys
    std::vector<float> rope_freqs;                                 // written as rope_freqs.weight when not empty
    std::vector<float> long_factors, short_factors;                // rope_factors_long / _short when not empty
};

Fixture fixture(const std::string& name) {
    Fixture f;
    if (name == "llama3") {  // Llama 3.1-style rope_freqs, linear scaling, a head size other than dim / heads
        f.arch = "llama";
        f.head_dim = 32;
        f.rope_freqs = {1.0f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, 8.0f, 8.0f, 8.0f, 8.0f, 8.0f, 8.0f, 8.0f, 8.0f, 8.0f};
        f.keys = [](GgufWriter& w, const std::string& a) {
            w.add_f32(a + "rope.freq_base", 500000.0f);
            w.add_string(a + "rope.scaling.type", "linear");
            w.add_f32(a + "rope.scaling.factor", 2.0f);
        };
    } else if (name == "qwen3") {  // QK-norm, a head size of its own, tied output
        f.arch = "qwen3";
        f.head_dim = 32;
        f.qk_norm = true;
        f.tied = true;
        f.rms_eps = 1e-6f;
        f.keys = [](GgufWriter& w, const std::string& a) { w.add_f32(a + "rope.freq_base", 1000000.0f); };
    } else if (name == "gemma3") {  // 5 of 6 layers windowed (window 5), local RoPE base, QK-norm, post-norms, GELU
        f.arch = "gemma3";
        f.n_layers = 7;  // layers 0-4 and 6 windowed, 5 global
        f.n_kv_heads = 1;
        f.head_dim = 32;
        f.qk_norm = true;
        f.post_norms = true;
        f.tied = true;
        f.rms_eps = 1e-6f;
        f.keys = [](GgufWriter& w, const std::string& a) {
            w.add_f32(a + "rope.freq_base", 1000000.0f);
            w.add_u32(a + "attention.sliding_window", 5);
        };
    } else if (name == "gemma2") {  // alternate layers windowed (window 5), post-norms, GELU, soft-capping
        f.arch = "gemma2";
        f.n_layers = 4;  // layers 0 and 2 windowed, 1 and 3 global
        f.n_kv_heads = 2;
        f.head_dim = 32;
        f.post_norms = true;
        f.tied = true;
        f.rms_eps = 1e-6f;
        f.keys = [](GgufWriter& w, const std::string& a) {
            w.add_f32(a + "rope.freq_base", 10000.0f);
            w.add_u32(a + "attention.sliding_window", 5);
            // Caps low enough to bend this fixture's scores (|s| up to ~3) and logits (standard deviation ~8).
            w.add_f32(a + "attn_logit_softcapping", 2.0f);
            w.add_f32(a + "final_logit_softcapping", 8.0f);
        };
    } else if (name == "smollm3") {  // every fourth layer without RoPE; Q/K/V fused in attn_qkv
        f.arch = "smollm3";
        f.n_layers = 4;
        f.fused_qkv = true;
        f.keys = [](GgufWriter& w, const std::string& a) { w.add_f32(a + "rope.freq_base", 2000000.0f); };
    } else if (name == "phi3") {  // fused Q/K/V and gate+up, partial rotary dims, LongRoPE, an ignored window
        f.arch = "phi3";
        f.rope_dim = 12;  // of 16
        f.fused_qkv = true;
        f.fused_gate_up = true;
        f.context = 1024;
        f.short_factors = {1.0f, 1.1f, 1.3f, 1.6f, 2.0f, 2.5f};
        f.long_factors = {1.0f, 1.5f, 3.0f, 6.0f, 12.0f, 24.0f};
        f.keys = [](GgufWriter& w, const std::string& a) {
            w.add_f32(a + "rope.freq_base", 10000.0f);
            w.add_f32(a + "rope.scaling.attn_factor", 1.19f);
            w.add_u32(a + "rope.scaling.original_context_length", 256);
            w.add_u32(a + "attention.sliding_window", 2047);
        };
    } else {
        throw Error("no architecture fixture '" + name + "'");
    }
    return f;
}

std::vector<uint8_t> bytes_of(const std::vector<float>& v) {
    std::vector<uint8_t> b(v.size() * sizeof(float));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

}  // namespace

std::vector<std::string> architecture_fixture_names() { return {"llama3", "qwen3", "gemma2", "gemma3", "smollm3", "phi3"}; }

void write_architecture_fixture(const std::string& name, const std::string& path) {
    const Fixture f = fixture(name);
    SplitMix64 rng{0x7a6e64656dull};  // seeded by the name (not std::hash, which differs between libraries)
    for (char ch : name) rng.state = rng.state * 131 + static_cast<unsigned char>(ch);
    const int q_dim = kHeads * f.head_dim, kv_dim = f.n_kv_heads * f.head_dim;

    GgufWriter w;
    const std::string a = f.arch + ".";
    w.add_string("general.architecture", f.arch);
    // (Not "phi3" in the name: llama.cpp's vocabulary loader then looks up Phi-3's special tokens by their text, which
    // the made-up vocabulary has not.)
    w.add_string("general.name", "tandem-fixture-" + (name == "phi3" ? std::string("phi-three") : name));
    w.add_u32(a + "context_length", static_cast<uint32_t>(f.context));
    w.add_u32(a + "embedding_length", kDim);
    w.add_u32(a + "feed_forward_length", kHidden);
    w.add_u32(a + "block_count", static_cast<uint32_t>(f.n_layers));
    w.add_u32(a + "attention.head_count", kHeads);
    w.add_u32(a + "attention.head_count_kv", static_cast<uint32_t>(f.n_kv_heads));
    if (f.head_dim != kDim / kHeads) {
        w.add_u32(a + "attention.key_length", static_cast<uint32_t>(f.head_dim));
        w.add_u32(a + "attention.value_length", static_cast<uint32_t>(f.head_dim));
    }
    w.add_u32(a + "rope.dimension_count", static_cast<uint32_t>(f.rope_dim > 0 ? f.rope_dim : f.head_dim));
    w.add_f32(a + "attention.layer_norm_rms_epsilon", f.rms_eps);
    f.keys(w, a);
    add_synthetic_vocabulary(w, kVocab);

    // Uniform values of standard deviation `sd`.
    auto values = [&](int64_t n, float sd) {
        std::vector<float> v(static_cast<size_t>(n));
        for (float& x : v) x = sd * std::sqrt(3.0f) * rng.uniform_pm1();
        return v;
    };
    auto matrix = [&](const std::string& tensor, int64_t cols, int64_t rows, float sd) {
        w.add_tensor(tensor, GgmlType::F32, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)},
                     bytes_of(values(cols * rows, sd)));
    };
    auto vector = [&](const std::string& tensor, int64_t n, float centre, float spread) {
        std::vector<float> v(static_cast<size_t>(n));
        for (float& x : v) x = centre + spread * rng.uniform_pm1();
        w.add_tensor(tensor, GgmlType::F32, {static_cast<uint64_t>(n)}, bytes_of(v));
    };
    const float proj = 1.0f / std::sqrt(static_cast<float>(kDim));
    matrix("token_embd.weight", kDim, kVocab, 1.0f);
    vector("output_norm.weight", kDim, 1.0f, 0.25f);
    // A wide spread of logits (standard deviation ~3), so that greedy picks are far from ties.
    if (!f.tied) matrix("output.weight", kDim, kVocab, 3.0f / std::sqrt(static_cast<float>(kDim)));
    if (!f.rope_freqs.empty())
        w.add_tensor("rope_freqs.weight", GgmlType::F32, {f.rope_freqs.size()}, bytes_of(f.rope_freqs));
    if (!f.long_factors.empty()) {
        w.add_tensor("rope_factors_long.weight", GgmlType::F32, {f.long_factors.size()}, bytes_of(f.long_factors));
        w.add_tensor("rope_factors_short.weight", GgmlType::F32, {f.short_factors.size()}, bytes_of(f.short_factors));
    }
    for (int l = 0; l < f.n_layers; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        vector(p + "attn_norm.weight", kDim, 1.0f, 0.25f);
        if (f.fused_qkv) {
            matrix(p + "attn_qkv.weight", kDim, q_dim + 2 * kv_dim, proj);
        } else {
            matrix(p + "attn_q.weight", kDim, q_dim, proj);
            matrix(p + "attn_k.weight", kDim, kv_dim, proj);
            matrix(p + "attn_v.weight", kDim, kv_dim, proj);
        }
        if (f.qk_norm) {
            vector(p + "attn_q_norm.weight", f.head_dim, 1.0f, 0.25f);
            vector(p + "attn_k_norm.weight", f.head_dim, 1.0f, 0.25f);
        }
        matrix(p + "attn_output.weight", q_dim, kDim, 1.0f / std::sqrt(static_cast<float>(q_dim)));
        if (f.post_norms) vector(p + "post_attention_norm.weight", kDim, 1.0f, 0.25f);
        vector(p + "ffn_norm.weight", kDim, 1.0f, 0.25f);
        if (f.fused_gate_up) {
            matrix(p + "ffn_up.weight", kDim, 2 * kHidden, proj);  // gate rows, then up rows
        } else {
            matrix(p + "ffn_gate.weight", kDim, kHidden, proj);
            matrix(p + "ffn_up.weight", kDim, kHidden, proj);
        }
        matrix(p + "ffn_down.weight", kHidden, kDim, 1.0f / std::sqrt(static_cast<float>(kHidden)));
        if (f.post_norms) vector(p + "post_ffw_norm.weight", kDim, 1.0f, 0.25f);
    }
    w.write(path);
}

}  // namespace tandem
