// Tokenizer: text <-> token ids for sentencepiece ("llama") vocabularies, built from the vocabulary stored in a
// GGUF file or loaded from a sentencepiece .model file; and TokenStreamDecoder, which turns a stream of generated
// ids into text piece by piece without ever splitting a UTF-8 character.
//
// Encoding and whole-sequence decoding are done by libsentencepiece itself (a BPE ModelProto assembled from the
// GGUF arrays, see sentencepiece_proto.h), so tandem tokenizes exactly as sentencepiece and llama.cpp do.
// Byte-level BPE ("gpt2") vocabularies are not supported yet and are rejected with a clear error.
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

class Tokenizer {
public:
    // tokenizer.ggml.model must be "llama"; reads tokens, scores, token_type, the bos/eos/unk/padding ids and
    // the add_bos_token / add_eos_token / add_space_prefix / remove_extra_whitespaces flags. Throws
    // tandem::Error naming the file on any inconsistency.
    static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& gguf);
    // A sentencepiece .model file (the --tokenizer override). Throws tandem::Error when unreadable or invalid.
    static std::unique_ptr<Tokenizer> from_model_file(const std::string& path);
    ~Tokenizer();
    Tokenizer(const Tokenizer&) = delete;
    Tokenizer& operator=(const Tokenizer&) = delete;

    // Token ids of `text`, with BOS in front when `add_bos` (and the vocabulary has one). Never appends EOS.
    std::vector<int> encode(std::string_view text, bool add_bos) const;
    // Whole-sequence decode, as sentencepiece does it: control tokens are invisible, byte pieces are joined
    // into UTF-8 (invalid bytes become U+FFFD), and the leading space of the first piece is dropped.
    // Throws tandem::Error for an id outside [0, n_vocab).
    std::string decode(const std::vector<int>& ids) const;

    // The raw piece text, e.g. "▁the", "<0x0A>", "<s>".
    std::string piece(int id) const;
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
    std::string model_type() const { return model_type_; }           // "llama"

private:
    friend class TokenStreamDecoder;
    Tokenizer();
    // Loads serialized ModelProto bytes into sentencepiece; `source` names the file for error messages.
    void load(const std::string& serialized, const std::string& source);
    // Decodes without range checks (ids come from a caller that already checked them).
    std::string decode_unchecked(const std::vector<int>& ids) const;

    std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
    std::vector<std::string> texts_;
    std::vector<int> types_;
    std::vector<int16_t> byte_values_;  // per id: 0..255 for byte pieces, -1 otherwise
    std::string model_type_ = "llama";
    int bos_ = -1, eos_ = -1, unk_ = -1;
    bool add_bos_ = true, add_eos_ = false;
    // A normal piece that decodes to non-empty text on its own. TokenStreamDecoder puts it in front of a
    // continuation so that sentencepiece treats the first generated piece as mid-text (keeps its space).
    int context_id_ = -1;
};

// Incremental detokenizer for generated tokens. push() returns the text that became final with this token;
// flush() returns what is left at the end. For every id sequence, the concatenation of all push() results and
// flush() is exactly what Tokenizer::decode would give (with `at_start`), and no result ever ends in the middle
// of a UTF-8 character that later byte pieces could complete.
//
// How: sentencepiece decodes a small window of recent ids. The window starts with ids whose text was already
// returned (the "prefix"); the new text is decode(window) minus decode(prefix). Because the prefix renders
// non-empty text, sentencepiece does not drop the leading space of the pieces after it, and because it ends on
// a complete character, later byte pieces cannot change how it renders. A trailing byte sequence that could
// still become a valid character is held back until it completes or can no longer complete.
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

    const Tokenizer& tok_;
    bool at_start_;
    std::vector<int> window_;  // ids decoded together; the first prefix_len_ of them are already returned
    size_t prefix_len_ = 0;
    std::string prefix_text_;  // decode(window_[0, prefix_len_)), as sentencepiece renders it
};

}  // namespace tandem
