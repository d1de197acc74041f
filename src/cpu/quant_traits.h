// Internal to quant.cpp: the per-type traits its dot-product tiles and kernel table are instantiated over, one struct
// per CPU weight type (ggml's block geometry, reference quantizers and dequantizers, the scalar and AVX2 decoders of
// a step or block), and the helpers they share. Defines TANDEM_QUANT_SIMD when the build has AVX2, FMA and F16C: the
// traits' SIMD members, and quant.cpp's SIMD tiles, exist only then.
//
// Everything here is inline (templates, in-class members, TANDEM_ALWAYS_INLINE helpers), so that the tiles inline
// the decoders into their loops. Only quant.cpp includes it: the structs change with the ISA flags (a Ctx exists only
// under TANDEM_QUANT_SIMD), so a file built with other flags would first need fp16.h's inline-namespace treatment.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu/fp16.h"
#include "cpu/quant.h"
#include "cpu/unaligned.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TANDEM_QUANT_SIMD 1
#include <immintrin.h>
#endif

#define TANDEM_ALWAYS_INLINE inline __attribute__((always_inline))

namespace tandem::cpu::quant_detail {

// Every kernel walks a row in steps of 32 elements, the block size of the 32-element ggml types; F32 and F16 rows
// are cut into 32-element pieces the same way, and their remainder (they may have any length) goes through a tail.
constexpr int64_t kStep = 32;

// Returns v rounded to float as a value the compiler cannot see through. ggml's reference quantizers compute
// x * id and then add to it; with FMA available GCC would fuse the two (it contracts across statements by default),
// which moves the rare element that sits on a rounding boundary. Quantized bytes stay the same in every build.
inline float opaque(float v) {
#if defined(__GNUC__)
    __asm__("" : "+m"(v));
#endif
    return v;
}

// ---- per-type traits ----------------------------------------------------------------------------------------------
// Each type provides:
//   kType, kBlockSize, kBlockBytes   ggml's block geometry (block size 1 for F32 / F16)
//   kStepBytes                       bytes of one 32-element step of a row
//   kScaled                          a step carries a scale that multiplies its partial dot product
//   kAnyLength                       rows need not be whole steps (F32 / F16): the remainder is a scalar tail
//   quantize, dequantize             whole rows
//   decode, scale                    one step as 32 unscaled floats, and its scale
//   element                          one element (the tail of F32 / F16 rows)
//   decode8, scale8                  under TANDEM_QUANT_SIMD: the same into four 8-float registers

struct F32Traits {
    static constexpr GgmlType kType = GgmlType::F32;
    static constexpr int64_t kBlockSize = 1;
    static constexpr size_t kBlockBytes = sizeof(float);
    static constexpr size_t kStepBytes = kStep * sizeof(float);
    static constexpr bool kScaled = false;
    static constexpr bool kAnyLength = true;

    static void quantize(const float* src, void* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
    static void dequantize(const void* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
    static void decode(const uint8_t* step, float* w) { std::memcpy(w, step, kStep * sizeof(float)); }
    static float element(const uint8_t* row, int64_t j) {
        float v;
        std::memcpy(&v, row + j * sizeof(float), sizeof v);
        return v;
    }
#ifdef TANDEM_QUANT_SIMD
    static TANDEM_ALWAYS_INLINE void decode8(const uint8_t* step, __m256 w[4]) {
        const float* p = reinterpret_cast<const float*>(step);
        for (int k = 0; k < 4; ++k) w[k] = _mm256_loadu_ps(p + 8 * k);
    }
#endif
};

struct F16Traits {
    static constexpr GgmlType kType = GgmlType::F16;
    static constexpr int64_t kBlockSize = 1;
    static constexpr size_t kBlockBytes = sizeof(uint16_t);
    static constexpr size_t kStepBytes = kStep * sizeof(uint16_t);
    static constexpr bool kScaled = false;
    static constexpr bool kAnyLength = true;

    static void quantize(const float* src, void* dst, int64_t n) {
        uint16_t* out = static_cast<uint16_t*>(dst);
        int64_t j = 0;
#ifdef TANDEM_QUANT_SIMD
        for (; j + 8 <= n; j += 8)
            _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j),
                             _mm256_cvtps_ph(_mm256_loadu_ps(src + j), _MM_FROUND_TO_NEAREST_INT));
#endif
        for (; j < n; ++j) out[j] = fp32_to_fp16(src[j]);
    }
    static void dequantize(const void* src, float* dst, int64_t n) {
        const uint16_t* in = static_cast<const uint16_t*>(src);
        int64_t j = 0;
#ifdef TANDEM_QUANT_SIMD
        for (; j + 8 <= n; j += 8)
            _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + j))));
#endif
        for (; j < n; ++j) dst[j] = fp16_to_fp32(in[j]);
    }
    static void decode(const uint8_t* step, float* w) {
        for (int j = 0; j < kStep; ++j) w[j] = fp16_to_fp32(load_u16(step + 2 * j));
    }
    static float element(const uint8_t* row, int64_t j) { return fp16_to_fp32(load_u16(row + 2 * j)); }
#ifdef TANDEM_QUANT_SIMD
    static TANDEM_ALWAYS_INLINE void decode8(const uint8_t* step, __m256 w[4]) {
        for (int k = 0; k < 4; ++k)
            w[k] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(step + 16 * k)));
    }
#endif
};

struct Q8_0Traits {
    static constexpr GgmlType kType = GgmlType::Q8_0;
    static constexpr int64_t kBlockSize = 32;
    static constexpr size_t kBlockBytes = sizeof(BlockQ8_0);
    static constexpr size_t kStepBytes = kBlockBytes;
    static constexpr bool kScaled = true;
    static constexpr bool kAnyLength = false;

    // ggml's quantize_row_q8_0_ref: d = amax / 127, q = round(x / d) (computed as x * (1/d), as ggml does, so the
    // bytes match llama.cpp's). The codes use the fp32 d; the stored d is its fp16 rounding.
    static void quantize(const float* src, void* dst, int64_t n) {
        BlockQ8_0* out = static_cast<BlockQ8_0*>(dst);
        for (int64_t b = 0; b < n / 32; ++b) {
            const float* x = src + b * 32;
            float amax = 0.0f;
            for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
            const float d = amax / 127.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            out[b].d = fp32_to_fp16(d);
            for (int j = 0; j < 32; ++j) out[b].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
        }
    }
    static void dequantize(const void* src, float* dst, int64_t n) {
        const BlockQ8_0* in = static_cast<const BlockQ8_0*>(src);
        for (int64_t b = 0; b < n / 32; ++b) {
            const float d = fp16_to_fp32(in[b].d);
            for (int j = 0; j < 32; ++j) dst[b * 32 + j] = static_cast<float>(in[b].qs[j]) * d;
        }
    }
    static void decode(const uint8_t* step, float* w) {
        const BlockQ8_0* blk = reinterpret_cast<const BlockQ8_0*>(step);
        for (int j = 0; j < 32; ++j) w[j] = static_cast<float>(blk->qs[j]);
    }
    static float scale(const uint8_t* step) { return fp16_to_fp32(load_u16(step)); }
#ifdef TANDEM_QUANT_SIMD
    static TANDEM_ALWAYS_INLINE void decode8(const uint8_t* step, __m256 w[4]) {
        const uint8_t* qs = step + offsetof(BlockQ8_0, qs);
        for (int k = 0; k < 4; ++k)
            w[k] = _mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8 * k))));
    }
    static TANDEM_ALWAYS_INLINE __m256 scale8(const uint8_t* step) {
        return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(load_u16(step))));
    }
#endif
};

#ifdef TANDEM_QUANT_SIMD
// The vector twin of opaque(): a register barrier that keeps a product rounded before the add that follows (GCC
// fuses _mm256_add_ps(_mm256_mul_ps(...)) into an FMA too).
TANDEM_ALWAYS_INLINE __m256 opaque_ps(__m256 v) {
    __asm__("" : "+x"(v));
    return v;
}

// quantize_row_q4_0_scalar's bytes, a block per iteration in AVX2 (a draft's weights are requantized at load,
// 360M elements for the 0.5B: the scalar loop, with its product forced through memory, took 60% of that). The
// element of largest magnitude is the first one equal to the maximum of |x| (the scalar loop keeps the first of
// ties); products and sums are the same IEEE operations, and cvttps truncates as the cast does. Rows hold no NaN.
inline void quantize_q4_0_avx2(const float* src, void* dst, int64_t n) {
    BlockQ4_0* out = static_cast<BlockQ4_0*>(dst);
    const __m256 sign = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(8.5f);
    const __m256i fifteen = _mm256_set1_epi32(15);
    for (int64_t b = 0; b < n / 32; ++b) {
        const float* x = src + b * 32;
        __m256 v[4], a[4];
        for (int i = 0; i < 4; ++i) {
            v[i] = _mm256_loadu_ps(x + 8 * i);
            a[i] = _mm256_andnot_ps(sign, v[i]);
        }
        const __m256 m8 = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float amax = _mm_cvtss_f32(m);
        float max = 0.0f;
        if (amax > 0.0f) {
            const __m256 am = _mm256_set1_ps(amax);
            uint32_t first = 0;
            for (int i = 0; i < 4; ++i)
                first |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a[i], am, _CMP_EQ_OQ))) << (8 * i);
            max = x[std::countr_zero(first)];
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        out[b].d = fp32_to_fp16(d);
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int i = 0; i < 4; ++i)
            q[i] = _mm256_min_epi32(fifteen, _mm256_cvttps_epi32(_mm256_add_ps(opaque_ps(_mm256_mul_ps(v[i], vid)), half)));
        // Byte j: code j low, code j + 16 high.
        const __m256i c0 = _mm256_or_si256(q[0], _mm256_slli_epi32(q[2], 4));  // bytes 0..7
        const __m256i c1 = _mm256_or_si256(q[1], _mm256_slli_epi32(q[3], 4));  // bytes 8..15
        __m256i p = _mm256_packus_epi32(c0, c1);  // 16-bit: c0 0..3, c1 0..3 | c0 4..7, c1 4..7
        p = _mm256_permute4x64_epi64(p, 0xD8);    // c0 0..7 | c1 0..7
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out[b].qs),
                         _mm_packus_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1)));
    }
}
#endif

struct Q4_0Traits {
    static constexpr GgmlType kType = GgmlType::Q4_0;
    static constexpr int64_t kBlockSize = 32;
    static constexpr size_t kBlockBytes = sizeof(BlockQ4_0);
    static constexpr size_t kStepBytes = kBlockBytes;
    static constexpr bool kScaled = true;
    static constexpr bool kAnyLength = false;

    static void quantize(const float* src, void* dst, int64_t n) {
#ifdef TANDEM_QUANT_SIMD
        quantize_q4_0_avx2(src, dst, n);
#else
        quantize_row_q4_0_scalar(src, dst, n);
#endif
    }
    static void dequantize(const void* src, float* dst, int64_t n) {
        const BlockQ4_0* in = static_cast<const BlockQ4_0*>(src);
        for (int64_t b = 0; b < n / 32; ++b) {
            const float d = fp16_to_fp32(in[b].d);
            for (int j = 0; j < 16; ++j) {
                dst[b * 32 + j] = static_cast<float>((in[b].qs[j] & 0xF) - 8) * d;
                dst[b * 32 + j + 16] = static_cast<float>((in[b].qs[j] >> 4) - 8) * d;
            }
        }
    }
    static void decode(const uint8_t* step, float* w) {
        const BlockQ4_0* blk = reinterpret_cast<const BlockQ4_0*>(step);
        for (int j = 0; j < 16; ++j) {
            w[j] = static_cast<float>((blk->qs[j] & 0xF) - 8);
            w[j + 16] = static_cast<float>((blk->qs[j] >> 4) - 8);
        }
    }
    static float scale(const uint8_t* step) { return fp16_to_fp32(load_u16(step)); }
#ifdef TANDEM_QUANT_SIMD
    // Bytes 0..7 and 8..15 are widened to 32-bit lanes; their low nibbles are elements 0..15 and their high
    // nibbles elements 16..31. The codes minus 8 convert to floats exactly.
    static TANDEM_ALWAYS_INLINE void decode8(const uint8_t* step, __m256 w[4]) {
        const uint8_t* qs = step + offsetof(BlockQ4_0, qs);
        const __m256i bytes_lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
        const __m256i bytes_hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)));
        const __m256i nibble = _mm256_set1_epi32(0xF), eight = _mm256_set1_epi32(8);
        w[0] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(bytes_lo, nibble), eight));
        w[1] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(bytes_hi, nibble), eight));
        w[2] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(bytes_lo, 4), eight));
        w[3] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(bytes_hi, 4), eight));
    }
    static TANDEM_ALWAYS_INLINE __m256 scale8(const uint8_t* step) {
        return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(load_u16(step))));
    }
#endif
};

struct BF16Traits {
    static constexpr GgmlType kType = GgmlType::BF16;
    static constexpr int64_t kBlockSize = 1;
    static constexpr size_t kBlockBytes = sizeof(uint16_t);
    static constexpr size_t kStepBytes = kStep * sizeof(uint16_t);
    static constexpr bool kScaled = false;
    static constexpr bool kAnyLength = true;

    // bfloat16 is the upper half of a binary32, so widening is a shift and exact.
    static float value(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }
    static void dequantize(const void* src, float* dst, int64_t n) {
        const uint8_t* in = static_cast<const uint8_t*>(src);
        for (int64_t j = 0; j < n; ++j) dst[j] = value(load_u16(in + 2 * j));
    }
    static void decode(const uint8_t* step, float* w) {
        for (int j = 0; j < kStep; ++j) w[j] = value(load_u16(step + 2 * j));
    }
    static float element(const uint8_t* row, int64_t j) { return value(load_u16(row + 2 * j)); }
#ifdef TANDEM_QUANT_SIMD
    static TANDEM_ALWAYS_INLINE void decode8(const uint8_t* step, __m256 w[4]) {
        for (int k = 0; k < 4; ++k)
            w[k] = _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(step + 16 * k))), 16));
    }
#endif
};

// ---- block types read from files (Q4_1, Q5_0, Q5_1 and the k-quants) ----------------------------------------------
// These go through a second pair of templates (tile_blocks_*), built around a block rather than a 32-element step:
//   kBlockSize, kBlockBytes, kSteps   geometry; kSteps = kBlockSize / 32
//   dequantize                        whole rows, with ggml's (and the gguf package's) float operations in the same
//                                     order, so the values are bitwise the reference ones
//   Ctx, prepare(blk, ctx)            (SIMD) the block's scales decoded once as floats: d[] per 32-element step, or
//                                     per 16-element half-step when kHalfScales; mins, when the type has them
//   decode8<S>(blk, w)                (SIMD) step S's 32 integer codes as floats, exactly
// A min (value = d*q - m, or + m) is not applied per element: sum(w x) = d sum(q x) - m sum(x), and the 16- or
// 32-element sums of x (kMinGroup) are computed once per token for the whole call, which makes the min cost one
// FMA per block instead of one per 8 weights. The same sums are used whatever the batch, so invariance holds.
//
// The opaque() below keeps a product rounded before the add that follows, as numpy and ggml's C reference do; a
// fused multiply-add would change the last bit of some values.

#ifdef TANDEM_QUANT_SIMD
// 8 bytes widened to 8 int32 lanes.
TANDEM_ALWAYS_INLINE __m256i load8_u8(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
TANDEM_ALWAYS_INLINE __m256 half_to_m256(uint16_t h) {
    return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(h)));
}
// 32 int8 codes, in element order in the bytes of v, as four 8-float registers (exact). Building the codes at byte
// level first and widening once costs about a third of the instructions of combining the bit fields in 32-bit
// lanes, for the types whose codes have more than one field (Q5_*, Q6_K, Q3_K).
TANDEM_ALWAYS_INLINE void i8x32_to_ps(__m256i v, __m256 w[4]) {
    const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    w[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    w[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(lo, lo)));
    w[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    w[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(hi, hi)));
}
// Byte e = 0xFF where bit e of x is set, 0 elsewhere (as ggml's bytes_from_bits_32).
TANDEM_ALWAYS_INLINE __m256i bytes_from_bits_32(uint32_t x) {
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x)), shuf);
    return _mm256_cmpeq_epi8(_mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)), _mm256_set1_epi64x(-1));
}
// Q4_0-style qs[16] as 32 bytes: low nibbles are elements 0..15, high nibbles 16..31.
TANDEM_ALWAYS_INLINE __m256i nibble_bytes32(const uint8_t* qs) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0xF));
}
TANDEM_ALWAYS_INLINE __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
// Bytes shifted by N bits (left for N > 0), in 16-bit lanes: the bits that cross into a neighbouring byte must be
// masked off by the caller.
template <int N>
TANDEM_ALWAYS_INLINE __m256i shift_bytes(__m256i v) {
    if constexpr (N > 0) return _mm256_slli_epi16(v, N);
    else if constexpr (N < 0) return _mm256_srli_epi16(v, -N);
    else return v;
}

// The 32 nibbles of a Q4_0-style qs[16] in element order: low nibbles are elements 0..15, high ones 16..31.
TANDEM_ALWAYS_INLINE void nibbles32(const uint8_t* qs, __m256i n[4]) {
    const __m256i lo = load8_u8(qs), hi = load8_u8(qs + 8), mask = _mm256_set1_epi32(0xF);
    n[0] = _mm256_and_si256(lo, mask);
    n[1] = _mm256_and_si256(hi, mask);
    n[2] = _mm256_srli_epi32(lo, 4);
    n[3] = _mm256_srli_epi32(hi, 4);
}
#endif

struct Q4_1Traits {
    static constexpr GgmlType kType = GgmlType::Q4_1;
    static constexpr int64_t kBlockSize = 32;
    static constexpr size_t kBlockBytes = sizeof(BlockQ4_1);
    static constexpr int kSteps = 1;
    static constexpr bool kHalfScales = false;
    static constexpr int kMinGroup = 32, kMinVecs = 0;
    static constexpr bool kScalarMin = true;

    static void dequantize(const void* src, float* dst, int64_t n) {
        const BlockQ4_1* in = static_cast<const BlockQ4_1*>(src);
        for (int64_t b = 0; b < n / 32; ++b) {
            const float d = fp16_to_fp32(in[b].d), m = fp16_to_fp32(in[b].m);
            for (int j = 0; j < 16; ++j) {
                dst[b * 32 + j] = opaque(static_cast<float>(in[b].qs[j] & 0xF) * d) + m;
                dst[b * 32 + j + 16] = opaque(static_cast<float>(in[b].qs[j] >> 4) * d) + m;
            }
        }
    }
#ifdef TANDEM_QUANT_SIMD
    struct Ctx {
        float d[1];
        float m;
    };
    static TANDEM_ALWAYS_INLINE void prepare(const uint8_t* blk, Ctx& c) {
        c.d[0] = fp16_to_fp32(load_u16(blk));
        c.m = fp16_to_fp32(load_u16(blk + 2));
    }
    template <int S>
    static TANDEM_ALWAYS_INLINE void decode8(const uint8_t* blk, __m256 w[4]) {
        __m256i n[4];
        nibbles32(blk + offsetof(BlockQ4_1, qs), n);
        for (int k = 0; k < 4; ++k) w[k] = _mm256_cvtepi32_ps(n[k]);
    }
#endif
};

struct Q5_0Traits {
    static constexpr GgmlType kType = GgmlType::Q5_0;
    static constexpr int64_t kBlockSize = 32;
    static constexpr size_t kBlockBytes = sizeof(BlockQ5_0);
    static constexpr int kSteps = 1;
    static constexpr bool kHalfScales = false;
    static constexpr int kMinGroup = 0, kMinVecs = 0;
    static constexpr bool kScalarMin = false;

    static void dequantize(const void* src, float* dst, int64_t n) {
        const BlockQ5_0* in = static_cast<const BlockQ5_0*>(src);
        for (int64_t b = 0; b < n / 32; ++b) {
            const float d = fp16_to_fp32(in[b].d);
            uint32_t qh;
            std::memcpy(&qh, in[b].qh, 4);
            for (int j = 0; j < 16; ++j) {
                const int q0 = (in[b].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
                const int q1 = (in[b].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
                dst[b * 32 + j] = static_cast<float>(q0 - 16) * d;
                dst[b * 32 + j + 16] = static_cast<float>(q1 - 16) * d;
            }
        }
    }
#ifdef TANDEM_QUANT_SIMD
    struct Ctx {
        float d[1];
    };
    static TANDEM_ALWAYS_INLINE void prepare(const uint8_t* blk, Ctx& c) { c.d[0] = fp16_to_fp32(load_u16(blk)); }
    template <int S>
    static TANDEM_ALWAYS_INLINE void decode8(const uint8_t* blk, __m256 w[4]) {
        uint32_t bits;
        std::memcpy(&bits, blk + offsetof(BlockQ5_0, qh), 4);
        // (q | 16) - 16 = q where the fifth bit is set; q - 16 = int8(q | 0xF0) where it is clear.
        const __m256i high = _mm256_andnot_si256(bytes_from_bits_32(bits), _mm256_set1_epi8(static_cast<char>(0xF0)));
        i8x32_to_ps(_mm256_or_si256(nibble_bytes32(blk + offsetof(BlockQ5_0, qs)), high), w);
    }
#endif
};

struct Q5_1Traits {
    static constexpr GgmlType kType = GgmlType::Q5_1;
    static constexpr int64_t kBlockSize = 32;
    static constexpr size_t kBlockBytes = sizeof(BlockQ5_1);
    static constexpr int kSteps = 1;
    static constexpr bool kHalfScales = false;
    static constexpr int kMinGroup = 32, kMinVecs = 0;
    static constexpr bool kScalarMin = true;

    static void dequantize(const void* src, float* dst, int64_t n) {
        const BlockQ5_1* in = static_cast<const BlockQ5_1*>(src);
        for (int64_t b = 0; b < n / 32; ++b) {
            const float d = fp16_to_fp32(in[b].d), m = fp16_to_fp32(in[b].m);
            uint32_t qh;
            std::memcpy(&qh, in[b].qh, 4);
            for (int j = 0; j < 16; ++j) {
                const int q0 = (in[b].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
                const int q1 = (in[b].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
                dst[b * 32 + j] = opaque(static_cast<float>(q0) * d) + m;
                dst[b * 32 + j + 16] = opaque(static_cast<float>(q1) * d) + m;
            }
        }
    }
#ifdef TANDEM_QUANT_SIMD
    struct Ctx {
        float d[1];
        float m;
    };
    static TANDEM_ALWAYS_INLINE void prepare(const uint8_t* blk, Ctx& c) {
        c.d[0] = fp16_to_fp32(load_u16(blk));
        c.m = fp16_to_fp32(load_u16(blk + 2));
    }
    template <int S>
    static TANDEM_ALWAYS_INLINE void decode8(const uint8_t* blk, __m256 w[4]) {
        uint32_t bits;
        std::memcpy(&bits, blk + offsetof(BlockQ5_1, qh), 4);
        const __m256i high = _mm256_and_si256(bytes_from_bits_32(bits), _mm256_set1_epi8(16));
        i8x32_to_ps(_mm256_or_si256(nibble_bytes32(blk + offsetof(BlockQ5_1, qs)), high), w);
    }
#endif
};

struct Q2_KTraits {
    static constexpr GgmlType kType = GgmlType::Q2_K;
    static constexpr int64_t kBlockSize = kQK_K;
    static constexpr size_t kBlockBytes = sizeof(BlockQ2_K);
    static constexpr int kSteps = 8;
    static constexpr bool kHalfScales = true;
    static constexpr int kMinGroup = 16, kMinVecs = 2;
    static constexpr bool kScalarMin = false;

    static void dequantize(const void* src, float* dst, int64_t n) {
        const BlockQ2_K* in = static_cast<const BlockQ2_K*>(src);
        for (int64_t b = 0; b < n / kQK_K; ++b) {
            const float d = fp16_to_fp32(in[b].d), dmin = fp16_to_fp32(in[b].dmin);
            float* y = dst + b * kQK_K;
            for (int c = 0; c < 8; ++c) {
                const uint8_t* q = in[b].qs + 32 * (c / 4);
                const int shift = 2 * (c % 4);
                for (int h = 0; h < 2; ++h) {
                    const int sc = in[b].scales[2 * c + h];
                    const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
                    for (int l = 16 * h; l < 16 * h + 16; ++l)
                        y[32 * c + l] = opaque(dl * static_cast<float>((q[l] >> shift) & 3)) - ml;
                }
            }
        }
    }
#ifdef TANDEM_QUANT_SIMD
    struct Ctx {
        float d[16];
        __m256 mv[2];  // -dmin * min, per 16-element sub-block
    };
    static TANDEM_ALWAYS_INLINE void prepare(const uint8_t* blk, Ctx& c) {
        const __m256 d = half_to_m256(load_u16(blk + offsetof(BlockQ2_K, d)));
        const __m256 neg_dmin = _mm256_xor_ps(half_to_m256(load_u16(blk + offsetof(BlockQ2_K, dmin))),
                                              _mm256_set1_ps(-0.0f));
        for (int h = 0; h < 2; ++h) {
            const __m256i s = load8_u8(blk + 8 * h);
            _mm256_storeu_ps(c.d + 8 * h,
                             _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(s, _mm256_set1_epi32(0xF)))));
            c.mv[h] = _mm256_mul_ps(neg_dmin, _mm256_cvtepi32_ps(_mm256_srli_epi32(s, 4)));
        }
    }
    template <int S>
    static TANDEM_ALWAYS_INLINE void decode8(const uint8_t* blk, __m256 w[4]) {
        const uint8_t* q = blk + offsetof(BlockQ2_K, qs) + 32 * (S / 4);
        for (int k = 0; k < 4; ++k)
            w[k] = _mm256_cvtepi32_ps(
                _mm256_and_si256(_mm256_srli_epi32(load8_u8(q + 8 * k), 2 * (S % 4)), _mm256_set1_epi32(3)));
    }
#endif
};

struct Q3_KTraits {
    static constexpr GgmlType kType = GgmlType::Q3_K;
    static constexpr int64_t kBlockSize = kQK_K;
    static constexpr size_t kBlockBytes = sizeof(BlockQ3_K);
    static constexpr int kSteps = 8;
    static constexpr bool kHalfScales = true;
    static constexpr int kMinGroup = 0, kMinVecs = 0;
    static constexpr bool kScalarMin = false;

    static void dequantize(const void* src, float* dst, int64_t n) {
        const BlockQ3_K* in = static_cast<const BlockQ3_K*>(src);
        for (int64_t b = 0; b < n / kQK_K; ++b) {
            const float d = fp16_to_fp32(in[b].d);
            int sc[16];
            unpack_scales_q3_k(in[b].scales, sc);
            float* y = dst + b * kQK_K;
            for (int c = 0; c < 8; ++c) {
                const uint8_t* q = in[b].qs + 32 * (c / 4);
                const int shift = 2 * (c % 4);
                for (int h = 0; h < 2; ++h) {
                    const float dl = d * static_cast<float>(sc[2 * c + h]);
                    for (int l = 16 * h; l < 16 * h + 16; ++l) {
                        const int v = ((q[l] >> shift) & 3) - (((in[b].hmask[l] >> c) & 1) ? 0 : 4);
                        y[32 * c + l] = dl * static_cast<float>(v);
                    }
                }
            }
        }
    }
#ifdef TANDEM_QUANT_SIMD
    struct Ctx {
        float d[16];
    };
    static TANDEM_ALWAYS_INLINE void prepare(const uint8_t* blk, Ctx& c) {
        int sc[16];
        unpack_scales_q3_k(blk + offsetof(BlockQ3_K, scales), sc);
        const __m256 d = half_to_m256(load_u16(blk + offsetof(BlockQ3_K, d)));
        for (int h = 0; h < 2; ++h)
            _mm256_storeu_ps(c.d + 8 * h,
                             _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_loadu_si256(
                                                  reinterpret_cast<const __m256i*>(sc + 8 * h)))));
    }
    template <int S>
    static TANDEM_ALWAYS_INLINE void decode8(const uint8_t* blk, __m256 w[4]) {
        const uint8_t* q = blk + offsetof(BlockQ3_K, qs) + 32 * (S / 4);
        const uint8_t* hm = blk + offsetof(BlockQ3_K, hmask);
        const __m256i lo = _mm256_and_si256(shift_bytes<-2 * (S % 4)>(load32(q)), _mm256_set1_epi8(3));
        // 4 is subtracted where bit S of hmask is clear.
        const __m256i clear = _mm256_cmpeq_epi8(_mm256_and_si256(load32(hm), _mm256_set1_epi8(static_cast<char>(1 << S))),
                                                _mm256_setzero_si256());
        i8x32_to_ps(_mm256_sub_epi8(lo, _mm256_and_si256(clear, _mm256_set1_epi8(4))), w);
    }
#endif
};

struct Q4_KTraits {
    static constexpr GgmlType kType = GgmlType::Q4_K;
    static constexpr int64_t kBlockSize = kQK_K;
    static constexpr size_t kBlockBytes = sizeof(BlockQ4_K);
    static constexpr int kSteps = 8;
    static constexpr bool kHalfScales = false;
    static constexpr int kMinGroup = 32, kMinVecs = 1;
    static constexpr bool kScalarMin = false;

    static void dequantize(const void* src, float* dst, int64_t n) {
        const BlockQ4_K* in = static_cast<const BlockQ4_K*>(src);
        for (int64_t b = 0; b < n / kQK_K; ++b) {
            const float d = fp16_to_fp32(in[b].d), dmin = fp16_to_fp32(in[b].dmin);
            uint8_t sc[8], m[8];
            unpack_scale_min_k4(in[b].scales, sc, m);
            float* y = dst + b * kQK_K;
            for (int c = 0; c < 8; ++c) {
                const float dl = d * static_cast<float>(sc[c]), ml = dmin * static_cast<float>(m[c]);
                const uint8_t* q = in[b].qs + 32 * (c / 2);
                const int shift = 4 * (c % 2);
                for (int l = 0; l < 32; ++l)
                    y[32 * c + l] = opaque(dl * static_cast<float>((q[l] >> shift) & 0xF)) - ml;
            }
        }
    }
#ifdef TANDEM_QUANT_SIMD
    struct Ctx {
        float d[8];
        __m256 mv[1];  // -dmin * min per 32-element sub-block
    };
    // ggml's 32-bit unpacking of the 12 scale bytes: afterwards bytes 0..7 are the scales, 8..15 the mins.
    static TANDEM_ALWAYS_INLINE void prepare_k4(const uint8_t* blk, size_t d_off, size_t scales_off, Ctx& c) {
        uint32_t u[4];
        std::memcpy(u, blk + scales_off, 12);
        constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
        u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
        const uint32_t mins_lo = u[1] & kmask1;
        u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
        u[2] = mins_lo;
        u[0] &= kmask1;
        const __m256 d = half_to_m256(load_u16(blk + d_off));
        const __m256 neg_dmin = _mm256_xor_ps(half_to_m256(load_u16(blk + d_off + 2)), _mm256_set1_ps(-0.0f));
        const uint8_t* bytes = reinterpret_cast<const uint8_t*>(u);
        _mm256_storeu_ps(c.d, _mm256_mul_ps(d, _mm256_cvtepi32_ps(load8_u8(bytes))));
        c.mv[0] = _mm256_mul_ps(neg_dmin, _mm256_cvtepi32_ps(load8_u8(bytes + 8)));
    }
    static TANDEM_ALWAYS_INLINE void prepare(const uint8_t* blk, Ctx& c) {
        prepare_k4(blk, offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, scales), c);
    }
    template <int S>
    static TANDEM_ALWAYS_INLINE void decode8(const uint8_t* blk, __m256 w[4]) {
        const uint8_t* q = blk + offsetof(BlockQ4_K, qs) + 32 * (S / 2);
        for (int k = 0; k < 4; ++k) {
            const __m256i b = load8_u8(q + 8 * k);
            w[k] = _mm256_cvtepi32_ps(S % 2 ? _mm256_srli_epi32(b, 4) : _mm256_and_si256(b, _mm256_set1_epi32(0xF)));
        }
    }
#endif
};

struct Q5_KTraits {
    static constexpr GgmlType kType = GgmlType::Q5_K;
    static constexpr int64_t kBlockSize = kQK_K;
    static constexpr size_t kBlockBytes = sizeof(BlockQ5_K);
    static constexpr int kSteps = 8;
    static constexpr bool kHalfScales = false;
    static constexpr int kMinGroup = 32, kMinVecs = 1;
    static constexpr bool kScalarMin = false;

    static void dequantize(const void* src, float* dst, int64_t n) {
        const BlockQ5_K* in = static_cast<const BlockQ5_K*>(src);
        for (int64_t b = 0; b < n / kQK_K; ++b) {
            const float d = fp16_to_fp32(in[b].d), dmin = fp16_to_fp32(in[b].dmin);
            uint8_t sc[8], m[8];
            unpack_scale_min_k4(in[b].scales, sc, m);
            float* y = dst + b * kQK_K;
            for (int c = 0; c < 8; ++c) {
                const float dl = d * static_cast<float>(sc[c]), ml = dmin * static_cast<float>(m[c]);
                const uint8_t* q = in[b].qs + 32 * (c / 2);
                const int shift = 4 * (c % 2);
                for (int l = 0; l < 32; ++l) {
                    const int v = ((q[l] >> shift) & 0xF) | (((in[b].qh[l] >> c) & 1) << 4);
                    y[32 * c + l] = opaque(dl * static_cast<float>(v)) - ml;
                }
            }
        }
    }
#ifdef TANDEM_QUANT_SIMD
    using Ctx = Q4_KTraits::Ctx;
    static TANDEM_ALWAYS_INLINE void prepare(const uint8_t* blk, Ctx& c) {
        Q4_KTraits::prepare_k4(blk, offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, scales), c);
    }
    template <int S>
    static TANDEM_ALWAYS_INLINE void decode8(const uint8_t* blk, __m256 w[4]) {
        const uint8_t* q = blk + offsetof(BlockQ5_K, qs) + 32 * (S / 2);
        const uint8_t* qh = blk + offsetof(BlockQ5_K, qh);
        const __m256i lo = _mm256_and_si256(shift_bytes<S % 2 ? -4 : 0>(load32(q)), _mm256_set1_epi8(0xF));
        const __m256i hi = _mm256_and_si256(shift_bytes<4 - S>(load32(qh)), _mm256_set1_epi8(0x10));
        i8x32_to_ps(_mm256_or_si256(lo, hi), w);
    }
#endif
};

struct Q6_KTraits {
    static constexpr GgmlType kType = GgmlType::Q6_K;
    static constexpr int64_t kBlockSize = kQK_K;
    static constexpr size_t kBlockBytes = sizeof(BlockQ6_K);
    static constexpr int kSteps = 8;
    static constexpr bool kHalfScales = true;
    static constexpr int kMinGroup = 0, kMinVecs = 0;
    static constexpr bool kScalarMin = false;

    static void dequantize(const void* src, float* dst, int64_t n) {
        const BlockQ6_K* in = static_cast<const BlockQ6_K*>(src);
        for (int64_t b = 0; b < n / kQK_K; ++b) {
            const float d = fp16_to_fp32(in[b].d);
            float* y = dst + b * kQK_K;
            for (int c = 0; c < 8; ++c) {
                const int h = c / 4, k = c % 4;
                const uint8_t* ql = in[b].ql + 64 * h + 32 * (k % 2);
                const uint8_t* qh = in[b].qh + 32 * h;
                for (int half = 0; half < 2; ++half) {
                    const float dl = d * static_cast<float>(in[b].scales[2 * c + half]);
                    for (int l = 16 * half; l < 16 * half + 16; ++l) {
                        const int v = ((ql[l] >> (4 * (k / 2))) & 0xF) | (((qh[l] >> (2 * k)) & 3) << 4);
                        y[32 * c + l] = dl * static_cast<float>(v - 32);
                    }
                }
            }
        }
    }
#ifdef TANDEM_QUANT_SIMD
    struct Ctx {
        float d[16];
    };
    static TANDEM_ALWAYS_INLINE void prepare(const uint8_t* blk, Ctx& c) {
        const __m256 d = half_to_m256(load_u16(blk + offsetof(BlockQ6_K, d)));
        const uint8_t* s = blk + offsetof(BlockQ6_K, scales);
        for (int h = 0; h < 2; ++h)
            _mm256_storeu_ps(c.d + 8 * h,
                             _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                                  reinterpret_cast<const __m128i*>(s + 8 * h))))));
    }
    template <int S>
    static TANDEM_ALWAYS_INLINE void decode8(const uint8_t* blk, __m256 w[4]) {
        constexpr int h = S / 4, k = S % 4;
        const uint8_t* ql = blk + offsetof(BlockQ6_K, ql) + 64 * h + 32 * (k % 2);
        const uint8_t* qh = blk + offsetof(BlockQ6_K, qh) + 32 * h;
        const __m256i lo = _mm256_and_si256(shift_bytes<k / 2 ? -4 : 0>(load32(ql)), _mm256_set1_epi8(0xF));
        const __m256i hi = _mm256_and_si256(shift_bytes<4 - 2 * k>(load32(qh)), _mm256_set1_epi8(0x30));
        i8x32_to_ps(_mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(32)), w);
    }
#endif
};

}  // namespace tandem::cpu::quant_detail
