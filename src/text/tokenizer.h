// Tokenizer: text <-> token ids for sentencepiece ("llama") and byte-level BPE ("gpt2") vocabularies, built from
// the vocabulary stored in a GGUF file or loaded from a sentencepiece .model file; special-token parsing; and
// TokenStreamDecoder, which turns a stream of generated ids into text piece by piece without ever splitting a
// UTF-8 character.
//
// Vocabularies stored in a GGUF file are tokenized as llama.cpp tokenizes them: sentencepiece-style ones ("llama":
// Llama 2, Phi-3, Gemma 3) by SpmTokenizer (spm_tokenizer.h), byte-level BPE ones ("gpt2": Qwen, SmolLM2,
// Llama 3) by BpeTokenizer (bpe_tokenizer.h). Only the tokenizer metadata is read, so a vocabulary loads whatever
// the file's architecture. A sentencepiece .model file (--tokenizer) is run by libsentencepiece itself.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace tandem {

class GgufFile;
class BpeTokenizer;
class SpmTokenizer;

class Tokenizer {
public:
    // Dispatches on tokenizer.ggml.model. "llama": reads tokens, scores, token_type, the bos/eos/unk ids and the
    // add_bos_token (default true) / add_eos_token / add_space_prefix (default true) flags; the unknown token is
    // optional. "gpt2": tokens, token_type (optional), merges, tokenizer.ggml.pre (the pre-tokenizer), bos/eos
    // ids, add_bos_token (default false, except for Llama 3's pre-tokenizer, as in llama.cpp). Both: the
    // per-model token attributes llama.cpp derives from general.name (Phi-3's special tokens strip the whitespace
    // after them). Throws tandem::Error naming the file on any inconsistency (arrays of different lengths,
    // unknown token types, malformed byte pieces, duplicate sentencepiece pieces, NaN scores), an unknown model or
    // an unknown pre-tokenizer. Never looks at the architecture.
    static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& gguf);
    // A sentencepiece .model file (the --tokenizer override). Throws tandem::Error when unreadable or invalid.
    static std::unique_ptr<Tokenizer> from_model_file(const std::string& path);
    ~Tokenizer();
    Tokenizer(const Tokenizer&) = delete;
    Tokenizer& operator=(const Tokenizer&) = delete;

    // Token ids of `text`, with BOS in front when `add_bos` (and the vocabulary has one). Never appends EOS.
    // With `parse_special`, the texts of the vocabulary's control (and unknown and user-defined) tokens, such as
    // "<|im_start|>" or "<s>", are found in `text` first (longest match at each position) and become their ids;
    // the text between them is tokenized normally. Without it they are ordinary text, so a user typing
    // "<|im_end|>" gets those characters. As in llama.cpp, GGUF vocabularies split off user-defined tokens (e.g.
    // Qwen's "<tool_call>", Gemma's "\n\n" or runs of spaces) either way; a .model file's sentencepiece matches
    // its user-defined pieces itself.
    std::vector<int> encode(std::string_view text, bool add_bos, bool parse_special = false) const;
    // Whole-sequence decode: the bytes of every token joined, with bytes that do not form UTF-8 as U+FFFD. GGUF
    // vocabularies render each token as llama.cpp does without special tokens: control, unknown and unused
    // tokens as nothing, user-defined ones as their text, byte pieces as their byte; byte-level BPE through the
    // inverse GPT-2 byte mapping, sentencepiece with "▁" as a space. A sentencepiece vocabulary that adds a space
    // prefix when encoding drops it again: the first token that renders text loses one leading space if it is a
    // normal token (so [<s>, "▁Hello"] is "Hello"). A .model file: as libsentencepiece decodes (similar, but
    // <unk> prints " ⁇ "). Throws tandem::Error for an id outside [0, n_vocab).
    std::string decode(const std::vector<int>& ids) const;

    // What token `id` decodes to as bytes, alone and not at the start of a text (decode()'s leading-space rule does
    // not apply): a byte piece's byte, byte-level BPE mapped back to raw bytes, sentencepiece's "▁" as a space;
    // empty for control, unknown and unused tokens. What a grammar constraint matches tokens by. GGUF vocabularies
    // only: with a .model file (--tokenizer) it throws tandem::Error.
    std::string token_bytes(int id) const;
    // token_bytes of every id below `n_vocab` (a model's output rows may outnumber the vocabulary: those are empty).
    std::vector<std::string> token_bytes_table(int n_vocab) const;
    // The raw piece text, e.g. "▁the", "<0x0A>", "<s>" (sentencepiece) or "Ġthe", "<|im_end|>" (BPE).
    std::string piece(int id) const;
    // The id of the token whose raw piece text is exactly `text` (e.g. "<|im_end|>"), or -1 when there is none.
    int token_id(std::string_view text) const;
    int n_vocab() const { return static_cast<int>(texts_.size()); }
    int bos() const { return bos_; }  // -1 when the vocabulary has none
    int eos() const { return eos_; }
    int unk() const { return unk_; }
    bool add_bos() const { return add_bos_; }  // whether prompts should start with BOS
    bool add_eos() const { return add_eos_; }
    bool is_control(int id) const;
    bool is_byte(int id) const;
    // For a byte piece "<0xNN>" the byte NN, otherwise -1.
    int byte_value(int id) const;

    // The vocabulary as stored, for comparing a draft model's vocabulary with the target's.
    const std::vector<std::string>& token_texts() const { return texts_; }
    const std::vector<int>& token_types() const { return types_; }  // sentencepiece / GGUF token type numbers
    std::string model_type() const { return model_type_; }          // "llama" or "gpt2"
    bool is_bpe() const { return bpe_ != nullptr; }
    // The BPE pre-tokenizer (tokenizer.ggml.pre, e.g. "qwen2"); empty for sentencepiece.
    std::string pre_tokenizer() const;

private:
    friend class TokenStreamDecoder;
    Tokenizer();
    // Loads serialized ModelProto bytes into sentencepiece; `source` names the file for error messages.
    void load(const std::string& serialized, const std::string& source);
    // GGUF vocabularies: appends what token `id` renders as to `out`. `at_text_start` is true until a token has
    // rendered text (then false); it drives the leading-space rule of decode().
    void append_rendered(int id, bool& at_text_start, std::string& out) const;
    // Decodes without range checks (ids come from a caller that already checked them).
    std::string decode_unchecked(const std::vector<int>& ids) const;
    // Byte-level BPE: "gpt2" vocabularies.
    static std::unique_ptr<Tokenizer> from_gguf_bpe(const GgufFile& gguf);
    // Indexes the tokens that encode() can match literally (see encode); `always_user_defined` marks the
    // user-defined ones as matched even without parse_special (GGUF vocabularies, as llama.cpp does).
    void index_specials(bool always_user_defined);
    // The token attributes llama.cpp sets by general.name (see from_gguf).
    void apply_name_rules(const GgufFile& gguf);
    // Plain text (no special tokens) to ids, appended.
    void encode_plain(std::string_view text, std::vector<int>& out) const;

    // Exactly one of these is set: sp_ for a .model file, spm_ for a GGUF sentencepiece vocabulary, bpe_ for a
    // GGUF byte-level BPE one.
    std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
    std::unique_ptr<SpmTokenizer> spm_;
    std::unique_ptr<BpeTokenizer> bpe_;
    // The special tokens as a byte trie, so that encode() finds the longest one starting at a position in time
    // proportional to its length, however many there are (Gemma 3 has 6,400, 6,300 of them starting with '<').
    struct SpecialNode {
        std::vector<std::pair<unsigned char, int>> children;  // (next byte, node index), sorted by byte
        int id = -1;          // the token whose text ends here (the lowest id if several), or -1
        bool always = false;  // matched even without parse_special
        bool rstrip = false;  // the whitespace that follows it is dropped (llama.cpp's LLAMA_TOKEN_ATTR_RSTRIP)
    };
    std::vector<SpecialNode> special_trie_;  // [0] is the root (the empty text)
    std::vector<std::string> texts_;
    std::vector<int> types_;
    std::vector<int16_t> byte_values_;  // per id: 0..255 for byte pieces, -1 otherwise
    std::string model_type_ = "llama";
    int bos_ = -1, eos_ = -1, unk_ = -1;
    bool add_bos_ = true, add_eos_ = false;
    // .model files: a normal piece that decodes to non-empty text on its own. TokenStreamDecoder puts it in front
    // of a continuation so that sentencepiece treats the first generated piece as mid-text (keeps its space).
    int context_id_ = -1;
};

// Incremental detokenizer for generated tokens. push() returns the text that became final with this token;
// flush() returns what is left at the end. For every id sequence, the concatenation of all push() results and
// flush() is exactly what Tokenizer::decode would give (with `at_start`), and no result ever ends in the middle
// of a UTF-8 character that later byte pieces could complete.
//
// How, for GGUF vocabularies: each token's rendering is appended to a byte buffer, and the complete characters
// at its front are returned; a trailing byte sequence that could still become a valid character is held back
// until it completes or can no longer complete. For a .model file, libsentencepiece decodes a small window of
// recent ids. The window starts with ids whose text was already returned (the "prefix"); the new text is
// decode(window) minus decode(prefix). Because the prefix renders non-empty text, sentencepiece does not drop
// the leading space of the pieces after it, and because it ends on a complete character, later byte pieces
// cannot change how it renders; incomplete trailing byte sequences are held back in the same way.
class TokenStreamDecoder {
public:
    // `at_start`: true when the first pushed token begins the text (its leading space is dropped, as decode()
    // does); false when the tokens continue an earlier text such as the prompt, so that "▁there" yields " there".
    explicit TokenStreamDecoder(const Tokenizer& tokenizer, bool at_start = true);

    std::string push(int id);
    // Returns the held-back remainder (an incomplete byte sequence renders as decode() renders it, U+FFFD per
    // byte) and starts a new stream, as if freshly constructed.
    std::string flush();

private:
    void reset();
    bool ends_in_incomplete_utf8() const;
    // GGUF vocabularies: returns the complete characters (and U+FFFD for bytes that cannot become one) at the
    // front of pending_, keeping a trailing sequence that later bytes may still complete unless `final`.
    std::string take_bytes(bool final);

    const Tokenizer& tok_;
    bool at_start_;
    std::vector<int> window_;  // ids decoded together; the first prefix_len_ of them are already returned
    size_t prefix_len_ = 0;
    std::string prefix_text_;  // decode(window_[0, prefix_len_)), as sentencepiece renders it
    std::string pending_;      // GGUF vocabularies: rendered bytes not returned yet (an incomplete character)
    bool text_start_ = true;   // GGUF vocabularies: no token has rendered text yet (see append_rendered)
};

}  // namespace tandem
