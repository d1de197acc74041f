// AVX-512 VNNI row-lane kernels of RepackedMatrix (repack.h): 16 weight rows of a group in the 16 int32 lanes of a
// zmm, against Q8_K activations. Compiled for AVX-512 by a target pragma (not the build flags); repack.cpp calls
// them only after checking the CPU.
//
// Q4_K, per super-block and token (read repack.h for the record): chunk c (64 elements) is 8 qs vectors; vector i's
// low nibbles are elements 64c + 4i..4i+3 of every row (sub-block 2c) and its high nibbles elements 64c + 32 + 4i..
// (sub-block 2c + 1). vpdpbusd of a nibble vector with the token's activation dword broadcast adds those 4 products
// into each row's lane, so after 8 of them lane r holds row r's exact sum over a whole 32-element sub-block:
//   S_j = sum(u * x) over sub-block j,   sumi = sum_j sc_j * S_j   (vpmulld by the rows' scales, vpaddd)
//   summ = sum_j m_j * bsum32_j          (four vpdpwssd: int16 pairs of mins times pairs of 32-element sums)
// then, per row lane, the float steps of quant_q8_kquants.cpp: acc = fma(d_w * d_x, float(sumi), acc) and
// acc_m = fma(dmin_w * d_x, float(summ), acc_m), result acc - acc_m. Integer sums are exact in any grouping and the
// float steps are the same operations per (row, token, super-block) in super-block order, so every result is
// bitwise that of the scalar kernel. Bounds: |S_j| <= 32 * 15 * 127, sc_j <= 63, |sumi| <= 256 * 15 * 127 * 63 < 2^31;
// |bsum32| <= 32 * 127 fits int16, m_j <= 63.
//
// Loop nest: a group of 16 rows at a time; within it tiles of up to kTile tokens sweep the group's super-blocks.
// Per chunk the 16 nibble vectors are built once and used by every token of the tile (the decode is shared; the
// multiplies are per token). The float accumulators of a tile stay in registers or the stack across super-blocks.
//
// Nothing after the target pragma is an inline function or template of a shared header (the linker could pick an
// AVX-512 instance for every caller); the scratch buffer comes from quant_q8_driver.h's scratch_buffer, defined before
// the pragma.
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC 12's _mm512_undefined_*() pass-throughs, once inlined
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstddef>
#include <cstdint>
#include <utility>

#include "cpu/quant.h"
#include "cpu/quant_q8.h"
#include "cpu/quant_q8_driver.h"
#include "cpu/repack.h"
#include "cpu/unaligned.h"

#if defined(TANDEM_AVX2) && defined(__x86_64__)
#define TANDEM_R512 1
#include <immintrin.h>
#endif

#ifdef TANDEM_R512
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")
#endif

namespace tandem::cpu::q8_detail {

#ifdef TANDEM_R512
namespace {

#define TR_INLINE inline __attribute__((always_inline))
// On the unrolled lambdas: without it GCC outlines the bodies of the larger tiles (a call per sub-block and token).
#define TR_LAMBDA __attribute__((always_inline))

constexpr size_t kXd = offsetof(BlockQ8_K, d), kXqs = offsetof(BlockQ8_K, qs), kXbsums = offsetof(BlockQ8_K, bsums);
constexpr size_t kXBytes = sizeof(BlockQ8_K);
// The legacy types' unit is a pair of 32-element blocks, against two Q8_0 activation blocks (68 bytes).
constexpr size_t kX0d = offsetof(BlockQ8_0, d), kX0qs = offsetof(BlockQ8_0, qs), kX0Bytes = sizeof(BlockQ8_0);

// Tokens per tile: 16 nibble vectors + 2 scale vectors + the tile's sumi + two sub-block sums in flight fit the 32
// zmm registers.
constexpr int kTile = 8;

template <int N>
struct Int {
    static constexpr int value = N;
};
template <int... I, class F>
TR_INLINE void unroll_seq(std::integer_sequence<int, I...>, F& f) {
    (f(Int<I>{}), ...);
}
template <int N, class F>
TR_INLINE void unroll(F&& f) {
    unroll_seq(std::make_integer_sequence<int, N>{}, f);
}

TR_INLINE int32_t load_i32(const uint8_t* p) { return static_cast<int32_t>(load_u32(p)); }
TR_INLINE __m512i load512(const uint8_t* p) { return _mm512_load_si512(p); }
TR_INLINE __m128i load128(const uint8_t* p) { return _mm_load_si128(reinterpret_cast<const __m128i*>(p)); }
TR_INLINE __m256i load256(const uint8_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }

// Software prefetch, to L2, of the record kPrefetchAhead bytes further along the stream, issued as each record is
// started. A tile of several tokens computes for longer per record than the hardware prefetchers look ahead, so
// without it every record began with a stall on DRAM: a tile of 8 tokens over a 113 MB Q4_K matrix took 16.7-18.6
// ms on one thread against 9.8 ms with the matrix in L3 (tandem-kernel-bench --rows 131072 --cols 1536); with it
// 11.1-12.3 ms. The 1.5B's forward of 5 tokens went from 1.79x a plain step to 1.31x. A distance of 2-3 Q4_K
// records (4.7-12 KB) measured alike, one record (2.4 KB) too short. One token is bound by bandwidth and the
// prefetches only cost it (q8_0: 8 -> 11 ms), so a single token's tile never issues them; and only a group's first
// tile does, the others find the group in L1/L2. Those that run past the end of the copy are harmless: a prefetch
// never faults.
constexpr size_t kPrefetchAhead = 8192;
constexpr int kPrefetchMinTokens = 2;

template <size_t kRecord>
TR_INLINE void prefetch_record(const uint8_t* rec, bool prefetch) {
    if (!prefetch) return;
    const char* p = reinterpret_cast<const char*>(rec + kPrefetchAhead);
    for (size_t o = 0; o < kRecord; o += 64) _mm_prefetch(p + o, _MM_HINT_T1);
}

// ---- Q4_K ------------------------------------------------------------------------------------------------------
struct Q4K {
    static constexpr size_t kRecord = q4k16::kBytes, kActBytes = kXBytes;
    // Per (token, super-block): the 32-element bsums as int16 pairs, dword p = (bsum32[2p], bsum32[2p + 1]) with
    // bsum32[j] = bsums[2j] + bsums[2j + 1] (|bsum32| <= 32 * 127).
    static constexpr int kAux = 4;
    static void prepare(const uint8_t* xb, int32_t* out) {
        int16_t s[16];
        __builtin_memcpy(s, xb + kXbsums, sizeof s);
        for (int p = 0; p < 4; ++p) {
            const auto lo = static_cast<uint16_t>(s[4 * p] + s[4 * p + 1]);
            const auto hi = static_cast<uint16_t>(s[4 * p + 2] + s[4 * p + 3]);
            out[p] = static_cast<int32_t>(static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16));
        }
    }
    template <int T>
    static void tile(const uint8_t* grp, int64_t n_blocks, const uint8_t* xq, size_t xq_stride, size_t block_stride,
                     const int32_t* aux, float* out, bool prefetch);
};

// One tile of T tokens against the super-blocks of one group; out[t * 16 + r] = row r's result for token t. Token t's
// activations of super-block b are at xq + b * block_stride + t * xq_stride, its aux at aux + (t * n_blocks + b) *
// kAux.
template <int T>
void Q4K::tile(const uint8_t* grp, int64_t n_blocks, const uint8_t* xq, size_t xq_stride, size_t block_stride,
               const int32_t* pairs, float* out, bool prefetch) {
    using namespace q4k16;
    __m512 acc[T], acc_m[T];
    unroll<T>([&](auto t) TR_LAMBDA { acc[t.value] = acc_m[t.value] = _mm512_setzero_ps(); });
    const __m512i nib = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < n_blocks; ++b) {
        const uint8_t* rec = grp + b * kBytes;
        prefetch_record<kBytes>(rec, prefetch);
        const uint8_t* xb = xq + b * block_stride;
        __m512i sumi[T];
        unroll<T>([&](auto t) TR_LAMBDA { sumi[t.value] = _mm512_setzero_si512(); });
        unroll<4>([&](auto cc) TR_LAMBDA {
            constexpr int c = decltype(cc)::value;
            __m512i lo[8], hi[8];
            unroll<8>([&](auto ii) TR_LAMBDA {
                constexpr int i = decltype(ii)::value;
                const __m512i v = load512(rec + kQs + 64 * (8 * c + i));
                lo[i] = _mm512_and_si512(v, nib);
                hi[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
            });
            const __m512i sc0 = _mm512_cvtepu8_epi32(load128(rec + kScales + 16 * (2 * c)));
            const __m512i sc1 = _mm512_cvtepu8_epi32(load128(rec + kScales + 16 * (2 * c + 1)));
            unroll<T>([&](auto tt) TR_LAMBDA {
                constexpr int t = decltype(tt)::value;
                const uint8_t* x = xb + t * xq_stride + kXqs + 64 * c;
                // Two chains per sub-block (even and odd i), joined at the end: a tile of one or two tokens has too
                // few independent chains otherwise to hide vpdpbusd's latency.
                __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
                unroll<4>([&](auto ii) TR_LAMBDA {
                    constexpr int i = 2 * decltype(ii)::value;
                    s0 = _mm512_dpbusd_epi32(s0, lo[i], _mm512_set1_epi32(load_i32(x + 4 * i)));
                    s1 = _mm512_dpbusd_epi32(s1, hi[i], _mm512_set1_epi32(load_i32(x + 32 + 4 * i)));
                    s2 = _mm512_dpbusd_epi32(s2, lo[i + 1], _mm512_set1_epi32(load_i32(x + 4 * (i + 1))));
                    s3 = _mm512_dpbusd_epi32(s3, hi[i + 1], _mm512_set1_epi32(load_i32(x + 32 + 4 * (i + 1))));
                });
                s0 = _mm512_add_epi32(s0, s2);
                s1 = _mm512_add_epi32(s1, s3);
                sumi[t] = _mm512_add_epi32(sumi[t], _mm512_add_epi32(_mm512_mullo_epi32(s0, sc0),
                                                                     _mm512_mullo_epi32(s1, sc1)));
            });
        });
        __m512i mp[4];
        unroll<4>([&](auto pp) TR_LAMBDA {
            mp[pp.value] = _mm512_cvtepu8_epi16(load256(rec + kMinPairs + 32 * pp.value));
        });
        const __m512 dw = _mm512_cvtph_ps(load256(rec + kD));
        const __m512 dmw = _mm512_cvtph_ps(load256(rec + kDmin));
        unroll<T>([&](auto tt) TR_LAMBDA {
            constexpr int t = decltype(tt)::value;
            const int32_t* bp = pairs + (static_cast<int64_t>(t) * n_blocks + b) * 4;
            __m512i summ = _mm512_dpwssd_epi32(_mm512_setzero_si512(), mp[0], _mm512_set1_epi32(bp[0]));
            summ = _mm512_dpwssd_epi32(summ, mp[1], _mm512_set1_epi32(bp[1]));
            summ = _mm512_dpwssd_epi32(summ, mp[2], _mm512_set1_epi32(bp[2]));
            summ = _mm512_dpwssd_epi32(summ, mp[3], _mm512_set1_epi32(bp[3]));
            const __m512 dx = _mm512_set1_ps(load_f32(xb + t * xq_stride + kXd));
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(sumi[t]), acc[t]);
            acc_m[t] = _mm512_fmadd_ps(_mm512_mul_ps(dmw, dx), _mm512_cvtepi32_ps(summ), acc_m[t]);
        });
    }
    unroll<T>([&](auto t) TR_LAMBDA { _mm512_storeu_ps(out + 16 * t.value, _mm512_sub_ps(acc[t.value], acc_m[t.value])); });
}

// ---- Q6_K ------------------------------------------------------------------------------------------------------
// Per super-block and token: ql vector m's low nibbles are elements 128h + 32k + l with k = (m % 16) / 8, its high
// nibbles those of k + 2 (h = m / 16, l = 4 (m % 8) + 0..3), and qh vector n holds bits 4..5 of all four k at bits 2k
// (h = n / 8, the same l). So a step (h, half) builds 16 code vectors, (k, d) for k < 4 and d = 4 half + 0..3 (codes
// u <= 63, elements 128h + 32k + 4d..), and every token adds 4 of them into each of 4 sub-block sums
//   S_j = -32 * bsum_j + sum(u * x) over sub-block j = 8h + 2k + half,   sumi += sc_j * S_j (vpmulld),
// which is sum_j sc_j * sum((u - 32) * x) as the scalar kernel forms it, exactly. Then acc = fma(d_w * d_x,
// float(sumi), acc). Bounds: |S_j| <= 16 * 63 * 127 + 32 * 16 * 127, |sc_j| <= 128, |sumi| < 2^31 (the scalar
// kernel's bound).
struct Q6K {
    static constexpr size_t kRecord = q6k16::kBytes, kActBytes = kXBytes;
    // Per (token, super-block): the initial values -32 * bsum_j of the 16 sub-block sums.
    static constexpr int kAux = 16;
    static void prepare(const uint8_t* xb, int32_t* out) {
        int16_t s[16];
        __builtin_memcpy(s, xb + kXbsums, sizeof s);
        for (int j = 0; j < 16; ++j) out[j] = -32 * static_cast<int32_t>(s[j]);
    }
    template <int T>
    static void tile(const uint8_t* grp, int64_t n_blocks, const uint8_t* xq, size_t xq_stride, size_t block_stride,
                     const int32_t* aux, float* out, bool prefetch) {
        using namespace q6k16;
        __m512 acc[T];
        unroll<T>([&](auto t) TR_LAMBDA { acc[t.value] = _mm512_setzero_ps(); });
        const __m512i nib = _mm512_set1_epi8(0x0F), hi2 = _mm512_set1_epi8(0x30);
        for (int64_t b = 0; b < n_blocks; ++b) {
            const uint8_t* rec = grp + b * kRecord;
            prefetch_record<kRecord>(rec, prefetch);
            const uint8_t* xb = xq + b * block_stride;
            __m512i sumi[T];
            unroll<T>([&](auto t) TR_LAMBDA { sumi[t.value] = _mm512_setzero_si512(); });
            unroll<4>([&](auto step) TR_LAMBDA {
                constexpr int h = decltype(step)::value / 2, half = decltype(step)::value % 2;
                __m512i u[4][4];  // [k][d - 4 half]
                unroll<4>([&](auto dd) TR_LAMBDA {
                    constexpr int i = decltype(dd)::value;
                    const uint8_t* v = rec + kCodes + 64 * (12 * decltype(step)::value + 3 * i);
                    const __m512i q1 = load512(v);        // ql vector 16h + d: k = 0 (low nibbles), 2 (high)
                    const __m512i q2 = load512(v + 64);   // ql vector 16h + 8 + d: k = 1, 3
                    const __m512i qh = load512(v + 128);  // qh vector 8h + d
                    // u = low 4 bits | (the two qh bits << 4): a | (b & 0x30) is one vpternlogd.
                    u[0][i] = _mm512_ternarylogic_epi32(_mm512_and_si512(q1, nib), _mm512_slli_epi16(qh, 4), hi2, 0xF8);
                    u[1][i] = _mm512_ternarylogic_epi32(_mm512_and_si512(q2, nib), _mm512_slli_epi16(qh, 2), hi2, 0xF8);
                    u[2][i] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(q1, 4), nib), qh, hi2, 0xF8);
                    u[3][i] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(q2, 4), nib),
                                                        _mm512_srli_epi16(qh, 2), hi2, 0xF8);
                });
                __m512i sc[4];
                unroll<4>([&](auto kk) TR_LAMBDA {
                    constexpr int k = decltype(kk)::value;
                    sc[k] = _mm512_cvtepi8_epi32(load128(rec + kScales + 16 * (8 * h + 2 * k + half)));
                });
                unroll<T>([&](auto tt) TR_LAMBDA {
                    constexpr int t = decltype(tt)::value;
                    const uint8_t* x = xb + t * xq_stride + kXqs;
                    const int32_t* a = aux + (static_cast<int64_t>(t) * n_blocks + b) * kAux;
                    unroll<4>([&](auto kk) TR_LAMBDA {
                        constexpr int k = decltype(kk)::value;
                        __m512i S = _mm512_set1_epi32(a[8 * h + 2 * k + half]);
                        unroll<4>([&](auto dd) TR_LAMBDA {
                            constexpr int i = decltype(dd)::value, d = 4 * half + i;
                            S = _mm512_dpbusd_epi32(S, u[k][i],
                                                    _mm512_set1_epi32(load_i32(x + 4 * (32 * h + 8 * k + d))));
                        });
                        sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(S, sc[k]));
                    });
                });
            });
            const __m512 dw = _mm512_cvtph_ps(load256(rec + kD));
            unroll<T>([&](auto tt) TR_LAMBDA {
                constexpr int t = decltype(tt)::value;
                const __m512 dx = _mm512_set1_ps(load_f32(xb + t * xq_stride + kXd));
                acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(sumi[t]), acc[t]);
            });
        }
        unroll<T>([&](auto t) TR_LAMBDA { _mm512_storeu_ps(out + 16 * t.value, acc[t.value]); });
    }
};

// ---- Q4_0, Q5_0, Q8_0 ------------------------------------------------------------------------------------------
// Per unit (two 32-element blocks) and token (read repack.h for the records): block h's code vectors are 16 rows'
// unsigned codes u = q + offset; vpdpbusd of vector k with the token's activation dword k adds 4 products into each
// row's lane, the accumulator starting at -offset * sum(q_x) of the block (prepare), so after the block lane r holds
// row r's exact sumi. Then the float step of quant_q8_legacy.cpp's kernels, per (row, token, block) in block order:
// acc = fma(float(sumi), d_w * d_x, acc). Bounds: |sumi| <= 32 * 255 * 128.
template <GgmlType kType>
struct Legacy {
    static constexpr bool kQ8 = kType == GgmlType::Q8_0, kQ5 = kType == GgmlType::Q5_0;
    static constexpr size_t kRecord = kQ8 ? legacy16::kQ8_0Bytes : kQ5 ? legacy16::kQ5_0Bytes : legacy16::kQ4_0Bytes;
    static constexpr size_t kCodeBytes = kQ8 ? 512 : 256;  // per block
    static constexpr size_t kBlockBytes = kQ5 ? kCodeBytes + 64 : kCodeBytes;  // Q5_0: + the high-bit masks
    static constexpr size_t kD = 2 * kBlockBytes;  // d of rows 0..15 (fp16) of block 0, then of block 1
    static constexpr size_t kActBytes = 2 * kX0Bytes;
    static constexpr int32_t kOffset = kQ8 ? 128 : kQ5 ? 16 : 8;
    // Per (token, unit): the accumulator starts -offset * sum(q_x) of blocks 0 and 1, then d_x of both as floats.
    static constexpr int kAux = 4;
    static void prepare(const uint8_t* xb, int32_t* out) {
        for (int h = 0; h < 2; ++h) {
            const uint8_t* blk = xb + h * kX0Bytes;
            int32_t sum = 0;
            for (int i = 0; i < 32; ++i) sum += static_cast<int8_t>(blk[kX0qs + i]);
            out[h] = -kOffset * sum;
            uint16_t d;
            __builtin_memcpy(&d, blk + kX0d, sizeof d);
            const float dx = _cvtsh_ss(d);
            __builtin_memcpy(&out[2 + h], &dx, sizeof dx);
        }
    }
    template <int T>
    static void tile(const uint8_t* grp, int64_t n_blocks, const uint8_t* xq, size_t xq_stride, size_t block_stride,
                     const int32_t* aux, float* out, bool prefetch) {
        __m512 acc[T];
        unroll<T>([&](auto t) TR_LAMBDA { acc[t.value] = _mm512_setzero_ps(); });
        const __m512i nib = _mm512_set1_epi8(0x0F), b16 = _mm512_set1_epi8(0x10);
        for (int64_t b = 0; b < n_blocks; ++b) {
            const uint8_t* rec = grp + b * kRecord;
            prefetch_record<kRecord>(rec, prefetch);
            const uint8_t* xb = xq + b * block_stride;
            unroll<2>([&](auto hh) TR_LAMBDA {
                constexpr int h = decltype(hh)::value;
                const uint8_t* codes = rec + h * kBlockBytes;
                // u[k] pairs with activation dword k of the block.
                __m512i u[8];
                if constexpr (kQ8) {
                    unroll<8>([&](auto kk) TR_LAMBDA { u[kk.value] = load512(codes + 64 * kk.value); });
                } else {
                    unroll<4>([&](auto kk) TR_LAMBDA {
                        constexpr int k = decltype(kk)::value;
                        const __m512i v = load512(codes + 64 * k);
                        u[k] = _mm512_and_si512(v, nib);
                        u[4 + k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
                        if constexpr (kQ5) {
                            uint64_t lo, hi;
                            __builtin_memcpy(&lo, codes + kCodeBytes + 16 * k, sizeof lo);
                            __builtin_memcpy(&hi, codes + kCodeBytes + 16 * k + 8, sizeof hi);
                            u[k] = _mm512_mask_add_epi8(u[k], _cvtu64_mask64(lo), u[k], b16);
                            u[4 + k] = _mm512_mask_add_epi8(u[4 + k], _cvtu64_mask64(hi), u[4 + k], b16);
                        }
                    });
                }
                const __m512 dw = _mm512_cvtph_ps(load256(rec + kD + 32 * h));
                unroll<T>([&](auto tt) TR_LAMBDA {
                    constexpr int t = decltype(tt)::value;
                    const uint8_t* x = xb + t * xq_stride + h * kX0Bytes + kX0qs;
                    const int32_t* a = aux + (static_cast<int64_t>(t) * n_blocks + b) * kAux;
                    __m512i s0 = _mm512_set1_epi32(a[h]), s1 = _mm512_setzero_si512();
                    unroll<4>([&](auto ii) TR_LAMBDA {
                        constexpr int i = 2 * decltype(ii)::value;
                        s0 = _mm512_dpbusd_epi32(s0, u[i], _mm512_set1_epi32(load_i32(x + 4 * i)));
                        s1 = _mm512_dpbusd_epi32(s1, u[i + 1], _mm512_set1_epi32(load_i32(x + 4 * (i + 1))));
                    });
                    float dx;
                    __builtin_memcpy(&dx, &a[2 + h], sizeof dx);
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)),
                                             _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc[t]);
                });
            });
        }
        unroll<T>([&](auto t) TR_LAMBDA { _mm512_storeu_ps(out + 16 * t.value, acc[t.value]); });
    }
};

// ---- the driver (every type) ------------------------------------------------------------------------------------
template <class Ty, int T>
void tile_upto(int n, const uint8_t* grp, int64_t n_blocks, const uint8_t* xq, size_t xq_stride, size_t block_stride,
               const int32_t* aux, float* out, bool prefetch) {
    if constexpr (T > 1) {
        if (n < T) return tile_upto<Ty, T - 1>(n, grp, n_blocks, xq, xq_stride, block_stride, aux, out, prefetch);
    }
    Ty::template tile<T>(grp, n_blocks, xq, xq_stride, block_stride, aux, out, prefetch);
}

template <class Ty>
void dot_groups(const uint8_t* data, size_t group_bytes, int64_t n_blocks, int64_t rows, int64_t group_begin,
                int64_t group_end, const uint8_t* xq, size_t xq_stride, int64_t n_tokens, float* y,
                int64_t y_stride) {
    if (n_tokens <= 0 || group_end <= group_begin) return;
    // Scratch: the aux values of every (token, super-block), then the activations of each tile of kTile tokens
    // repacked super-block-major (block b of the tile's token t at (b * n + t) * Ty::kActBytes), so that a tile reads one
    // stream rather than n streams a row apart: with the weights streaming from L3, n separate streams of a wide
    // matrix (8960 columns: 10 KB a token) measured at half the speed from 3 tokens on.
    const size_t aux_bytes = static_cast<size_t>(n_tokens * n_blocks) * Ty::kAux * sizeof(int32_t);
    const size_t tile_bytes = static_cast<size_t>(n_blocks) * kTile * Ty::kActBytes;
    // Tiles of as equal a size as possible (9 tokens: 5 + 4, not 8 + 1): a tile of one token is latency-bound
    // (few independent vpdpbusd chains), and every tile reads the group's weights once whatever its size.
    const int64_t n_tiles = (n_tokens + kTile - 1) / kTile;
    auto tile_begin = [&](int64_t i) { return i * n_tokens / n_tiles; };
    uint8_t* scratch = scratch_buffer(aux_bytes + static_cast<size_t>(n_tiles) * tile_bytes);
    int32_t* aux = reinterpret_cast<int32_t*>(scratch);
    for (int64_t t = 0; t < n_tokens; ++t)
        for (int64_t b = 0; b < n_blocks; ++b)
            Ty::prepare(xq + t * xq_stride + b * Ty::kActBytes, aux + (t * n_blocks + b) * Ty::kAux);
    uint8_t* packed = scratch + aux_bytes;
    for (int64_t i = 0; i < n_tiles; ++i) {
        const int64_t t0 = tile_begin(i), n = tile_begin(i + 1) - t0;
        if (n == 1) continue;  // one token: the activation row itself is already in that layout
        for (int64_t b = 0; b < n_blocks; ++b)
            for (int64_t t = 0; t < n; ++t)
                __builtin_memcpy(packed + i * tile_bytes + (b * n + t) * Ty::kActBytes, xq + (t0 + t) * xq_stride + b * Ty::kActBytes,
                                 Ty::kActBytes);
    }
    alignas(64) float out[kTile * 16];
    for (int64_t g = group_begin; g < group_end; ++g) {
        const uint8_t* grp = data + g * group_bytes;
        const int64_t r0 = g * RepackedMatrix::kGroupRows;
        const int valid = static_cast<int>(rows - r0 < 16 ? rows - r0 : 16);
        const auto mask = static_cast<__mmask16>((1u << valid) - 1u);
        for (int64_t i = 0; i < n_tiles; ++i) {
            const int64_t t0 = tile_begin(i);
            const int n = static_cast<int>(tile_begin(i + 1) - t0);
            const uint8_t* acts = n == 1 ? xq + t0 * xq_stride : packed + i * tile_bytes;
            tile_upto<Ty, kTile>(n, grp, n_blocks, acts, Ty::kActBytes, static_cast<size_t>(n) * Ty::kActBytes,
                                 aux + t0 * n_blocks * Ty::kAux, out, i == 0 && n >= kPrefetchMinTokens);
            for (int t = 0; t < n; ++t)
                _mm512_mask_storeu_ps(y + (t0 + t) * y_stride + r0, mask, _mm512_load_ps(out + 16 * t));
        }
    }
}

// ---- repacking ---------------------------------------------------------------------------------------------------
// A record's vectors are columns of the group's rows: vector k holds dword k of every row. Each row's bytes are
// loaded as they lie (64 at a time) and 16 rows are transposed in registers, 4 shuffle stages of 16 instructions:
// a fraction of what a vpgatherdd per vector or scalar stores cost (measured: 2.3 and 3.6 GB/s a thread).

// r[i] (row i, 16 dwords) -> r[j] (lane i: dword j of row i).
TR_INLINE void transpose16(__m512i (&r)[16]) {
    __m512i a[16], b[16];
    for (int p = 0; p < 8; ++p) {
        a[2 * p] = _mm512_unpacklo_epi32(r[2 * p], r[2 * p + 1]);
        a[2 * p + 1] = _mm512_unpackhi_epi32(r[2 * p], r[2 * p + 1]);
    }
    // b[4q + c], 128-bit lane L: element 4L + c of rows 4q..4q+3.
    for (int q = 0; q < 4; ++q) {
        b[4 * q] = _mm512_unpacklo_epi64(a[4 * q], a[4 * q + 2]);
        b[4 * q + 1] = _mm512_unpackhi_epi64(a[4 * q], a[4 * q + 2]);
        b[4 * q + 2] = _mm512_unpacklo_epi64(a[4 * q + 1], a[4 * q + 3]);
        b[4 * q + 3] = _mm512_unpackhi_epi64(a[4 * q + 1], a[4 * q + 3]);
    }
    // Dword 4L + c of all rows: lane L of b[c], b[4 + c], b[8 + c], b[12 + c].
    for (int c = 0; c < 4; ++c) {
        const __m512i x0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x44), x1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xEE);
        const __m512i y0 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x44);
        const __m512i y1 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xEE);
        r[c] = _mm512_shuffle_i32x4(x0, y0, 0x88);
        r[4 + c] = _mm512_shuffle_i32x4(x0, y0, 0xDD);
        r[8 + c] = _mm512_shuffle_i32x4(x1, y1, 0x88);
        r[12 + c] = _mm512_shuffle_i32x4(x1, y1, 0xDD);
    }
}

// Bytes [off, off + n) (n <= 64) of block `blk` of each of the group's rows (zero past n and for rows past
// valid_rows), transposed: v[k] lane r = dword k of those bytes of row r. Masked loads read nothing past n.
TR_INLINE void load_columns(const uint8_t* rows, size_t row_bytes, int valid_rows, size_t blk, size_t off, int n,
                            __m512i (&v)[16]) {
    const __mmask64 m = n >= 64 ? ~__mmask64{0} : ((__mmask64{1} << n) - 1);
    for (int r = 0; r < 16; ++r)
        v[r] = r < valid_rows ? _mm512_maskz_loadu_epi8(m, rows + r * row_bytes + blk + off) : _mm512_setzero_si512();
    transpose16(v);
}

TR_INLINE void store16(uint8_t* p, __m128i v) { _mm_store_si128(reinterpret_cast<__m128i*>(p), v); }
TR_INLINE void store32(uint8_t* p, __m256i v) { _mm256_store_si256(reinterpret_cast<__m256i*>(p), v); }

void repack_group_q4_k(const uint8_t* rows, size_t row_bytes, int valid_rows, int64_t n_blocks, uint8_t* out) {
    using namespace q4k16;
    static_assert(sizeof(BlockQ4_K) == 144 && offsetof(BlockQ4_K, scales) == 4 && offsetof(BlockQ4_K, qs) == 16);
    for (int64_t b = 0; b < n_blocks; ++b) {
        const size_t blk = static_cast<size_t>(b) * sizeof(BlockQ4_K);
        uint8_t* rec = out + b * kBytes;
        __m512i v[16];
        // Bytes 0..63: dword 0 d and dmin, dwords 1..3 the scales, dwords 4..15 qs dwords 0..11.
        load_columns(rows, row_bytes, valid_rows, blk, 0, 64, v);
        for (int k = 4; k < 16; ++k) _mm512_store_si512(rec + kQs + 64 * (k - 4), v[k]);
        store32(rec + kD, _mm512_cvtepi32_epi16(v[0]));
        store32(rec + kDmin, _mm512_cvtepi32_epi16(_mm512_srli_epi32(v[0], 16)));
        // The 12 scale bytes as dwords u0, u1, u2 per row lane: unpack_scale_min_k4 lane by lane.
        const __m512i u0 = v[1], u1 = v[2], u2 = v[3];
        const __m512i m63 = _mm512_set1_epi32(63), m15 = _mm512_set1_epi32(15), m48 = _mm512_set1_epi32(0x30);
        __m512i sc[8], m[8];
        for (int j = 0; j < 4; ++j) {
            const __m512i a0 = _mm512_srli_epi32(u0, 8 * j), a1 = _mm512_srli_epi32(u1, 8 * j);
            const __m512i a2 = _mm512_srli_epi32(u2, 8 * j);
            sc[j] = _mm512_and_si512(a0, m63);
            m[j] = _mm512_and_si512(a1, m63);
            sc[j + 4] = _mm512_or_si512(_mm512_and_si512(a2, m15), _mm512_and_si512(_mm512_srli_epi32(a0, 2), m48));
            m[j + 4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(a2, 4), m15),
                                       _mm512_and_si512(_mm512_srli_epi32(a1, 2), m48));
        }
        for (int j = 0; j < 8; ++j) store16(rec + kScales + 16 * j, _mm512_cvtepi32_epi8(sc[j]));
        for (int p = 0; p < 4; ++p)
            store32(rec + kMinPairs + 32 * p,
                    _mm512_cvtepi32_epi16(_mm512_or_si512(m[2 * p], _mm512_slli_epi32(m[2 * p + 1], 8))));
        // Bytes 64..127: qs dwords 12..27; bytes 128..143: qs dwords 28..31.
        load_columns(rows, row_bytes, valid_rows, blk, 64, 64, v);
        for (int k = 0; k < 16; ++k) _mm512_store_si512(rec + kQs + 64 * (12 + k), v[k]);
        load_columns(rows, row_bytes, valid_rows, blk, 128, 16, v);
        for (int k = 0; k < 4; ++k) _mm512_store_si512(rec + kQs + 64 * (28 + k), v[k]);
    }
}

void repack_group_q6_k(const uint8_t* rows, size_t row_bytes, int valid_rows, int64_t n_blocks, uint8_t* out) {
    using namespace q6k16;
    static_assert(sizeof(BlockQ6_K) == 210 && offsetof(BlockQ6_K, qh) == 128 && offsetof(BlockQ6_K, scales) == 192);
    for (int64_t b = 0; b < n_blocks; ++b) {
        const size_t blk = static_cast<size_t>(b) * sizeof(BlockQ6_K);
        uint8_t* rec = out + b * kBytes;
        // ql dwords 0..31 and qh dwords 0..15 as columns, then stored in the kernel's reading order (repack.h).
        __m512i ql[32], qh[16];
        {
            __m512i v[16];
            load_columns(rows, row_bytes, valid_rows, blk, 0, 64, v);
            for (int k = 0; k < 16; ++k) ql[k] = v[k];
            load_columns(rows, row_bytes, valid_rows, blk, 64, 64, v);
            for (int k = 0; k < 16; ++k) ql[16 + k] = v[k];
            load_columns(rows, row_bytes, valid_rows, blk, 128, 64, qh);
        }
        for (int step = 0; step < 4; ++step)
            for (int i = 0; i < 4; ++i) {
                const int h = step / 2, d = 4 * (step % 2) + i;
                uint8_t* v = rec + kCodes + 64 * (12 * step + 3 * i);
                _mm512_store_si512(v, ql[16 * h + d]);
                _mm512_store_si512(v + 64, ql[16 * h + 8 + d]);
                _mm512_store_si512(v + 128, qh[8 * h + d]);
            }
        // Bytes 192..209: dwords 0..3 the 16 int8 scales, dword 4's low half d.
        __m512i v[16];
        load_columns(rows, row_bytes, valid_rows, blk, 192, 18, v);
        for (int q = 0; q < 4; ++q)
            for (int j = 0; j < 4; ++j)
                store16(rec + kScales + 16 * (4 * q + j), _mm512_cvtepi32_epi8(_mm512_srli_epi32(v[q], 8 * j)));
        store32(rec + kD, _mm512_cvtepi32_epi16(v[4]));
        store32(rec + kD + 32, _mm256_setzero_si256());
    }
}

// Legacy types: one record per pair of 32-element blocks (repack.h), built with dword copies: the 0.5B draft has
// ~340 MB of legacy matrices, and with a byte-per-byte version (and the background thread alone) the first
// drafting round waited 0.88-0.92 s for the copies (with this and RepackedWeights::wait() helping: 0.08-0.18 s).
template <GgmlType kType>
void repack_group_legacy(const uint8_t* rows, size_t row_bytes, int valid_rows, int64_t n_units, uint8_t* out) {
    using L = Legacy<kType>;
    constexpr size_t kBlock = kType == GgmlType::Q8_0 ? sizeof(BlockQ8_0)
                              : kType == GgmlType::Q5_0 ? sizeof(BlockQ5_0) : sizeof(BlockQ4_0);
    constexpr size_t kQs = kType == GgmlType::Q8_0 ? offsetof(BlockQ8_0, qs)
                           : kType == GgmlType::Q5_0 ? offsetof(BlockQ5_0, qs) : offsetof(BlockQ4_0, qs);
    constexpr int kVectors = L::kQ8 ? 8 : 4;
    for (int64_t u = 0; u < n_units; ++u) {
        uint8_t* rec = out + u * L::kRecord;
        if (valid_rows < 16) __builtin_memset(rec, 0, L::kRecord);  // missing rows: zero codes and scales
        for (int h = 0; h < 2; ++h) {
            uint8_t* codes = rec + h * L::kBlockBytes;
            uint64_t lo_mask[4] = {}, hi_mask[4] = {};
            for (int r = 0; r < valid_rows; ++r) {
                const uint8_t* blk = rows + r * row_bytes + static_cast<size_t>(2 * u + h) * kBlock;
                __builtin_memcpy(rec + L::kD + 32 * h + 2 * r, blk, 2);  // d
                for (int k = 0; k < kVectors; ++k) {
                    uint32_t w;
                    __builtin_memcpy(&w, blk + kQs + 4 * k, sizeof w);
                    if constexpr (L::kQ8) w ^= 0x80808080u;
                    __builtin_memcpy(codes + 64 * k + 4 * r, &w, sizeof w);
                }
                if constexpr (L::kQ5) {
                    uint32_t qh;
                    __builtin_memcpy(&qh, blk + offsetof(BlockQ5_0, qh), sizeof qh);
                    // Mask k: bit 4r + j is row r's fifth bit of element 4k + j (lo) or 16 + 4k + j (hi).
                    for (int k = 0; k < 4; ++k) {
                        lo_mask[k] |= static_cast<uint64_t>((qh >> (4 * k)) & 0xFu) << (4 * r);
                        hi_mask[k] |= static_cast<uint64_t>((qh >> (16 + 4 * k)) & 0xFu) << (4 * r);
                    }
                }
            }
            if constexpr (L::kQ5)
                for (int k = 0; k < 4; ++k) {
                    __builtin_memcpy(codes + L::kCodeBytes + 16 * k, &lo_mask[k], 8);
                    __builtin_memcpy(codes + L::kCodeBytes + 16 * k + 8, &hi_mask[k], 8);
                }
        }
    }
}

}  // namespace

RepackGroupFn repack_avx512(GgmlType type) {
    switch (type) {
        case GgmlType::Q4_K: return &repack_group_q4_k;
        case GgmlType::Q6_K: return &repack_group_q6_k;
        case GgmlType::Q4_0: return &repack_group_legacy<GgmlType::Q4_0>;
        case GgmlType::Q5_0: return &repack_group_legacy<GgmlType::Q5_0>;
        case GgmlType::Q8_0: return &repack_group_legacy<GgmlType::Q8_0>;
        default: return nullptr;
    }
}

RepackedDotFn repacked_avx512_kernel(GgmlType type) {
    switch (type) {
        case GgmlType::Q4_K: return &dot_groups<Q4K>;
        case GgmlType::Q6_K: return &dot_groups<Q6K>;
        case GgmlType::Q4_0: return &dot_groups<Legacy<GgmlType::Q4_0>>;
        case GgmlType::Q5_0: return &dot_groups<Legacy<GgmlType::Q5_0>>;
        case GgmlType::Q8_0: return &dot_groups<Legacy<GgmlType::Q8_0>>;
        default: return nullptr;
    }
}

#else

RepackedDotFn repacked_avx512_kernel(GgmlType) { return nullptr; }
RepackGroupFn repack_avx512(GgmlType) { return nullptr; }

#endif  // TANDEM_R512

}  // namespace tandem::cpu::q8_detail

#ifdef TANDEM_R512
#pragma GCC pop_options
#endif
