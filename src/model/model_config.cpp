// ModelConfig::from_gguf: the architecture table, the keys every architecture shares, and their checks. How each
// architecture's block differs is read off llama.cpp's graph for it (src/models/<arch>.cpp of the llama.cpp that
// llama-cpp-python 0.3.36 vendors, commit 0c1e570), the reference the tests compare with.
#include "model/model_config.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "error.h"
#include "gguf/gguf.h"

namespace tandem {
namespace {

// What a file's attention.sliding_window means for an architecture.
enum class WindowRule {
    Refused,  // the architecture has no sliding window: a file declaring one is an error
    Ignored,  // llama.cpp reads and ignores it (phi3: "Phi SWA is currently disabled"), and so do we
    AllLayers,
    Pattern,  // layers il % n < n - 1 of every n (attention.sliding_window_pattern, default swa_pattern)
};

struct Architecture {
    const char* name;
    RopeStyle rope_style = RopeStyle::AdjacentPairs;
    bool qk_norm = false;
    bool post_norms = false;
    FfnActivation activation = FfnActivation::Silu;
    bool scale_embeddings = false;  // by sqrt(dim)
    WindowRule window = WindowRule::Refused;
    int swa_pattern = 0;        // WindowRule::Pattern's default n
    int default_window = 0;     // WindowRule::Pattern: the window where attention.sliding_window is absent (0: none)
    // WindowRule::Pattern: the RoPE base of windowed layers where rope.freq_base_swa is absent, without the linear
    // scaling; 0: the global base and scaling.
    float local_rope_base = 0.0f;
    int no_rope_every = 0;      // > 0: layers with (il + 1) % n == 0 are not rotated
    bool reads_rope_freqs = false;  // the rope_freqs tensor divides the frequencies (Llama 3.1+)
    bool long_rope = false;     // rope_factors_short / rope_factors_long (LongRoPE) where the file has them (phi3)
    bool soft_caps = false;     // tanh soft-capping of attention scores and final logits (attn_logit_softcapping,
                                // final_logit_softcapping; llama.cpp's defaults 50 and 30)
    int wide_scale_layers = 0;  // the layer count of the size whose attention scale is 1 / sqrt(dim / heads)
};

// One row per architecture. Adding a family whose block is made of these variations is a row here (and its
// tensors' names in weights.cpp); a new variation is a field here and one op in each backend.
constexpr Architecture kArchitectures[] = {
    {.name = "llama", .window = WindowRule::AllLayers, .reads_rope_freqs = true},
    {.name = "qwen2", .rope_style = RopeStyle::Neox},
    {.name = "qwen3", .rope_style = RopeStyle::Neox, .qk_norm = true},
    // Gemma 2 and 3 27B scale attention by the model width per head rather than the head size (llama.cpp's
    // gemma2.cpp / gemma3.cpp, after gemma_pytorch's config), recognised by their layer counts as llama.cpp does.
    {.name = "gemma2", .rope_style = RopeStyle::Neox, .post_norms = true, .activation = FfnActivation::GeluTanh,
     .scale_embeddings = true, .window = WindowRule::Pattern, .swa_pattern = 2, .default_window = 4096,
     .soft_caps = true, .wide_scale_layers = 46},
    {.name = "gemma3", .rope_style = RopeStyle::Neox, .qk_norm = true, .post_norms = true,
     .activation = FfnActivation::GeluTanh, .scale_embeddings = true, .window = WindowRule::Pattern, .swa_pattern = 6,
     .local_rope_base = 10000.0f, .wide_scale_layers = 62},
    {.name = "smollm3", .no_rope_every = 4},
    // Phi-3 / Phi-4-mini: fused attn_qkv and gate+up (weights.cpp views them), partial rotary dims, LongRoPE; a
    // declared window is ignored as llama.cpp does ("Phi SWA is currently disabled").
    {.name = "phi3", .rope_style = RopeStyle::Neox, .window = WindowRule::Ignored, .long_rope = true},
};

const Architecture* find_architecture(const std::string& name) {
    for (const Architecture& a : kArchitectures)
        if (name == a.name) return &a;
    return nullptr;
}

int positive_int(const GgufFile& f, const std::string& key, uint32_t value) {
    if (value == 0 || value > (1u << 30))
        throw Error(f.path() + ": metadata '" + key + "' has an invalid value " + std::to_string(value));
    return static_cast<int>(value);
}

// The per-pair inverse frequencies of a RoPE with base `theta`: theta^(-2i/d) / factor_i * scale, in double, rounded
// once (with no factors and scale 1, the value llama2.c and the earlier backends computed).
std::vector<float> inverse_frequencies(double theta, int rope_dim, const std::vector<float>& factors, double scale) {
    std::vector<float> inv;
    for (int i = 0; i < rope_dim / 2; ++i) {
        const double factor = factors.empty() ? 1.0 : static_cast<double>(factors[static_cast<size_t>(i)]);
        inv.push_back(static_cast<float>(std::pow(theta, -2.0 * i / rope_dim) / factor * scale));
    }
    return inv;
}

// The rope_freqs tensor's values: rope_dim / 2 finite positive f32 factors.
std::vector<float> read_rope_factors(const GgufFile& f, const std::string& name, int rope_dim) {
    const GgufTensorInfo* t = f.find_tensor(name);
    if (t->type != GgmlType::F32 || t->n_dims != 1 || t->ne[0] != static_cast<uint64_t>(rope_dim / 2))
        throw Error(f.path() + ": tensor '" + name + "' has shape " + t->shape_string() + " and type " +
                    ggml_type_name(t->type) + ", expected f32 [" + std::to_string(rope_dim / 2) + "]");
    std::vector<float> factors(static_cast<size_t>(rope_dim / 2));
    std::memcpy(factors.data(), t->data, factors.size() * sizeof(float));
    for (float v : factors)
        if (!(v > 0.0f) || !std::isfinite(v))
            throw Error(f.path() + ": tensor '" + name + "' holds a factor " + std::to_string(v) +
                        " (factors must be finite and positive)");
    return factors;
}

// Which layers have a window under WindowRule::Pattern: attention.sliding_window_pattern as a per-layer array of
// booleans, or as n (layers il % n < n - 1), or the architecture's n.
std::vector<bool> windowed_layers(const GgufFile& f, const std::string& a, const Architecture& arch, int n_layers) {
    const std::string key = a + "attention.sliding_window_pattern";
    std::vector<bool> windowed(static_cast<size_t>(n_layers));
    const GgufValue* v = f.find(key);
    if (v && v->type == GgufValueType::ARRAY) {
        if (v->arr.size() != static_cast<size_t>(n_layers))
            throw Error(f.path() + ": " + key + " has " + std::to_string(v->arr.size()) + " entries for " +
                        std::to_string(n_layers) + " layers");
        for (int il = 0; il < n_layers; ++il) {
            const GgufValue& e = v->arr[static_cast<size_t>(il)];
            if (e.type != GgufValueType::BOOL) throw Error(f.path() + ": " + key + " must hold booleans");
            windowed[static_cast<size_t>(il)] = e.u != 0;
        }
        return windowed;
    }
    const int n = v ? static_cast<int>(f.get_u32(key)) : arch.swa_pattern;
    for (int il = 0; il < n_layers; ++il) windowed[static_cast<size_t>(il)] = n == 0 || il % n < n - 1;
    return windowed;
}

}  // namespace

std::vector<std::string> ModelConfig::supported_architectures() {
    std::vector<std::string> names;
    for (const Architecture& a : kArchitectures) names.push_back(a.name);
    return names;
}

bool ModelConfig::has_sliding_window() const {
    for (const LayerAttention& l : layers)
        if (l.window > 0) return true;
    return false;
}

bool ModelConfig::is_plain_block() const {
    if (qk_norm || post_norms || activation != FfnActivation::Silu || embedding_scale != 1.0f ||
        rope_amplitude != 1.0f || rope_inv_freq.size() != 1 || has_sliding_window())
        return false;
    if (attention_scale != 1.0f / std::sqrt(static_cast<float>(head_dim))) return false;
    if (attention_softcap != 0.0f || logit_softcap != 0.0f) return false;
    for (const LayerAttention& l : layers)
        if (l.rope_table != 0) return false;
    return true;
}

std::string ModelConfig::describe_block() const {
    std::vector<std::string> parts;
    if (qkv_bias) parts.push_back("Q/K/V biases");
    if (qk_norm) parts.push_back("QK-norm");
    if (post_norms) parts.push_back("post-norms");
    if (activation == FfnActivation::GeluTanh) parts.push_back("GeGLU");
    if (embedding_scale != 1.0f) parts.push_back("sqrt(dim) embeddings");
    if (rope_dim < head_dim) parts.push_back("RoPE on " + std::to_string(rope_dim) + " of " + std::to_string(head_dim) + " dims");
    if (long_rope_table >= 0) parts.push_back("LongRoPE (long factors past " + std::to_string(long_rope_context) + ")");
    auto number = [](float v) {
        std::string t = std::to_string(v);
        t.erase(t.find_last_not_of('0') + 1);
        if (t.back() == '.') t.pop_back();
        return t;
    };
    if (attention_softcap != 0.0f)
        parts.push_back("soft-capped scores (" + number(attention_softcap) + ") and logits (" + number(logit_softcap) + ")");
    int windowed = 0, unrotated = 0, window = 0;
    for (const LayerAttention& l : layers) {
        if (l.window > 0) ++windowed, window = l.window;
        if (l.rope_table < 0) ++unrotated;
    }
    if (windowed > 0)
        parts.push_back("window " + std::to_string(window) + " on " + std::to_string(windowed) + " of " +
                        std::to_string(n_layers) + " layers");
    if (unrotated > 0)
        parts.push_back("no RoPE on " + std::to_string(unrotated) + " of " + std::to_string(n_layers) + " layers");
    std::string text = arch + " block";
    for (size_t i = 0; i < parts.size(); ++i) text += (i == 0 ? ": " : ", ") + parts[i];
    return text;
}

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
    ModelConfig c;
    c.arch = f.get_string("general.architecture");
    c.name = f.get_string_or("general.name", c.arch);
    const Architecture* arch = find_architecture(c.arch);
    if (!arch) {
        std::string names;
        for (const Architecture& a : kArchitectures) names += std::string(names.empty() ? "" : ", ") + a.name;
        throw Error(f.path() + ": architecture '" + c.arch + "' is not supported (supported: " + names + ")");
    }
    const std::string a = c.arch + ".";
    auto required = [&](const std::string& key) { return positive_int(f, a + key, f.get_u32(a + key)); };

    c.dim = required("embedding_length");
    c.hidden_dim = required("feed_forward_length");
    c.n_layers = required("block_count");
    c.n_heads = required("attention.head_count");
    c.context_length = required("context_length");
    c.n_kv_heads = positive_int(f, a + "attention.head_count_kv",
                                f.get_u32_or(a + "attention.head_count_kv", static_cast<uint32_t>(c.n_heads)));
    c.rms_eps = f.get_f32(a + "attention.layer_norm_rms_epsilon");
    c.rope_theta = f.get_f32_or(a + "rope.freq_base", 10000.0f);

    if (f.find(a + "attention.key_length")) {
        c.head_dim = required("attention.key_length");
    } else {
        if (c.dim % c.n_heads != 0)
            throw Error(f.path() + ": embedding_length " + std::to_string(c.dim) + " is not a multiple of head_count " +
                        std::to_string(c.n_heads) + " (and " + a + "attention.key_length is absent)");
        c.head_dim = c.dim / c.n_heads;
    }
    if (f.find(a + "attention.value_length") && f.get_u32(a + "attention.value_length") != static_cast<uint32_t>(c.head_dim))
        throw Error(f.path() + ": " + a + "attention.value_length " +
                    std::to_string(f.get_u32(a + "attention.value_length")) + " differs from the key length " +
                    std::to_string(c.head_dim) + " (not supported)");
    if (c.n_heads % c.n_kv_heads != 0)
        throw Error(f.path() + ": head_count " + std::to_string(c.n_heads) + " is not a multiple of head_count_kv " +
                    std::to_string(c.n_kv_heads));
    c.rope_dim = positive_int(f, a + "rope.dimension_count",
                              f.get_u32_or(a + "rope.dimension_count", static_cast<uint32_t>(c.head_dim)));
    if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0)
        throw Error(f.path() + ": rope.dimension_count " + std::to_string(c.rope_dim) +
                    " must be even and at most the head size " + std::to_string(c.head_dim));
    if (!(c.rms_eps > 0.0f && c.rms_eps < 1.0f))
        throw Error(f.path() + ": attention.layer_norm_rms_epsilon " + std::to_string(c.rms_eps) + " is out of range");
    if (!(c.rope_theta > 1.0f))
        throw Error(f.path() + ": rope.freq_base " + std::to_string(c.rope_theta) + " is out of range");

    // RoPE scaling, as llama.cpp reads it: the type defaults to linear, whose factor (default 1) divides the
    // frequencies; "none" ignores the factor. YaRN and LongRoPE change more than the frequencies: refused.
    const std::string scaling = f.get_string_or(a + "rope.scaling.type", "linear");
    const bool has_long_rope = f.find_tensor("rope_factors_long.weight") || f.find_tensor("rope_factors_short.weight");
    if (scaling != "linear" && scaling != "none" && !(scaling == "longrope" && has_long_rope && arch->long_rope))
        throw Error(f.path() + ": " + a + "rope.scaling.type '" + scaling +
                    "' is not supported (supported: none, linear, and longrope for phi3)");
    double freq_scale = 1.0;
    if (scaling == "linear" && f.find(a + "rope.scaling.factor")) {
        const float factor = f.get_f32(a + "rope.scaling.factor");
        if (!(factor >= 0.0f) || !std::isfinite(factor))
            throw Error(f.path() + ": " + a + "rope.scaling.factor " + std::to_string(factor) + " is out of range");
        if (factor != 0.0f) freq_scale = 1.0 / factor;
    }
    c.rope_amplitude = f.get_f32_or(a + "rope.scaling.attn_factor", 1.0f);
    if (!(c.rope_amplitude > 0.0f) || !std::isfinite(c.rope_amplitude))
        throw Error(f.path() + ": " + a + "rope.scaling.attn_factor " + std::to_string(c.rope_amplitude) +
                    " is out of range");
    std::vector<float> short_factors, long_factors;
    if (has_long_rope) {
        if (!arch->long_rope)
            throw Error(f.path() + ": LongRoPE factors (rope_factors_long / rope_factors_short) are not part of the " +
                        c.arch + " architecture");
        for (const char* tensor : {"rope_factors_long.weight", "rope_factors_short.weight"})
            if (!f.find_tensor(tensor)) throw Error(f.path() + ": tensor '" + tensor + "' is missing (LongRoPE needs both)");
        short_factors = read_rope_factors(f, "rope_factors_short.weight", c.rope_dim);
        long_factors = read_rope_factors(f, "rope_factors_long.weight", c.rope_dim);
        c.long_rope_context = positive_int(
            f, a + "rope.scaling.original_context_length",
            f.get_u32_or(a + "rope.scaling.original_context_length", static_cast<uint32_t>(c.context_length)));
    }
    std::vector<float> factors = short_factors;
    if (f.find_tensor("rope_freqs.weight")) {
        if (!arch->reads_rope_freqs)
            throw Error(f.path() + ": tensor 'rope_freqs.weight' is not part of the " + c.arch + " architecture");
        factors = read_rope_factors(f, "rope_freqs.weight", c.rope_dim);
    }

    c.rope_style = arch->rope_style;
    c.qk_norm = arch->qk_norm;
    c.post_norms = arch->post_norms;
    c.activation = arch->activation;
    c.embedding_scale = arch->scale_embeddings ? std::sqrt(static_cast<float>(c.dim)) : 1.0f;
    c.attention_scale = arch->wide_scale_layers > 0 && c.n_layers == arch->wide_scale_layers
                            ? 1.0f / std::sqrt(static_cast<float>(c.dim / c.n_heads))
                            : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    if (arch->soft_caps) {
        c.attention_softcap = f.get_f32_or(a + "attn_logit_softcapping", 50.0f);
        c.logit_softcap = f.get_f32_or(a + "final_logit_softcapping", 30.0f);
        for (const auto& [key, value] : {std::pair{"attn_logit_softcapping", c.attention_softcap},
                                         std::pair{"final_logit_softcapping", c.logit_softcap}})
            if (!(value > 0.0f) || !std::isfinite(value))
                throw Error(f.path() + ": " + a + key + " " + std::to_string(value) + " is out of range");
    }
    c.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;

    // Layers: the window, and which RoPE. Table 0 is the model's RoPE (with LongRoPE's short factors), then the
    // long factors' table; a windowed gemma layer uses the last table: gemma3's local base (rope.freq_base_swa, 10000
    // by default) without the linear scaling, gemma2's the global base and scaling unless rope.freq_base_swa says
    // otherwise, as llama.cpp's get_rope_freq_base and get_rope_freq_scale give them.
    c.rope_inv_freq.push_back(inverse_frequencies(c.rope_theta, c.rope_dim, factors, freq_scale));
    if (!long_factors.empty()) {
        c.long_rope_table = 1;
        c.rope_inv_freq.push_back(inverse_frequencies(c.rope_theta, c.rope_dim, long_factors, freq_scale));
    }
    const uint32_t window = f.find(a + "attention.sliding_window")
                                ? f.get_u32(a + "attention.sliding_window")
                                : static_cast<uint32_t>(arch->default_window);
    if (window > (1u << 30)) throw Error(f.path() + ": " + a + "attention.sliding_window is out of range");
    if (window > 0 && arch->window == WindowRule::Refused)
        throw Error(f.path() + ": " + a + "attention.sliding_window is " + std::to_string(window) +
                    " (the " + c.arch + " architecture has no sliding-window attention)");
    std::vector<bool> windowed(static_cast<size_t>(c.n_layers), window > 0 && arch->window == WindowRule::AllLayers);
    if (window > 0 && arch->window == WindowRule::Pattern) {
        windowed = windowed_layers(f, a, *arch, c.n_layers);
        const bool global = arch->local_rope_base == 0.0f;
        const float local_theta =
            f.get_f32_or(a + "rope.freq_base_swa", global ? c.rope_theta : arch->local_rope_base);
        if (!(local_theta > 1.0f))
            throw Error(f.path() + ": rope.freq_base_swa " + std::to_string(local_theta) + " is out of range");
        c.rope_inv_freq.push_back(
            inverse_frequencies(local_theta, c.rope_dim, global ? factors : std::vector<float>{}, global ? freq_scale : 1.0));
    }
    const int local_table = static_cast<int>(c.rope_inv_freq.size()) - 1;
    for (int il = 0; il < c.n_layers; ++il) {
        LayerAttention layer;
        if (windowed[static_cast<size_t>(il)]) {
            layer.window = static_cast<int>(window);
            if (arch->window == WindowRule::Pattern) layer.rope_table = local_table;
        }
        if (arch->no_rope_every > 0 && (il + 1) % arch->no_rope_every == 0) layer.rope_table = -1;
        c.layers.push_back(layer);
    }

    // The vocabulary size comes from token_embd (checked against llama.vocab_size and the tokenizer by the loader).
    const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
    if (!embd) throw Error(f.path() + ": tensor 'token_embd.weight' is missing");
    if (embd->n_dims != 2 || embd->ne[1] > (1u << 24))
        throw Error(f.path() + ": tensor 'token_embd.weight' has shape " + embd->shape_string() +
                    ", expected [embedding_length, n_vocab]");
    c.n_vocab = static_cast<int>(embd->ne[1]);
    if (f.find(a + "vocab_size") && f.get_u32(a + "vocab_size") != static_cast<uint32_t>(c.n_vocab))
        throw Error(f.path() + ": " + a + "vocab_size " + std::to_string(f.get_u32(a + "vocab_size")) +
                    " disagrees with token_embd.weight rows " + std::to_string(c.n_vocab));
    return c;
}

}  // namespace tandem
