// AVX2 integer kernels of Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (legacy_q8_avx2_kernel of quant_q8_driver.h), "row
// octets": 8 weight rows in the 8 lanes of a ymm, so that per block and token the float work (one
// conversion, one scale product, one fma) is shared by 8 rows instead of being spent on 8 lanes of one row.
//
// Arithmetic: exactly the scalar kernel's (ScalarKernel in quant_q8_legacy.cpp), per (row, token) and block in row
// order: sumi = the exact int32 sum of the 32 code products, acc = fma(float(sumi), d_w * d_x, acc); Q4_1 / Q5_1
// also macc = fma(m_w, s_x, macc), result acc + macc. Lane r of every vector op is row r's scalar operation, and the
// integer sums are exact however they are formed, so the results are bitwise dot_rows_scalar's: batch invariance
// (no dependence on tile width, token position or row range) follows from that.
//
// Layout. A group of 8 rows is decoded, a chunk of blocks at a time, into a small buffer (L1): per block, 8 vectors
// U_k (k = 0..7) whose lane r holds the 4 code bytes 4k..4k+3 of row r, as unsigned bytes u = q + offset (Q4_0:
// the nibble, offset 8; Q5_0: the 5-bit code, offset 16; Q4_1 / Q5_1: unsigned already), plus the 8 rows' d (and
// m) as floats. For a token, activation dword k (codes 4k..4k+3) is broadcast, and maddubs(U_k, x_k) gives, per
// lane, row r's two pair sums of those 4 products; 8 of them summed (int16) and one madd with ones give row r's
// block sum in lane r. No horizontal sums at all. The offset comes off as offset * sum(x codes), an exact integer
// per (token, block) computed once per call for all rows.
//
// Why the int16 sums cannot wrap: |x| <= 127 (the activation quantizer: x * 127 / amax rounds to at most 127; even
// -128 would fit below), u <= 15 for the 4-bit types, so a maddubs pair is at most 2 * 15 * 128 = 3840 and 8 of
// them 30720 < 32767. Q5 (u <= 31): pairs up to 7936, so 4 groups at most per int16 sum (31744), two sums. Q8_0's
// codes are signed -128..127 (offset 128 would make maddubs saturate), so it keeps the sign trick: maddubs(|q_w|,
// sign(q_x, q_w)) per group (pairs <= 2 * 128 * 127 = 32512, widened to int32 at once).
//
// Loop order: tokens in super-tiles whose activations stay in L2; within one, each group of 8 rows is decoded once
// per chunk of blocks and every token tile (8 tokens: 8 accumulators in registers) sweeps the chunk. The
// accumulators live in a per-call buffer between chunks (exact: a float stored and reloaded).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "cpu/quant.h"
#include "cpu/quant_q8_driver.h"
#include "cpu/unaligned.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TANDEM_Q8R_SIMD 1
#include <immintrin.h>
#endif

namespace tandem::cpu::q8_detail {

#ifdef TANDEM_Q8R_SIMD
namespace {

#define TANDEM_Q8R_INLINE inline __attribute__((always_inline))

constexpr int kRows = 8;        // rows per group: the lanes of a ymm
constexpr int kTile = 8;        // tokens per tile: 8 accumulators (+ the block's scale and temporaries) in 16 ymm
constexpr int64_t kSuper = 64;  // tokens per super-tile: 64 x 4096 activation bytes stay in L2
constexpr int64_t kFused = 2;   // up to this many tokens: decode and use each block at once (rows_fused)

TANDEM_Q8R_INLINE __m128i load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
// [16 bytes at lo | 16 bytes at hi]
TANDEM_Q8R_INLINE __m256i load_2x128(const uint8_t* lo, const uint8_t* hi) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(load128(lo)), load128(hi), 1);
}

template <int... I, class F>
TANDEM_Q8R_INLINE void static_for(std::integer_sequence<int, I...>, F&& f) {
    (f(std::integral_constant<int, I>{}), ...);
}

// ---- weight types ----------------------------------------------------------------------------------------------
// kBytes, kQs (offset of the codes), kQh (of the fifth bits, -1: none), kOffset (subtracted from the unsigned
// codes; 0 for the types with m), kHasMin (m after d), kQ8 (Q8_0: signed bytes, the sign trick), and the
// activation block (kActBytes, kActQs).
struct Q4_0R {
    static constexpr GgmlType kType = GgmlType::Q4_0;
    static constexpr size_t kBytes = sizeof(BlockQ4_0), kQs = offsetof(BlockQ4_0, qs);
    static constexpr int kQh = -1, kOffset = 8;
    static constexpr bool kHasMin = false, kQ8 = false;
    static constexpr size_t kActBytes = sizeof(BlockQ8_0), kActQs = offsetof(BlockQ8_0, qs);
};
struct Q4_1R {
    static constexpr GgmlType kType = GgmlType::Q4_1;
    static constexpr size_t kBytes = sizeof(BlockQ4_1), kQs = offsetof(BlockQ4_1, qs);
    static constexpr int kQh = -1, kOffset = 0;
    static constexpr bool kHasMin = true, kQ8 = false;
    static constexpr size_t kActBytes = sizeof(BlockQ8_1), kActQs = offsetof(BlockQ8_1, qs);
};
struct Q5_0R {
    static constexpr GgmlType kType = GgmlType::Q5_0;
    static constexpr size_t kBytes = sizeof(BlockQ5_0), kQs = offsetof(BlockQ5_0, qs);
    static constexpr int kQh = offsetof(BlockQ5_0, qh), kOffset = 16;
    static constexpr bool kHasMin = false, kQ8 = false;
    static constexpr size_t kActBytes = sizeof(BlockQ8_0), kActQs = offsetof(BlockQ8_0, qs);
};
struct Q5_1R {
    static constexpr GgmlType kType = GgmlType::Q5_1;
    static constexpr size_t kBytes = sizeof(BlockQ5_1), kQs = offsetof(BlockQ5_1, qs);
    static constexpr int kQh = offsetof(BlockQ5_1, qh), kOffset = 0;
    static constexpr bool kHasMin = true, kQ8 = false;
    static constexpr size_t kActBytes = sizeof(BlockQ8_1), kActQs = offsetof(BlockQ8_1, qs);
};
struct Q8_0R {
    static constexpr GgmlType kType = GgmlType::Q8_0;
    static constexpr size_t kBytes = sizeof(BlockQ8_0), kQs = offsetof(BlockQ8_0, qs);
    static constexpr int kQh = -1, kOffset = 0;
    static constexpr bool kHasMin = false, kQ8 = true;
    static constexpr size_t kActBytes = sizeof(BlockQ8_0), kActQs = offsetof(BlockQ8_0, qs);
};

// A decoded block of a row group: U_0..U_7 (Q8_0: then |U_0|..|U_7|), the rows' d and m as floats.
template <class W>
struct Rec {
    static constexpr int kU = W::kQ8 ? 16 : 8;
    __m256i u[kU];
    __m256 d, m;
};

// 4x4 transpose of dwords within each 128-bit half: out[j] half h = dword j of in[0..3] half h.
TANDEM_Q8R_INLINE void transpose4(const __m256i (&in)[4], __m256i* out) {
    const __m256i a = _mm256_unpacklo_epi32(in[0], in[1]), b = _mm256_unpackhi_epi32(in[0], in[1]);
    const __m256i c = _mm256_unpacklo_epi32(in[2], in[3]), d = _mm256_unpackhi_epi32(in[2], in[3]);
    out[0] = _mm256_unpacklo_epi64(a, c);
    out[1] = _mm256_unpackhi_epi64(a, c);
    out[2] = _mm256_unpacklo_epi64(b, d);
    out[3] = _mm256_unpackhi_epi64(b, d);
}

// Decodes block `blk` (byte offset in the row) of the 8 rows into rec. Rows r and r + 4 share a register, row r in
// the low half: L_r holds their elements 0..15 (16 code bytes), H_r elements 16..31. A 4x4 dword transpose within
// the halves then gives U_k (k < 4: from L, elements 4k..4k+3; k >= 4: from H, elements 16 + 4(k-4).. = 4k..) with
// row r in lane r. So U_k pairs with activation dword k for every k.
template <class W>
TANDEM_Q8R_INLINE void decode(const uint8_t* const (&row)[kRows], size_t blk, Rec<W>& rec) {
    __m256i L[4], H[4];
    static_for(std::make_integer_sequence<int, 4>{}, [&](auto rr) {
        constexpr int r = decltype(rr)::value;
        const uint8_t* p0 = row[r] + blk;
        const uint8_t* p1 = row[r + 4] + blk;
        if constexpr (W::kQ8) {
            L[r] = load_2x128(p0 + W::kQs, p1 + W::kQs);
            H[r] = load_2x128(p0 + W::kQs + 16, p1 + W::kQs + 16);
        } else {
            // Byte j's low nibble is element j, its high nibble element j + 16.
            const __m256i v = load_2x128(p0 + W::kQs, p1 + W::kQs);
            const __m256i m4 = _mm256_set1_epi8(0x0F);
            L[r] = _mm256_and_si256(v, m4);
            H[r] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if constexpr (W::kQh >= 0) {
                // Fifth bits: byte e of a half gets qh byte e / 8 (elements 0..15: qh bytes 0, 1; 16..31: 2, 3),
                // keeps bit e % 8, and becomes 0x10 where it is set.
                const __m256i qh = _mm256_inserti128_si256(
                    _mm256_castsi128_si256(_mm_cvtsi32_si128(static_cast<int>(load_u32(p0 + W::kQh)))),
                    _mm_cvtsi32_si128(static_cast<int>(load_u32(p1 + W::kQh))), 1);
                const __m256i ctl_lo = _mm256_set_epi64x(0x0101010101010101, 0, 0x0101010101010101, 0);
                const __m256i ctl_hi = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                         0x0303030303030303, 0x0202020202020202);
                const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
                const __m256i b16 = _mm256_set1_epi8(0x10);
                const __m256i lo = _mm256_shuffle_epi8(qh, ctl_lo), hi = _mm256_shuffle_epi8(qh, ctl_hi);
                L[r] = _mm256_or_si256(L[r], _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(lo, bit), bit), b16));
                H[r] = _mm256_or_si256(H[r], _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hi, bit), bit), b16));
            }
        }
    });
    transpose4(L, rec.u);
    transpose4(H, rec.u + 4);
    if constexpr (W::kQ8)
        for (int k = 0; k < 8; ++k) rec.u[8 + k] = _mm256_sign_epi8(rec.u[k], rec.u[k]);  // |q|, -128 -> 128
    // d (and m: the next fp16) of the 8 rows: 4 bytes from each block start, bytes d0 d1 gathered into the low
    // 8 bytes of each half and m0 m1 into the high 8, then the qwords reordered to [d 0..3, d 4..7, m 0..3, m 4..7].
    const __m256i hdr = _mm256_setr_epi32(
        static_cast<int>(load_u32(row[0] + blk)), static_cast<int>(load_u32(row[1] + blk)),
        static_cast<int>(load_u32(row[2] + blk)), static_cast<int>(load_u32(row[3] + blk)),
        static_cast<int>(load_u32(row[4] + blk)), static_cast<int>(load_u32(row[5] + blk)),
        static_cast<int>(load_u32(row[6] + blk)), static_cast<int>(load_u32(row[7] + blk)));
    const __m256i ctl = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,  //
                                         0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    const __m256i dm = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(hdr, ctl), 0xD8);
    rec.d = _mm256_cvtph_ps(_mm256_castsi256_si128(dm));
    rec.m = W::kHasMin ? _mm256_cvtph_ps(_mm256_extracti128_si256(dm, 1)) : _mm256_setzero_ps();
}

// Per (token, block): d_x as a float, and c: offset * sum(q_x) (Q4_0, Q5_0) or the bits of s_x as a float (Q4_1,
// Q5_1); unused for Q8_0.
struct Aux {
    float d;
    int32_t c;
};

template <class W>
void prepare_aux(const uint8_t* xq, size_t xq_stride, int64_t n_tokens, int64_t n_blocks, Aux* aux) {
    for (int64_t t = 0; t < n_tokens; ++t)
        for (int64_t b = 0; b < n_blocks; ++b) {
            const uint8_t* xb = xq + t * xq_stride + b * W::kActBytes;
            Aux& a = aux[t * n_blocks + b];
            a.d = _cvtsh_ss(static_cast<uint16_t>(load_u32(xb)));
            a.c = 0;
            if constexpr (W::kOffset != 0) {
                const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + W::kActQs));
                const __m256i s8 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q),
                                                     _mm256_set1_epi16(1));
                __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
                s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
                s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
                a.c = W::kOffset * _mm_cvtsi128_si32(s);
            } else if constexpr (W::kHasMin) {
                const float s = _cvtsh_ss(static_cast<uint16_t>(load_u32(xb) >> 16));
                std::memcpy(&a.c, &s, sizeof s);
            }
        }
}

// Row r's exact block sum (before the offset) in lane r, for one token's activation codes x.
template <class W>
TANDEM_Q8R_INLINE __m256i block_sum(const Rec<W>& rec, const uint8_t* x) {
    const __m256i ones = _mm256_set1_epi16(1);
    auto bx = [&](int k) { return _mm256_set1_epi32(static_cast<int>(load_u32(x + 4 * k))); };
    if constexpr (W::kQ8) {
        __m256i s[8];
        for (int k = 0; k < 8; ++k)
            s[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(rec.u[8 + k], _mm256_sign_epi8(bx(k), rec.u[k])), ones);
        return _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), _mm256_add_epi32(s[2], s[3])),
                                _mm256_add_epi32(_mm256_add_epi32(s[4], s[5]), _mm256_add_epi32(s[6], s[7])));
    } else {
        __m256i p[8];
        for (int k = 0; k < 8; ++k) p[k] = _mm256_maddubs_epi16(rec.u[k], bx(k));
        const __m256i a = _mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3]));
        const __m256i b = _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7]));
        if constexpr (W::kQh >= 0)
            return _mm256_add_epi32(_mm256_madd_epi16(a, ones), _mm256_madd_epi16(b, ones));
        else
            return _mm256_madd_epi16(_mm256_add_epi16(a, b), ones);
    }
}

// One token tile (T tokens) over a chunk of nb decoded blocks. acc / macc: the tile's accumulators, 8 floats per
// token (row r in lane r), read unless `first` (the chunk starting the row) and written back. aux and x start at
// the tile's first token and the chunk's first block.
template <class W, int T>
void tile_chunk(const Rec<W>* rec, int nb, const Aux* aux, int64_t aux_stride, const uint8_t* x, size_t xq_stride,
                float* acc_io, float* macc_io, bool first) {
    __m256 acc[T];
    static_for(std::make_integer_sequence<int, T>{}, [&](auto tt) {
        constexpr int t = decltype(tt)::value;
        acc[t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc_io + 8 * t);
    });
    for (int b = 0; b < nb; ++b) {
        const Rec<W>& r = rec[b];
        static_for(std::make_integer_sequence<int, T>{}, [&](auto tt) {
            constexpr int t = decltype(tt)::value;
            const Aux& a = aux[t * aux_stride + b];
            __m256i s = block_sum<W>(r, x + t * xq_stride + b * W::kActBytes + W::kActQs);
            if constexpr (W::kOffset != 0) s = _mm256_sub_epi32(s, _mm256_set1_epi32(a.c));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(r.d, _mm256_set1_ps(a.d)), acc[t]);
        });
    }
    static_for(std::make_integer_sequence<int, T>{}, [&](auto tt) {
        constexpr int t = decltype(tt)::value;
        _mm256_storeu_ps(acc_io + 8 * t, acc[t]);
    });
    if constexpr (W::kHasMin) {
        // The offsets' sum: a separate chain per token (as the scalar kernel's macc), in block order.
        __m256 macc[T];
        static_for(std::make_integer_sequence<int, T>{}, [&](auto tt) {
            constexpr int t = decltype(tt)::value;
            macc[t] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(macc_io + 8 * t);
        });
        for (int b = 0; b < nb; ++b) {
            const __m256 m = rec[b].m;
            static_for(std::make_integer_sequence<int, T>{}, [&](auto tt) {
                constexpr int t = decltype(tt)::value;
                float s;
                std::memcpy(&s, &aux[t * aux_stride + b].c, sizeof s);
                macc[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(s), macc[t]);
            });
        }
        static_for(std::make_integer_sequence<int, T>{}, [&](auto tt) {
            constexpr int t = decltype(tt)::value;
            _mm256_storeu_ps(macc_io + 8 * t, macc[t]);
        });
    }
}

template <class W, int T>
void tile_chunk_upto(int n, const Rec<W>* rec, int nb, const Aux* aux, int64_t aux_stride, const uint8_t* x,
                     size_t xq_stride, float* acc_io, float* macc_io, bool first) {
    if constexpr (T > 1) {
        if (n < T)
            return tile_chunk_upto<W, T - 1>(n, rec, nb, aux, aux_stride, x, xq_stride, acc_io, macc_io, first);
    }
    tile_chunk<W, T>(rec, nb, aux, aux_stride, x, xq_stride, acc_io, macc_io, first);
}

// Few tokens (decode): each block of the 8 rows is decoded into registers and used at once, with the accumulators
// in registers for the whole row: no decoded-block buffer to write and read back. The same per-lane arithmetic as
// tile_chunk (the offsets' chain runs beside the main one), so the same bits.
// Software prefetch of rows_fused, which reads a group's 8 rows as 8 streams (one token or two: nothing else hides
// the memory latency). Rows of a matrix are contiguous, so a group is one region of 8 * row_bytes, and the next
// group's region is fetched while this one is used:
//  - short rows (a group of at most kSweepBytes): swept linearly into L1, as many bytes per block step as the step
//    consumes. The hardware prefetchers lose 8 streams that restart every 8 rows (the 896-column matrices of the
//    0.5B are 28 blocks long);
//  - long rows: block b of each of the next group's rows at block step b (a linear sweep would bring a whole 70 KB
//    group into a 32 KB L1 long before its use).
// Measured (tandem-kernel-bench --tokens 1 --wall, Q8_0, AVX2, one thread, from DRAM), 151936 x 896 (the 0.5B's
// output matrix) / 16384 x 8192: 512 bytes ahead in each row 5.5 / 15 GB/s, block b of the next group 9.6 / 22,
// the linear sweep 23.6 / 12.6.
constexpr int64_t kSweepBytes = 16 * 1024;

struct Prefetch {
    const uint8_t* next;  // the next group's region (this group's when it is the last before row_end)
    const uint8_t* next_end;
    bool sweep;
};

template <class W>
TANDEM_Q8R_INLINE Prefetch prefetch_plan(const uint8_t* w, size_t row_bytes, int64_t g, int64_t row_end) {
    const int64_t next = g + kRows < row_end ? g + kRows : g;
    return {w + next * row_bytes, w + std::min(next + kRows, row_end) * row_bytes,
            static_cast<int64_t>(kRows * row_bytes) <= kSweepBytes};
}

template <class W>
TANDEM_Q8R_INLINE void prefetch_block(const Prefetch& pf, size_t row_bytes, int64_t b) {
    if (pf.sweep) {
        const uint8_t* lo = pf.next + b * (kRows * static_cast<int64_t>(W::kBytes));
        const uint8_t* hi = std::min(lo + kRows * W::kBytes, pf.next_end);
        for (const uint8_t* p = lo; p < hi; p += 64) _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
    } else if (W::kBytes > 32 || (b & 1) == 0) {
        // Every other block for blocks of at most 32 bytes: consecutive prefetches of a row are then at most 64
        // bytes apart, so no line is skipped.
        for (const uint8_t* p = pf.next + b * W::kBytes; p < pf.next_end; p += row_bytes)
            _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
    }
}

template <class W, int T>
void rows_fused(const uint8_t* w, size_t row_bytes, int64_t n_blocks, int64_t row_begin, int64_t row_end,
                const Aux* aux, const uint8_t* xq, size_t xq_stride, float* y, int64_t y_stride) {
    for (int64_t g = row_begin; g < row_end; g += kRows) {
        const int valid = static_cast<int>(std::min<int64_t>(kRows, row_end - g));
        const uint8_t* row[kRows];
        for (int r = 0; r < kRows; ++r) row[r] = w + (g + std::min(r, valid - 1)) * row_bytes;
        const Prefetch pf = prefetch_plan<W>(w, row_bytes, g, row_end);
        __m256 acc[T], macc[T];
        for (int t = 0; t < T; ++t) acc[t] = macc[t] = _mm256_setzero_ps();
        for (int64_t b = 0; b < n_blocks; ++b) {
            prefetch_block<W>(pf, row_bytes, b);
            Rec<W> rec;
            decode<W>(row, static_cast<size_t>(b) * W::kBytes, rec);
            static_for(std::make_integer_sequence<int, T>{}, [&](auto tt) {
                constexpr int t = decltype(tt)::value;
                const Aux& a = aux[t * n_blocks + b];
                __m256i s = block_sum<W>(rec, xq + t * xq_stride + b * W::kActBytes + W::kActQs);
                if constexpr (W::kOffset != 0) s = _mm256_sub_epi32(s, _mm256_set1_epi32(a.c));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(rec.d, _mm256_set1_ps(a.d)), acc[t]);
                if constexpr (W::kHasMin) {
                    float sx;
                    std::memcpy(&sx, &a.c, sizeof sx);
                    macc[t] = _mm256_fmadd_ps(rec.m, _mm256_set1_ps(sx), macc[t]);
                }
            });
        }
        for (int t = 0; t < T; ++t) {
            __m256 v = acc[t];
            if constexpr (W::kHasMin) v = _mm256_add_ps(v, macc[t]);
            float* out = y + t * y_stride + g;
            if (valid == kRows) {
                _mm256_storeu_ps(out, v);
            } else {
                float lanes[kRows];
                _mm256_storeu_ps(lanes, v);
                for (int r = 0; r < valid; ++r) out[r] = lanes[r];
            }
        }
    }
}

// The calling thread's scratch: decoded blocks, per-(token, block) activation data, accumulators. Grown, never
// shrunk (as the driver's packed tiles).
struct alignas(64) Line {
    unsigned char bytes[64];
};
struct Scratch {
    std::vector<Line> rec;  // storage for Rec<W>[chunk]
    std::vector<Aux> aux;
    std::vector<float> acc, macc;
};
Scratch& scratch() {
    thread_local Scratch s;
    return s;
}

template <class W>
void dot_rows_octet(const void* Wv, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end,
                    const uint8_t* xq, size_t xq_stride, int64_t n_tokens, float* y, int64_t y_stride) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    const uint8_t* w = static_cast<const uint8_t*>(Wv);
    const int64_t n_blocks = cols / 32;
    // Blocks decoded at a time: about 20 KiB of decoded codes, which every token of a super-tile reads again.
    constexpr int kChunk = W::kQ8 ? 32 : 64;
    Scratch& s = scratch();
    const size_t rec_lines = (sizeof(Rec<W>) * kChunk + sizeof(Line) - 1) / sizeof(Line);
    if (s.rec.size() < rec_lines) s.rec.resize(rec_lines);
    Rec<W>* rec = reinterpret_cast<Rec<W>*>(s.rec.data());
    const size_t n_aux = static_cast<size_t>(n_tokens * n_blocks);
    if (s.aux.size() < n_aux) s.aux.resize(n_aux);
    const size_t n_acc = static_cast<size_t>(std::min(n_tokens, kSuper)) * kRows;
    if (s.acc.size() < n_acc) s.acc.resize(n_acc), s.macc.resize(n_acc);
    Aux* aux = s.aux.data();
    prepare_aux<W>(xq, xq_stride, n_tokens, n_blocks, aux);
    if (n_tokens <= kFused) {
        switch (n_tokens) {
            case 1: return rows_fused<W, 1>(w, row_bytes, n_blocks, row_begin, row_end, aux, xq, xq_stride, y, y_stride);
            default: return rows_fused<W, 2>(w, row_bytes, n_blocks, row_begin, row_end, aux, xq, xq_stride, y, y_stride);
        }
    }
    float* acc = s.acc.data();
    float* macc = s.macc.data();

    for (int64_t t0 = 0; t0 < n_tokens; t0 += kSuper) {
        const int64_t nt = std::min(kSuper, n_tokens - t0);
        for (int64_t g = row_begin; g < row_end; g += kRows) {
            // A partial last group reads its last valid row again in the missing lanes, whose results are dropped.
            const int valid = static_cast<int>(std::min<int64_t>(kRows, row_end - g));
            const uint8_t* row[kRows];
            for (int r = 0; r < kRows; ++r) row[r] = w + (g + std::min(r, valid - 1)) * row_bytes;
            if (n_blocks == 0) {
                std::fill(acc, acc + nt * kRows, 0.0f);
                std::fill(macc, macc + nt * kRows, 0.0f);
            }
            for (int64_t c0 = 0; c0 < n_blocks; c0 += kChunk) {
                const int nb = static_cast<int>(std::min<int64_t>(kChunk, n_blocks - c0));
                for (int b = 0; b < nb; ++b) decode<W>(row, static_cast<size_t>(c0 + b) * W::kBytes, rec[b]);
                for (int64_t i = 0; i < nt; i += kTile) {
                    const int n = static_cast<int>(std::min<int64_t>(kTile, nt - i));
                    const int64_t t = t0 + i;
                    tile_chunk_upto<W, kTile>(n, rec, nb, aux + t * n_blocks + c0, n_blocks,
                                              xq + t * xq_stride + c0 * W::kActBytes, xq_stride, acc + i * kRows,
                                              macc + i * kRows, c0 == 0);
                }
            }
            for (int64_t i = 0; i < nt; ++i) {
                float* out = y + (t0 + i) * y_stride + g;
                __m256 v = _mm256_loadu_ps(acc + i * kRows);
                if constexpr (W::kHasMin) v = _mm256_add_ps(v, _mm256_loadu_ps(macc + i * kRows));
                if (valid == kRows) {
                    _mm256_storeu_ps(out, v);
                } else {
                    float lanes[kRows];
                    _mm256_storeu_ps(lanes, v);
                    for (int r = 0; r < valid; ++r) out[r] = lanes[r];
                }
            }
        }
    }
}

}  // namespace
#endif  // TANDEM_Q8R_SIMD

DotRowsQ8Fn legacy_q8_avx2_kernel(GgmlType type) {
#ifdef TANDEM_Q8R_SIMD
    switch (type) {
        case GgmlType::Q4_0: return &dot_rows_octet<Q4_0R>;
        case GgmlType::Q4_1: return &dot_rows_octet<Q4_1R>;
        case GgmlType::Q5_0: return &dot_rows_octet<Q5_0R>;
        case GgmlType::Q5_1: return &dot_rows_octet<Q5_1R>;
        case GgmlType::Q8_0: return &dot_rows_octet<Q8_0R>;
        default: return nullptr;
    }
#else
    (void)type;
    return nullptr;
#endif
}

}  // namespace tandem::cpu::q8_detail
