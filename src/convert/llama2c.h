// llama2.c checkpoints: a validating reader for the three .bin layouts of karpathy/llama2.c (legacy fp32, "ak42"
// version 1 fp32, version 2 int8 groups), the sentencepiece vocabulary loader for the --tokenizer file, and the
// mapping of both onto a llama-architecture GGUF (llama.cpp's tensor names and metadata keys).
//
// Every matrix is held as fp32, row-major [out][in] exactly as llama2.c stores it; version 2 int8 weights are
// dequantized on reading (value = q * scale of its group). A [out][in] row-major matrix is byte for byte a GGUF
// tensor with ne = [in, out], so the mapping copies rows without any transposition, and without permuting the
// Q/K rows either: llama2.c's RoPE rotates adjacent pairs (0,1), (2,3), ..., which is the llama-architecture
// GGUF convention (llama.cpp's own converter writes stories260K's attn_q bit-identical to the .bin's wq).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gguf/ggml_types.h"
#include "gguf/gguf_writer.h"

namespace tandem {

struct Llama2cConfig {
    int version = 0;     // 0 = legacy (7-int header), 1 = "ak42" fp32, 2 = "ak42" int8
    int dim = 0;         // embedding width
    int hidden_dim = 0;  // FFN width
    int n_layers = 0;
    int n_heads = 0;
    int n_kv_heads = 0;
    int vocab_size = 0;             // always positive here (the legacy sign is decoded into shared_classifier)
    int seq_len = 0;                // the context the model was trained for
    bool shared_classifier = true;  // the output projection is the token embedding
    int group_size = 0;             // version 2: weights per int8 scale group; 0 otherwise

    int head_size() const { return dim / n_heads; }
    int kv_dim() const { return n_kv_heads * head_size(); }
};

struct Llama2cCheckpoint {
    Llama2cConfig config;
    // fp32 weights, row-major, llama2.c's shapes (layers outermost):
    std::vector<float> token_embedding;  // [vocab][dim]
    std::vector<float> rms_att;          // [layers][dim]
    std::vector<float> wq;               // [layers][dim][dim]          (out = n_heads * head_size)
    std::vector<float> wk;               // [layers][kv_dim][dim]
    std::vector<float> wv;               // [layers][kv_dim][dim]
    std::vector<float> wo;               // [layers][dim][dim]
    std::vector<float> rms_ffn;          // [layers][dim]
    std::vector<float> w1;               // [layers][hidden][dim]   gate
    std::vector<float> w2;               // [layers][dim][hidden]   down
    std::vector<float> w3;               // [layers][hidden][dim]   up
    std::vector<float> rms_final;        // [dim]
    std::vector<float> wcls;             // [vocab][dim]; empty when shared_classifier
};

// Parses a checkpoint held in memory. The layout is recognised by the "ak42" magic (else legacy), the header is
// checked (positive, bounded, consistent dimensions) and the byte count must be exactly what the dimensions
// imply, so a truncated, padded or foreign file is a tandem::Error naming `name`, never a crash or a silent
// misread. Weights must be finite.
Llama2cCheckpoint parse_llama2c(std::span<const uint8_t> bytes, const std::string& name);
// Reads `path` and parses it.
Llama2cCheckpoint read_llama2c(const std::string& path);

// A sentencepiece vocabulary as GGUF stores it (tokenizer.ggml.*).
struct SpmVocab {
    std::vector<std::string> tokens;
    std::vector<float> scores;
    std::vector<int32_t>
        types;  // sentencepiece piece types: NORMAL=1 UNKNOWN=2 CONTROL=3 USER_DEFINED=4 UNUSED=5 BYTE=6
    int bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;  // -1: none
};
// Loads a sentencepiece .model file; tandem::Error when it cannot be loaded.
SpmVocab load_spm_vocab(const std::string& path);

// What a conversion did with each matrix: the type asked for, or F16 where the row length is not a multiple of
// the requested type's block size.
struct ConvertNote {
    std::string tensor;
    GgmlType type;
    bool fell_back;  // true when `type` is the fallback, not the requested type
};

// Builds the GGUF: llama metadata, the vocabulary, norms as F32 and every matrix as `type` (F32, F16, Q8_0 or
// Q4_0) or its fallback.
// Version 2 (int8) input is dequantized and then requantized. To Q8_0 with group_size 32 this keeps every int8
// value exactly (each group's largest |value| is 127 * scale, so ggml's quantizer finds the same scale and
// round(q * scale / scale) = q) but stores the scale as fp16, a relative change of at most 2^-11: close, not
// bit-exact. Other group sizes regroup the values, which adds a second rounding. `name` goes to general.name. Throws tandem::Error when the vocabulary does not match the
// checkpoint's vocab_size or the type cannot be produced.
GgufWriter llama2c_to_gguf(const Llama2cCheckpoint& ckpt, const SpmVocab& vocab, GgmlType type, const std::string& name,
                           std::vector<ConvertNote>* notes = nullptr);

}  // namespace tandem
