// Protobuf wire format for the sentencepiece ModelProto subset in sentencepiece_proto.h: serializer and parser.
//
// Wire format recap: every field is a varint key (field_number << 3 | wire_type) followed by its value:
// wire type 0 = varint (ints, bools, enums; negative int32 are sign-extended to 10 bytes), 2 = length-delimited
// (strings, nested messages), 5 = fixed32 little-endian (floats), 1 = fixed64. Field numbers are those of
// sentencepiece_model.proto.
#include "text/sentencepiece_proto.h"

#include <cstring>

#include "error.h"

namespace tandem::spm {
namespace {

enum WireType : uint32_t { VARINT = 0, FIXED64 = 1, LENGTH_DELIMITED = 2, FIXED32 = 5 };

// ModelProto
constexpr uint32_t kModelPieces = 1, kModelTrainerSpec = 2, kModelNormalizerSpec = 3, kModelDenormalizerSpec = 5;
// ModelProto.SentencePiece
constexpr uint32_t kPieceText = 1, kPieceScore = 2, kPieceType = 3;
// TrainerSpec
constexpr uint32_t kTrainerModelType = 3, kTrainerVocabSize = 4, kTrainerByteFallback = 35, kTrainerUnkId = 40,
                   kTrainerBosId = 41, kTrainerEosId = 42, kTrainerPadId = 43, kTrainerUnkSurface = 44,
                   kTrainerUnkPiece = 45, kTrainerBosPiece = 46, kTrainerEosPiece = 47, kTrainerPadPiece = 48;
// NormalizerSpec
constexpr uint32_t kNormName = 1, kNormPrecompiledCharsmap = 2, kNormAddDummyPrefix = 3,
                   kNormRemoveExtraWhitespaces = 4, kNormEscapeWhitespaces = 5;

// ---- writing ------------------------------------------------------------------------------------------------

class Writer {
public:
    void varint(uint64_t v) {
        while (v >= 0x80) {
            out_.push_back(static_cast<char>((v & 0x7f) | 0x80));
            v >>= 7;
        }
        out_.push_back(static_cast<char>(v));
    }
    void key(uint32_t field, WireType type) { varint(uint64_t{field} << 3 | type); }

    // int32 fields are encoded as the 64-bit two's complement, so -1 takes 10 bytes (protobuf's rule).
    void int32_field(uint32_t field, int32_t v) {
        key(field, VARINT);
        varint(static_cast<uint64_t>(static_cast<int64_t>(v)));
    }
    void bool_field(uint32_t field, bool v) {
        key(field, VARINT);
        varint(v ? 1 : 0);
    }
    void float_field(uint32_t field, float v) {
        key(field, FIXED32);
        uint32_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
    }
    void bytes_field(uint32_t field, std::string_view v) {
        key(field, LENGTH_DELIMITED);
        varint(v.size());
        out_.append(v);
    }

    std::string& str() { return out_; }

private:
    std::string out_;
};

std::string serialize_piece(const Piece& p) {
    Writer w;
    w.bytes_field(kPieceText, p.piece);
    w.float_field(kPieceScore, p.score);
    if (p.type != PieceType::NORMAL) w.int32_field(kPieceType, static_cast<int32_t>(p.type));
    return std::move(w.str());
}

std::string serialize_trainer(const TrainerSpec& t) {
    Writer w;
    w.int32_field(kTrainerModelType, static_cast<int32_t>(t.model_type));
    w.int32_field(kTrainerVocabSize, t.vocab_size);
    w.bool_field(kTrainerByteFallback, t.byte_fallback);
    w.int32_field(kTrainerUnkId, t.unk_id);
    w.int32_field(kTrainerBosId, t.bos_id);
    w.int32_field(kTrainerEosId, t.eos_id);
    w.int32_field(kTrainerPadId, t.pad_id);
    if (t.has_unk_surface) w.bytes_field(kTrainerUnkSurface, t.unk_surface);
    w.bytes_field(kTrainerUnkPiece, t.unk_piece);
    w.bytes_field(kTrainerBosPiece, t.bos_piece);
    w.bytes_field(kTrainerEosPiece, t.eos_piece);
    w.bytes_field(kTrainerPadPiece, t.pad_piece);
    return std::move(w.str());
}

std::string serialize_normalizer(const NormalizerSpec& n) {
    Writer w;
    w.bytes_field(kNormName, n.name);
    w.bool_field(kNormAddDummyPrefix, n.add_dummy_prefix);
    w.bool_field(kNormRemoveExtraWhitespaces, n.remove_extra_whitespaces);
    w.bool_field(kNormEscapeWhitespaces, n.escape_whitespaces);
    return std::move(w.str());
}

// ---- reading ------------------------------------------------------------------------------------------------

[[noreturn]] void malformed(const std::string& what) {
    throw Error("sentencepiece model: malformed protobuf (" + what + ")");
}

// One field as read from the wire: its number, wire type, and value (integer for VARINT/FIXED*, bytes for
// LENGTH_DELIMITED).
struct Field {
    uint32_t number = 0;
    WireType type = VARINT;
    uint64_t u = 0;
    std::string_view bytes;

    int32_t as_int32() const { return static_cast<int32_t>(static_cast<uint32_t>(u)); }
    float as_float() const {
        if (type != FIXED32) malformed("float field " + std::to_string(number) + " is not fixed32");
        const uint32_t bits = static_cast<uint32_t>(u);
        float f;
        std::memcpy(&f, &bits, sizeof f);
        return f;
    }
    std::string as_string() const {
        if (type != LENGTH_DELIMITED) malformed("field " + std::to_string(number) + " is not length-delimited");
        return std::string(bytes);
    }
};

class Reader {
public:
    explicit Reader(std::string_view data) : data_(data) {}
    bool done() const { return pos_ == data_.size(); }

    Field next() {
        Field f;
        const uint64_t key = varint();
        f.number = static_cast<uint32_t>(key >> 3);
        f.type = static_cast<WireType>(key & 7);
        if (f.number == 0) malformed("field number 0");
        switch (f.type) {
            case VARINT: f.u = varint(); break;
            case FIXED64: f.u = fixed(8); break;
            case FIXED32: f.u = fixed(4); break;
            case LENGTH_DELIMITED: {
                const uint64_t n = varint();
                if (n > data_.size() - pos_) malformed("length runs past the end");
                f.bytes = data_.substr(pos_, n);
                pos_ += n;
                break;
            }
            default: malformed("unsupported wire type " + std::to_string(key & 7));
        }
        return f;
    }

private:
    uint64_t varint() {
        uint64_t v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            if (pos_ >= data_.size()) malformed("truncated varint");
            const uint8_t b = static_cast<uint8_t>(data_[pos_++]);
            v |= uint64_t{b & 0x7fu} << shift;
            if (b < 0x80) return v;
        }
        malformed("varint longer than 10 bytes");
    }
    uint64_t fixed(int n) {
        if (data_.size() - pos_ < static_cast<size_t>(n)) malformed("truncated fixed-width value");
        uint64_t v = 0;
        for (int i = 0; i < n; ++i) v |= uint64_t{static_cast<uint8_t>(data_[pos_++])} << (8 * i);
        return v;
    }

    std::string_view data_;
    size_t pos_ = 0;
};

Piece parse_piece(std::string_view bytes) {
    Piece p;
    for (Reader r(bytes); !r.done();) {
        const Field f = r.next();
        switch (f.number) {
            case kPieceText: p.piece = f.as_string(); break;
            case kPieceScore: p.score = f.as_float(); break;
            case kPieceType: p.type = static_cast<PieceType>(f.as_int32()); break;
            default: break;
        }
    }
    return p;
}

TrainerSpec parse_trainer(std::string_view bytes) {
    TrainerSpec t;
    t.model_type = ModelType::UNIGRAM;  // proto default
    t.vocab_size = 8000;                // proto default
    for (Reader r(bytes); !r.done();) {
        const Field f = r.next();
        switch (f.number) {
            case kTrainerModelType: t.model_type = static_cast<ModelType>(f.as_int32()); break;
            case kTrainerVocabSize: t.vocab_size = f.as_int32(); break;
            case kTrainerByteFallback: t.byte_fallback = f.u != 0; break;
            case kTrainerUnkId: t.unk_id = f.as_int32(); break;
            case kTrainerBosId: t.bos_id = f.as_int32(); break;
            case kTrainerEosId: t.eos_id = f.as_int32(); break;
            case kTrainerPadId: t.pad_id = f.as_int32(); break;
            case kTrainerUnkSurface:
                t.unk_surface = f.as_string();
                t.has_unk_surface = true;
                break;
            case kTrainerUnkPiece: t.unk_piece = f.as_string(); break;
            case kTrainerBosPiece: t.bos_piece = f.as_string(); break;
            case kTrainerEosPiece: t.eos_piece = f.as_string(); break;
            case kTrainerPadPiece: t.pad_piece = f.as_string(); break;
            default: break;
        }
    }
    return t;
}

// Appends the precompiled_charsmap fields of a (de)normalizer spec message to `out`.
void collect_charsmaps(std::string_view bytes, std::vector<std::string>& out) {
    for (Reader r(bytes); !r.done();) {
        const Field f = r.next();
        if (f.number == kNormPrecompiledCharsmap && f.type == LENGTH_DELIMITED) out.emplace_back(f.bytes);
    }
}

NormalizerSpec parse_normalizer(std::string_view bytes) {
    NormalizerSpec n;
    n.name.clear();                     // proto default
    n.remove_extra_whitespaces = true;  // proto default
    for (Reader r(bytes); !r.done();) {
        const Field f = r.next();
        switch (f.number) {
            case kNormName: n.name = f.as_string(); break;
            case kNormAddDummyPrefix: n.add_dummy_prefix = f.u != 0; break;
            case kNormRemoveExtraWhitespaces: n.remove_extra_whitespaces = f.u != 0; break;
            case kNormEscapeWhitespaces: n.escape_whitespaces = f.u != 0; break;
            default: break;
        }
    }
    return n;
}

}  // namespace

std::string serialize(const ModelProto& model) {
    Writer w;
    for (const Piece& p : model.pieces) w.bytes_field(kModelPieces, serialize_piece(p));
    w.bytes_field(kModelTrainerSpec, serialize_trainer(model.trainer_spec));
    w.bytes_field(kModelNormalizerSpec, serialize_normalizer(model.normalizer_spec));
    return std::move(w.str());
}

ModelProto parse(std::string_view bytes) {
    ModelProto model;
    bool have_trainer = false, have_normalizer = false;
    for (Reader r(bytes); !r.done();) {
        const Field f = r.next();
        const bool message = f.type == LENGTH_DELIMITED;
        switch (f.number) {
            case kModelPieces:
                if (!message) malformed("piece is not a message");
                model.pieces.push_back(parse_piece(f.bytes));
                break;
            case kModelTrainerSpec:
                if (!message) malformed("trainer_spec is not a message");
                model.trainer_spec = parse_trainer(f.bytes);
                have_trainer = true;
                break;
            case kModelNormalizerSpec:
                if (!message) malformed("normalizer_spec is not a message");
                model.normalizer_spec = parse_normalizer(f.bytes);
                collect_charsmaps(f.bytes, model.charsmaps);
                have_normalizer = true;
                break;
            case kModelDenormalizerSpec:
                if (!message) malformed("denormalizer_spec is not a message");
                collect_charsmaps(f.bytes, model.charsmaps);
                break;
            default: break;
        }
    }
    // An absent sub-message reads as all proto defaults, like a present but empty one.
    if (!have_trainer) model.trainer_spec = parse_trainer({});
    if (!have_normalizer) model.normalizer_spec = parse_normalizer({});
    return model;
}

}  // namespace tandem::spm
