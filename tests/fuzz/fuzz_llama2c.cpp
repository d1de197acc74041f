// Fuzz target: arbitrary bytes as a llama2.c checkpoint (tandem-convert's input). The reader either accepts the
// file or throws tandem::Error (llama2c.h: "never a crash or a silent misread"); an accepted checkpoint is converted
// to GGUF with a made-up vocabulary of its size, in F32, F16, Q8_0 or Q4_0 (by the input's length), and that GGUF
// must load as a model and run a two-token forward on the CPU backend: what the converter writes, tandem reads.
#include <cstring>
#include <string>
#include <vector>

#include "error.h"
#include "fuzz_checks.h"
#include "convert/llama2c.h"
#include "model/model.h"

namespace {

// <unk>, <s>, </s>, then made-up normal pieces: a vocabulary of any size that llama2c_to_gguf accepts.
tandem::SpmVocab made_up_vocabulary(int n) {
    tandem::SpmVocab v;
    for (int i = 0; i < n; ++i) {
        v.tokens.push_back(i == 0 ? "<unk>" : i == 1 ? "<s>" : i == 2 ? "</s>" : "\xe2\x96\x81t" + std::to_string(i));
        v.scores.push_back(i < 3 ? 0.0f : -static_cast<float>(i));
        v.types.push_back(i == 0 ? 2 : i < 3 ? 3 : 1);
    }
    v.unk_id = 0;
    v.bos_id = n > 1 ? 1 : -1;
    v.eos_id = n > 2 ? 2 : -1;
    return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    tandem::Llama2cCheckpoint ckpt;
    try {
        ckpt = tandem::parse_llama2c({data, size}, "fuzz.bin");
    } catch (const tandem::Error&) {
        return 0;
    }
    static constexpr tandem::GgmlType kTypes[] = {tandem::GgmlType::F32, tandem::GgmlType::F16,
                                                   tandem::GgmlType::Q8_0, tandem::GgmlType::Q4_0};
    std::vector<uint8_t> gguf;
    try {
        gguf = tandem::llama2c_to_gguf(ckpt, made_up_vocabulary(ckpt.config.vocab_size), kTypes[size % 4], "fuzz")
                   .serialize();
    } catch (const tandem::Error&) {
        return 0;  // e.g. a vocabulary too small for its special tokens
    }
    const tandem::fuzz::MemoryFile file(gguf.data(), gguf.size());
    try {
        tandem::fuzz::run_two_tokens(*tandem::Model::load(file.path()));
    } catch (const tandem::Error& e) {
        tandem::fuzz::fail(std::string("a converted checkpoint does not load: ") + e.what());
    }
    return 0;
}

namespace tandem::fuzz {

namespace {

// The three layouts of karpathy/llama2.c's export.py at a tiny shape, with deterministic weights.
class CheckpointWriter {
public:
    void i32(int32_t v) { raw(&v, 4); }
    void u8(uint8_t v) { raw(&v, 1); }
    void floats(uint64_t n) {
        for (uint64_t i = 0; i < n; ++i) {
            const float v = static_cast<float>(static_cast<int>(next() % 2001) - 1000) / 4000.0f;
            raw(&v, 4);
        }
    }
    // Version 2: per layer, the int8 values then one fp32 scale per group.
    void q8(int layers, uint64_t per_layer, int group) {
        for (int l = 0; l < layers; ++l) {
            for (uint64_t i = 0; i < per_layer; ++i) u8(static_cast<uint8_t>(next()));
            for (uint64_t g = 0; g < per_layer / group; ++g) {
                const float scale = 0.002f;
                raw(&scale, 4);
            }
        }
    }
    void pad_to(size_t n) { bytes_.resize(n, '\0'); }
    std::string take() { return std::move(bytes_); }

private:
    void raw(const void* p, size_t n) { bytes_.append(static_cast<const char*>(p), n); }
    uint32_t next() { return state_ = state_ * 1664525u + 1013904223u; }
    std::string bytes_;
    uint32_t state_ = 1;
};

}  // namespace

std::vector<std::pair<std::string, std::string>> fuzz_seeds() {
    constexpr int dim = 32, hidden = 64, layers = 1, heads = 4, kv_heads = 2, vocab = 16, seq = 16, group = 16;
    constexpr int kv_dim = dim / heads * kv_heads;
    const uint64_t attention[] = {uint64_t{dim} * dim, uint64_t{kv_dim} * dim, uint64_t{kv_dim} * dim,
                                  uint64_t{dim} * dim};
    const uint64_t ffn[] = {uint64_t{hidden} * dim, uint64_t{dim} * hidden, uint64_t{hidden} * dim};
    std::vector<std::pair<std::string, std::string>> out;
    for (bool shared : {true, false}) {  // legacy: token embedding, layers, final norm, freq_cis, [classifier]
        CheckpointWriter w;
        for (int v : {dim, hidden, layers, heads, kv_heads, shared ? vocab : -vocab, seq}) w.i32(v);
        w.floats(uint64_t{vocab} * dim);
        w.floats(uint64_t{layers} * dim);
        for (uint64_t n : attention) w.floats(layers * n);
        w.floats(uint64_t{layers} * dim);
        for (uint64_t n : ffn) w.floats(layers * n);
        w.floats(dim);
        w.floats(uint64_t{seq} * (dim / heads));  // freq_cis real and imaginary halves
        if (!shared) w.floats(uint64_t{vocab} * dim);
        out.emplace_back(shared ? "legacy.bin" : "legacy-unshared.bin", w.take());
    }
    for (int version : {1, 2}) {  // "ak42": 256-byte header, norms first, then the matrices
        CheckpointWriter w;
        w.i32(0x616b3432);
        w.i32(version);
        for (int v : {dim, hidden, layers, heads, kv_heads, vocab, seq}) w.i32(v);
        w.u8(version == 1 ? 1 : 0);  // shared classifier: v1 yes, v2 no
        if (version == 2) w.i32(group);
        w.pad_to(256);
        w.floats(uint64_t{layers} * dim * 2 + dim);
        if (version == 1) {
            w.floats(uint64_t{vocab} * dim);
            for (uint64_t n : attention) w.floats(layers * n);
            for (uint64_t n : ffn) w.floats(layers * n);
        } else {
            w.q8(1, uint64_t{vocab} * dim, group);
            for (uint64_t n : attention) w.q8(layers, n, group);
            for (uint64_t n : ffn) w.q8(layers, n, group);
            w.q8(1, uint64_t{vocab} * dim, group);
        }
        out.emplace_back(version == 1 ? "v1.bin" : "v2-int8-unshared.bin", w.take());
    }
    return out;
}

}  // namespace tandem::fuzz
