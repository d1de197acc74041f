// SpmTokenizer: the sentencepiece-style ("llama") tokenization of a vocabulary stored in a GGUF file — Llama 2,
// Phi-3, Gemma 3 — as llama.cpp performs it (llm_tokenizer_spm in src/llama-vocab.cpp), and what each token
// renders as when decoding. Special-token splitting, BOS and the public API live in Tokenizer (tokenizer.h), which
// owns one of these. (A sentencepiece .model file given with --tokenizer is run by libsentencepiece instead.)
//
// Encoding one stretch of plain text:
//  - a space is put in front when the vocabulary says so (tokenizer.ggml.add_space_prefix, default true; Gemma's
//    is false), then every ' ' becomes "▁" (U+2581); no other normalization;
//  - the text is cut into UTF-8 characters (a lead byte claims its sequence's length, as llama.cpp's
//    unicode_len_utf8 does, even when the bytes after it do not continue it);
//  - adjacent symbols whose concatenation is a token merge, the highest-scoring merge first (leftmost among equal
//    scores), until no pair forms a token;
//  - a symbol that is not a token (a character the vocabulary lacks) becomes its bytes' <0xNN> pieces.
// One deliberate difference: control and unknown tokens are never the result of a merge (llama.cpp would merge
// into any token text), so plain text can never turn into a control token; in the vocabularies tested no control
// or unknown token is the concatenation of two other tokens, so the ids are the same.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tandem {

class SpmTokenizer {
public:
    // `texts`, `types` (GGUF token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte) and
    // `scores` are the vocabulary, already checked by Tokenizer (same lengths, types in range, byte pieces spelled
    // <0xNN>, no empty text, no NaN score). `texts` must outlive this object unchanged: the lookup table points
    // into it. `unk` (or -1) is used for a byte that has neither a <0xNN> piece nor a one-byte token. Throws
    // tandem::Error naming `path` when two tokens have the same text.
    SpmTokenizer(const std::string& path, const std::vector<std::string>& texts, const std::vector<int>& types,
                 std::vector<float> scores, int unk, bool add_space_prefix);
    SpmTokenizer(const SpmTokenizer&) = delete;
    SpmTokenizer& operator=(const SpmTokenizer&) = delete;

    // Appends the ids of one stretch of plain text (no special-token handling; Tokenizer splits those off first
    // and calls this for each stretch between them, so each gets the space prefix, as in llama.cpp). Throws
    // tandem::Error when a byte has no token at all (a vocabulary without byte pieces and without <unk>).
    void encode(std::string_view text, std::vector<int>& out) const;

    // What token `id` renders as (unchecked id), as llama.cpp's token_to_piece without special tokens: normal
    // tokens with "▁" turned back into spaces, user-defined tokens as stored, byte pieces as their byte, control,
    // unknown and unused tokens as nothing.
    const std::string& rendered(int id) const { return rendered_[static_cast<size_t>(id)]; }
    // Id of the token whose stored text is exactly `text` (any type), or -1.
    int token_id(std::string_view text) const;
    bool add_space_prefix() const { return add_space_prefix_; }

private:
    std::unordered_map<std::string_view, int> id_of_;  // views into the caller's texts
    std::vector<float> scores_;
    std::vector<uint8_t> mergeable_;  // per id: may be the result of a merge (not control/unknown)
    std::vector<std::string> rendered_;
    int byte_ids_[256];  // the token for each byte when a character falls back to bytes; -1: none
    bool add_space_prefix_;
};

}  // namespace tandem
