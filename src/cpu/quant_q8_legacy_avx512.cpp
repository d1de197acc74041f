// AVX-512 VNNI integer kernels of Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (legacy_q8_avx512_kernel of quant_q8_driver.h):
// quant_q8_legacy_avx2.cpp's scheme with 16 rows in the 16 lanes of a zmm, and vpdpbusd
// (4 unsigned x signed byte products summed into an int32 lane, no int16 stage, no saturation) instead of
// maddubs + madd. Bitwise equal to the scalar kernel for the same reason as the AVX2 one: lane r runs row r's
// scalar arithmetic, and the integer block sums are exact.
//
// Codes are unsigned bytes u = q + offset for every type here, Q8_0 included (u = q ^ 0x80 = q + 128): vpdpbusd sums
// in int32, so 255 * 127 products cannot saturate anything, and the offset comes off as the accumulator's start
// value, -offset * sum(q_x) (exact: |sum| <= 32 * 255 * 128).
//
// Compiled for AVX-512 by a target pragma placed after all includes; everything under it is in an anonymous
// namespace and calls no inline function or template of a shared header (those could be instantiated for AVX-512
// and picked by the linker for every caller): the std::vector scratch is managed by functions defined above the
// pragma. Call the kernels only after checking the CPU.
#pragma GCC diagnostic ignored "-Wuninitialized"        // GCC 12's _mm512_undefined_*() pass-throughs, once inlined
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpu/quant.h"
#include "cpu/quant_q8_driver.h"
#include "cpu/unaligned.h"

#if defined(TANDEM_AVX2) && defined(__x86_64__)
#define TANDEM_Q8R512 1
#include <immintrin.h>
#endif

namespace tandem::cpu::q8_detail {

#ifdef TANDEM_Q8R512
namespace {

// Per (token, block): d_x, and c: offset * sum(q_x) (Q4_0, Q5_0, Q8_0) or the bits of s_x as a float (Q4_1, Q5_1).
struct Aux {
    float d;
    int32_t c;
};
struct alignas(64) Line {
    unsigned char bytes[64];
};
// The calling thread's scratch (compiled for the build's target, outside the pragma): grown, never shrunk.
struct Scratch {
    std::vector<Line> rec;
    std::vector<Aux> aux;
    std::vector<float> acc, macc;
};
struct ScratchPtrs {
    void* rec;
    Aux* aux;
    float *acc, *macc;
};
__attribute__((noinline)) ScratchPtrs scratch(size_t rec_bytes, size_t n_aux, size_t n_acc) {
    thread_local Scratch s;
    const size_t lines = (rec_bytes + sizeof(Line) - 1) / sizeof(Line);
    if (s.rec.size() < lines) s.rec.resize(lines);
    if (s.aux.size() < n_aux) s.aux.resize(n_aux);
    if (s.acc.size() < n_acc) s.acc.resize(n_acc), s.macc.resize(n_acc);
    return {s.rec.data(), s.aux.data(), s.acc.data(), s.macc.data()};
}

}  // namespace
}  // namespace tandem::cpu::q8_detail

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")

namespace tandem::cpu::q8_detail {
namespace {

#define TANDEM_Q8R512_INLINE inline __attribute__((always_inline))

constexpr int kRows = 16;       // rows per group: the lanes of a zmm
constexpr int kTile = 16;       // tokens per tile: 16 accumulators + 8 codes vectors + scales in 32 zmm
constexpr int64_t kSuper = 64;  // tokens per super-tile (activations in L2)
constexpr int kChunk = 32;      // blocks decoded at a time: 32 x 640 bytes
constexpr int64_t kFused = 2;

TANDEM_Q8R512_INLINE int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
TANDEM_Q8R512_INLINE __m128i load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
// [16 bytes at p0 | p1 | p2 | p3]
TANDEM_Q8R512_INLINE __m512i load_4x128(const uint8_t* p0, const uint8_t* p1, const uint8_t* p2, const uint8_t* p3) {
    const __m256i lo = _mm256_inserti128_si256(_mm256_castsi128_si256(load128(p0)), load128(p1), 1);
    const __m256i hi = _mm256_inserti128_si256(_mm256_castsi128_si256(load128(p2)), load128(p3), 1);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

template <int... I, class F>
TANDEM_Q8R512_INLINE void static_for(std::integer_sequence<int, I...>, F&& f) {
    (f(std::integral_constant<int, I>{}), ...);
}

struct Q4_0R {
    static constexpr size_t kBytes = sizeof(BlockQ4_0), kQs = offsetof(BlockQ4_0, qs);
    static constexpr int kQh = -1, kOffset = 8;
    static constexpr bool kHasMin = false, kQ8 = false;
    static constexpr size_t kActBytes = sizeof(BlockQ8_0), kActQs = offsetof(BlockQ8_0, qs);
};
struct Q4_1R {
    static constexpr size_t kBytes = sizeof(BlockQ4_1), kQs = offsetof(BlockQ4_1, qs);
    static constexpr int kQh = -1, kOffset = 0;
    static constexpr bool kHasMin = true, kQ8 = false;
    static constexpr size_t kActBytes = sizeof(BlockQ8_1), kActQs = offsetof(BlockQ8_1, qs);
};
struct Q5_0R {
    static constexpr size_t kBytes = sizeof(BlockQ5_0), kQs = offsetof(BlockQ5_0, qs);
    static constexpr int kQh = offsetof(BlockQ5_0, qh), kOffset = 16;
    static constexpr bool kHasMin = false, kQ8 = false;
    static constexpr size_t kActBytes = sizeof(BlockQ8_0), kActQs = offsetof(BlockQ8_0, qs);
};
struct Q5_1R {
    static constexpr size_t kBytes = sizeof(BlockQ5_1), kQs = offsetof(BlockQ5_1, qs);
    static constexpr int kQh = offsetof(BlockQ5_1, qh), kOffset = 0;
    static constexpr bool kHasMin = true, kQ8 = false;
    static constexpr size_t kActBytes = sizeof(BlockQ8_1), kActQs = offsetof(BlockQ8_1, qs);
};
struct Q8_0R {
    static constexpr size_t kBytes = sizeof(BlockQ8_0), kQs = offsetof(BlockQ8_0, qs);
    static constexpr int kQh = -1, kOffset = 128;
    static constexpr bool kHasMin = false, kQ8 = true;
    static constexpr size_t kActBytes = sizeof(BlockQ8_0), kActQs = offsetof(BlockQ8_0, qs);
};

// A decoded block of 16 rows: U_k (lane r: row r's unsigned codes 4k..4k+3), d and m as floats.
struct Rec {
    __m512i u[8];
    __m512 d, m;
};

TANDEM_Q8R512_INLINE void transpose4(const __m512i (&in)[4], __m512i* out) {
    const __m512i a = _mm512_unpacklo_epi32(in[0], in[1]), b = _mm512_unpackhi_epi32(in[0], in[1]);
    const __m512i c = _mm512_unpacklo_epi32(in[2], in[3]), d = _mm512_unpackhi_epi32(in[2], in[3]);
    out[0] = _mm512_unpacklo_epi64(a, c);
    out[1] = _mm512_unpackhi_epi64(a, c);
    out[2] = _mm512_unpacklo_epi64(b, d);
    out[3] = _mm512_unpackhi_epi64(b, d);
}

// As the AVX2 decode with four rows per register: L_r's 128-bit quarter h holds row r + 4h, so after the in-lane
// 4x4 transposes dword 4h + i of U_k is row 4h + i.
template <class W>
TANDEM_Q8R512_INLINE void decode(const uint8_t* const (&row)[kRows], const __m512i& hdr_idx, size_t blk, Rec& rec) {
    __m512i L[4], H[4];
    static_for(std::make_integer_sequence<int, 4>{}, [&](auto rr) {
        constexpr int r = decltype(rr)::value;
        const uint8_t* p0 = row[r] + blk;
        const uint8_t* p1 = row[r + 4] + blk;
        const uint8_t* p2 = row[r + 8] + blk;
        const uint8_t* p3 = row[r + 12] + blk;
        if constexpr (W::kQ8) {
            const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
            L[r] = _mm512_xor_si512(load_4x128(p0 + W::kQs, p1 + W::kQs, p2 + W::kQs, p3 + W::kQs), flip);
            H[r] = _mm512_xor_si512(
                load_4x128(p0 + W::kQs + 16, p1 + W::kQs + 16, p2 + W::kQs + 16, p3 + W::kQs + 16), flip);
        } else {
            const __m512i v = load_4x128(p0 + W::kQs, p1 + W::kQs, p2 + W::kQs, p3 + W::kQs);
            const __m512i m4 = _mm512_set1_epi8(0x0F);
            L[r] = _mm512_and_si512(v, m4);
            H[r] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            if constexpr (W::kQh >= 0) {
                const __m512i qh = _mm512_setr_epi32(
                    static_cast<int>(load_u32(p0 + W::kQh)), 0, 0, 0, static_cast<int>(load_u32(p1 + W::kQh)), 0, 0,
                    0, static_cast<int>(load_u32(p2 + W::kQh)), 0, 0, 0, static_cast<int>(load_u32(p3 + W::kQh)), 0,
                    0, 0);
                const __m512i ctl_lo = _mm512_set_epi64(0x0101010101010101, 0, 0x0101010101010101, 0,
                                                        0x0101010101010101, 0, 0x0101010101010101, 0);
                const __m512i ctl_hi = _mm512_set_epi64(0x0303030303030303, 0x0202020202020202, 0x0303030303030303,
                                                        0x0202020202020202, 0x0303030303030303, 0x0202020202020202,
                                                        0x0303030303030303, 0x0202020202020202);
                const __m512i bit = _mm512_set1_epi64(static_cast<int64_t>(0x8040201008040201ull));
                const __m512i b16 = _mm512_set1_epi8(0x10);
                L[r] = _mm512_mask_add_epi8(L[r], _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, ctl_lo), bit), L[r],
                                            b16);
                H[r] = _mm512_mask_add_epi8(H[r], _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, ctl_hi), bit), H[r],
                                            b16);
            }
        }
    });
    transpose4(L, rec.u);
    transpose4(H, rec.u + 4);
    // The first 4 bytes of each row's block (d, then m or codes), gathered; d the low halves, m the high ones.
    const __m512i hdr = _mm512_i32gather_epi32(hdr_idx, row[0] + blk, 1);
    rec.d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr));
    rec.m = W::kHasMin ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hdr, 16))) : _mm512_setzero_ps();
}

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
                const __m256i s8 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), q);
                __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
                s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
                s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
                a.c = W::kOffset * _mm_cvtsi128_si32(s);
            } else if constexpr (W::kHasMin) {
                const float s = _cvtsh_ss(static_cast<uint16_t>(load_u32(xb) >> 16));
                __builtin_memcpy(&a.c, &s, sizeof s);
            }
        }
}

// Row r's exact block sum in lane r: -c + sum over k of the 4 products of U_k with activation dword k.
template <class W>
TANDEM_Q8R512_INLINE __m512i block_sum(const Rec& rec, const uint8_t* x, int32_t c) {
    auto bx = [&](int k) { return _mm512_set1_epi32(static_cast<int>(load_u32(x + 4 * k))); };
    // Two chains of 4 (vpdpbusd's latency), joined by one add: integer, so exact in any order.
    __m512i s0 = W::kOffset != 0 ? _mm512_set1_epi32(-c) : _mm512_setzero_si512();
    __m512i s1 = _mm512_setzero_si512();
    for (int k = 0; k < 8; k += 2) {
        s0 = _mm512_dpbusd_epi32(s0, rec.u[k], bx(k));
        s1 = _mm512_dpbusd_epi32(s1, rec.u[k + 1], bx(k + 1));
    }
    return _mm512_add_epi32(s0, s1);
}

template <class W, int T>
void tile_chunk(const Rec* rec, int nb, const Aux* aux, int64_t aux_stride, const uint8_t* x, size_t xq_stride,
                float* acc_io, float* macc_io, bool first) {
    __m512 acc[T];
    static_for(std::make_integer_sequence<int, T>{}, [&](auto tt) {
        constexpr int t = decltype(tt)::value;
        acc[t] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc_io + kRows * t);
    });
    for (int b = 0; b < nb; ++b) {
        const Rec& r = rec[b];
        static_for(std::make_integer_sequence<int, T>{}, [&](auto tt) {
            constexpr int t = decltype(tt)::value;
            const Aux& a = aux[t * aux_stride + b];
            const __m512i s = block_sum<W>(r, x + t * xq_stride + b * W::kActBytes + W::kActQs, a.c);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(r.d, _mm512_set1_ps(a.d)), acc[t]);
        });
    }
    static_for(std::make_integer_sequence<int, T>{}, [&](auto tt) {
        constexpr int t = decltype(tt)::value;
        _mm512_storeu_ps(acc_io + kRows * t, acc[t]);
    });
    if constexpr (W::kHasMin) {
        __m512 macc[T];
        static_for(std::make_integer_sequence<int, T>{}, [&](auto tt) {
            constexpr int t = decltype(tt)::value;
            macc[t] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(macc_io + kRows * t);
        });
        for (int b = 0; b < nb; ++b) {
            const __m512 m = rec[b].m;
            static_for(std::make_integer_sequence<int, T>{}, [&](auto tt) {
                constexpr int t = decltype(tt)::value;
                float s;
                __builtin_memcpy(&s, &aux[t * aux_stride + b].c, sizeof s);
                macc[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(s), macc[t]);
            });
        }
        static_for(std::make_integer_sequence<int, T>{}, [&](auto tt) {
            constexpr int t = decltype(tt)::value;
            _mm512_storeu_ps(macc_io + kRows * t, macc[t]);
        });
    }
}

template <class W, int T>
void tile_chunk_upto(int n, const Rec* rec, int nb, const Aux* aux, int64_t aux_stride, const uint8_t* x,
                     size_t xq_stride, float* acc_io, float* macc_io, bool first) {
    if constexpr (T > 1) {
        if (n < T)
            return tile_chunk_upto<W, T - 1>(n, rec, nb, aux, aux_stride, x, xq_stride, acc_io, macc_io, first);
    }
    tile_chunk<W, T>(rec, nb, aux, aux_stride, x, xq_stride, acc_io, macc_io, first);
}

// Lanes [0, valid) of v to out.
TANDEM_Q8R512_INLINE void store_rows(float* out, __m512 v, int valid) {
    _mm512_mask_storeu_ps(out, static_cast<__mmask16>((1u << valid) - 1u), v);
}

// Row group setup: row pointers (a partial group repeats its last valid row in the missing lanes, whose results
// are dropped) and their byte offsets from row 0 for the scale gather.
TANDEM_Q8R512_INLINE int group_rows(const uint8_t* w, size_t row_bytes, int64_t g, int64_t row_end,
                                    const uint8_t* (&row)[kRows], __m512i& idx) {
    const int valid = static_cast<int>(min64(kRows, row_end - g));
    alignas(64) int32_t off[kRows];
    for (int r = 0; r < kRows; ++r) {
        const int64_t rr = r < valid ? r : valid - 1;
        row[r] = w + (g + rr) * static_cast<int64_t>(row_bytes);
        off[r] = static_cast<int32_t>(rr * static_cast<int64_t>(row_bytes));
    }
    idx = _mm512_load_si512(off);
    return valid;
}

// Software prefetch of rows_fused: quant_q8_legacy_avx2.cpp's scheme (read its comment) for groups of 16 rows.
// The next group's region is fetched while this one is used: swept linearly into L1 when a group is at most
// kSweepBytes, else block b of each of its rows at block step b.
constexpr int64_t kSweepBytes = 16 * 1024;

struct Prefetch {
    const uint8_t* next;  // the next group's region (this group's when it is the last before row_end)
    const uint8_t* next_end;
    bool sweep;
};

TANDEM_Q8R512_INLINE Prefetch prefetch_plan(const uint8_t* w, size_t row_bytes, int64_t g, int64_t row_end) {
    const int64_t next = g + kRows < row_end ? g + kRows : g;
    return {w + next * row_bytes, w + (next + kRows < row_end ? next + kRows : row_end) * row_bytes,
            static_cast<int64_t>(kRows * row_bytes) <= kSweepBytes};
}

template <class W>
TANDEM_Q8R512_INLINE void prefetch_block(const Prefetch& pf, size_t row_bytes, int64_t b) {
    if (pf.sweep) {
        const uint8_t* lo = pf.next + b * (kRows * static_cast<int64_t>(W::kBytes));
        const uint8_t* end = lo + kRows * W::kBytes;
        const uint8_t* hi = end < pf.next_end ? end : pf.next_end;
        for (const uint8_t* p = lo; p < hi; p += 64) _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
    } else if (W::kBytes > 32 || (b & 1) == 0) {
        for (const uint8_t* p = pf.next + b * W::kBytes; p < pf.next_end; p += row_bytes)
            _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
    }
}

template <class W, int T>
void rows_fused(const uint8_t* w, size_t row_bytes, int64_t n_blocks, int64_t row_begin, int64_t row_end,
                const Aux* aux, const uint8_t* xq, size_t xq_stride, float* y, int64_t y_stride) {
    for (int64_t g = row_begin; g < row_end; g += kRows) {
        const uint8_t* row[kRows];
        __m512i idx;
        const int valid = group_rows(w, row_bytes, g, row_end, row, idx);
        const Prefetch pf = prefetch_plan(w, row_bytes, g, row_end);
        __m512 acc[T], macc[T];
        for (int t = 0; t < T; ++t) acc[t] = macc[t] = _mm512_setzero_ps();
        for (int64_t b = 0; b < n_blocks; ++b) {
            prefetch_block<W>(pf, row_bytes, b);
            Rec rec;
            decode<W>(row, idx, static_cast<size_t>(b) * W::kBytes, rec);
            static_for(std::make_integer_sequence<int, T>{}, [&](auto tt) {
                constexpr int t = decltype(tt)::value;
                const Aux& a = aux[t * n_blocks + b];
                const __m512i s = block_sum<W>(rec, xq + t * xq_stride + b * W::kActBytes + W::kActQs, a.c);
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(rec.d, _mm512_set1_ps(a.d)), acc[t]);
                if constexpr (W::kHasMin) {
                    float sx;
                    __builtin_memcpy(&sx, &a.c, sizeof sx);
                    macc[t] = _mm512_fmadd_ps(rec.m, _mm512_set1_ps(sx), macc[t]);
                }
            });
        }
        for (int t = 0; t < T; ++t)
            store_rows(y + t * y_stride + g, W::kHasMin ? _mm512_add_ps(acc[t], macc[t]) : acc[t], valid);
    }
}

template <class W>
void dot_rows_octet(const void* Wv, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end,
                    const uint8_t* xq, size_t xq_stride, int64_t n_tokens, float* y, int64_t y_stride) {
    if (row_end <= row_begin || n_tokens <= 0) return;
    const uint8_t* w = static_cast<const uint8_t*>(Wv);
    const int64_t n_blocks = cols / 32;
    const ScratchPtrs s = scratch(sizeof(Rec) * kChunk, static_cast<size_t>(n_tokens * n_blocks),
                                  static_cast<size_t>(min64(n_tokens, kSuper) * kRows));
    Rec* rec = static_cast<Rec*>(s.rec);
    prepare_aux<W>(xq, xq_stride, n_tokens, n_blocks, s.aux);
    if (n_tokens <= kFused) {
        if (n_tokens == 1) return rows_fused<W, 1>(w, row_bytes, n_blocks, row_begin, row_end, s.aux, xq, xq_stride, y, y_stride);
        return rows_fused<W, 2>(w, row_bytes, n_blocks, row_begin, row_end, s.aux, xq, xq_stride, y, y_stride);
    }
    float* acc = s.acc;
    float* macc = s.macc;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kSuper) {
        const int64_t nt = min64(kSuper, n_tokens - t0);
        for (int64_t g = row_begin; g < row_end; g += kRows) {
            const uint8_t* row[kRows];
            __m512i idx;
            const int valid = group_rows(w, row_bytes, g, row_end, row, idx);
            if (n_blocks == 0)
                for (int64_t i = 0; i < nt * kRows; ++i) acc[i] = macc[i] = 0.0f;
            for (int64_t c0 = 0; c0 < n_blocks; c0 += kChunk) {
                const int nb = static_cast<int>(min64(kChunk, n_blocks - c0));
                for (int b = 0; b < nb; ++b) decode<W>(row, idx, static_cast<size_t>(c0 + b) * W::kBytes, rec[b]);
                for (int64_t i = 0; i < nt; i += kTile) {
                    const int n = static_cast<int>(min64(kTile, nt - i));
                    const int64_t t = t0 + i;
                    tile_chunk_upto<W, kTile>(n, rec, nb, s.aux + t * n_blocks + c0, n_blocks,
                                              xq + t * xq_stride + c0 * W::kActBytes, xq_stride, acc + i * kRows,
                                              macc + i * kRows, c0 == 0);
                }
            }
            for (int64_t i = 0; i < nt; ++i) {
                __m512 v = _mm512_loadu_ps(acc + i * kRows);
                if constexpr (W::kHasMin) v = _mm512_add_ps(v, _mm512_loadu_ps(macc + i * kRows));
                store_rows(y + (t0 + i) * y_stride + g, v, valid);
            }
        }
    }
}

}  // namespace

DotRowsQ8Fn legacy_q8_avx512_kernel(GgmlType type) {
    switch (type) {
        case GgmlType::Q4_0: return &dot_rows_octet<Q4_0R>;
        case GgmlType::Q4_1: return &dot_rows_octet<Q4_1R>;
        case GgmlType::Q5_0: return &dot_rows_octet<Q5_0R>;
        case GgmlType::Q5_1: return &dot_rows_octet<Q5_1R>;
        case GgmlType::Q8_0: return &dot_rows_octet<Q8_0R>;
        default: return nullptr;
    }
}

}  // namespace tandem::cpu::q8_detail

#pragma GCC pop_options

#else  // not an x86 AVX2 build: no AVX-512 kernels either

namespace tandem::cpu::q8_detail {

DotRowsQ8Fn legacy_q8_avx512_kernel(GgmlType) { return nullptr; }

}  // namespace tandem::cpu::q8_detail

#endif
