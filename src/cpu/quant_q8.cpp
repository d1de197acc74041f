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

// q[j] = round-half-even(x[j] * id), clamped to [-127, 127]: |x * id| <= 127 already, and the clamp states that
// -128 never occurs, which the kernels' sign trick relies on. Returns the sum of the codes.
int round_codes(const float* x, float id, int n, int8_t* q) {
    int sum = 0;
    int j = 0;
#ifdef TANDEM_Q8_SIMD
    const __m256 mul = _mm256_set1_ps(id);
    for (; j + 8 <= n; j += 8) {
        const __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j), mul),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        alignas(32) int32_t lanes[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_cvtps_epi32(v));
        for (int k = 0; k < 8; ++k) {
            const int c = std::clamp(lanes[k], -127, 127);
            q[j + k] = static_cast<int8_t>(c);
            sum += c;
        }
    }
#endif
    for (; j < n; ++j) {
        const int c = std::clamp(static_cast<int>(std::nearbyint(x[j] * id)), -127, 127);
        q[j] = static_cast<int8_t>(c);
        sum += c;
    }
    return sum;
}

void quantize_q8_0(const float* x, void* dst, int64_t cols) {
    BlockQ8_0* out = static_cast<BlockQ8_0*>(dst);
    for (int64_t b = 0; b < cols / 32; ++b) {
        const float amax = max_abs(x + 32 * b, 32);
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        out[b].d = fp32_to_fp16(amax / 127.0f);
        round_codes(x + 32 * b, id, 32, out[b].qs);
    }
}

void quantize_q8_1(const float* x, void* dst, int64_t cols) {
    BlockQ8_1* out = static_cast<BlockQ8_1*>(dst);
    for (int64_t b = 0; b < cols / 32; ++b) {
        const float amax = max_abs(x + 32 * b, 32);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const int sum = round_codes(x + 32 * b, id, 32, out[b].qs);
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
        const char* off = std::getenv("TANDEM_NO_AVX512");
        if (off && std::string_view(off) == "1") return false;
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
