// Tokenizer (sentencepiece vocabularies from GGUF metadata or .model files, byte-level BPE vocabularies from GGUF
// metadata, special-token parsing) and TokenStreamDecoder (incremental, UTF-8-safe detokenization). See
// tokenizer.h; the algorithms themselves are in spm_tokenizer.cpp and bpe_tokenizer.cpp.
#include "text/tokenizer.h"

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sentencepiece_processor.h>

#include "error.h"
#include "gguf/gguf.h"
#include "text/bpe_tokenizer.h"
#include "text/sentencepiece_proto.h"
#include "text/spm_tokenizer.h"

namespace tandem {
namespace {

// "<0x0A>" -> 10; anything else -> -1. sentencepiece spells byte pieces with two upper-case hex digits.
int parse_byte_piece(std::string_view text) {
    if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
    int value = 0;
    for (char c : text.substr(3, 2)) {
        int digit;
        if (c >= '0' && c <= '9')
            digit = c - '0';
        else if (c >= 'A' && c <= 'F')
            digit = c - 'A' + 10;
        else
            return -1;
        value = value * 16 + digit;
    }
    return value;
}

// An optional token id from GGUF metadata: absent, negative or 0xFFFFFFFF (how converters write "none") give -1.
int optional_token_id(const GgufFile& gguf, std::string_view key, int n_vocab) {
    const GgufValue* v = gguf.find(key);
    if (!v) return -1;
    if (v->is_integer() && v->i < 0) return -1;  // -1 stored as a signed integer
    const uint32_t id = gguf.get_u32(key);
    if (id == UINT32_MAX) return -1;
    if (id >= static_cast<uint32_t>(n_vocab))
        throw Error(gguf.path() + ": " + std::string(key) + " = " + std::to_string(id) +
                    " is outside the vocabulary of " + std::to_string(n_vocab) + " tokens");
    return static_cast<int>(id);
}

// A sentencepiece piece must not be empty (both vocabulary sources). A .model file's must also be free of NUL
// bytes (`nul_allowed` false): libsentencepiece keys a unigram model's trie by C strings and aborted the process
// (an uncaught Darts exception) on a piece that is empty as one. The model built from a GGUF vocabulary is a BPE
// one, whose pieces go into no such trie.
void check_piece_text(const std::string& path, size_t id, std::string_view text, bool nul_allowed) {
    if (text.empty()) throw Error(path + ": token " + std::to_string(id) + " is an empty string");
    if (!nul_allowed && text.find('\0') != std::string_view::npos)
        throw Error(path + ": token " + std::to_string(id) + " contains a NUL byte");
}

// A precompiled charsmap is a uint32 (little-endian) byte count, a darts-clone double-array trie of that many
// bytes, then the normalized strings, NUL-terminated, that the trie's values index. libsentencepiece walks the
// trie and reads the strings without any bounds check (a corrupt .model made it read wild memory), so before it
// sees one, every path it can take is walked here: the root, then, from each node that matches a byte, all 256
// children's slots it may read, each leaf's value unit, and the string a value points at.
// (darts-clone units: bit 8 has_leaf, label = bits 0-7 plus bit 31, value = bits 0-30, offset = bits 10-31
// shifted left by 8 when bit 9 is set.)
void check_charsmap(const std::string& path, std::string_view blob) {
    const auto fail = [&](const std::string& what) {
        throw Error(path + ": the normalization rules (precompiled_charsmap) are corrupt: " + what);
    };
    if (blob.empty()) return;  // no rules (the identity normalizer): libsentencepiece builds no trie
    uint32_t trie_bytes = 0;
    if (blob.size() <= sizeof trie_bytes) fail("too short");
    std::memcpy(&trie_bytes, blob.data(), sizeof trie_bytes);
    if (trie_bytes >= blob.size() - sizeof trie_bytes) fail("the trie is longer than the rules");
    const size_t n_units = trie_bytes / 4;
    const std::string_view strings = blob.substr(sizeof trie_bytes + trie_bytes);
    const auto unit = [&](size_t i) {
        uint32_t u;
        std::memcpy(&u, blob.data() + sizeof trie_bytes + 4 * i, 4);
        return u;
    };
    const auto offset = [](uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); };
    // A node's children sit at base ^ c for bytes c: the slots base | 0..255 must all exist.
    const auto check_base = [&](size_t base) {
        if ((base | 0xFF) >= n_units) fail("a node's children lie outside the trie");
    };
    if (n_units == 0) fail("the trie is empty");
    std::vector<bool> seen(n_units, false);
    std::vector<size_t> bases = {offset(unit(0))};
    check_base(bases[0]);
    seen[bases[0]] = true;
    while (!bases.empty()) {
        const size_t base = bases.back();
        bases.pop_back();
        for (uint32_t c = 0; c < 256; ++c) {
            const size_t pos = base ^ c;
            const uint32_t u = unit(pos);
            if ((u & ((1u << 31) | 0xFF)) != c) continue;  // not a child for byte c: the walk stops there
            const size_t next = pos ^ offset(u);
            check_base(next);
            if (u & (1u << 8)) {  // has a leaf: its value unit is at `next`
                const uint32_t value = unit(next) & ((1u << 31) - 1);
                if (value >= strings.size() || strings.find('\0', value) == std::string_view::npos)
                    fail("a value points past the normalized strings");
            }
            if (!seen[next]) {
                seen[next] = true;
                bases.push_back(next);
            }
        }
    }
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path + ": cannot open tokenizer model file");
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw Error(path + ": cannot read tokenizer model file");
    return bytes;
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& gguf) {
    const std::string& path = gguf.path();
    const std::string model = gguf.get_string("tokenizer.ggml.model");
    if (model == "gpt2") return from_gguf_bpe(gguf);
    if (model != "llama")
        throw Error(path + ": tokenizer model \"" + model +
                    "\" is not supported (tokenizer.ggml.model must be "
                    "\"llama\", sentencepiece, or \"gpt2\", byte-level BPE)");

    const std::vector<std::string_view> tokens = gguf.get_string_array("tokenizer.ggml.tokens");
    std::vector<float> scores = gguf.get_f32_array("tokenizer.ggml.scores");
    const std::vector<int64_t> types = gguf.get_int_array("tokenizer.ggml.token_type");
    const size_t n = tokens.size();
    if (n == 0) throw Error(path + ": tokenizer.ggml.tokens is empty");
    if (n > static_cast<size_t>(INT32_MAX)) throw Error(path + ": tokenizer.ggml.tokens is too large");
    if (scores.size() != n || types.size() != n)
        throw Error(path + ": tokenizer arrays differ in length (tokens " + std::to_string(n) + ", scores " +
                    std::to_string(scores.size()) + ", token_type " + std::to_string(types.size()) + ")");

    auto tok = std::unique_ptr<Tokenizer>(new Tokenizer());
    tok->model_type_ = model;
    tok->texts_.reserve(n);
    tok->types_.reserve(n);
    tok->byte_values_.assign(n, -1);
    for (size_t i = 0; i < n; ++i) {
        const int64_t type = types[i];
        if (type < static_cast<int64_t>(spm::PieceType::NORMAL) || type > static_cast<int64_t>(spm::PieceType::BYTE))
            throw Error(path + ": token " + std::to_string(i) + " has unknown token type " + std::to_string(type));
        check_piece_text(path, i, tokens[i], /*nul_allowed=*/true);
        if (type == static_cast<int64_t>(spm::PieceType::BYTE)) {
            tok->byte_values_[i] = static_cast<int16_t>(parse_byte_piece(tokens[i]));
            if (tok->byte_values_[i] < 0)
                throw Error(path + ": token " + std::to_string(i) + " \"" + std::string(tokens[i]) +
                            "\" has the byte type but is not of the form <0xNN>");
        }
        // A NaN would make the merge order undefined (and the heap's comparisons inconsistent).
        if (scores[i] != scores[i]) throw Error(path + ": token " + std::to_string(i) + " has a NaN score");
        tok->texts_.emplace_back(tokens[i]);
        tok->types_.push_back(static_cast<int>(type));
    }

    const int n_vocab = static_cast<int>(n);
    // llama.cpp needs no unknown token (byte pieces cover every character), and its type does not matter:
    // Phi-3's unknown_token_id names "<unk>", a control token, while 53 padding tokens carry the unknown type.
    int unk = optional_token_id(gguf, "tokenizer.ggml.unknown_token_id", n_vocab);
    for (size_t i = 0; i < n && unk < 0; ++i)
        if (tok->types_[i] == static_cast<int>(spm::PieceType::UNKNOWN)) unk = static_cast<int>(i);
    tok->unk_ = unk;
    tok->bos_ = optional_token_id(gguf, "tokenizer.ggml.bos_token_id", n_vocab);
    tok->eos_ = optional_token_id(gguf, "tokenizer.ggml.eos_token_id", n_vocab);
    tok->add_bos_ = gguf.get_bool_or("tokenizer.ggml.add_bos_token", true) && tok->bos_ >= 0;
    tok->add_eos_ = gguf.get_bool_or("tokenizer.ggml.add_eos_token", false) && tok->eos_ >= 0;
    // tokenizer.ggml.remove_extra_whitespaces is not read: llama.cpp's SPM tokenizer ignores it too.
    tok->spm_ = std::make_unique<SpmTokenizer>(path, tok->texts_, tok->types_, std::move(scores), unk,
                                               gguf.get_bool_or("tokenizer.ggml.add_space_prefix", true));
    tok->index_specials(/*always_user_defined=*/true);
    tok->apply_name_rules(gguf);
    return tok;
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf_bpe(const GgufFile& gguf) {
    const std::string& path = gguf.path();
    const std::vector<std::string_view> tokens = gguf.get_string_array("tokenizer.ggml.tokens");
    const size_t n = tokens.size();
    if (n == 0) throw Error(path + ": tokenizer.ggml.tokens is empty");
    if (n > static_cast<size_t>(INT32_MAX)) throw Error(path + ": tokenizer.ggml.tokens is too large");
    // token_type is optional for BPE (llama.cpp then treats every token as normal).
    std::vector<int64_t> types(n, static_cast<int64_t>(spm::PieceType::NORMAL));
    if (gguf.find("tokenizer.ggml.token_type")) {
        types = gguf.get_int_array("tokenizer.ggml.token_type");
        if (types.size() != n)
            throw Error(path + ": tokenizer arrays differ in length (tokens " + std::to_string(n) + ", token_type " +
                        std::to_string(types.size()) + ")");
    }

    auto tok = std::unique_ptr<Tokenizer>(new Tokenizer());
    tok->model_type_ = "gpt2";
    tok->texts_.reserve(n);
    tok->types_.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        const int64_t type = types[i];
        if (type < static_cast<int64_t>(spm::PieceType::NORMAL) || type > static_cast<int64_t>(spm::PieceType::BYTE))
            throw Error(path + ": token " + std::to_string(i) + " has unknown token type " + std::to_string(type));
        tok->texts_.emplace_back(tokens[i]);
        tok->types_.push_back(static_cast<int>(type));
    }
    tok->bpe_ = BpeTokenizer::from_gguf(gguf, tok->texts_, tok->types_);

    const int n_vocab = static_cast<int>(n);
    tok->unk_ = optional_token_id(gguf, "tokenizer.ggml.unknown_token_id", n_vocab);
    tok->bos_ = optional_token_id(gguf, "tokenizer.ggml.bos_token_id", n_vocab);
    tok->eos_ = optional_token_id(gguf, "tokenizer.ggml.eos_token_id", n_vocab);
    tok->add_bos_ = gguf.get_bool_or("tokenizer.ggml.add_bos_token", tok->bpe_->default_add_bos()) && tok->bos_ >= 0;
    tok->add_eos_ = gguf.get_bool_or("tokenizer.ggml.add_eos_token", false) && tok->eos_ >= 0;
    tok->byte_values_.assign(n, -1);  // byte-level BPE has no <0xNN> pieces: every token is bytes already
    tok->index_specials(/*always_user_defined=*/true);
    tok->apply_name_rules(gguf);
    return tok;
}

std::unique_ptr<Tokenizer> Tokenizer::from_model_file(const std::string& path) {
    const std::string bytes = read_file(path);
    spm::ModelProto proto;
    try {
        proto = spm::parse(bytes);
    } catch (const Error& e) {
        throw Error(path + ": " + e.what());
    }
    if (proto.pieces.empty()) throw Error(path + ": not a sentencepiece model (no pieces)");
    for (const std::string& charsmap : proto.charsmaps) check_charsmap(path, charsmap);

    auto tok = std::unique_ptr<Tokenizer>(new Tokenizer());
    tok->sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
    for (const spm::Piece& p : proto.pieces) {
        check_piece_text(path, tok->texts_.size(), p.piece, /*nul_allowed=*/false);
        tok->texts_.push_back(p.piece);
        tok->types_.push_back(static_cast<int>(p.type));
    }
    tok->load(bytes, path);  // the file's own bytes: every setting it has, not just the ones tandem parses
    tok->unk_ = tok->sp_->unk_id();
    tok->bos_ = tok->sp_->bos_id();
    tok->eos_ = tok->sp_->eos_id();
    tok->add_bos_ = tok->bos_ >= 0;
    tok->add_eos_ = false;
    return tok;
}

void Tokenizer::load(const std::string& serialized, const std::string& source) {
    sentencepiece::util::Status status;
    try {
        status = sp_->LoadFromSerializedProto(serialized);
    } catch (const std::exception& e) {  // what the checks above missed must still be an error, not an abort
        throw Error(source + ": sentencepiece failed on the vocabulary: " + e.what());
    }
    if (!status.ok()) throw Error(source + ": sentencepiece rejected the vocabulary: " + status.ToString());
    if (sp_->GetPieceSize() != n_vocab())
        throw Error(source + ": sentencepiece loaded " + std::to_string(sp_->GetPieceSize()) + " pieces, expected " +
                    std::to_string(n_vocab()));

    byte_values_.assign(texts_.size(), -1);
    for (int id = 0; id < n_vocab(); ++id)
        if (types_[id] == static_cast<int>(spm::PieceType::BYTE))
            byte_values_[id] = static_cast<int16_t>(parse_byte_piece(texts_[id]));

    for (int id = 0; id < n_vocab() && context_id_ < 0; ++id)
        if (types_[id] == static_cast<int>(spm::PieceType::NORMAL) && !decode_unchecked({id}).empty()) context_id_ = id;
    // sentencepiece matches its user-defined pieces itself; only parse_special adds the control tokens.
    index_specials(/*always_user_defined=*/false);
}

void Tokenizer::index_specials(bool always_user_defined) {
    special_trie_.assign(1, SpecialNode());
    for (int id = 0; id < n_vocab(); ++id) {
        const auto type = static_cast<spm::PieceType>(types_[id]);
        const std::string& text = texts_[id];
        if (text.empty()) continue;
        // llama.cpp's special-token cache: control, user-defined and unknown tokens.
        if (type != spm::PieceType::CONTROL && type != spm::PieceType::USER_DEFINED && type != spm::PieceType::UNKNOWN)
            continue;
        int node = 0;
        for (const char c : text) {
            const auto byte = static_cast<unsigned char>(c);
            auto& children = special_trie_[static_cast<size_t>(node)].children;
            const auto at = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, 0),
                                             [](const auto& a, const auto& b) { return a.first < b.first; });
            if (at != children.end() && at->first == byte) {
                node = at->second;
            } else {
                const int fresh = static_cast<int>(special_trie_.size());
                children.insert(at, {byte, fresh});  // `children` is not used after the push_back below
                special_trie_.emplace_back();
                node = fresh;
            }
        }
        SpecialNode& end = special_trie_[static_cast<size_t>(node)];
        if (end.id >= 0) continue;  // two tokens with one text: the first one is the one matched
        end.id = id;
        end.always = always_user_defined && type == spm::PieceType::USER_DEFINED;
    }
}

void Tokenizer::apply_name_rules(const GgufFile& gguf) {
    // llama.cpp sets per-token attributes by model name, since GGUF files do not carry them. The one rule that
    // concerns the families tandem tokenizes: Phi-3's special tokens eat the whitespace after them (its chat
    // template's "<|user|>\n" is tokenized as "<|user|>" alone), except <unk>, <s> and <|endoftext|>.
    std::string name = gguf.get_string_or("general.name", "");
    std::transform(name.begin(), name.end(), name.begin(),
                   [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; });
    if (name.find("phi-3") == std::string::npos && name.find("phi3") == std::string::npos) return;
    for (SpecialNode& node : special_trie_) {
        if (node.id < 0) continue;
        const std::string& text = texts_[static_cast<size_t>(node.id)];
        node.rstrip = text != "<unk>" && text != "<s>" && text != "<|endoftext|>";
    }
}

void Tokenizer::encode_plain(std::string_view text, std::vector<int>& out) const {
    if (text.empty()) return;
    if (bpe_) {
        bpe_->encode(text, out);
        return;
    }
    if (spm_) {
        spm_->encode(text, out);
        return;
    }
    std::vector<int> ids;
    const sentencepiece::util::Status status = sp_->Encode(text, &ids);
    if (!status.ok()) throw Error("tokenizer: cannot encode text: " + status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
}

std::vector<int> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
    std::vector<int> ids;
    if (add_bos && bos_ >= 0) ids.push_back(bos_);
    // Cut out the special tokens (longest first at each position); each stretch of text between them is
    // tokenized on its own, as llama.cpp's tokenizer_st_partition does. Sentencepiece vocabularies then give
    // every stretch the space prefix, which is also what llama.cpp does after a special token.
    size_t plain = 0;  // start of the text not yet tokenized
    for (size_t i = 0; i < text.size();) {
        // The longest special token that starts at i and may be matched: walk the trie along the text.
        const SpecialNode* hit = nullptr;
        size_t hit_length = 0;
        int node = 0;
        for (size_t k = i; k < text.size(); ++k) {
            const auto byte = static_cast<unsigned char>(text[k]);
            const auto& children = special_trie_[static_cast<size_t>(node)].children;
            const auto at = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, 0),
                                             [](const auto& a, const auto& b) { return a.first < b.first; });
            if (at == children.end() || at->first != byte) break;
            node = at->second;
            const SpecialNode& here = special_trie_[static_cast<size_t>(node)];
            if (here.id >= 0 && (parse_special || here.always)) {
                hit = &here;
                hit_length = k - i + 1;
            }
        }
        if (!hit) {
            ++i;
            continue;
        }
        encode_plain(text.substr(plain, i - plain), ids);
        ids.push_back(hit->id);
        i += hit_length;
        if (hit->rstrip)  // the whitespace after it goes with it (llama.cpp: isspace in the C locale)
            while (i < text.size() && (text[i] == ' ' || (text[i] >= '\t' && text[i] <= '\r'))) ++i;
        plain = i;
    }
    encode_plain(text.substr(plain), ids);
    return ids;
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
    for (int id : ids)
        if (id < 0 || id >= n_vocab())
            throw Error("tokenizer: token id " + std::to_string(id) + " is outside the vocabulary of " +
                        std::to_string(n_vocab()) + " tokens");
    return decode_unchecked(ids);
}

void Tokenizer::append_rendered(int id, bool& at_text_start, std::string& out) const {
    const std::string& text = bpe_ ? bpe_->rendered(id) : spm_->rendered(id);
    if (text.empty()) return;
    size_t skip = 0;
    if (at_text_start) {
        at_text_start = false;
        if (spm_ && spm_->add_space_prefix() && types_[id] == static_cast<int>(spm::PieceType::NORMAL) &&
            text[0] == ' ')
            skip = 1;
    }
    out.append(text, skip);
}

std::string Tokenizer::decode_unchecked(const std::vector<int>& ids) const {
    if (bpe_ || spm_) {
        std::string bytes;
        bool at_text_start = true;
        for (int id : ids) append_rendered(id, at_text_start, bytes);
        return utf8::sanitize(bytes);
    }
    std::string text;
    const sentencepiece::util::Status status = sp_->Decode(ids, &text);
    if (!status.ok()) throw Error("tokenizer: cannot decode tokens: " + status.ToString());
    return text;
}

std::string Tokenizer::token_bytes(int id) const {
    if (id < 0 || id >= n_vocab())
        throw Error("tokenizer: token id " + std::to_string(id) + " is outside the vocabulary of " +
                    std::to_string(n_vocab()) + " tokens");
    if (!bpe_ && !spm_) throw Error("tokenizer: a sentencepiece .model file (--tokenizer) cannot give token bytes");
    std::string out;
    bool at_text_start = false;
    append_rendered(id, at_text_start, out);
    return out;
}

std::vector<std::string> Tokenizer::token_bytes_table(int n_vocab) const {
    std::vector<std::string> table(static_cast<size_t>(std::max(0, n_vocab)));
    for (int id = 0; id < n_vocab && id < this->n_vocab(); ++id) table[static_cast<size_t>(id)] = token_bytes(id);
    return table;
}

std::string Tokenizer::piece(int id) const {
    if (id < 0 || id >= n_vocab())
        throw Error("tokenizer: token id " + std::to_string(id) + " is outside the vocabulary of " +
                    std::to_string(n_vocab()) + " tokens");
    return texts_[id];
}

int Tokenizer::token_id(std::string_view text) const {
    if (bpe_) return bpe_->token_id(text);
    if (spm_) return spm_->token_id(text);
    const int id = sp_->PieceToId(text);  // sentencepiece answers unk for an unknown piece
    return id >= 0 && id < n_vocab() && texts_[id] == text ? id : -1;
}

std::string Tokenizer::pre_tokenizer() const { return bpe_ ? bpe_->pre() : std::string(); }

bool Tokenizer::is_control(int id) const {
    return id >= 0 && id < n_vocab() && types_[id] == static_cast<int>(spm::PieceType::CONTROL);
}

bool Tokenizer::is_byte(int id) const { return byte_value(id) >= 0; }

int Tokenizer::byte_value(int id) const { return id >= 0 && id < n_vocab() ? byte_values_[id] : -1; }

// ---- TokenStreamDecoder -------------------------------------------------------------------------------------

TokenStreamDecoder::TokenStreamDecoder(const Tokenizer& tokenizer, bool at_start)
    : tok_(tokenizer), at_start_(at_start) {
    reset();
}

void TokenStreamDecoder::reset() {
    pending_.clear();
    text_start_ = at_start_;
    window_.clear();
    prefix_text_.clear();
    // A continuation starts with one already-"returned" piece of context, so the first real piece is mid-text.
    if (!at_start_ && tok_.context_id_ >= 0) {
        window_.push_back(tok_.context_id_);
        prefix_text_ = tok_.decode_unchecked(window_);
    }
    prefix_len_ = window_.size();
}

// True when the bytes at the end of the window could be the start of a UTF-8 character that later byte pieces
// complete. Conservative by design (holding back too long only delays text; releasing too early could split a
// character): any lead byte among the last three whose sequence would reach past the end counts, even where
// sentencepiece would reject the finished sequence (overlong forms, surrogates).
bool TokenStreamDecoder::ends_in_incomplete_utf8() const {
    for (size_t k = 1; k <= 3 && k <= window_.size(); ++k) {
        const int b = tok_.byte_value(window_[window_.size() - k]);
        if (b < 0) return false;  // the byte run ends here
        const size_t need = (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
        if (need > k) return true;
    }
    return false;
}

// GGUF vocabularies decode token by token (the only context is whether text has started, for the leading-space
// rule), so streaming only has to hold back the bytes of a character that is not complete yet. Each decision uses
// exactly the bytes decode() would look at, so the pieces always add up to decode(all ids).
std::string TokenStreamDecoder::take_bytes(bool final) {
    const auto* s = reinterpret_cast<const unsigned char*>(pending_.data());
    const size_t n = pending_.size();
    size_t i = 0;
    while (i < n) {
        const int len = utf8::sequence_length(s + i, n - i);
        if (len > 0) {
            i += static_cast<size_t>(len);
        } else if (len < 0 && !final) {
            break;  // may still complete
        } else {
            i += 1;  // decode() renders this byte as U+FFFD; sanitize below does the same
        }
    }
    std::string out = utf8::sanitize(std::string_view(pending_).substr(0, i));
    pending_.erase(0, i);
    return out;
}

std::string TokenStreamDecoder::push(int id) {
    if (id < 0 || id >= tok_.n_vocab())
        throw Error("tokenizer: token id " + std::to_string(id) + " is outside the vocabulary of " +
                    std::to_string(tok_.n_vocab()) + " tokens");
    if (!tok_.sp_) {
        tok_.append_rendered(id, text_start_, pending_);
        return take_bytes(false);
    }
    // A run of control tokens renders exactly like one (invisible, ends a byte run), so keep just one: the
    // window then stays small even if a model emits many in a row.
    if (tok_.is_control(id) && !window_.empty() && tok_.is_control(window_.back()) && prefix_len_ == window_.size())
        return {};
    window_.push_back(id);
    if (tok_.byte_value(id) >= 0 && ends_in_incomplete_utf8()) return {};

    const std::string text = tok_.decode_unchecked(window_);
    // Holds by construction: the prefix ends on a complete character and leaves sentencepiece past its
    // leading-space handling, so appending ids only appends text.
    assert(text.compare(0, prefix_text_.size(), prefix_text_) == 0);
    std::string out = text.substr(prefix_text_.size());

    // Slide the window: the ids just returned become the new prefix, provided they render non-empty text on
    // their own (otherwise sentencepiece would drop the next piece's leading space); if not (control tokens,
    // or a leading space at the very start), the window keeps its older ids as well.
    std::vector<int> fresh(window_.begin() + static_cast<std::ptrdiff_t>(prefix_len_), window_.end());
    std::string fresh_text = tok_.decode_unchecked(fresh);
    if (!fresh_text.empty()) {
        window_ = std::move(fresh);
        prefix_text_ = std::move(fresh_text);
    } else {
        prefix_text_ = text;
    }
    prefix_len_ = window_.size();
    return out;
}

std::string TokenStreamDecoder::flush() {
    std::string out;
    if (!tok_.sp_) {
        out = take_bytes(true);
        reset();
        return out;
    }
    if (prefix_len_ < window_.size()) out = tok_.decode_unchecked(window_).substr(prefix_text_.size());
    reset();
    return out;
}

}  // namespace tandem
