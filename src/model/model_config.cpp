// ModelConfig::from_gguf: architecture keys and their checks.
#include "model/model_config.h"

#include "error.h"
#include "gguf/gguf.h"

namespace tandem {
namespace {

int positive_int(const GgufFile& f, const std::string& key, uint32_t value) {
    if (value == 0 || value > (1u << 30))
        throw Error(f.path() + ": metadata '" + key + "' has an invalid value " + std::to_string(value));
    return static_cast<int>(value);
}

// What a file may declare that the forward pass does not implement yet. Loading it anyway would run another model
// than the file's (wrong text, no error), so each is refused, naming the key or tensor.
void refuse_unsupported(const GgufFile& f, const std::string& a, const ModelConfig& c) {
    const std::string head = " (a head size other than embedding_length / head_count = " + std::to_string(c.head_dim) +
                             " is not supported yet)";
    for (const char* key : {"attention.key_length", "attention.value_length"})
        if (f.find(a + key) && f.get_u32(a + key) != static_cast<uint32_t>(c.head_dim))
            throw Error(f.path() + ": " + a + key + " is " + std::to_string(f.get_u32(a + key)) + head);
    if (f.find(a + "attention.sliding_window") && f.get_u32(a + "attention.sliding_window") > 0)
        throw Error(f.path() + ": " + a + "attention.sliding_window is " +
                    std::to_string(f.get_u32(a + "attention.sliding_window")) +
                    " (sliding-window attention is not supported yet)");
    // A scaling factor without a type is linear scaling in llama.cpp's reading of the keys.
    if (f.find(a + "rope.scaling.factor") && f.get_f32(a + "rope.scaling.factor") != 1.0f &&
        f.get_f32(a + "rope.scaling.factor") != 0.0f)
        throw Error(f.path() + ": " + a + "rope.scaling.factor is " +
                    std::to_string(f.get_f32(a + "rope.scaling.factor")) + " (RoPE scaling is not supported yet)");
    for (const char* tensor : {"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"})
        if (f.find_tensor(tensor))
            throw Error(f.path() + ": tensor '" + tensor +
                        "' (per-dimension RoPE frequency factors, as Llama 3.1+ and Phi-3 files carry) is not "
                        "supported yet");
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
    ModelConfig c;
    c.arch = f.get_string("general.architecture");
    c.name = f.get_string_or("general.name", c.arch);
    if (c.arch != "llama" && c.arch != "qwen2")
        throw Error(f.path() + ": architecture '" + c.arch + "' is not supported (supported: llama, qwen2)");
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

    if (c.dim % c.n_heads != 0)
        throw Error(f.path() + ": embedding_length " + std::to_string(c.dim) + " is not a multiple of head_count " +
                    std::to_string(c.n_heads));
    c.head_dim = c.dim / c.n_heads;
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
    if (f.find(a + "rope.scaling.type") && f.get_string(a + "rope.scaling.type") != "none")
        throw Error(f.path() + ": rope scaling '" + f.get_string(a + "rope.scaling.type") + "' is not supported");
    refuse_unsupported(f, a, c);

    // ggml's rope mode by architecture: llama files rotate adjacent pairs, qwen2 files the two halves (NEOX).
    c.rope_style = c.arch == "qwen2" ? RopeStyle::Neox : RopeStyle::AdjacentPairs;
    c.qkv_bias = c.arch == "qwen2";
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
