// Activation quantizers (Q8_0, Q8_1, Q8_K), the lookup of the integer kernels, and vec_dot_q8. The kernels
// themselves live in quant_q8_legacy.cpp (32-element types) and quant_q8_kquants.cpp (k-quants).
//
// The quantizers produce the same bytes with and without AVX2: the maximum is exact whatever the order, x * id is a
// single rounding (no add for the compiler to fuse), the rounding is half-to-even in both, and the sums are integers.
#include "cpu/quant_q8.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "cpu/dispatch.h"
#include "cpu/fp16.h"
#include "cpu/quant.h"
#include "cpu/quant_q8_driver.h"
#include "cpu/unaligned.h"
#include "error.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TANDEM_Q8_SIMD 1
#include <immintrin.h>
#endif

namespace tandem::cpu {
namespace {

float max_abs(const float* x, int n) {
#ifdef TANDEM_Q8_SIMD
    if (n % 8 == 0) {
        const __m256 sign = _mm256_set1_ps(-0.0f);
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < n; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
        float lanes[8];
        _mm256_storeu_ps(lanes, m);
        float r = 0.0f;
        for (float v : lanes) r = std::max(r, v);
        return r;
    }
#endif
    float r = 0.0f;
    for (int j = 0; j < n; ++j) r = std::max(r, std::fabs(x[j]));
    return r;
}

#ifdef TANDEM_Q8_SIMD
// Eight codes of v * mul as int32: rounded half to even, clamped to [-127, 127] (round_codes' definition).
inline __m256i codes8(__m256 v, __m256 mul) {
    const __m256 r = _mm256_round_ps(_mm256_mul_ps(v, mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(r), _mm256_set1_epi32(-127)), _mm256_set1_epi32(127));
}

// Stores the 32 codes of v[0..3] * mul at q, narrowed in registers; returns their sums, eight lanes.
inline __m256i store_codes32(const __m256 v[4], __m256 mul, int8_t* q) {
    const __m256i c0 = codes8(v[0], mul), c1 = codes8(v[1], mul), c2 = codes8(v[2], mul), c3 = codes8(v[3], mul);
    // The packs narrow within 128-bit lanes: 4-byte groups come out as c0 c1 c2 c3 (low halves), then the high
    // halves; the permutation puts each input's two groups side by side. Codes in [-127, 127] never saturate.
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(c0, c1), _mm256_packs_epi32(c2, c3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    return _mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3));
}

inline int hsum_epi32(__m256i v) {
    const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    return _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
}
#endif

// q[j] = round-half-even(x[j] * id), clamped to [-127, 127]: |x * id| <= 127 already, and the clamp states that
// -128 never occurs, which the kernels' sign trick relies on. Returns the sum of the codes. The vector path rounds,
// clamps, sums and narrows 32 values at a time in registers: a decode step quantizes every matmul's input on one
// thread while the others wait, and the scalar narrowing (a store and a byte load per value) was 12% of SmolLM2's
// decode and 31% of its prefill.
int round_codes(const float* x, float id, int n, int8_t* q) {
    int sum = 0;
    int j = 0;
#ifdef TANDEM_Q8_SIMD
    const __m256 mul = _mm256_set1_ps(id);
    __m256i sums = _mm256_setzero_si256();
    for (; j + 32 <= n; j += 32) {
        const __m256 v[4] = {_mm256_loadu_ps(x + j), _mm256_loadu_ps(x + j + 8), _mm256_loadu_ps(x + j + 16),
                             _mm256_loadu_ps(x + j + 24)};
        sums = _mm256_add_epi32(sums, store_codes32(v, mul, q + j));
    }
    for (; j + 8 <= n; j += 8) {
        const __m256i c = codes8(_mm256_loadu_ps(x + j), mul);
        sums = _mm256_add_epi32(sums, c);
        const __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(q + j), _mm_packs_epi16(words, words));
    }
    sum = hsum_epi32(sums);
#endif
    for (; j < n; ++j) {
        const int c = std::clamp(static_cast<int>(std::nearbyint(x[j] * id)), -127, 127);
        q[j] = static_cast<int8_t>(c);
        sum += c;
    }
    return sum;
}

// One 32-value block: its largest magnitude, then the codes of x * (127 / amax) and their sum. The vector path
// reads the block once into four registers for both; its maximum and codes are the scalar ones (a maximum is exact
// in any order).
int quantize_block32(const float* x, int8_t* q, float* amax_out) {
#ifdef TANDEM_Q8_SIMD
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 v[4] = {_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8), _mm256_loadu_ps(x + 16),
                         _mm256_loadu_ps(x + 24)};
    const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                   _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
    *amax_out = amax;
    return hsum_epi32(store_codes32(v, _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f), q));
#else
    const float amax = max_abs(x, 32);
    *amax_out = amax;
    return round_codes(x, amax != 0.0f ? 127.0f / amax : 0.0f, 32, q);
#endif
}

void quantize_q8_0(const float* x, void* dst, int64_t cols) {
    BlockQ8_0* out = static_cast<BlockQ8_0*>(dst);
    for (int64_t b = 0; b < cols / 32; ++b) {
        float amax;
        quantize_block32(x + 32 * b, out[b].qs, &amax);
        out[b].d = fp32_to_fp16(amax / 127.0f);
    }
}

void quantize_q8_1(const float* x, void* dst, int64_t cols) {
    BlockQ8_1* out = static_cast<BlockQ8_1*>(dst);
    for (int64_t b = 0; b < cols / 32; ++b) {
        float amax;
        const int sum = quantize_block32(x + 32 * b, out[b].qs, &amax);
        const float d = amax / 127.0f;
        out[b].d = fp32_to_fp16(d);
        out[b].s = fp32_to_fp16(d * static_cast<float>(sum));
    }
}

void quantize_q8_k(const float* x, void* dst, int64_t cols) {
    BlockQ8_K* out = static_cast<BlockQ8_K*>(dst);
    for (int64_t b = 0; b < cols / kQK_K; ++b) {
        const float* xb = x + kQK_K * b;
        BlockQ8_K& o = out[b];
        const float amax = max_abs(xb, kQK_K);
        if (amax == 0.0f) {
            std::memset(&o, 0, sizeof o);
            continue;
        }
        int first = 0;  // the first element of largest magnitude decides the sign, as in ggml
        while (std::fabs(xb[first]) != amax) ++first;
        const float iscale = -127.0f / xb[first];
        round_codes(xb, iscale, kQK_K, o.qs);  // |x * iscale| <= 127 except -(-127) rounding: clamp keeps 127
        for (int g = 0; g < kQK_K / 16; ++g) {
            int s = 0;
            for (int j = 0; j < 16; ++j) s += o.qs[16 * g + j];
            o.bsums[g] = static_cast<int16_t>(s);
        }
        o.d = 1.0f / iscale;
    }
}

const Q8TypeKernels& require_q8_kernels(GgmlType type, int64_t n, const char* what) {
    const Q8TypeKernels* k = find_q8_kernels(type);
    if (!k) throw Error(std::string(what) + ": type " + ggml_type_name(type) + " has no 8-bit-activation kernel");
    if (n <= 0 || n % act_block_size(k->act) != 0 || n % find_kernels(type)->block_size != 0)
        throw Error(std::string(what) + ": " + std::to_string(n) + " elements is not a whole number of blocks of " +
                    ggml_type_name(type));
    return *k;
}

float dot_one(DotRowsQ8Fn fn, const Q8TypeKernels& k, int64_t n, const void* row, const float* x) {
    std::vector<uint8_t> xq(act_row_bytes(k.act, n));
    quantize_activations(k.act, x, xq.data(), n);
    float y = 0.0f;
    fn(row, ggml_row_bytes(k.type, static_cast<uint64_t>(n)), n, 0, 1, xq.data(), xq.size(), 1, &y, 1);
    return y;
}

}  // namespace

int64_t act_block_size(ActFormat f) { return f == ActFormat::Q8_K ? kQK_K : 32; }

size_t act_block_bytes(ActFormat f) {
    switch (f) {
        case ActFormat::Q8_0: return sizeof(BlockQ8_0);
        case ActFormat::Q8_1: return sizeof(BlockQ8_1);
        case ActFormat::Q8_K: return sizeof(BlockQ8_K);
    }
    return 0;
}

size_t act_row_bytes(ActFormat f, int64_t cols) {
    return static_cast<size_t>(cols / act_block_size(f)) * act_block_bytes(f);
}

void quantize_activations(ActFormat f, const float* x, void* dst, int64_t cols) {
    switch (f) {
        case ActFormat::Q8_0: return quantize_q8_0(x, dst, cols);
        case ActFormat::Q8_1: return quantize_q8_1(x, dst, cols);
        case ActFormat::Q8_K: return quantize_q8_k(x, dst, cols);
    }
}

void dequantize_activations(ActFormat f, const void* src, float* dst, int64_t cols) {
    const int64_t bs = act_block_size(f);
    for (int64_t b = 0; b < cols / bs; ++b) {
        const uint8_t* blk = static_cast<const uint8_t*>(src) + b * act_block_bytes(f);
        float d;
        const int8_t* qs;
        if (f == ActFormat::Q8_K) {
            const auto* p = reinterpret_cast<const BlockQ8_K*>(blk);
            d = p->d;
            qs = p->qs;
        } else {
            d = fp16_to_fp32(load_u16(blk));
            qs = reinterpret_cast<const int8_t*>(blk + (f == ActFormat::Q8_1 ? 4 : 2));
        }
        for (int64_t j = 0; j < bs; ++j) dst[b * bs + j] = static_cast<float>(qs[j]) * d;
    }
}

namespace {

// The family tables with each type's AVX-512 kernel filled in where this CPU runs it.
std::vector<Q8TypeKernels> make_table() {
    const bool avx512 = avx512_kernels_enabled();
    std::vector<Q8TypeKernels> table;
    for (auto family : {q8_detail::legacy_q8_kernels(), q8_detail::kquant_q8_kernels()})
        for (Q8TypeKernels k : family) {
            if (avx512) {
                k.dot_rows_avx512 = q8_detail::legacy_q8_avx512_kernel(k.type);
                if (!k.dot_rows_avx512) k.dot_rows_avx512 = q8_detail::kquant_q8_avx512_kernel(k.type);
            }
            if (k.dot_rows_avx512) k.dot_rows = k.dot_rows_avx512;
            table.push_back(k);
        }
    return table;
}

}  // namespace

bool avx512_kernels_enabled() {
    static const bool enabled = [] {
#if defined(TANDEM_AVX2) && defined(__x86_64__)
        if (!dispatch().avx512) return false;
        __builtin_cpu_init();  // libgcc's checks include the OS saving the zmm state
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("avx512vnni");
#else
        return false;
#endif
    }();
    return enabled;
}

const Q8TypeKernels* find_q8_kernels(GgmlType type) {
    static const std::vector<Q8TypeKernels> table = make_table();
    for (const Q8TypeKernels& k : table)
        if (k.type == type) return &k;
    return nullptr;
}

float vec_dot_q8(GgmlType type, int64_t n, const void* row, const float* x) {
    const Q8TypeKernels& k = require_q8_kernels(type, n, "vec_dot_q8");
    return dot_one(k.dot_rows, k, n, row, x);
}

float vec_dot_q8_scalar(GgmlType type, int64_t n, const void* row, const float* x) {
    const Q8TypeKernels& k = require_q8_kernels(type, n, "vec_dot_q8_scalar");
    return dot_one(k.dot_rows_scalar, k, n, row, x);
}

}  // namespace tandem::cpu
