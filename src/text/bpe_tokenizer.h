// BpeTokenizer: byte-level BPE ("gpt2" GGUF vocabularies: Qwen2, Qwen3.5, SmolLM2, Llama 3, GPT-2) — the pre-tokenizer
// regexes (PCRE2, JIT), the GPT-2 byte<->unicode mapping, rank-ordered merges and the per-token rendering used by
// decode. Special-token splitting and the public API live in Tokenizer (tokenizer.h), which owns one of these.
//
// Behaviour follows llama.cpp (src/llama-vocab.cpp, src/unicode.cpp at the commit our references come from):
//  - text is cut into words by a sequence of regexes chosen by tokenizer.ggml.pre; each regex is applied inside
//    each piece the previous one produced, and the text between matches is kept as pieces of its own;
//  - each word's bytes are mapped to the GPT-2 "byte characters" and merged pairwise, lowest merge rank first
//    (leftmost first among equal ranks), exactly as llm_tokenizer_bpe_session does;
//  - invalid UTF-8 in the input becomes U+FFFD before pre-tokenization, as llama.cpp's unicode_cpts_from_utf8 does.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/utf8.h"  // utf8::sequence_length, which sanitize and Tokenizer use

namespace tandem {

class GgufFile;

namespace utf8 {
// `text` with every byte that does not belong to a well-formed sequence replaced by U+FFFD.
std::string sanitize(std::string_view text);
}  // namespace utf8

class BpeTokenizer {
public:
    // Reads tokenizer.ggml.pre (absent: "default", as llama.cpp does), tokenizer.ggml.merges and builds the
    // lookup tables over `texts`/`types` (already read and checked by Tokenizer). Throws tandem::Error naming the
    // file for an unknown pre-tokenizer (listing the supported ones) or malformed merges.
    static std::unique_ptr<BpeTokenizer> from_gguf(const GgufFile& gguf, const std::vector<std::string>& texts,
                                                   const std::vector<int>& types);
    ~BpeTokenizer();
    BpeTokenizer(const BpeTokenizer&) = delete;
    BpeTokenizer& operator=(const BpeTokenizer&) = delete;

    // Appends the ids of plain text (no special-token handling; Tokenizer splits those off first).
    void encode(std::string_view text, std::vector<int>& out) const;
    // The bytes token `id` renders as (unchecked id): normal tokens through the inverse byte mapping,
    // user-defined tokens as stored, control/unknown/unused tokens as nothing (llama_token_to_piece, special=false).
    const std::string& rendered(int id) const { return rendered_[id]; }
    // Id of the token whose stored text is `text`, or -1.
    int token_id(std::string_view text) const;

    const std::string& pre() const { return pre_; }
    // Whether this pre-tokenizer type makes llama.cpp add BOS when the GGUF does not say (Llama 3 does).
    bool default_add_bos() const { return default_add_bos_; }
    // The accepted tokenizer.ggml.pre values, comma-separated, for error messages.
    static std::string supported_pre();

private:
    struct Regex;
    BpeTokenizer();
    // Appends the ids of one pre-tokenized word (raw bytes).
    void encode_word(std::string_view word, std::vector<int>& out) const;
    void merge_word(std::string_view word, std::vector<int>& out) const;

    std::string pre_;
    std::vector<std::unique_ptr<Regex>> regexes_;
    bool ignore_merges_ = false;  // Llama 3: a word that is itself a token is taken whole
    bool default_add_bos_ = false;

    std::vector<std::string> rendered_;
    std::unordered_map<std::string, int> text_to_id_;  // stored (byte-encoded) text -> id; first id wins
    int byte_to_id_[256];                              // id of each byte's one-character token, -1 if absent
    std::string byte_to_char_[256];                    // GPT-2 bytes_to_unicode, as UTF-8
    struct Merge {
        int rank;
        int id;  // the merged token
    };
    std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> rank and result

    // Recently seen words -> ids. Natural text repeats words constantly, so this skips most merge work; guarded
    // by a mutex because encode is const and may be called from several threads.
    mutable std::mutex cache_mutex_;
    mutable std::unordered_map<std::string, std::vector<int>> cache_;
};

}  // namespace tandem
