// Integer (8-bit activation) dot-product kernels of the k-quants Q2_K, Q3_K, Q4_K, Q5_K and Q6_K against Q8_K
// activations: one AVX2 kernel and one portable scalar kernel per type, and the table quant_q8.cpp looks them up in.
//
// The arithmetic, per 256-element super-block of a weight row and one token:
//   sumi = sum over sub-blocks j of  sc_j * sum(u * x)            u: the weight's unsigned code, x: the int8 code
//   summ = sum over sub-blocks j of  m_j * bsum_j                 (types with a min: Q2_K, Q4_K, Q5_K)
//   acc   = fma(d_w * d_x, float(sumi), acc)
//   acc_m = fma(dmin_w * d_x, float(summ), acc_m)                 (types with a min; the result is acc - acc_m)
// Both sums are exact int32 (the bounds are next to each type). The signed-code types (Q3_K: u - 4, Q6_K: u - 32)
// keep unsigned codes for maddubs and take the offset out through the activation sums: sc_j * sum((u - o) x) =
// sc_j * sum(u x) - o * sc_j * bsum_j, all in the same int32 sumi. Only two float operations per super-block and
// token, whose inputs are exact integers and the scales, so the float result depends on nothing but the order of
// the super-blocks. (The mins have their own accumulator, as in llama.cpp: it keeps the two fma chains apart.)
//
// Batch invariance (quant_q8.h) follows: an integer sum is the same whatever order it is added in, so the AVX2
// kernel is free to add the per-token int32 lanes in a tree shared by the tokens of a tile (tokens end up as the
// lanes of one float vector), and the float steps of a token are the same lane operations whatever T or its place
// in the tile. The scalar kernel computes the same integers and the same fmas per super-block, so it agrees with
// the AVX2 one bit for bit where std::fma is the hardware instruction (a build with AVX2 and FMA).
#include <cmath>
#include <cstddef>
#include <cstring>
#include <utility>

#include "cpu/fp16.h"
#include "cpu/quant.h"
#include "cpu/quant_q8_driver.h"
#include "cpu/unaligned.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TANDEM_Q8K_SIMD 1
#include <immintrin.h>
#endif

#define TANDEM_ALWAYS_INLINE inline __attribute__((always_inline))

namespace tandem::cpu::q8_detail {
namespace {

// Field offsets of a BlockQ8_K: d, then the 256 codes, then the 16 sums.
constexpr size_t kXd = offsetof(BlockQ8_K, d), kXqs = offsetof(BlockQ8_K, qs), kXbsums = offsetof(BlockQ8_K, bsums);
constexpr size_t kXBytes = sizeof(BlockQ8_K);

// Tokens per tile. Eight tokens' int32 accumulators take 8 of the 16 ymm registers, leaving room for the decoded
// 32-element chunk, its scales and temporaries; the per-token float accumulators are lanes of two more. Measured
// (4096 x 4096, one thread): 4, 6 and 8 tokens run at about 66, 70 and 75 GMAC/s for Q4_K; the tile is bound by
// the two multiply pipes (maddubs + madd per 32 products and token) more than by anything a larger tile amortises.
constexpr int kTile = 8;

// acc + a * b rounded once: the hardware fma when there is one (the AVX2 kernel's operation, so the two kernels
// agree), else the two roundings of a plain multiply and add (nothing can fuse them without FMA instructions).
TANDEM_ALWAYS_INLINE float fmadd(float a, float b, float acc) {
#if defined(__FMA__)
    return std::fma(a, b, acc);
#else
    return a * b + acc;
#endif
}

template <int... I, class F>
TANDEM_ALWAYS_INLINE void static_for(std::integer_sequence<int, I...>, F&& f) {
    (f(std::integral_constant<int, I>{}), ...);
}

// ---- portable kernel -----------------------------------------------------------------------------------------------
// Each type decodes a super-block into the form every type shares: 256 unsigned codes, a scale per 16 elements,
// the code offset (value = sc * (u - kOffset)) and, for the types with a min, a min per 16 elements.

struct Decoded {
    uint8_t u[kQK_K];
    int sc[16];
    int m[16];
    float d, dmin;
};

struct Q2_KScalar {
    static constexpr GgmlType kType = GgmlType::Q2_K;
    static constexpr size_t kBytes = sizeof(BlockQ2_K);
    static constexpr int kOffset = 0;
    static constexpr bool kHasMin = true;
    static void decode(const uint8_t* blk, Decoded& o) {
        const uint8_t* qs = blk + offsetof(BlockQ2_K, qs);
        for (int c = 0; c < 8; ++c)
            for (int l = 0; l < 32; ++l) o.u[32 * c + l] = (qs[32 * (c / 4) + l] >> (2 * (c % 4))) & 3;
        for (int j = 0; j < 16; ++j) {
            o.sc[j] = blk[j] & 0xF;
            o.m[j] = blk[j] >> 4;
        }
        o.d = fp16_to_fp32(load_u16(blk + offsetof(BlockQ2_K, d)));
        o.dmin = fp16_to_fp32(load_u16(blk + offsetof(BlockQ2_K, dmin)));
    }
};

struct Q3_KScalar {
    static constexpr GgmlType kType = GgmlType::Q3_K;
    static constexpr size_t kBytes = sizeof(BlockQ3_K);
    static constexpr int kOffset = 4;
    static constexpr bool kHasMin = false;
    static void decode(const uint8_t* blk, Decoded& o) {
        const uint8_t* qs = blk + offsetof(BlockQ3_K, qs);
        const uint8_t* hm = blk + offsetof(BlockQ3_K, hmask);
        // A set hmask bit means "no -4": u = low 2 bits + 4 * bit, value = u - 4.
        for (int c = 0; c < 8; ++c)
            for (int l = 0; l < 32; ++l)
                o.u[32 * c + l] = static_cast<uint8_t>(((qs[32 * (c / 4) + l] >> (2 * (c % 4))) & 3) |
                                                       (((hm[l] >> c) & 1) << 2));
        unpack_scales_q3_k(blk + offsetof(BlockQ3_K, scales), o.sc);
        o.d = fp16_to_fp32(load_u16(blk + offsetof(BlockQ3_K, d)));
        o.dmin = 0.0f;
    }
};

// Q4_K and Q5_K: scales and mins per 32 elements, spread here over the two 16-element halves.
template <GgmlType Type, class Block, bool kFifthBit>
struct QK4Scalar {
    static constexpr GgmlType kType = Type;
    static constexpr size_t kBytes = sizeof(Block);
    static constexpr int kOffset = 0;
    static constexpr bool kHasMin = true;
    static void decode(const uint8_t* blk, Decoded& o) {
        const uint8_t* qs = blk + offsetof(Block, qs);
        for (int c = 0; c < 8; ++c)
            for (int l = 0; l < 32; ++l) {
                int u = (qs[32 * (c / 2) + l] >> (4 * (c % 2))) & 0xF;
                if constexpr (kFifthBit) u |= ((blk[offsetof(BlockQ5_K, qh) + l] >> c) & 1) << 4;
                o.u[32 * c + l] = static_cast<uint8_t>(u);
            }
        uint8_t sc[8], m[8];
        unpack_scale_min_k4(blk + offsetof(Block, scales), sc, m);
        for (int j = 0; j < 16; ++j) {
            o.sc[j] = sc[j / 2];
            o.m[j] = m[j / 2];
        }
        o.d = fp16_to_fp32(load_u16(blk + offsetof(Block, d)));
        o.dmin = fp16_to_fp32(load_u16(blk + offsetof(Block, dmin)));
    }
};
using Q4_KScalar = QK4Scalar<GgmlType::Q4_K, BlockQ4_K, false>;
using Q5_KScalar = QK4Scalar<GgmlType::Q5_K, BlockQ5_K, true>;

struct Q6_KScalar {
    static constexpr GgmlType kType = GgmlType::Q6_K;
    static constexpr size_t kBytes = sizeof(BlockQ6_K);
    static constexpr int kOffset = 32;
    static constexpr bool kHasMin = false;
    static void decode(const uint8_t* blk, Decoded& o) {
        const uint8_t* ql = blk + offsetof(BlockQ6_K, ql);
        const uint8_t* qh = blk + offsetof(BlockQ6_K, qh);
        for (int c = 0; c < 8; ++c) {
            const int h = c / 4, k = c % 4;
            for (int l = 0; l < 32; ++l)
                o.u[32 * c + l] = static_cast<uint8_t>(((ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF) |
                                                       (((qh[32 * h + l] >> (2 * k)) & 3) << 4));
        }
        for (int j = 0; j < 16; ++j) o.sc[j] = static_cast<int8_t>(blk[offsetof(BlockQ6_K, scales) + j]);
        o.d = fp16_to_fp32(load_u16(blk + offsetof(BlockQ6_K, d)));
        o.dmin = 0.0f;
    }
};

template <class Ty>
struct ScalarKernel {
    static constexpr int kMaxTile = 4;  // the decode is shared by the tile; beyond 4 tokens it hardly matters here
    template <int T>
    static void tile(const uint8_t* row, int64_t cols, const uint8_t* xq, size_t xq_stride, float* out) {
        float acc[T] = {}, acc_m[T] = {};
        const int64_t n_blocks = cols / kQK_K;
        for (int64_t b = 0; b < n_blocks; ++b) {
            Decoded w;
            Ty::decode(row + b * Ty::kBytes, w);
            for (int t = 0; t < T; ++t) {
                const uint8_t* xb = xq + t * xq_stride + b * kXBytes;
                const int8_t* x = reinterpret_cast<const int8_t*>(xb + kXqs);
                int16_t bsums[16];
                std::memcpy(bsums, xb + kXbsums, sizeof bsums);
                // |sumi| <= 256 * 63 * 128 * 128 (Q6_K) < 2^31; every partial below is bounded by the same.
                int32_t sumi = 0, summ = 0;
                for (int j = 0; j < 16; ++j) {
                    int32_t s = 0;
                    for (int l = 16 * j; l < 16 * j + 16; ++l) s += w.u[l] * x[l];
                    sumi += w.sc[j] * (s - Ty::kOffset * bsums[j]);
                    if constexpr (Ty::kHasMin) summ += w.m[j] * bsums[j];
                }
                const float dx = load_f32(xb + kXd);
                acc[t] = fmadd(w.d * dx, static_cast<float>(sumi), acc[t]);
                if constexpr (Ty::kHasMin) acc_m[t] = fmadd(w.dmin * dx, static_cast<float>(summ), acc_m[t]);
            }
        }
        for (int t = 0; t < T; ++t) out[t] = Ty::kHasMin ? acc[t] - acc_m[t] : acc[t];
    }
};

// ---- AVX2 kernel ---------------------------------------------------------------------------------------------------
// A super-block is worked through in eight 32-element chunks. Each chunk's 32 unsigned codes are built once in a
// register, with the matching int16 scales (one per 16-element half: the 16 int16 products of maddubs are elements
// 0..15 in the low 128 bits and 16..31 in the high 128 bits), and then for each token
//   isum[t] += madd(maddubs(codes, x_t), scales)
// (maddubs: pairs of u8 * s8 summed to int16; madd: pairs of int16 * int16 summed to int32). After the eight chunks
// the offset or min terms come from one madd of the token's bsums with a per-16 multiplier vector, the 8 int32
// lanes of all tokens are added in one hadd tree (token t -> lane t), and the float update is one vector fma per
// accumulator for the whole tile.
//
// Every type provides, for a block:
//   kDOffset                       where d is (dmin follows it in the types with a min)
//   W prepare(blk)                 the scale vectors
//   codes<C>(blk, w)               chunk C's 32 codes as bytes (each <= 63, so maddubs cannot saturate: 2*63*128)
//   scale<C>(w)                    chunk C's int16 scales as above (not for kPrescaled types)
//   kPrescaled                     codes<C> are already multiplied by their scales (Q2_K, where they fit a byte)
//   w.mvec                         16 int16 multipliers of the bsums: the mins (kHasMin) or the scales (kOffset)
//   kOffsetShift                   log2 of the code offset (2 for Q3_K, 5 for Q6_K; 0: none)
#ifdef TANDEM_Q8K_SIMD

TANDEM_ALWAYS_INLINE __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
TANDEM_ALWAYS_INLINE __m128i load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// The bytes of v shifted by N bits (left for N > 0) in 16-bit lanes; bits that cross into the neighbouring byte
// are the caller's to mask off (every use keeps only bits that stay within their byte).
template <int N>
TANDEM_ALWAYS_INLINE __m256i shift_bytes(__m256i v) {
    if constexpr (N > 0) return _mm256_slli_epi16(v, N);
    else if constexpr (N < 0) return _mm256_srli_epi16(v, -N);
    else return v;
}

TANDEM_ALWAYS_INLINE __m256i mask8(int m) { return _mm256_set1_epi8(static_cast<char>(m)); }

// Chunk C's scales from 16 per-16 int16 scales s (sub-block j in lane j): chunk C uses sub-blocks 2C (low half)
// and 2C+1 (high half). lo / hi hold scales 0..7 / 8..15 in both 128-bit halves, and a byte shuffle within each
// half broadcasts the right one.
template <int C>
TANDEM_ALWAYS_INLINE __m256i scale_pair(__m256i lo, __m256i hi) {
    constexpr int k = 4 * (C % 4);
    const __m256i shuf = _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(((k + 3) << 8) | (k + 2))),
                                          _mm_set1_epi16(static_cast<short>(((k + 1) << 8) | k)));
    return _mm256_shuffle_epi8(C < 4 ? lo : hi, shuf);
}

// Per-16 int16 scales as the (lo, hi) pair scale_pair reads.
struct Scales16 {
    __m256i lo, hi;
};
TANDEM_ALWAYS_INLINE Scales16 split_scales(__m256i s) {
    return {_mm256_permute2x128_si256(s, s, 0x00), _mm256_permute2x128_si256(s, s, 0x11)};
}

struct Q2_KSimd {
    static constexpr int kOffsetShift = 0;
    static constexpr bool kHasMin = true;
    static constexpr size_t kDOffset = offsetof(BlockQ2_K, d);
    static constexpr bool kPrescaled = true;
    using Scalar = Q2_KScalar;
    struct W {
        Scales16 sc;
        __m256i mvec;
    };
    static TANDEM_ALWAYS_INLINE W prepare(const uint8_t* blk) {
        // Scales (low nibbles) and mins (high nibbles) are both 0..15; sumi <= 256 * 3 * 128 * 15.
        const __m128i v = load16(blk);
        const __m128i nib = _mm_set1_epi8(0xF);
        return {split_scales(_mm256_cvtepu8_epi16(_mm_and_si128(v, nib))),
                _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), nib))};
    }
    // The codes times their scales: 3 * 15 = 45 still fits a byte, and both bytes of a 16-bit lane belong to the
    // same sub-block, so one 16-bit multiply by the scale scales both without a carry between them.
    template <int C>
    static TANDEM_ALWAYS_INLINE __m256i codes(const uint8_t* blk, const W& w) {
        const __m256i u =
            _mm256_and_si256(shift_bytes<-2 * (C % 4)>(load32(blk + offsetof(BlockQ2_K, qs) + 32 * (C / 4))), mask8(3));
        return _mm256_mullo_epi16(u, scale_pair<C>(w.sc.lo, w.sc.hi));
    }
};

struct Q3_KSimd {
    static constexpr int kOffsetShift = 2;
    static constexpr bool kHasMin = false;
    static constexpr size_t kDOffset = offsetof(BlockQ3_K, d);
    static constexpr bool kPrescaled = false;
    using Scalar = Q3_KScalar;
    struct W {
        Scales16 sc;
        __m256i mvec;
    };
    static TANDEM_ALWAYS_INLINE W prepare(const uint8_t* blk) {
        // The 12 scale bytes end 2 bytes before the block does, so they are read as 8 + 4 bytes.
        const uint8_t* s = blk + offsetof(BlockQ3_K, scales);
        const __m128i lo8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s));
        uint32_t hi_bits;
        std::memcpy(&hi_bits, s + 8, 4);
        const __m128i nib = _mm_set1_epi8(0xF);
        // Low 4 bits: scales 0..7 from the low nibbles of bytes 0..7, scales 8..15 from their high nibbles.
        const __m128i low = _mm_unpacklo_epi64(_mm_and_si128(lo8, nib), _mm_and_si128(_mm_srli_epi16(lo8, 4), nib));
        // High 2 bits: scale i takes bits 2*(i/4) of byte 8 + i%4, i.e. each 32-bit group g of the broadcast word
        // shifted right by 2g (the two bits kept never cross a byte).
        const __m128i high = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(static_cast<int>(hi_bits)),
                                                          _mm_setr_epi32(0, 2, 4, 6)),
                                           _mm_set1_epi8(3));
        const __m128i sc8 = _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(high, 4)), _mm_set1_epi8(32));
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);  // -32..31; sumi <= 256 * 7 * 128 * 32 + 4 * 32 * 16 * 2048
        return {split_scales(sc16), sc16};
    }
    template <int C>
    static TANDEM_ALWAYS_INLINE __m256i codes(const uint8_t* blk, const W&) {
        const __m256i low = _mm256_and_si256(
            shift_bytes<-2 * (C % 4)>(load32(blk + offsetof(BlockQ3_K, qs) + 32 * (C / 4))), mask8(3));
        // Bit C of hmask[l] moved to bit 2: u = low + 4 * bit, the value is u - 4.
        const __m256i high = _mm256_and_si256(shift_bytes<2 - C>(load32(blk + offsetof(BlockQ3_K, hmask))), mask8(4));
        return _mm256_or_si256(low, high);
    }
    template <int C>
    static TANDEM_ALWAYS_INLINE __m256i scale(const W& w) {
        return scale_pair<C>(w.sc.lo, w.sc.hi);
    }
};

// Q4_K and Q5_K: one scale per 32-element chunk (broadcast to the whole register) and one min per chunk.
template <class Block, bool kFifthBit>
struct QK4Simd {
    static constexpr int kOffsetShift = 0;
    static constexpr bool kHasMin = true;
    static constexpr size_t kDOffset = offsetof(Block, d);
    static constexpr bool kPrescaled = false;
    using Scalar = QK4Scalar<kFifthBit ? GgmlType::Q5_K : GgmlType::Q4_K, Block, kFifthBit>;
    struct W {
        __m256i sc;    // scales 0..7 as int16, in both 128-bit halves
        __m256i mvec;  // min of chunk j at lanes 2j and 2j+1 (the two bsums of the chunk)
    };
    static TANDEM_ALWAYS_INLINE W prepare(const uint8_t* blk) {
        // The 12 bytes as 32-bit words u0, u1, u2 (ggml's layout, see unpack_scale_min_k4): scales 0..3 = u0 & 63
        // per byte, mins 0..3 = u1 & 63, scales 4..7 = (u2 & 0xF) | (u0 >> 6 & 3) << 4, mins 4..7 = (u2 >> 4 & 0xF)
        // | (u1 >> 6 & 3) << 4. Words 0 and 1 of the vector compute the scales and the mins side by side.
        const __m128i u = load16(blk + offsetof(Block, scales));  // the 4 bytes past the scales belong to the block
        const __m128i first = _mm_and_si128(u, _mm_set1_epi8(63));
        const __m128i u2 = _mm_shuffle_epi32(u, _MM_SHUFFLE(2, 2, 2, 2));
        const __m128i second =
            _mm_or_si128(_mm_and_si128(_mm_srlv_epi32(u2, _mm_setr_epi32(0, 4, 0, 0)), _mm_set1_epi8(0xF)),
                         _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(u, 6), _mm_set1_epi8(3)), 4));
        // Bytes 0..7: scales 0..7; bytes 8..15: mins 0..7 (all <= 63, so sumi <= 256 * 31 * 128 * 63).
        const __m128i sm = _mm_unpacklo_epi32(first, second);
        const __m128i sc = _mm_cvtepu8_epi16(sm);
        const __m128i mins2 = _mm_shuffle_epi8(sm, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15));
        return {_mm256_broadcastsi128_si256(sc), _mm256_cvtepu8_epi16(mins2)};
    }
    template <int C>
    static TANDEM_ALWAYS_INLINE __m256i codes(const uint8_t* blk, const W&) {
        const __m256i low = _mm256_and_si256(shift_bytes<C % 2 ? -4 : 0>(load32(blk + offsetof(Block, qs) + 32 * (C / 2))),
                                             mask8(0xF));
        if constexpr (kFifthBit) {
            const __m256i high =
                _mm256_and_si256(shift_bytes<4 - C>(load32(blk + offsetof(BlockQ5_K, qh))), mask8(0x10));
            return _mm256_or_si256(low, high);
        } else {
            return low;
        }
    }
    template <int C>
    static TANDEM_ALWAYS_INLINE __m256i scale(const W& w) {
        return _mm256_shuffle_epi8(w.sc, _mm256_set1_epi16(static_cast<short>(((2 * C + 1) << 8) | (2 * C))));
    }
};
using Q4_KSimd = QK4Simd<BlockQ4_K, false>;
using Q5_KSimd = QK4Simd<BlockQ5_K, true>;

struct Q6_KSimd {
    static constexpr int kOffsetShift = 5;
    static constexpr bool kHasMin = false;
    static constexpr size_t kDOffset = offsetof(BlockQ6_K, d);
    static constexpr bool kPrescaled = false;
    using Scalar = Q6_KScalar;
    struct W {
        Scales16 sc;
        __m256i mvec;
    };
    static TANDEM_ALWAYS_INLINE W prepare(const uint8_t* blk) {
        // int8 scales; sumi <= 256 * 63 * 128 * 128 + 32 * 128 * 16 * 2048 < 2^31.
        const __m256i sc16 = _mm256_cvtepi8_epi16(load16(blk + offsetof(BlockQ6_K, scales)));
        return {split_scales(sc16), sc16};
    }
    template <int C>
    static TANDEM_ALWAYS_INLINE __m256i codes(const uint8_t* blk, const W&) {
        constexpr int h = C / 4, k = C % 4;
        const __m256i low = _mm256_and_si256(
            shift_bytes<k / 2 ? -4 : 0>(load32(blk + offsetof(BlockQ6_K, ql) + 64 * h + 32 * (k % 2))), mask8(0xF));
        const __m256i high =
            _mm256_and_si256(shift_bytes<4 - 2 * k>(load32(blk + offsetof(BlockQ6_K, qh) + 32 * h)), mask8(0x30));
        return _mm256_or_si256(low, high);
    }
    template <int C>
    static TANDEM_ALWAYS_INLINE __m256i scale(const W& w) {
        return scale_pair<C>(w.sc.lo, w.sc.hi);
    }
};

// v[t] holds token t's int32 partial sums in 8 lanes; returns their totals with token t in lane t (lanes >= T
// zero). Integer adds: exact in any order.
template <int T>
TANDEM_ALWAYS_INLINE __m256i sum_tokens(const __m256i (&v)[T]) {
    auto at = [&](int t) { return t < T ? v[t] : _mm256_setzero_si256(); };
    // After two hadds, 128-bit half h of q0 holds, for tokens 0..3, the sum of their lanes in half h.
    const __m256i q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(at(0), at(1)), _mm256_hadd_epi32(at(2), at(3)));
    if constexpr (T <= 4) {
        return _mm256_add_epi32(q0, _mm256_permute2x128_si256(q0, q0, 0x81));  // upper half zeroed
    } else {
        const __m256i q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(at(4), at(5)), _mm256_hadd_epi32(at(6), at(7)));
        return _mm256_add_epi32(_mm256_permute2x128_si256(q0, q1, 0x20), _mm256_permute2x128_si256(q0, q1, 0x31));
    }
}

// Pins v to a register at this point. Without it GCC, free to reassociate integer adds, collects all 64 products
// of a super-block (8 chunks x 8 tokens) and adds them in a tree, spilling most of them to the stack.
TANDEM_ALWAYS_INLINE void pin(__m256i& v) { __asm__("" : "+x"(v)); }

// Runs f(integral_constant<t>) for t = 0..T-1, unrolled: the per-token accumulators must stay in registers, and
// GCC at -O2 keeps a plain loop over them (and the arrays with it) in memory.
template <int T, class F>
TANDEM_ALWAYS_INLINE void for_tokens(F&& f) {
    static_for(std::make_integer_sequence<int, T>{}, f);
}

template <class Ty>
struct SimdKernel {
    static constexpr int kMaxTile = kTile;

    // The block's d (lane 0) and dmin (lane 1, types with a min) as floats.
    static TANDEM_ALWAYS_INLINE __m128 scales_of(const uint8_t* blk) {
        if constexpr (Ty::kHasMin) {
            uint32_t both;  // d and dmin are adjacent fp16 in every type with a min
            std::memcpy(&both, blk + Ty::kDOffset, 4);
            return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(both)));
        } else {
            return _mm_cvtph_ps(_mm_cvtsi32_si128(load_u16(blk + Ty::kDOffset)));
        }
    }

    template <int T>
    static void tile(const uint8_t* row, int64_t cols, const uint8_t* xq, size_t xq_stride, float* out) {
        // Token t's float sums: acc lane t (the d * sumi terms) and acc_m lane t (the dmin * summ terms); with one
        // token the two share a 128-bit register, lanes 0 and 1. The lane operations are the same either way.
        __m256 acc = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();
        __m128 acc1 = _mm_setzero_ps();
        const int64_t n_blocks = cols / kQK_K;
        for (int64_t b = 0; b < n_blocks; ++b) {
            const uint8_t* blk = row + b * Ty::Scalar::kBytes;
            const uint8_t* x0 = xq + b * kXBytes;
            const typename Ty::W w = Ty::prepare(blk);
            __m256i isum[T];
            for_tokens<T>([&](auto t) { isum[t] = _mm256_setzero_si256(); });
            if constexpr (Ty::kPrescaled) {
                // Codes already scaled (<= 45): two chunks' maddubs sums (each <= 2 * 45 * 128) add in int16, and
                // one madd by 1 widens them: 3 multiplies per 64 products instead of 4.
                const __m256i ones = _mm256_set1_epi16(1);
                static_for(std::make_integer_sequence<int, 4>{}, [&](auto c) {
                    constexpr int C = 2 * decltype(c)::value;
                    const __m256i u0 = Ty::template codes<C>(blk, w), u1 = Ty::template codes<C + 1>(blk, w);
                    for_tokens<T>([&](auto t) {
                        const uint8_t* x = x0 + t * xq_stride + kXqs + 32 * C;
                        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(u0, load32(x)),
                                                           _mm256_maddubs_epi16(u1, load32(x + 32)));
                        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, ones));
                        pin(isum[t]);
                    });
                });
            } else {
                static_for(std::make_integer_sequence<int, 8>{}, [&](auto c) {
                    constexpr int C = decltype(c)::value;
                    const __m256i u = Ty::template codes<C>(blk, w);
                    const __m256i s = Ty::template scale<C>(w);
                    for_tokens<T>([&](auto t) {
                        const __m256i x = load32(x0 + t * xq_stride + kXqs + 32 * C);
                        isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), s));
                        pin(isum[t]);
                    });
                });
            }
            __m256i msum[T];
            for_tokens<T>([&](auto t) {
                const __m256i p = _mm256_madd_epi16(load32(x0 + t * xq_stride + kXbsums), w.mvec);
                if constexpr (Ty::kOffsetShift > 0)
                    isum[t] = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(p, Ty::kOffsetShift));
                else
                    msum[t] = p;
            });
            const __m128 dm = scales_of(blk);
            if constexpr (T == 1) {
                // sumi in lane 0 and summ in lane 1 (lanes 2, 3: don't care).
                __m256i h;
                if constexpr (Ty::kHasMin)
                    h = _mm256_hadd_epi32(isum[0], msum[0]);  // i01 i23 m01 m23 | i45 i67 m45 m67
                else
                    h = _mm256_hadd_epi32(isum[0], isum[0]);
                __m128i q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
                q = _mm_hadd_epi32(q, q);
                const __m128 coef = _mm_mul_ps(dm, _mm_set1_ps(load_f32(x0 + kXd)));
                acc1 = _mm_fmadd_ps(coef, _mm_cvtepi32_ps(q), acc1);
            } else {
                float dxs[8] = {};
                for_tokens<T>([&](auto t) { dxs[t] = load_f32(x0 + t * xq_stride + kXd); });
                const __m256 dx = _mm256_setr_ps(dxs[0], dxs[1], dxs[2], dxs[3], dxs[4], dxs[5], dxs[6], dxs[7]);
                const __m256 d = _mm256_broadcastss_ps(dm);
                acc = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(sum_tokens<T>(isum)), acc);
                if constexpr (Ty::kHasMin) {
                    const __m256 dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
                    acc_m = _mm256_fmadd_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(sum_tokens<T>(msum)), acc_m);
                }
            }
        }
        if constexpr (T == 1) {
            const float a = _mm_cvtss_f32(acc1);
            out[0] = Ty::kHasMin ? a - _mm_cvtss_f32(_mm_movehdup_ps(acc1)) : a;
        } else {
            float lanes[8], lanes_m[8];
            _mm256_storeu_ps(lanes, acc);
            _mm256_storeu_ps(lanes_m, acc_m);
            for (int t = 0; t < T; ++t) out[t] = Ty::kHasMin ? lanes[t] - lanes_m[t] : lanes[t];
        }
    }
};

#endif  // TANDEM_Q8K_SIMD

template <class Scalar, class Fast>
constexpr Q8TypeKernels make_kernels() {
    const DotRowsQ8Fn scalar = &dot_rows<ScalarKernel<Scalar>>;
#ifdef TANDEM_Q8K_SIMD
    return Q8TypeKernels{Scalar::kType, ActFormat::Q8_K, &dot_rows<Fast>, scalar, &dot_rows<Fast>};
#else
    return Q8TypeKernels{Scalar::kType, ActFormat::Q8_K, scalar, scalar};
#endif
}

#ifdef TANDEM_Q8K_SIMD
template <class Simd>
constexpr Q8TypeKernels kernels_of() {
    return make_kernels<typename Simd::Scalar, SimdKernel<Simd>>();
}
constexpr Q8TypeKernels kKernels[] = {kernels_of<Q2_KSimd>(), kernels_of<Q3_KSimd>(), kernels_of<Q4_KSimd>(),
                                      kernels_of<Q5_KSimd>(), kernels_of<Q6_KSimd>()};
#else
template <class Scalar>
constexpr Q8TypeKernels kernels_of() {
    return make_kernels<Scalar, ScalarKernel<Scalar>>();
}
constexpr Q8TypeKernels kKernels[] = {kernels_of<Q2_KScalar>(), kernels_of<Q3_KScalar>(), kernels_of<Q4_KScalar>(),
                                      kernels_of<Q5_KScalar>(), kernels_of<Q6_KScalar>()};
#endif

}  // namespace

std::span<const Q8TypeKernels> kquant_q8_kernels() { return kKernels; }

}  // namespace tandem::cpu::q8_detail
