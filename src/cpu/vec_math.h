// Elementwise math for the CPU backend's hot loops: exp (for softmax), SiLU- and GELU-gated products (SwiGLU,
// GeGLU) and tanh soft-capping, 8 lanes
// at a time with AVX2/FMA, and a scalar form that performs the same operations (fused multiply-adds included) so
// that every element gets the same bits whichever path computes it. A prefill chunk and a 1-token step therefore
// agree bitwise (batch invariance), and so do the SIMD body and its tail.
//
// exp: range reduction x = n ln2 + r (ln2 split in two for an exact product), e^r by a degree-6 polynomial on
// |r| <= ln2 / 2 (the Cephes expf coefficients, public domain, ~1 ulp), then scaling by 2^n through the exponent
// bits. Inputs below -87.3 give 0 (no subnormals), above 88.37 give +inf; NaN propagates.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__)
#define TANDEM_VEC_MATH_SIMD 1
#include <immintrin.h>
#endif

namespace tandem::cpu {

namespace vec_math_detail {
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kExpMax = 88.3762626647949f, kExpMin = -87.3f;
constexpr float kP[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                        4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace vec_math_detail

inline float exp_scalar(float x) {
    using namespace vec_math_detail;
    if (std::isnan(x)) return x;
    if (x > kExpMax) return INFINITY;
    if (x < kExpMin) return 0.0f;
    const float n = std::nearbyint(x * kLog2e);
    float r = std::fma(n, -kLn2Hi, x);
    r = std::fma(n, -kLn2Lo, r);
    float p = kP[0];
    for (int i = 1; i < 6; ++i) p = std::fma(p, r, kP[i]);
    const float r2 = r * r;
    p = std::fma(p, r2, r);
    p = p + 1.0f;
    const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#ifdef TANDEM_VEC_MATH_SIMD
inline __m256 exp8(__m256 x) {
    using namespace vec_math_detail;
    const __m256 too_big = _mm256_cmp_ps(x, _mm256_set1_ps(kExpMax), _CMP_GT_OQ);
    const __m256 too_small = _mm256_cmp_ps(x, _mm256_set1_ps(kExpMin), _CMP_LT_OQ);
    const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpMin)), _mm256_set1_ps(kExpMax));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(kLog2e)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), xc);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
    __m256 p = _mm256_set1_ps(kP[0]);
    for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP[i]));
    const __m256 r2 = _mm256_mul_ps(r, r);
    p = _mm256_fmadd_ps(p, r2, r);
    p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), too_small);
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), too_big);
    return _mm256_blendv_ps(y, x, is_nan);
}
#endif

// v[i] = exp(v[i] - shift) for i < n; returns the sum of the results, added in a fixed order (8 running lanes, then
// the lanes in order, then the tail), so the same inputs give the same sum whatever else runs.
inline float exp_shifted_sum(float* v, int n, float shift) {
    int i = 0;
    float lanes[8] = {};
#ifdef TANDEM_VEC_MATH_SIMD
    __m256 acc = _mm256_setzero_ps();
    const __m256 s = _mm256_set1_ps(shift);
    for (; i + 8 <= n; i += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(v + i), s));
        _mm256_storeu_ps(v + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    _mm256_storeu_ps(lanes, acc);
#else
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; ++k) {
            v[i + k] = exp_scalar(v[i + k] - shift);
            lanes[k] += v[i + k];
        }
#endif
    float sum = 0.0f;
    for (float l : lanes) sum += l;
    for (; i < n; ++i) {
        v[i] = exp_scalar(v[i] - shift);
        sum += v[i];
    }
    return sum;
}

// gate[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i], for i < n.
inline void swiglu(float* gate, const float* up, int64_t n) {
    int64_t i = 0;
#ifdef TANDEM_VEC_MATH_SIMD
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = exp8(_mm256_xor_ps(g, sign));
        const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
#endif
    for (; i < n; ++i) {
        const float g = gate[i];
        gate[i] = g / (1.0f + exp_scalar(-g)) * up[i];
    }
}

// gate[i] = gelu(gate[i]) * up[i] for i < n, GELU in its tanh approximation (gemma's gelu_pytorch_tanh):
// 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), computed as x / (1 + exp(-2u)), the same function
// (1 + tanh(u) = 2 / (1 + exp(-2u))) with one exponential and no cancellation for negative x.
inline void geglu(float* gate, const float* up, int64_t n) {
    constexpr float kTwoSqrt2OverPi = 1.5957691216057308f;  // 2 sqrt(2 / pi)
    constexpr float kCubic = 0.044715f;
    int64_t i = 0;
#ifdef TANDEM_VEC_MATH_SIMD
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 minus_k = _mm256_set1_ps(-kTwoSqrt2OverPi);
    const __m256 cubic = _mm256_set1_ps(kCubic);
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 inner = _mm256_mul_ps(g, _mm256_add_ps(one, _mm256_mul_ps(cubic, _mm256_mul_ps(g, g))));
        const __m256 e = exp8(_mm256_mul_ps(minus_k, inner));
        const __m256 gelu = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(gelu, _mm256_loadu_ps(up + i)));
    }
#endif
    for (; i < n; ++i) {
        const float g = gate[i];
        const float inner = g * (1.0f + kCubic * (g * g));
        gate[i] = g / (1.0f + exp_scalar(-kTwoSqrt2OverPi * inner)) * up[i];
    }
}

// v[i] = cap * tanh(v[i] / cap) for i < n (gemma2's soft-capping of attention scores and logits), with tanh(y) as
// 2 / (1 + exp(-2y)) - 1: one exponential; its absolute error (a few ulp of 1, times cap) is far below what the
// softmax or a sampler can tell. -inf stays -inf (the logits of ids a restriction leaves out).
inline void soft_cap(float* v, int64_t n, float cap) {
    const float minus_two_over_cap = -2.0f / cap;
    int64_t i = 0;
#ifdef TANDEM_VEC_MATH_SIMD
    const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
    const __m256 k = _mm256_set1_ps(minus_two_over_cap), c = _mm256_set1_ps(cap);
    const __m256 minus_inf = _mm256_set1_ps(-INFINITY);
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(v + i);
        const __m256 e = exp8(_mm256_mul_ps(x, k));
        const __m256 t = _mm256_sub_ps(_mm256_div_ps(two, _mm256_add_ps(one, e)), one);
        const __m256 capped = _mm256_mul_ps(t, c);
        _mm256_storeu_ps(v + i, _mm256_blendv_ps(capped, x, _mm256_cmp_ps(x, minus_inf, _CMP_EQ_OQ)));
    }
#endif
    for (; i < n; ++i) {
        if (v[i] == -INFINITY) continue;
        const float e = exp_scalar(v[i] * minus_two_over_cap);
        v[i] = (2.0f / (1.0f + e) - 1.0f) * cap;
    }
}

}  // namespace tandem::cpu
