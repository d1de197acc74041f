// UTF-8 helpers, header only (so that libraries below tandem_text can use them): encoding one code point, shared
// by the BPE tokenizer's byte mapping and the JSON reader; the well-formed sequence length, shared by the tokenizers'
// U+FFFD replacement (sanitize, bpe_tokenizer.h) and the JSON reader and writer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem::utf8 {

// Appends the UTF-8 encoding of `cp` (at most U+10FFFF; surrogates are encoded as they are, as JSON readers need).
inline void append(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

// Length of the well-formed UTF-8 sequence at s[0..n) (Unicode Table 3-7: no overlongs, surrogates or values past
// U+10FFFF); 0 when the bytes cannot start one; -1 when they are a proper prefix of one (more bytes needed).
inline int sequence_length(const unsigned char* s, size_t n) {
    const unsigned c = s[0];
    if (c < 0x80) return 1;
    int len;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Table 3-7), later bytes 80..BF
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;  // overlong
        else if (c == 0xED)
            hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;  // overlong
        else if (c == 0xF4)
            hi = 0x8F;  // past U+10FFFF
    } else {
        return 0;
    }
    for (int k = 1; k < len; ++k) {
        if (static_cast<size_t>(k) >= n) return -1;
        const unsigned b = s[k];
        if (b < lo || b > hi) return 0;
        lo = 0x80;
        hi = 0xBF;
    }
    return len;
}

}  // namespace tandem::utf8
