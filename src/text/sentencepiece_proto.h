// The subset of sentencepiece's ModelProto (sentencepiece_model.proto) that tandem needs, with a hand-written
// protobuf wire-format serializer and parser.
//
// Why by hand: the Debian libsentencepiece-dev package ships no .proto or generated .pb.h headers. The parser
// reads real .model files (the --tokenizer override: tandem checks what libsentencepiece would otherwise trust);
// it keeps the fields below and skips every other field, as protobuf readers do. The serializer writes models for
// the tests (SentencePieceProcessor::LoadFromSerializedProto takes its bytes); GGUF vocabularies no longer go
// through libsentencepiece (see spm_tokenizer.h).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::spm {

// SentencePiece.Type. GGUF's tokenizer.ggml.token_type uses the same numbers.
enum class PieceType : int32_t {
    NORMAL = 1,
    UNKNOWN = 2,
    CONTROL = 3,
    USER_DEFINED = 4,
    UNUSED = 5,
    BYTE = 6,
};

// TrainerSpec.ModelType.
enum class ModelType : int32_t { UNIGRAM = 1, BPE = 2, WORD = 3, CHAR = 4 };

struct Piece {
    std::string piece;                   // field 1
    float score = 0;                     // field 2
    PieceType type = PieceType::NORMAL;  // field 3 (NORMAL is the proto default and is not written)
};

// Only the trainer fields that matter when *using* a model (encode/decode), not training options.
struct TrainerSpec {
    ModelType model_type = ModelType::BPE;  // field 3
    int32_t vocab_size = 0;                 // field 4
    bool byte_fallback = false;             // field 35: unknown characters become <0xNN> pieces
    int32_t unk_id = 0;                     // field 40
    int32_t bos_id = 1;                     // field 41
    int32_t eos_id = 2;                     // field 42
    int32_t pad_id = -1;                    // field 43 (-1: none)
    // Fields 45..48. The processor finds its bos/eos/unk/pad ids by looking these texts up in the vocabulary,
    // so they must be the texts of the pieces at the ids above.
    std::string unk_piece = "<unk>";
    std::string bos_piece = "<s>";
    std::string eos_piece = "</s>";
    std::string pad_piece = "<pad>";
    // Field 44: what decode prints for <unk>. Empty and unset means sentencepiece's default " \u2047 ".
    std::string unk_surface;
    bool has_unk_surface = false;
};

struct NormalizerSpec {
    std::string name = "identity";          // field 1: no Unicode normalization (no precompiled charsmap)
    bool add_dummy_prefix = true;           // field 3: encode "Hello" as "▁Hello"
    bool remove_extra_whitespaces = false;  // field 4: Llama keeps runs of spaces (the proto default is true)
    bool escape_whitespaces = true;         // field 5: spaces become ▁ (U+2581)
};

struct ModelProto {
    std::vector<Piece> pieces;       // field 1 (repeated)
    TrainerSpec trainer_spec;        // field 2
    NormalizerSpec normalizer_spec;  // field 3
    // Read only, never written: every precompiled_charsmap (NormalizerSpec field 2) of every normalizer_spec and
    // denormalizer_spec (field 5) occurrence in the file. libsentencepiece walks these tries without bounds checks,
    // so a reader of untrusted files checks each one first (tokenizer.cpp); protobuf merges repeated
    // sub-messages, so whichever the library ends up with is among them.
    std::vector<std::string> charsmaps;
};

// Serializes to protobuf wire format. Every field above is written explicitly (defaults included, except a
// NORMAL piece type and an unset unk_surface) so that the bytes do not depend on proto2 default values.
std::string serialize(const ModelProto& model);

// Parses protobuf wire format; fields not listed above are skipped. Fields absent from the bytes get the
// sentencepiece_model.proto defaults (which differ from the struct's defaults for remove_extra_whitespaces
// and name). Throws tandem::Error on malformed input.
ModelProto parse(std::string_view bytes);

}  // namespace tandem::spm
