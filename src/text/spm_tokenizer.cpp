// Sentencepiece-style tokenization of GGUF vocabularies (score-ordered pairwise merges, byte fallback) and the
// per-token rendering used by decode. See spm_tokenizer.h.
#include "text/spm_tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>

#include "error.h"

namespace tandem {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // ▁ U+2581, sentencepiece's visible space

enum : int { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// The number of bytes the character starting with `lead` claims: by its top four bits, as llama.cpp's
// unicode_len_utf8 does (a continuation or invalid byte counts as one, a lead byte claims its full length).
size_t claimed_length(unsigned char lead) {
    static constexpr uint8_t kByHighNibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return kByHighNibble[lead >> 4];
}

// "<0x0A>" -> 10 (checked by Tokenizer before we get here).
int byte_of_piece(std::string_view text) {
    const auto hex = [](char c) { return c <= '9' ? c - '0' : c - 'A' + 10; };
    return hex(text[3]) * 16 + hex(text[4]);
}

std::string unescape_spaces(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        if (text.compare(i, kSpace.size(), kSpace) == 0) {
            out += ' ';
            i += kSpace.size();
        } else {
            out += text[i++];
        }
    }
    return out;
}

}  // namespace

SpmTokenizer::SpmTokenizer(const std::string& path, const std::vector<std::string>& texts,
                           const std::vector<int>& types, std::vector<float> scores, int unk, bool add_space_prefix)
    : scores_(std::move(scores)), add_space_prefix_(add_space_prefix) {
    const size_t n = texts.size();
    id_of_.reserve(n);
    mergeable_.resize(n);
    rendered_.resize(n);
    std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
    for (size_t i = 0; i < n; ++i) {
        const int id = static_cast<int>(i);
        const auto [it, fresh] = id_of_.emplace(texts[i], id);
        if (!fresh)
            throw Error(path + ": duplicate token in the vocabulary: \"" + texts[i] + "\" has ids " +
                        std::to_string(it->second) + " and " + std::to_string(id));
        mergeable_[i] = types[i] != kControl && types[i] != kUnknown;
        switch (types[i]) {
            case kNormal: rendered_[i] = unescape_spaces(texts[i]); break;
            case kUserDefined: rendered_[i] = texts[i]; break;
            case kByte: rendered_[i] = std::string(1, static_cast<char>(byte_of_piece(texts[i]))); break;
            default: break;  // control, unknown, unused: nothing
        }
    }
    // Byte fallback: the <0xNN> piece, else a token that is the byte itself (llama.cpp's byte_to_token does the
    // same), else <unk>.
    for (size_t i = 0; i < n; ++i)
        if (types[i] == kByte) byte_ids_[byte_of_piece(texts[i])] = static_cast<int>(i);
    for (int b = 0; b < 256; ++b) {
        if (byte_ids_[b] >= 0) continue;
        const char byte = static_cast<char>(b);
        const auto it = id_of_.find(std::string_view(&byte, 1));
        byte_ids_[b] = it != id_of_.end() && mergeable_[static_cast<size_t>(it->second)] ? it->second : unk;
    }
}

int SpmTokenizer::token_id(std::string_view text) const {
    const auto it = id_of_.find(text);
    return it == id_of_.end() ? -1 : it->second;
}

void SpmTokenizer::encode(std::string_view raw, std::vector<int>& out) const {
    if (raw.empty()) return;
    std::string text;
    text.reserve(raw.size() + raw.size() / 2 + kSpace.size());
    if (add_space_prefix_) text += kSpace;
    for (char c : raw) {
        if (c == ' ')
            text += kSpace;
        else
            text += c;
    }
    if (text.size() > static_cast<size_t>(INT32_MAX)) throw Error("tokenizer: the text is too long to encode");

    // Symbols: [begin, begin + length) of `text`, in a doubly linked list; a merged-away symbol has length 0.
    struct Symbol {
        uint32_t begin, length;
        int prev, next;
    };
    std::vector<Symbol> sym;
    sym.reserve(text.size());
    for (size_t at = 0; at < text.size();) {
        const size_t len = std::min(claimed_length(static_cast<unsigned char>(text[at])), text.size() - at);
        const int index = static_cast<int>(sym.size());
        sym.push_back({static_cast<uint32_t>(at), static_cast<uint32_t>(len), index - 1, -1});
        if (index > 0) sym[index - 1].next = index;
        at += len;
    }

    // Candidate merges in a max-heap: highest score first, then leftmost. A candidate goes stale when either
    // symbol takes part in another merge first; lengths only grow, so it is recognised by its two symbols'
    // lengths no longer adding up to `size`.
    struct Candidate {
        float score;
        int left, right;
        uint32_t size;
    };
    const auto lower = [](const Candidate& a, const Candidate& b) {
        return a.score < b.score || (a.score == b.score && a.left > b.left);
    };
    std::vector<Candidate> heap;
    heap.reserve(sym.size());
    const std::string_view view(text);
    const auto lookup = [&](int left, int right, Candidate& c) {
        if (left < 0 || right < 0) return false;
        const uint32_t size = sym[left].length + sym[right].length;
        const auto it = id_of_.find(view.substr(sym[left].begin, size));
        if (it == id_of_.end() || !mergeable_[static_cast<size_t>(it->second)]) return false;
        c = {scores_[static_cast<size_t>(it->second)], left, right, size};
        return true;
    };
    for (size_t i = 1; i < sym.size(); ++i) {
        Candidate c;
        if (lookup(static_cast<int>(i) - 1, static_cast<int>(i), c)) heap.push_back(c);
    }
    std::make_heap(heap.begin(), heap.end(), lower);
    const auto consider = [&](int left, int right) {
        Candidate c;
        if (!lookup(left, right, c)) return;
        heap.push_back(c);
        std::push_heap(heap.begin(), heap.end(), lower);
    };
    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), lower);
        const Candidate c = heap.back();
        heap.pop_back();
        Symbol& left = sym[c.left];
        Symbol& right = sym[c.right];
        if (left.length == 0 || right.length == 0 || left.length + right.length != c.size) continue;  // stale
        left.length += right.length;
        right.length = 0;
        left.next = right.next;
        if (right.next >= 0) sym[right.next].prev = c.left;
        consider(left.prev, c.left);
        consider(c.left, left.next);
    }

    for (int i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) {
        const std::string_view piece = view.substr(sym[i].begin, sym[i].length);
        const auto it = id_of_.find(piece);
        if (it != id_of_.end() && mergeable_[static_cast<size_t>(it->second)]) {
            out.push_back(it->second);
            continue;
        }
        for (unsigned char b : piece) {  // a character the vocabulary lacks: its bytes
            if (byte_ids_[b] < 0) {
                char hex[8];
                std::snprintf(hex, sizeof hex, "0x%02X", b);
                throw Error(std::string("tokenizer: cannot encode byte ") + hex +
                            ": the vocabulary has no byte pieces and no unknown token");
            }
            out.push_back(byte_ids_[b]);
        }
    }
}

}  // namespace tandem
