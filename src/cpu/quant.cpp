// The per-type CPU kernels behind quant.h: ggml's reference quantizers, row decoding, and the dot-product tiles
// (AVX2/FMA/F16C and portable scalar) that vec_dot and matmul share. One traits struct per type, one table.
//
// Batch invariance, the property matmul promises, is built here. A tile computes the dot products of one weight
// row with T tokens at once (T = 1..4): each block of the row is decoded into registers once and then used for
// every token. For each token the sequence of floating-point operations is written once, in a template over T, and
// does not depend on T or on the token's place in the tile, so the 1-token result (decode, vec_dot) and the 4-token
// result (prefill, verification) of a (row, token) pair are bitwise equal. Only explicit intrinsics are used for
// the SIMD arithmetic that matters: the compiler may not reassociate them, and a separate mul + add is never left
// where -ffp-contract could fuse it differently in different instantiations.
#include "cpu/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "cpu/fp16.h"
#include "error.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TANDEM_QUANT_SIMD 1
#include <immintrin.h>
#endif

#define TANDEM_ALWAYS_INLINE inline __attribute__((always_inline))

namespace tandem::cpu {
namespace {

// Every kernel walks a row in steps of 32 elements, the block size of the 32-element ggml types; F32 and F16 rows
// are cut into 32-element pieces the same way, and their remainder (they may have any length) goes through a tail.
constexpr int64_t kStep = 32;

// Tokens per tile: 4 tokens x 2 accumulators = 8 ymm registers, plus 4 for the decoded block and 1 for its scale,
// stays within the 16 AVX2 registers.
constexpr int kTokenTile = 4;

// With more tokens than one tile, rows are processed in chunks of about this many weight bytes, and every token
// tile sweeps a chunk before the next: the chunk stays in L2 while the activations stream past it.
constexpr size_t kRowChunkBytes = 128 * 1024;

// Returns v rounded to float as a value the compiler cannot see through. ggml's reference quantizers compute
// x * id and then add to it; with FMA available GCC would fuse the two (it contracts across statements by default),
// which moves the rare element that sits on a rounding boundary. Quantized bytes stay the same in every build.
inline float opaque(float v) {
#if defined(__GNUC__)
    __asm__("" : "+m"(v));
#endif
    return v;
}

uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
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

struct Q4_0Traits {
    static constexpr GgmlType kType = GgmlType::Q4_0;
    static constexpr int64_t kBlockSize = 32;
    static constexpr size_t kBlockBytes = sizeof(BlockQ4_0);
    static constexpr size_t kStepBytes = kBlockBytes;
    static constexpr bool kScaled = true;
    static constexpr bool kAnyLength = false;

    // ggml's quantize_row_q4_0_ref: `max` is the element of largest magnitude with its sign, d = max / -8 (so that
    // element maps to code 0 exactly and the other side gets the 15 remaining codes), q = min(15, trunc(x/d + 8.5)).
    static void quantize(const float* src, void* dst, int64_t n) {
        BlockQ4_0* out = static_cast<BlockQ4_0*>(dst);
        for (int64_t b = 0; b < n / 32; ++b) {
            const float* x = src + b * 32;
            float amax = 0.0f, max = 0.0f;
            for (int j = 0; j < 32; ++j) {
                if (amax < std::fabs(x[j])) {
                    amax = std::fabs(x[j]);
                    max = x[j];
                }
            }
            const float d = max / -8.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            out[b].d = fp32_to_fp16(d);
            for (int j = 0; j < 16; ++j) {
                const float x0 = opaque(x[j] * id), x1 = opaque(x[j + 16] * id);
                const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(x0 + 8.5f)));
                const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(x1 + 8.5f)));
                out[b].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
            }
        }
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

// ---- portable kernel ------------------------------------------------------------------------------------------
// Per token: each 32-element step is reduced into 8 lane sums p[k] (lane k gets elements k, k+8, k+16, k+24, in
// that order), then acc[k] += d * p[k]; at the end the 8 lanes are added in a fixed tree and the tail (F32/F16
// rows whose length is not a multiple of 32) is added last. The lanes are independent, so compilers may vectorise
// them (SSE2 on any x86-64) without changing a single result. Products and sums are plain a * b + c here: without
// FMA instructions (the portable build) nothing can be fused, and a compiler that may fuse (-mfma with the default
// -ffp-contract=fast) sees the same expressions in every tile width.

inline float lane_sum8(const float* a) {
    // The same tree as hsum8 below: halves, then pairs, then the last two.
    const float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
    return (s0 + s2) + (s1 + s3);
}

template <class Ty, int T>
void tile_scalar(const uint8_t* row, int64_t cols, const float* x, int64_t x_stride, float* out) {
    float acc[T][8] = {};
    const int64_t n_steps = cols / kStep;
    for (int64_t b = 0; b < n_steps; ++b) {
        const uint8_t* step = row + b * Ty::kStepBytes;
        float w[kStep];
        Ty::decode(step, w);
        float d = 1.0f;
        if constexpr (Ty::kScaled) d = Ty::scale(step);
        for (int t = 0; t < T; ++t) {
            const float* xt = x + t * x_stride + b * kStep;
            float p[8];
            for (int k = 0; k < 8; ++k) p[k] = w[k] * xt[k];
            for (int i = 1; i < 4; ++i)
                for (int k = 0; k < 8; ++k) p[k] += w[8 * i + k] * xt[8 * i + k];
            for (int k = 0; k < 8; ++k) {
                if constexpr (Ty::kScaled)
                    acc[t][k] += d * p[k];
                else
                    acc[t][k] += p[k];
            }
        }
    }
    for (int t = 0; t < T; ++t) {
        out[t] = lane_sum8(acc[t]);
        if constexpr (Ty::kAnyLength) {
            const float* xt = x + t * x_stride;
            float tail = 0.0f;
            for (int64_t j = n_steps * kStep; j < cols; ++j) tail += Ty::element(row, j) * xt[j];
            out[t] += tail;
        }
    }
}

template <class Ty>
struct ScalarKernel {
    template <int T>
    static TANDEM_ALWAYS_INLINE void tile(const uint8_t* row, int64_t cols, const float* x, int64_t x_stride,
                                          float* out) {
        tile_scalar<Ty, T>(row, cols, x, x_stride, out);
    }
};

// ---- AVX2 / FMA / F16C kernel -----------------------------------------------------------------------------------
#ifdef TANDEM_QUANT_SIMD

// Sum of the 8 lanes in a fixed order: (lo128 + hi128), then the two 64-bit halves, then the last pair.
TANDEM_ALWAYS_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// One 32-element step of the row against T tokens. Per token: p = w0*x0 + w1*x1 + w2*x2 + w3*x3 (a multiply and
// three FMAs into a fresh register), then acc = fma(d, p, acc). Keeping the scale out of the inner products costs
// one FMA per step instead of four multiplies, and leaves a single dependent operation on `acc` per step.
template <class Ty, int T>
TANDEM_ALWAYS_INLINE void step_simd(const uint8_t* step, const float* x, int64_t x_stride, __m256 (&acc)[T]) {
    __m256 w[4];
    Ty::decode8(step, w);
    __m256 d;
    if constexpr (Ty::kScaled) d = Ty::scale8(step);
    for (int t = 0; t < T; ++t) {
        const float* xt = x + t * x_stride;
        __m256 p = _mm256_mul_ps(w[0], _mm256_loadu_ps(xt));
        p = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xt + 8), p);
        p = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xt + 16), p);
        p = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xt + 24), p);
        if constexpr (Ty::kScaled)
            acc[t] = _mm256_fmadd_ps(d, p, acc[t]);
        else
            acc[t] = _mm256_add_ps(acc[t], p);
    }
}

// Even and odd steps go to two accumulator sets, so consecutive steps do not wait on each other's FMA latency.
// The split is by step index, not by token count: it is the same for T = 1 and T = 4.
template <class Ty, int T>
void tile_simd(const uint8_t* row, int64_t cols, const float* x, int64_t x_stride, float* out) {
    __m256 even[T], odd[T];
    for (int t = 0; t < T; ++t) even[t] = odd[t] = _mm256_setzero_ps();
    const int64_t n_steps = cols / kStep;
    int64_t b = 0;
    for (; b + 1 < n_steps; b += 2) {
        step_simd<Ty, T>(row + b * Ty::kStepBytes, x + b * kStep, x_stride, even);
        step_simd<Ty, T>(row + (b + 1) * Ty::kStepBytes, x + (b + 1) * kStep, x_stride, odd);
    }
    if (b < n_steps) step_simd<Ty, T>(row + b * Ty::kStepBytes, x + b * kStep, x_stride, even);
    for (int t = 0; t < T; ++t) {
        out[t] = hsum8(_mm256_add_ps(even[t], odd[t]));
        if constexpr (Ty::kAnyLength) {
            // std::fma is a single instruction here (-mfma) and, unlike a * b + c, never depends on contraction.
            const float* xt = x + t * x_stride;
            float tail = 0.0f;
            for (int64_t j = n_steps * kStep; j < cols; ++j) tail = std::fma(Ty::element(row, j), xt[j], tail);
            out[t] += tail;
        }
    }
}

template <class Ty>
struct SimdKernel {
    template <int T>
    static TANDEM_ALWAYS_INLINE void tile(const uint8_t* row, int64_t cols, const float* x, int64_t x_stride,
                                          float* out) {
        tile_simd<Ty, T>(row, cols, x, x_stride, out);
    }
};

#endif  // TANDEM_QUANT_SIMD

// ---- rows x tokens driver (shared by both kernels) ---------------------------------------------------------------

template <class Kernel, int T>
void rows_tile(const uint8_t* W, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end,
               const float* x, int64_t x_stride, float* y, int64_t y_stride) {
    for (int64_t r = row_begin; r < row_end; ++r) {
        float out[T];
        Kernel::template tile<T>(W + r * row_bytes, cols, x, x_stride, out);
        for (int t = 0; t < T; ++t) y[t * y_stride + r] = out[t];
    }
}

template <class Kernel>
void dot_rows(const void* W, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end, const float* x,
              int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
    const uint8_t* w = static_cast<const uint8_t*>(W);
    // One token tile (decode, short verification) streams the whole range once; more tiles reuse chunks from L2.
    const size_t chunk_rows = std::max<size_t>(1, kRowChunkBytes / std::max<size_t>(1, row_bytes));
    const int64_t chunk = n_tokens <= kTokenTile ? std::max<int64_t>(1, row_end - row_begin)
                                                 : static_cast<int64_t>(chunk_rows);
    for (int64_t r0 = row_begin; r0 < row_end; r0 += chunk) {
        const int64_t r1 = std::min(row_end, r0 + chunk);
        for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenTile) {
            const float* xt = x + t0 * x_stride;
            float* yt = y + t0 * y_stride;
            switch (std::min<int64_t>(kTokenTile, n_tokens - t0)) {
                case 4: rows_tile<Kernel, 4>(w, row_bytes, cols, r0, r1, xt, x_stride, yt, y_stride); break;
                case 3: rows_tile<Kernel, 3>(w, row_bytes, cols, r0, r1, xt, x_stride, yt, y_stride); break;
                case 2: rows_tile<Kernel, 2>(w, row_bytes, cols, r0, r1, xt, x_stride, yt, y_stride); break;
                default: rows_tile<Kernel, 1>(w, row_bytes, cols, r0, r1, xt, x_stride, yt, y_stride); break;
            }
        }
    }
}
static_assert(kTokenTile == 4, "dot_rows dispatches tiles of 1..4 tokens");

template <class Ty>
constexpr TypeKernels make_kernels() {
#ifdef TANDEM_QUANT_SIMD
    constexpr DotRowsFn fast = &dot_rows<SimdKernel<Ty>>;
#else
    constexpr DotRowsFn fast = &dot_rows<ScalarKernel<Ty>>;
#endif
    return TypeKernels{Ty::kType,     Ty::kBlockSize,   Ty::kBlockBytes, &Ty::quantize,
                       &Ty::dequantize, fast,             &dot_rows<ScalarKernel<Ty>>};
}

constexpr TypeKernels kKernels[] = {
    make_kernels<F32Traits>(),
    make_kernels<F16Traits>(),
    make_kernels<Q8_0Traits>(),
    make_kernels<Q4_0Traits>(),
};

const TypeKernels& require_kernels(GgmlType type, int64_t n, const char* what) {
    const TypeKernels* k = find_kernels(type);
    if (!k)
        throw Error(std::string(what) + ": type " + ggml_type_name(type) + " is not supported by the CPU kernels");
    if (n < 0 || n % k->block_size != 0)
        throw Error(std::string(what) + ": " + std::to_string(n) + " elements is not a whole number of " +
                    ggml_type_name(type) + " blocks (" + std::to_string(k->block_size) + " elements each)");
    return *k;
}

float dot_one(DotRowsFn fn, const TypeKernels& k, int64_t n, const void* row, const float* x) {
    float y = 0.0f;
    fn(row, ggml_row_bytes(k.type, static_cast<uint64_t>(n)), n, 0, 1, x, n, 1, &y, 1);
    return y;
}

}  // namespace

const TypeKernels* find_kernels(GgmlType type) {
    for (const TypeKernels& k : kKernels)
        if (k.type == type) return &k;
    return nullptr;
}

bool cpu_supports(GgmlType type) { return find_kernels(type) != nullptr; }

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
    require_kernels(type, n, "quantize_row").quantize(src, dst, n);
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
    require_kernels(type, n, "dequantize_row").dequantize(src, dst, n);
}

float vec_dot(GgmlType type, int64_t n, const void* row, const float* x) {
    const TypeKernels& k = require_kernels(type, n, "vec_dot");
    return dot_one(k.dot_rows, k, n, row, x);
}

float vec_dot_scalar(GgmlType type, int64_t n, const void* row, const float* x) {
    const TypeKernels& k = require_kernels(type, n, "vec_dot_scalar");
    return dot_one(k.dot_rows_scalar, k, n, row, x);
}

}  // namespace tandem::cpu
