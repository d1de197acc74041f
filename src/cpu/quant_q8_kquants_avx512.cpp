// AVX-512 VNNI integer kernels of Q2_K, Q3_K, Q4_K, Q5_K and Q6_K against Q8_K activations: the kernels of
// quant_q8_kquants.cpp on zmm registers with vpdpbusd, bitwise equal to the AVX2 ones. Compiled for AVX-512 by a
// target pragma (not the build flags), so the rest of the library keeps running on CPUs without it;
// find_q8_kernels calls these only after checking the CPU.
//
// The arithmetic is that of quant_q8_kquants.cpp (read its header): per super-block and token the exact int32 sums
//   sumi = sum_j sc_j * sum(u * x) - o * sum_j sc_j * bsum_j      summ = sum_j m_j * bsum_j
// then acc = fma(d_w * d_x, float(sumi), acc) and acc_m = fma(dmin_w * d_x, float(summ), acc_m), and the result
// acc - acc_m. Integer sums are exact in any grouping, so only the integer work is reorganised here; the float steps
// are the same lane operations in the same order (the super-blocks of the row in turn), hence the same bits.
//
// The integer work. A super-block is four zmm chunks of 64 codes (chunk P: elements 64P..64P+63, the AVX2 kernel's
// chunks 2P and 2P+1), built once and then used by every token of the tile:
//   - vpdpbusd sums 4 adjacent u8 * s8 products into each int32 lane, so lane i of chunk P covers elements
//     64P + 4i..4i+3 and 128-bit lane k of it covers one 16-element sub-block (Q4_K / Q5_K: half of a 32 one).
//   - Those 4-product sums fit int16 (the largest, Q6_K: 4 * 63 * 127 = 32004), so two of them are packed to int16
//     (vpackssdw, which cannot saturate here) and one vpdpwssd multiplies them by their int16 sub-block scales and
//     adds the pairs into an int32 accumulator. Per 128 products: 2 vpdpbusd, 1 pack and 1 vpdpwssd, where AVX2
//     spends 4 maddubs and 4 madd. In a tile the two packed sums are one chunk of two tokens (one scale vector for
//     both, and the accumulator holds both tokens: half the vectors to add up afterwards); for a single token they
//     are two chunks of it.
//   - Q2_K's codes times their scales fit a byte (3 * 15), as in the AVX2 kernel, so its chunks are prescaled and
//     vpdpbusd accumulates straight into the token's int32 lanes: one instruction per 64 products.
// The tokens' lanes are then summed in a shuffle tree that leaves token t in lane t, and the bsum terms (mins, or
// the code offsets of Q3_K / Q6_K) come out of eight vpdpwssd already in that layout (see the loop nest), so the
// float steps are single zmm operations for the whole tile.
//
// Batch invariance: each weight chunk is decoded once per super-block and every token runs the same code on it;
// the integer totals do not depend on how they were added, and the float steps of token t are lane t's whatever
// T or t.
//
// The loop nest over rows, token tiles and column blocks is this file's own rather than the driver's dot_rows
// (quant_q8_driver.h): it carries float accumulators across column blocks, which the driver's per-row tile
// interface has no place for (see "the loop nest" below).
//
// Nothing after the target pragma is an inline function or template of a shared header (those would be compiled
// for AVX-512 and could be picked by the linker for every caller): the helpers are defined here, and the scratch
// buffer comes from the driver header's scratch_buffer, defined before the pragma.

// GCC 12's AVX-512 intrinsics start their pass-through operands from _mm512_undefined_*() (a self-initialised
// variable), which -Wuninitialized reports once inlined (a false positive). Diagnostic state follows source
// locations, so these come before any header pulls in immintrin.h.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstddef>
#include <cstdint>
#include <utility>

#include "cpu/quant.h"
#include "cpu/quant_q8_driver.h"
#include "cpu/unaligned.h"

#if defined(TANDEM_AVX2) && defined(__x86_64__)
#include <immintrin.h>
#define TANDEM_Q8K_AVX512 1
#endif

#ifdef TANDEM_Q8K_AVX512
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")
#endif

namespace tandem::cpu::q8_detail {

#ifdef TANDEM_Q8K_AVX512
namespace {

#define TQ_INLINE inline __attribute__((always_inline))

// Field offsets of a BlockQ8_K: d, then the 256 codes, then the 16 sums.
constexpr size_t kXd = offsetof(BlockQ8_K, d), kXqs = offsetof(BlockQ8_K, qs), kXbsums = offsetof(BlockQ8_K, bsums);
constexpr size_t kXBytes = sizeof(BlockQ8_K);

// Tokens per tile: a token per float lane. Measured (4096 x 4096, one thread, Q3_K / Q4_K / Q6_K, 512 tokens):
// 8, 12 and 16 tokens ran in 64, 58 and 51 ms: the weight decoding, the tree and the bsum terms are per tile.
constexpr int kTile = 16;

// Compile-time loops, written here (see the file header; std::integer_sequence is only a type): f(Int<I>{}) for
// I = 0..N-1, unrolled, so per-token accumulators stay in registers.
template <int N>
struct Int {
    static constexpr int value = N;
};
template <int... I, class F>
TQ_INLINE void unroll_seq(std::integer_sequence<int, I...>, F& f) {
    (f(Int<I>{}), ...);
}
template <int N, class F>
TQ_INLINE void unroll(F&& f) {
    unroll_seq(std::make_integer_sequence<int, N>{}, f);
}

// Pins v to a register at this point: without it GCC, free to reassociate integer adds, gathers all the products of
// a super-block for a tree of adds and spills them (see the AVX2 kernel).
TQ_INLINE void pin(__m512i& v) { __asm__("" : "+v"(v)); }

TQ_INLINE __m128i load16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
TQ_INLINE __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
TQ_INLINE __m512i load64(const uint8_t* p) { return _mm512_loadu_si512(p); }
// 32 bytes in both 256-bit halves (one broadcast load).
TQ_INLINE __m512i bcast32(const uint8_t* p) { return _mm512_broadcast_i64x4(load32(p)); }
TQ_INLINE __m512i bytes(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }

// 16-bit lanes of v shifted left by A in the low 256 bits and B in the high ones (negative: right). As in the AVX2
// kernel, bits that cross into the neighbouring byte are masked off by every caller.
template <int A, int B>
TQ_INLINE __m512i shift_halves(__m512i v) {
    if constexpr (A == 0 && B == 0) {
        return v;
    } else if constexpr (A >= 0 && B >= 0) {
        return _mm512_sllv_epi16(v, _mm512_inserti64x4(_mm512_set1_epi16(A), _mm256_set1_epi16(B), 1));
    } else {
        static_assert(A <= 0 && B <= 0, "one direction per call");
        return _mm512_srlv_epi16(v, _mm512_inserti64x4(_mm512_set1_epi16(-A), _mm256_set1_epi16(-B), 1));
    }
}

// a | (b & c), one vpternlogd.
TQ_INLINE __m512i or_and(__m512i a, __m512i b, __m512i c) { return _mm512_ternarylogic_epi32(a, b, c, 0xF8); }

// The int16 scale vectors of packed dpbusd sums. Sub(P, k) names the 16-element sub-block whose sums 128-bit lane k of
// chunk P holds (vpdpbusd: lane i of chunk P covers elements 64P + 4i..4i+3); the scales of the 16 sub-blocks are the
// int16 lanes of `sc`. vpackssdw puts, in 128-bit lane k, the four sums of its first operand and then the four of
// its second, so:
//   kPair false: both operands are chunk P (of two tokens): sub-block Sub(P, k) in all 8 int16 lanes of lane k
//   kPair true:  chunks P and P + 1 (of one token): Sub(P, k) in the first 4, Sub(P + 1, k) in the last 4
template <int P, int (*Sub)(int, int), bool kPair>
TQ_INLINE __m512i packed_scales(__m512i sc) {
    alignas(64) static constexpr auto idx = [] {
        struct {
            short v[32];
        } r{};
        for (int k = 0; k < 4; ++k)
            for (int i = 0; i < 8; ++i) r.v[8 * k + i] = static_cast<short>(kPair && i >= 4 ? Sub(P + 1, k) : Sub(P, k));
        return r;
    }();
    return _mm512_permutexvar_epi16(_mm512_load_si512(&idx), sc);
}

constexpr int sub16(int P, int k) { return 4 * P + k; }       // per-16 scales (Q3_K, Q6_K)
constexpr int sub32(int P, int k) { return 2 * P + k / 2; }   // per-32 scales (Q4_K, Q5_K)

// ---- the types ---------------------------------------------------------------------------------------------------
// Every type provides, for a block (the AVX2 kernel's interface on 64-code chunks):
//   kBytes, kDOffset (d; dmin follows it in the types with a min), kHasMin, kOffsetShift (log2 of the code offset)
//   W prepare(blk)             the scale vectors; w.mvec: 16 int16 multipliers of the bsums (mins, or scales)
//   codes<P>(blk, w)           chunk P's 64 codes as bytes, each <= 63 (prescaled: <= 45)
//   kPrescaled                 codes<P> are already multiplied by their scales (Q2_K)
//   kSub                       which sub-block each 128-bit lane of a chunk covers (not for kPrescaled types)

struct Q2_K {
    static constexpr size_t kBytes = sizeof(BlockQ2_K);
    static constexpr size_t kDOffset = offsetof(BlockQ2_K, d);
    static constexpr bool kHasMin = true, kPrescaled = true;
    static constexpr int kOffsetShift = 0;
    struct W {
        __m512i sc;     // the 16 scales as int16 (lanes 0..15)
        __m256i mvec;   // the 16 mins as int16
    };
    static TQ_INLINE W prepare(const uint8_t* blk) {
        // Scales (low nibbles) and mins (high nibbles), 0..15: sumi <= 256 * 3 * 128 * 15.
        const __m128i v = load16(blk + offsetof(BlockQ2_K, scales));
        const __m128i nib = _mm_set1_epi8(0xF);
        return {_mm512_zextsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(v, nib))),
                _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), nib))};
    }
    // AVX2 chunk C is bits 2*(C%4) of qs[32*(C/4) + l]: chunk P = (C = 2P, 2P + 1) shares the 32 bytes. Times the
    // scale of its sub-block (16-bit lane i covers sub-block 4P + i/8; 3 * 15 fits the low byte, no carry).
    template <int P>
    static TQ_INLINE __m512i codes(const uint8_t* blk, const W& w) {
        constexpr int s = 4 * (P % 2);
        const __m512i u = _mm512_and_si512(
            shift_halves<-s, -(s + 2)>(bcast32(blk + offsetof(BlockQ2_K, qs) + 32 * (P / 2))), bytes(3));
        alignas(64) static constexpr auto idx = [] {
            struct {
                short v[32];
            } r{};
            for (int i = 0; i < 32; ++i) r.v[i] = static_cast<short>(4 * P + i / 8);
            return r;
        }();
        return _mm512_mullo_epi16(u, _mm512_permutexvar_epi16(_mm512_load_si512(&idx), w.sc));
    }
};

struct Q3_K {
    static constexpr size_t kBytes = sizeof(BlockQ3_K);
    static constexpr int (*kSub)(int, int) = sub16;
    static constexpr size_t kDOffset = offsetof(BlockQ3_K, d);
    static constexpr bool kHasMin = false, kPrescaled = false;
    static constexpr int kOffsetShift = 2;
    struct W {
        __m512i sc;
        __m256i mvec;
    };
    static TQ_INLINE W prepare(const uint8_t* blk) {
        // As the AVX2 kernel: low 4 bits of scales 0..7 / 8..15 in the low / high nibbles of bytes 0..7, the high
        // 2 bits of scale i at bits 2*(i/4) of byte 8 + i%4; biased by 32 (-32..31).
        const uint8_t* s = blk + offsetof(BlockQ3_K, scales);
        const __m128i lo8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s));
        const __m128i nib = _mm_set1_epi8(0xF);
        const __m128i low = _mm_unpacklo_epi64(_mm_and_si128(lo8, nib), _mm_and_si128(_mm_srli_epi16(lo8, 4), nib));
        const __m128i high = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(static_cast<int>(load_u32(s + 8))),
                                                          _mm_setr_epi32(0, 2, 4, 6)),
                                           _mm_set1_epi8(3));
        const __m128i sc8 = _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(high, 4)), _mm_set1_epi8(32));
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        return {_mm512_zextsi256_si512(sc16), sc16};
    }
    // Low 2 bits: bits 2*(C%4) of qs[32*(C/4) + l]; bit 2: bit C of hmask[l] (set: no -4; value = u - 4).
    template <int P>
    static TQ_INLINE __m512i codes(const uint8_t* blk, const W&) {
        constexpr int s = 4 * (P % 2);
        const __m512i low = _mm512_and_si512(
            shift_halves<-s, -(s + 2)>(bcast32(blk + offsetof(BlockQ3_K, qs) + 32 * (P / 2))), bytes(3));
        const __m512i hm = bcast32(blk + offsetof(BlockQ3_K, hmask));
        // Bit C to bit 2: left by 2 - C (C = 2P, 2P + 1).
        return or_and(low, shift_halves<2 - 2 * P, 1 - 2 * P>(hm), bytes(4));
    }
};

// Q4_K and Q5_K: a scale and a min per 32 elements.
template <class Block, bool kFifthBit>
struct QK4 {
    static constexpr size_t kBytes = sizeof(Block);
    static constexpr int (*kSub)(int, int) = sub32;
    static constexpr size_t kDOffset = offsetof(Block, d);
    static constexpr bool kHasMin = true, kPrescaled = false;
    static constexpr int kOffsetShift = 0;
    struct W {
        __m512i sc;     // scales 0..7 as int16 (lanes 0..7)
        __m256i mvec;   // min of 32-element sub-block j at lanes 2j and 2j+1 (its two bsums)
    };
    static TQ_INLINE W prepare(const uint8_t* blk) {
        // The AVX2 kernel's unpacking (see there): bytes 0..7 of sm the scales, bytes 8..15 the mins, all <= 63.
        const __m128i u = load16(blk + offsetof(Block, scales));  // the 4 bytes past the scales belong to the block
        const __m128i first = _mm_and_si128(u, _mm_set1_epi8(63));
        const __m128i u2 = _mm_shuffle_epi32(u, _MM_SHUFFLE(2, 2, 2, 2));
        const __m128i second =
            _mm_or_si128(_mm_and_si128(_mm_srlv_epi32(u2, _mm_setr_epi32(0, 4, 0, 0)), _mm_set1_epi8(0xF)),
                         _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(u, 6), _mm_set1_epi8(3)), 4));
        const __m128i sm = _mm_unpacklo_epi32(first, second);
        const __m128i mins2 =
            _mm_shuffle_epi8(sm, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15));
        return {_mm512_zextsi128_si512(_mm_cvtepu8_epi16(sm)), _mm256_cvtepu8_epi16(mins2)};
    }
    // AVX2 chunk C is the low (C even) or high nibble of qs[32*(C/2) + l]: chunk P = both nibbles of the same 32
    // bytes. Q5_K's fifth bit: bit C of qh[l], moved to bit 4.
    template <int P>
    static TQ_INLINE __m512i codes(const uint8_t* blk, const W&) {
        const __m512i low =
            _mm512_and_si512(shift_halves<0, -4>(bcast32(blk + offsetof(Block, qs) + 32 * P)), bytes(0xF));
        if constexpr (kFifthBit) {
            const __m512i qh = bcast32(blk + offsetof(BlockQ5_K, qh));
            return or_and(low, shift_halves<4 - 2 * P, 3 - 2 * P>(qh), bytes(0x10));
        } else {
            return low;
        }
    }
};
using Q4_K = QK4<BlockQ4_K, false>;
using Q5_K = QK4<BlockQ5_K, true>;

struct Q6_K {
    static constexpr size_t kBytes = sizeof(BlockQ6_K);
    static constexpr int (*kSub)(int, int) = sub16;
    static constexpr size_t kDOffset = offsetof(BlockQ6_K, d);
    static constexpr bool kHasMin = false, kPrescaled = false;
    static constexpr int kOffsetShift = 5;
    struct W {
        __m512i sc;
        __m256i mvec;
    };
    static TQ_INLINE W prepare(const uint8_t* blk) {
        // int8 scales; sumi <= 256 * 63 * 128 * 128 + 32 * 128 * 16 * 2048 < 2^31 (the AVX2 kernel's bound).
        const __m256i sc16 = _mm256_cvtepi8_epi16(load16(blk + offsetof(BlockQ6_K, scales)));
        return {_mm512_zextsi256_si512(sc16), sc16};
    }
    // AVX2 chunk C = 4h + k: low 4 bits the low (k < 2) or high nibble of ql[64h + 32(k%2) + l], bits 4..5 bits
    // 2k..2k+1 of qh[32h + l]. Chunk P = (C = 2P, 2P + 1): h = P/2, the 64 contiguous bytes ql[64h..], one nibble.
    template <int P>
    static TQ_INLINE __m512i codes(const uint8_t* blk, const W&) {
        constexpr int h = P / 2, k0 = 2 * (P % 2);
        __m512i ql = load64(blk + offsetof(BlockQ6_K, ql) + 64 * h);
        if constexpr (P % 2) ql = _mm512_srli_epi16(ql, 4);
        const __m512i low = _mm512_and_si512(ql, bytes(0xF));
        const __m512i high = shift_halves<4 - 2 * k0, 2 - 2 * k0>(bcast32(blk + offsetof(BlockQ6_K, qh) + 32 * h));
        return or_and(low, high, bytes(0x30));
    }
};

// ---- the token tree ----------------------------------------------------------------------------------------------
// Sums of lane groups of many vectors, leaving vector (or group) i's total in lane i. Each step adds pairs of lanes
// of two vectors into one: h32 at 32-bit distance (lanes 0, 2 of each 128 bits from a, 1, 3 from b), h64 at 64-bit
// distance, h128 at 128-bit.
TQ_INLINE __m512i h32(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
TQ_INLINE __m512i h64(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}
TQ_INLINE __m512i h128(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

// v[0..N) (N <= 16, the rest zero) -> lane t = the sum of v[t]'s 16 lanes. After h32 and h64, 128-bit lane L of
// q[k] holds the L-th quarter sums of v[4k..4k+3]; the two h128 steps add the quarters.
template <int N>
TQ_INLINE __m512i sum_lanes16(const __m512i* v) {
    const __m512i z = _mm512_setzero_si512();
    auto at = [&](int i) { return i < N ? v[i] : z; };
    __m512i q[4];
    for (int k = 0; k < 4; ++k)
        q[k] = 4 * k < N ? h64(h32(at(4 * k), at(4 * k + 1)), h32(at(4 * k + 2), at(4 * k + 3))) : z;
    const __m512i r0 = h128(q[0], q[1]);
    const __m512i r1 = N > 8 ? h128(q[2], q[3]) : z;
    return h128(r0, r1);
}

// v[0..N) (N <= 8, the rest zero) in the paired layout of products_paired: 128-bit lane L of v[i] holds partial
// sums [2i, 2i, 2i+1, 2i+1] -> lane t = token t's total. One two-source shuffle step (an hadd: the even and the odd
// elements of v[2k] and v[2k+1]) leaves q[k] in the layout sum_lanes16 reaches after two steps: lane L holds the
// L-th quarter sums of tokens 4k..4k+3. (vshufps moves 32-bit elements whatever they hold.)
TQ_INLINE __m512i hadd32(__m512i a, __m512i b) {
    const __m512 fa = _mm512_castsi512_ps(a), fb = _mm512_castsi512_ps(b);
    return _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(fa, fb, _MM_SHUFFLE(2, 0, 2, 0))),
                            _mm512_castps_si512(_mm512_shuffle_ps(fa, fb, _MM_SHUFFLE(3, 1, 3, 1))));
}
template <int N>
TQ_INLINE __m512i sum_pairs(const __m512i* v) {
    const __m512i z = _mm512_setzero_si512();
    auto at = [&](int i) { return i < N ? v[i] : z; };
    __m512i q[4];
    for (int k = 0; k < 4; ++k) q[k] = 2 * k < N ? hadd32(at(2 * k), at(2 * k + 1)) : z;
    const __m512i r0 = h128(q[0], q[1]);
    const __m512i r1 = N > 4 ? h128(q[2], q[3]) : z;
    return h128(r0, r1);
}

// ---- the loop nest ---------------------------------------------------------------------------------------------
// With more than one token the activations are first repacked, per tile of up to kTile tokens and per super-block:
//   bytes [0, 64)        the tokens' d as 16 floats (0 past T): one load gives the float lanes of the tile
//   bytes [64, 576)      the bsums transposed: vector i holds, for token t, bsums 2i and 2i+1 as the int16 pair of
//                        lane t, so one vpdpwssd by the pair of multipliers adds both terms for all tokens at once
//   bytes [576, ...)     token t's 256 codes at 576 + 256 t: fixed offsets from one pointer
// and the rows sweep each tile in column blocks: a tile of 16 tokens is 4.6 KB per super-block, so a 4096-column
// tile (75 KB) would stream from L2 for every row, which measured at half the speed of an L1-resident one. The float
// accumulators of each (row, tile) are kept in memory between column blocks, and every (row, token) still adds its
// super-blocks one after the other with the same operations: the column blocks change nothing in the result.
// (A call with a single token, decode, keeps the activations as they are, whole rows at a time: there is nothing to
// amortise a copy over. A last tile of one token in a longer call is packed like any other.)
constexpr size_t kPackDx = 0, kPackBsums = 64, kPackCodes = 576;
constexpr size_t packed_block_bytes(int T) { return kPackCodes + 256 * static_cast<size_t>(T); }


// Super-blocks per column block: 6 x 4.6 KB of a 16-token tile in L1 (48 KB on Zen 5) with room for the weights
// (4 and 8 measured the same within noise).
constexpr int64_t kColBlock = 6;
// Column blocks make the weights a strided stream (a few hundred bytes of each row in turn), which the hardware
// prefetchers do not follow: each super-block prefetches the same super-block kPrefetchRows rows ahead. Measured
// (4096 x 4096 Q6_K, 8 tokens): 4.8 ms without, 1.8 ms one row ahead, 1.0 ms four rows ahead (2, 6, 8 no better).
constexpr int64_t kPrefetchRows = 4;

template <class Ty>
struct Kernel {
    static void pack(int T, const uint8_t* xq, size_t xq_stride, int64_t n_blocks, uint8_t* dst) {
        for (int64_t b = 0; b < n_blocks; ++b) {
            uint8_t* d = dst + b * packed_block_bytes(T);
            alignas(64) float dx[16] = {};
            alignas(64) int16_t bsums[8][16][2] = {};
            for (int t = 0; t < T; ++t) {
                const uint8_t* xb = xq + t * xq_stride + b * kXBytes;
                __builtin_memcpy(&dx[t], xb + kXd, sizeof(float));
                int16_t bs[16];
                __builtin_memcpy(bs, xb + kXbsums, sizeof bs);
                for (int j = 0; j < 16; ++j) bsums[j / 2][t][j % 2] = bs[j];
                __builtin_memcpy(d + kPackCodes + 256 * t, xb + kXqs, 256);
            }
            __builtin_memcpy(d + kPackDx, dx, sizeof dx);
            __builtin_memcpy(d + kPackBsums, bsums, sizeof bsums);
        }
    }

    // The block's d (lane 0) and dmin (lane 1, types with a min) as floats.
    static TQ_INLINE __m128 scales_of(const uint8_t* blk) {
        if constexpr (Ty::kHasMin)
            return _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(load_u32(blk + Ty::kDOffset))));
        else
            return _mm_cvtph_ps(_mm_cvtsi32_si128(load_u16(blk + Ty::kDOffset)));
    }

    // One token's (T == 1) or, for the prescaled type, each token's scaled code products of the super-block at blk:
    // isum[t] += them, the codes of token t starting at x + 256 t. Chunks 2Q and 2Q + 1 are packed together.
    template <int T>
    static TQ_INLINE void products(const uint8_t* blk, const typename Ty::W& w, const uint8_t* x, __m512i* isum) {
        if constexpr (Ty::kPrescaled) {
            unroll<4>([&](auto p) {
                constexpr int P = decltype(p)::value;
                const __m512i u = Ty::template codes<P>(blk, w);
                unroll<T>([&](auto t) {
                    isum[t.value] = _mm512_dpbusd_epi32(isum[t.value], u, load64(x + 256 * t.value + 64 * P));
                    pin(isum[t.value]);
                });
            });
        } else {
            static_assert(T == 1, "tiles of the types with sub-block scales use products_paired");
            unroll<2>([&](auto q) {
                constexpr int Q = decltype(q)::value;
                const __m512i u0 = Ty::template codes<2 * Q>(blk, w), u1 = Ty::template codes<2 * Q + 1>(blk, w);
                const __m512i s = packed_scales<2 * Q, Ty::kSub, true>(w.sc);
                const __m512i z = _mm512_setzero_si512();
                const __m512i p0 = _mm512_dpbusd_epi32(z, u0, load64(x + 128 * Q));
                const __m512i p1 = _mm512_dpbusd_epi32(z, u1, load64(x + 128 * Q + 64));
                isum[0] = _mm512_dpwssd_epi32(isum[0], _mm512_packs_epi32(p0, p1), s);
            });
        }
    }

    // Tiles of the types with sub-block scales: tokens 2i and 2i + 1 share accumulator acc[i], chunk by chunk (the
    // two tokens' sums of one chunk packed together, under one scale vector), so that 128-bit lane k of acc[i] ends
    // as [2i, 2i, 2i+1, 2i+1] (partial sums of each token): half the vectors for the tree to add up, for the same
    // number of multiplies as a chunk pair per token. Token 2i + 1 past T contributes zeros.
    template <int T>
    static TQ_INLINE void products_paired(const uint8_t* blk, const typename Ty::W& w, const uint8_t* x, __m512i* acc) {
        constexpr int NP = (T + 1) / 2;
        unroll<4>([&](auto p) {
            constexpr int P = decltype(p)::value;
            const __m512i u = Ty::template codes<P>(blk, w);
            const __m512i s = packed_scales<P, Ty::kSub, false>(w.sc);
            unroll<NP>([&](auto i) {
                constexpr int A = 2 * i.value, B = A + 1;
                const __m512i z = _mm512_setzero_si512();
                const __m512i pa = _mm512_dpbusd_epi32(z, u, load64(x + 256 * A + 64 * P));
                __m512i pb = z;
                if constexpr (B < T) pb = _mm512_dpbusd_epi32(z, u, load64(x + 256 * B + 64 * P));
                const __m512i packed = _mm512_packs_epi32(pa, pb);
                if constexpr (P == 0) acc[i.value] = _mm512_madd_epi16(packed, s);
                else acc[i.value] = _mm512_dpwssd_epi32(acc[i.value], packed, s);
                pin(acc[i.value]);
            });
        });
    }

    // Lane t: sum_j mvec_j * bsum_j of token t, from a packed block's transposed bsums. The multipliers of sub-blocks
    // 2i and 2i+1 are int32 lane i of mvec; two chains of four keep the vpdpwssd latency off the critical path.
    static TQ_INLINE __m512i bsum_terms(const uint8_t* bs, __m256i mvec) {
        alignas(32) int32_t m[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(m), mvec);
        __m512i a = _mm512_setzero_si512(), c = _mm512_setzero_si512();
        for (int i = 0; i < 8; i += 2) {
            a = _mm512_dpwssd_epi32(a, _mm512_load_si512(bs + 64 * i), _mm512_set1_epi32(m[i]));
            c = _mm512_dpwssd_epi32(c, _mm512_load_si512(bs + 64 * (i + 1)), _mm512_set1_epi32(m[i + 1]));
        }
        return _mm512_add_epi32(a, c);
    }

    // One token, whole rows, activations as they are: the AVX2 kernel's single-token layout, sumi in lane 0 and
    // summ in lane 1 of one xmm.
    static void rows_one_token(const uint8_t* W, size_t row_bytes, int64_t n_blocks, int64_t r0, int64_t r1,
                               const uint8_t* xq, float* y) {
        for (int64_t r = r0; r < r1; ++r) {
            const uint8_t* row = W + r * row_bytes;
            __m128 acc1 = _mm_setzero_ps();
            for (int64_t b = 0; b < n_blocks; ++b) {
                const uint8_t* blk = row + b * Ty::kBytes;
                const uint8_t* x0 = xq + b * kXBytes;
                const typename Ty::W w = Ty::prepare(blk);
                __m512i isum[1] = {_mm512_setzero_si512()};
                products<1>(blk, w, x0 + kXqs, isum);
                const __m256i p = _mm256_madd_epi16(load32(x0 + kXbsums), w.mvec);
                __m256i i8 = _mm256_add_epi32(_mm512_castsi512_si256(isum[0]), _mm512_extracti64x4_epi64(isum[0], 1));
                __m256i h;
                if constexpr (Ty::kOffsetShift > 0) {
                    i8 = _mm256_sub_epi32(i8, _mm256_slli_epi32(p, Ty::kOffsetShift));
                    h = _mm256_hadd_epi32(i8, i8);
                } else {
                    h = _mm256_hadd_epi32(i8, p);
                }
                __m128i q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
                q = _mm_hadd_epi32(q, q);
                float dx;
                __builtin_memcpy(&dx, x0 + kXd, sizeof dx);
                const __m128 coef = _mm_mul_ps(scales_of(blk), _mm_set1_ps(dx));
                acc1 = _mm_fmadd_ps(coef, _mm_cvtepi32_ps(q), acc1);
            }
            const float a = _mm_cvtss_f32(acc1);
            y[r] = Ty::kHasMin ? a - _mm_cvtss_f32(_mm_movehdup_ps(acc1)) : a;
        }
    }

    // Super-blocks [b0, b1) of rows [r0, r1) against a packed tile of T tokens. Token t's float sums are lane t of
    // acc (the d * sumi terms) and acc_m (the dmin * summ terms), carried in state[2 (r - r0)], [2 (r - r0) + 1]
    // between column blocks; the last block writes acc - acc_m to y. Rows before r_end may be prefetched.
    template <int T>
    static void rows_tile(const uint8_t* W, size_t row_bytes, int64_t r0, int64_t r1, int64_t r_end, int64_t b0,
                          int64_t b1, bool last, const uint8_t* tile, __m512* state, float* y, int64_t y_stride) {
        for (int64_t r = r0; r < r1; ++r) {
            const uint8_t* row = W + r * row_bytes;
            const uint8_t* ahead = W + (r + kPrefetchRows < r_end ? r + kPrefetchRows : r) * row_bytes;
            __m512 acc = state[2 * (r - r0)], acc_m = state[2 * (r - r0) + 1];
            for (int64_t b = b0; b < b1; ++b) {
                const uint8_t* blk = row + b * Ty::kBytes;
                const uint8_t* xb = tile + b * packed_block_bytes(T);
                for (size_t off = 0; off < Ty::kBytes; off += 64)
                    _mm_prefetch(reinterpret_cast<const char*>(ahead + b * Ty::kBytes + off), _MM_HINT_T0);
                const typename Ty::W w = Ty::prepare(blk);
                __m512i sumi;
                if constexpr (Ty::kPrescaled) {
                    __m512i isum[T];
                    unroll<T>([&](auto t) { isum[t.value] = _mm512_setzero_si512(); });
                    products<T>(blk, w, xb + kPackCodes, isum);
                    sumi = sum_lanes16<T>(isum);
                } else {
                    __m512i acc2[(T + 1) / 2];
                    products_paired<T>(blk, w, xb + kPackCodes, acc2);
                    sumi = sum_pairs<(T + 1) / 2>(acc2);
                }
                const __m512i bsum = bsum_terms(xb + kPackBsums, w.mvec);
                if constexpr (Ty::kOffsetShift > 0) sumi = _mm512_sub_epi32(sumi, _mm512_slli_epi32(bsum, Ty::kOffsetShift));
                const __m512 dx = _mm512_load_ps(xb + kPackDx);
                const __m128 dm = scales_of(blk);
                acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_broadcastss_ps(dm), dx), _mm512_cvtepi32_ps(sumi), acc);
                if constexpr (Ty::kHasMin) {
                    const __m512 dmin = _mm512_broadcastss_ps(_mm_movehdup_ps(dm));
                    acc_m = _mm512_fmadd_ps(_mm512_mul_ps(dmin, dx), _mm512_cvtepi32_ps(bsum), acc_m);
                }
            }
            if (!last) {
                state[2 * (r - r0)] = acc;
                state[2 * (r - r0) + 1] = acc_m;
                continue;
            }
            alignas(64) float lanes[16], lanes_m[16];
            _mm512_store_ps(lanes, acc);
            _mm512_store_ps(lanes_m, acc_m);
            for (int t = 0; t < T; ++t) y[t * y_stride + r] = Ty::kHasMin ? lanes[t] - lanes_m[t] : lanes[t];
        }
    }

    // rows_tile<n> for a tile of n tokens, 1 <= n <= T (a call of 16k + 1 tokens ends with a packed tile of one).
    template <int T>
    static void rows_tile_upto(int n, const uint8_t* W, size_t row_bytes, int64_t r0, int64_t r1, int64_t r_end,
                               int64_t b0, int64_t b1, bool last, const uint8_t* tile, __m512* state, float* y,
                               int64_t y_stride) {
        if constexpr (T > 1) {
            if (n < T)
                return rows_tile_upto<T - 1>(n, W, row_bytes, r0, r1, r_end, b0, b1, last, tile, state, y, y_stride);
        }
        rows_tile<T>(W, row_bytes, r0, r1, r_end, b0, b1, last, tile, state, y, y_stride);
    }

    // The DotRowsQ8Fn (quant_q8.h's contract). Rows go in chunks of about kRowChunkBytes of weights that stay in L2
    // while every tile sweeps them, column block by column block.
    static void dot_rows(const void* Wv, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end,
                         const uint8_t* xq, size_t xq_stride, int64_t n_tokens, float* y, int64_t y_stride) {
        const uint8_t* W = static_cast<const uint8_t*>(Wv);
        const int64_t n_blocks = cols / kQK_K;
        if (n_tokens <= 0 || row_end <= row_begin) return;
        if (n_tokens == 1) return rows_one_token(W, row_bytes, n_blocks, row_begin, row_end, xq, y);
        const int64_t n_tiles = (n_tokens + kTile - 1) / kTile;
        auto tile_tokens = [&](int64_t i) {
            const int64_t left = n_tokens - i * kTile;
            return static_cast<int>(left < kTile ? left : kTile);
        };
        const size_t tile_bytes = static_cast<size_t>(n_blocks) * packed_block_bytes(kTile);
        int64_t chunk = static_cast<int64_t>(kRowChunkBytes / (row_bytes > 0 ? row_bytes : 1));
        if (chunk < 1) chunk = 1;
        if (chunk > row_end - row_begin) chunk = row_end - row_begin;
        // One scratch buffer: the packed tiles, then the float state of a chunk's rows.
        uint8_t* scratch = scratch_buffer(static_cast<size_t>(n_tiles) * tile_bytes + static_cast<size_t>(chunk) * 128);
        __m512* state = reinterpret_cast<__m512*>(scratch + n_tiles * tile_bytes);
        for (int64_t i = 0; i < n_tiles; ++i)
            pack(tile_tokens(i), xq + i * kTile * xq_stride, xq_stride, n_blocks, scratch + i * tile_bytes);
        // Column blocks of equal size, at most kColBlock super-blocks each.
        const int64_t n_col = (n_blocks + kColBlock - 1) / kColBlock;
        for (int64_t r0 = row_begin; r0 < row_end; r0 += chunk) {
            const int64_t r1 = r0 + chunk < row_end ? r0 + chunk : row_end;
            for (int64_t i = 0; i < n_tiles; ++i) {
                for (int64_t k = 0; k < 2 * (r1 - r0); ++k) state[k] = _mm512_setzero_ps();
                for (int64_t c = 0; c < n_col; ++c)
                    rows_tile_upto<kTile>(tile_tokens(i), W, row_bytes, r0, r1, row_end, n_blocks * c / n_col,
                                          n_blocks * (c + 1) / n_col, c == n_col - 1, scratch + i * tile_bytes,
                                          state, y + i * kTile * y_stride, y_stride);
            }
        }
    }
};

}  // namespace

DotRowsQ8Fn kquant_q8_avx512_kernel(GgmlType type) {
    switch (type) {
        case GgmlType::Q2_K: return &Kernel<Q2_K>::dot_rows;
        case GgmlType::Q3_K: return &Kernel<Q3_K>::dot_rows;
        case GgmlType::Q4_K: return &Kernel<Q4_K>::dot_rows;
        case GgmlType::Q5_K: return &Kernel<Q5_K>::dot_rows;
        case GgmlType::Q6_K: return &Kernel<Q6_K>::dot_rows;
        default: return nullptr;
    }
}

#else

DotRowsQ8Fn kquant_q8_avx512_kernel(GgmlType) { return nullptr; }

#endif  // TANDEM_Q8K_AVX512

}  // namespace tandem::cpu::q8_detail

#ifdef TANDEM_Q8K_AVX512
#pragma GCC pop_options
#endif
