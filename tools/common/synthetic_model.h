// Synthetic llama (and qwen2) models: GGUF files of any shape and weight type with random weights and a made-up
// sentencepiece vocabulary, so speed can be measured on model sizes that no real file here has (e.g. a 1B or 7B
// llama in q4_0) and the loader can be tested on every type. The text they generate is meaningless.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gguf/ggml_types.h"

namespace tandem {

class GgufWriter;

// Writes a sentencepiece-style vocabulary of n_vocab pieces (<unk>, <s>, </s>, the 256 byte pieces, then made-up
// normal pieces) into the file's tokenizer keys: a vocabulary llama.cpp and tandem both load.
void add_synthetic_vocabulary(GgufWriter& w, int n_vocab);

struct SyntheticShape {
    std::string name;
    int dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, n_vocab = 0, context_length = 0;
    bool tied_output = false;
    // "llama", or "qwen2": Q/K/V biases, NEOX RoPE (the loader's rule for the architecture), Qwen2.5's RoPE base
    // (1e6) and RMSNorm epsilon (1e-6).
    std::string arch = "llama";
    uint64_t n_params() const;
};

// Named presets: "tiny" (a few MB, for tests), "1b" (TinyLlama-1.1B's shape), "7b" (Llama-2-7B's shape),
// "qwen1.5b" / "qwen0.5b" (Qwen2.5-Coder-1.5B / 0.5B's shapes and architecture, the default speculative pair: a
// lent GPU times the pair's steps on them, as the real files are too large to travel there).
std::optional<SyntheticShape> synthetic_preset(const std::string& name);

// A rule that makes a synthetic model's greedy next token a function of the last token alone, so that two models
// of different shapes can agree on it to a chosen degree: a synthetic speculative pair with a known acceptance
// rate, whose steps cost what its shapes cost (every layer still reads all its weights and the KV cache). The
// ids 3..cycle_ids-1 form one cycle, the same for every model of that vocabulary size (the other ids lead into it;
// nothing leads to ids 0-2, so generation never meets end-of-sequence; the cycle stays below the ids a draft's
// restricted logits cover, SpeculativeParams::draft_vocab, as a real vocabulary's frequent tokens do); a model with
// agreement a follows the cycle from a fraction a of the tokens (picked by `seed`) and skips one cycle step from
// the others. A draft made with agreement a beside a target made with 1 proposes each token the target would pick
// with probability a, independently of the position (tokens are visited along the cycle).
//
// A draft can instead replay a recorded pattern (`pattern`; tandem-bench --record-agreement records a real pair's
// greedy agreement along the target's output): the j-th id of the cycle, in the cycle's order, takes step
// j mod size: the draft follows the cycle from it where the step agrees and skips a step where not, and its pick's
// softmax probability is near the step's confidence (the rest going to three runner-ups, later ids of the cycle,
// and to the vocabulary's other rows). A target's greedy run from any token then meets a stretch of the recording:
// the disagreements in their runs, the draft unsure where it was (which --draft-p-min reads).
struct AgreementStep {
    bool agrees = true;
    float confidence = 1.0f;  // the draft's top probability there (1: as sure as the plain rule's draft)
};
struct SyntheticNextToken {
    SyntheticNextToken() = default;
    SyntheticNextToken(double agreement_, uint64_t seed_ = 1, int cycle_ids_ = 32768)
        : agreement(agreement_), seed(seed_), cycle_ids(cycle_ids_) {}
    double agreement = 1.0;
    uint64_t seed = 1;
    int cycle_ids = 32768;               // the cycle's ids are 3..min(cycle_ids, n_vocab)-1
    std::vector<AgreementStep> pattern;  // non-empty: replayed instead of `agreement`
};
// A pattern file: '#' lines are comments, then steps "A:P" (A 1 where the draft agreed, 0 where not; P its top
// probability) separated by white space, the lines one after another. read_ throws Error naming the file and what
// is wrong with it.
std::vector<AgreementStep> read_agreement_pattern(const std::string& path);
std::string format_agreement_steps(const std::vector<AgreementStep>& steps);  // one line of "A:P" steps
// The confidence a pattern step's draft is written for: its confidence within what the mixture can give (0.3 ..
// 0.99), what the model's top probability is then near.
float replayed_confidence(const AgreementStep& step);
// The successor of each token id under the rule (what the model's greedy decoding picks after it).
std::vector<int> synthetic_successors(int n_vocab, const SyntheticNextToken& rule);

// The weight types of a synthetic model's matrices: one type for all (rows whose length is not a multiple of its
// block size fall back to f16), or one of llama.cpp's _K_M mixtures: Q4_K_M, the default models' (q4_k_m: Q4_K
// with attn_v and ffn_down in Q6_K in some layers and the output in Q6_K; rows that are not whole super-blocks of
// 256 in Q5_0 and Q8_0 instead), or Q5_K_M (q5_k_m: the same with Q5_K, whose fallback is Q5_1), so that the kernels
// a GPU times are the real files' kernels.
struct SyntheticTypes {
    GgmlType type = GgmlType::F32;           // every matrix's, or the mixture's base (Q4_K, Q5_K)
    bool k_m = false;                        // the _K_M mixture of that base
    SyntheticTypes(GgmlType t) : type(t) {}  // NOLINT(google-explicit-constructor): one type, the usual case
    static SyntheticTypes Q4_K_M();
    static SyntheticTypes Q5_K_M();
    std::string name() const;  // "q4_0", ..., "q4_k_m", "q5_k_m"
};
// "q4_k_m", "q5_k_m", or a type name (ggml_type_from_name); nullopt when none.
std::optional<SyntheticTypes> synthetic_types_from_name(const std::string& name);
// The type of matrix `tensor` ("token_embd", "output", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
// "ffn_up", "ffn_down") of layer `layer` (ignored for the first two), whose rows are `cols` long.
GgmlType synthetic_matrix_type(const SyntheticShape& shape, const SyntheticTypes& types, const std::string& tensor,
                               int layer, int64_t cols);

// Writes a model of `shape` whose 2-D matrices are of `types` (norms f32, weights around 1): random values
// quantized for the types tandem can write, random codes with scales fitted to the same RMS for the others (the
// k-quants). Deterministic for a given seed.
// With `next`: the layers' output projections (attn_output, ffn_down) are zero, so the residual stream leaving
// the last layer is the token's embedding, and the embedding (f16, which costs a step nothing: it is gathered, not
// multiplied) of token t is output row succ(t) centred per 32 columns: its logit is that row's squared norm over
// its RMS, some sqrt(dim) standard deviations above any other row's (not tied_output).
void write_synthetic_model(const std::string& path, const SyntheticShape& shape, const SyntheticTypes& types,
                           uint64_t seed = 1, const std::optional<SyntheticNextToken>& next = std::nullopt);

}  // namespace tandem
