// IEEE 754 binary16 <-> binary32 conversion: fp16_to_fp32 / fp32_to_fp16 (round to nearest, ties to even), with
// F16C instructions where the including file is compiled with them and a bit-exact portable version otherwise.
//
// Why the inline namespaces: only tandem_core is compiled with -mf16c, but this header is meant to be included from
// anywhere (tools, tests). Were the F16C and portable bodies both named tandem::cpu::fp16_to_fp32, two translation
// units would hold different definitions of one inline function (an ODR violation: the linker keeps one of them at
// random). The inline namespace gives each flavour its own mangled name while callers still write fp16_to_fp32.
#pragma once
#include <bit>
#include <cstdint>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace tandem::cpu {

// binary16: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits. Every binary16 value is exactly representable
// as a binary32, so this direction never rounds.
inline float fp16_to_fp32_portable(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1Fu;
    const uint32_t mantissa = h & 0x3FFu;
    uint32_t bits;
    if (exponent == 0x1F) {
        // Inf stays Inf. A NaN keeps its payload and gets the quiet bit, as VCVTPH2PS does with signalling NaNs.
        bits = sign | 0x7F800000u | (mantissa << 13) | (mantissa ? 0x00400000u : 0u);
    } else if (exponent != 0) {
        bits = sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13);  // normal: rebias the exponent
    } else if (mantissa == 0) {
        bits = sign;  // +-0
    } else {
        // Subnormal: mantissa * 2^-24. Normalise so the leading 1 becomes the implicit bit of the binary32.
        const int top = 31 - std::countl_zero(mantissa);  // index of the leading 1, 0..9
        bits = sign | (static_cast<uint32_t>(top + 127 - 24) << 23) | ((mantissa << (23 - top)) & 0x7FFFFFu);
    }
    return std::bit_cast<float>(bits);
}

// Rounds to nearest, ties to even, like VCVTPS2PH with imm8 = 0 (_MM_FROUND_TO_NEAREST_INT) and MXCSR ignored.
inline uint16_t fp32_to_fp16_portable(float f) {
    const uint32_t bits = std::bit_cast<uint32_t>(f);
    const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
    const uint32_t magnitude = bits & 0x7FFFFFFFu;

    if (magnitude > 0x7F800000u)  // NaN: quiet it and keep the top of the payload, as the hardware does
        return static_cast<uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x3FFu));
    // 65520 is halfway between the largest finite half (65504, odd mantissa) and 2^16: ties go to even, i.e. to
    // Inf, so everything from 65520 up (Inf included) becomes Inf.
    if (magnitude >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
    if (magnitude >= 0x38800000u) {
        // Normal half (>= 2^-14). Rebias, then round the 13 dropped bits to nearest even; a carry out of the
        // mantissa correctly bumps the exponent (and cannot reach Inf: that range was handled above).
        const uint32_t odd = (magnitude >> 13) & 1u;
        const uint32_t rebiased = magnitude - ((127u - 15u) << 23);
        return static_cast<uint16_t>(sign | ((rebiased + 0xFFFu + odd) >> 13));
    }
    // Subnormal half or zero: the result counts units of 2^-24. With the implicit bit restored the float is
    // m * 2^(e - 150), i.e. m >> (126 - e) units, rounded to nearest even on the shifted-out bits. A result of
    // 0x400 (rounded up into the smallest normal) is the right bit pattern as it stands.
    const uint32_t exponent = magnitude >> 23;
    const uint32_t shift = 126u - exponent;  // >= 14 here
    if (shift >= 32) return sign;            // far below 2^-25: rounds to zero
    const uint32_t m = (magnitude & 0x7FFFFFu) | (exponent ? 0x800000u : 0u);
    uint32_t q = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
}

#if defined(__F16C__)
inline namespace f16c_isa {
inline float fp16_to_fp32(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t fp32_to_fp16(float f) { return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }
}  // namespace f16c_isa
#else
inline namespace portable_isa {
inline float fp16_to_fp32(uint16_t h) { return fp16_to_fp32_portable(h); }
inline uint16_t fp32_to_fp16(float f) { return fp32_to_fp16_portable(f); }
}  // namespace portable_isa
#endif

}  // namespace tandem::cpu

namespace tandem {
// The conversions are about the file format as much as the CPU kernels (converters and tools use them too).
using cpu::fp16_to_fp32;
using cpu::fp32_to_fp16;
}  // namespace tandem
