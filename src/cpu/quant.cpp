// The per-type CPU kernels behind quant.h: the dot-product tiles (AVX2/FMA/F16C and portable scalar) that vec_dot
// and matmul share, instantiated over one traits struct per type, and one table. The traits (ggml's reference
// quantizers, row decoding, the decoders of a step or block) are in quant_traits.h.
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
#include <string>
#include <utility>
#include <vector>

#include "cpu/fp16.h"
#include "cpu/quant_traits.h"
#include "error.h"

namespace tandem::cpu {

// ggml's quantize_row_q4_0_ref: `max` is the element of largest magnitude with its sign, d = max / -8 (so that
// element maps to code 0 exactly and the other side gets the 15 remaining codes), q = min(15, trunc(x/d + 8.5)).
void quantize_row_q4_0_scalar(const float* src, void* dst, int64_t n) {
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
            const float x0 = quant_detail::opaque(x[j] * id), x1 = quant_detail::opaque(x[j + 16] * id);
            const int lo = std::min(15, static_cast<int>(static_cast<int8_t>(x0 + 8.5f)));
            const int hi = std::min(15, static_cast<int>(static_cast<int8_t>(x1 + 8.5f)));
            out[b].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
        }
    }
}

namespace {

using quant_detail::kStep;

// Tokens per tile: 4 tokens x 2 accumulators = 8 ymm registers, plus 4 for the decoded block and 1 for its scale,
// stays within the 16 AVX2 registers.
constexpr int kTokenTile = 4;

// With more tokens than one tile, rows are processed in chunks of about this many weight bytes, and every token
// tile sweeps a chunk before the next: the chunk stays in L2 while the activations stream past it.
constexpr size_t kRowChunkBytes = 128 * 1024;

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
    static constexpr int kMinGroup = 0;
    template <int T>
    static TANDEM_ALWAYS_INLINE void tile(const uint8_t* row, int64_t cols, const float* x, int64_t x_stride,
                                          const float* /*xs*/, int64_t /*xs_stride*/, float* out) {
        tile_scalar<Ty, T>(row, cols, x, x_stride, out);
    }
};

// Block types: each block is decoded to its exact reference values (Ty::dequantize, on the stack) and then summed
// like a scale-free step above. The slowest kernel and the most accurate; it is the SIMD one's yardstick.
template <class Ty, int T>
void tile_blocks_scalar(const uint8_t* row, int64_t cols, const float* x, int64_t x_stride, float* out) {
    float acc[T][8] = {};
    const int64_t n_blocks = cols / Ty::kBlockSize;
    for (int64_t b = 0; b < n_blocks; ++b) {
        float w[Ty::kBlockSize];
        Ty::dequantize(row + b * Ty::kBlockBytes, w, Ty::kBlockSize);
        for (int s = 0; s < Ty::kSteps; ++s) {
            const float* ws = w + s * kStep;
            for (int t = 0; t < T; ++t) {
                const float* xt = x + t * x_stride + b * Ty::kBlockSize + s * kStep;
                float p[8];
                for (int k = 0; k < 8; ++k) p[k] = ws[k] * xt[k];
                for (int i = 1; i < 4; ++i)
                    for (int k = 0; k < 8; ++k) p[k] += ws[8 * i + k] * xt[8 * i + k];
                for (int k = 0; k < 8; ++k) acc[t][k] += p[k];
            }
        }
    }
    for (int t = 0; t < T; ++t) out[t] = lane_sum8(acc[t]);
}

template <class Ty>
struct BlockScalarKernel {
    static constexpr int kMinGroup = 0;
    template <int T>
    static TANDEM_ALWAYS_INLINE void tile(const uint8_t* row, int64_t cols, const float* x, int64_t x_stride,
                                          const float* /*xs*/, int64_t /*xs_stride*/, float* out) {
        tile_blocks_scalar<Ty, T>(row, cols, x, x_stride, out);
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
    static constexpr int kMinGroup = 0;
    template <int T>
    static TANDEM_ALWAYS_INLINE void tile(const uint8_t* row, int64_t cols, const float* x, int64_t x_stride,
                                          const float* /*xs*/, int64_t /*xs_stride*/, float* out) {
        tile_simd<Ty, T>(row, cols, x, x_stride, out);
    }
};

// One 32-element step S of a block against T tokens: as step_simd, with the step's scale from the block context.
// Types with 16-element sub-blocks (kHalfScales) form two partial products and fold each in with its own scale.
template <class Ty, int S, int T>
TANDEM_ALWAYS_INLINE void block_step_simd(const uint8_t* blk, const typename Ty::Ctx& c, const float* x,
                                          int64_t x_stride, __m256 (&acc)[T]) {
    __m256 w[4];
    Ty::template decode8<S>(blk, w);
    if constexpr (Ty::kHalfScales) {
        const __m256 d0 = _mm256_set1_ps(c.d[2 * S]), d1 = _mm256_set1_ps(c.d[2 * S + 1]);
        for (int t = 0; t < T; ++t) {
            const float* xt = x + t * x_stride;
            __m256 p0 = _mm256_mul_ps(w[0], _mm256_loadu_ps(xt));
            __m256 p1 = _mm256_mul_ps(w[2], _mm256_loadu_ps(xt + 16));
            p0 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xt + 8), p0);
            p1 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xt + 24), p1);
            acc[t] = _mm256_fmadd_ps(d0, p0, acc[t]);
            acc[t] = _mm256_fmadd_ps(d1, p1, acc[t]);
        }
    } else {
        const __m256 d = _mm256_set1_ps(c.d[S]);
        for (int t = 0; t < T; ++t) {
            const float* xt = x + t * x_stride;
            __m256 p = _mm256_mul_ps(w[0], _mm256_loadu_ps(xt));
            p = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xt + 8), p);
            p = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xt + 16), p);
            p = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xt + 24), p);
            acc[t] = _mm256_fmadd_ps(d, p, acc[t]);
        }
    }
}

// Steps alternate between two accumulator sets by their index in the row (as in tile_simd), mins go to a third
// (vector) or a scalar accumulator per token; the four are added in a fixed order at the end.
template <class Ty, int T>
void tile_blocks_simd(const uint8_t* row, int64_t cols, const float* x, int64_t x_stride, const float* xs,
                      int64_t xs_stride, float* out) {
    __m256 even[T], odd[T], macc[T];
    float msum[T];
    for (int t = 0; t < T; ++t) {
        even[t] = odd[t] = macc[t] = _mm256_setzero_ps();
        msum[t] = 0.0f;
    }
    constexpr int64_t kXsPerBlock = Ty::kMinGroup ? Ty::kBlockSize / Ty::kMinGroup : 0;
    auto mins = [&](const typename Ty::Ctx& c, int64_t b) {
        if constexpr (Ty::kScalarMin) {
            for (int t = 0; t < T; ++t) msum[t] = std::fma(c.m, xs[t * xs_stride + b], msum[t]);
        } else if constexpr (Ty::kMinVecs > 0) {
            for (int v = 0; v < Ty::kMinVecs; ++v)
                for (int t = 0; t < T; ++t)
                    macc[t] = _mm256_fmadd_ps(c.mv[v], _mm256_loadu_ps(xs + t * xs_stride + b * kXsPerBlock + 8 * v),
                                              macc[t]);
        }
    };
    const int64_t n_blocks = cols / Ty::kBlockSize;
    if constexpr (Ty::kSteps == 1) {
        int64_t b = 0;
        for (; b + 1 < n_blocks; b += 2) {
            const uint8_t* b0 = row + b * Ty::kBlockBytes;
            const uint8_t* b1 = b0 + Ty::kBlockBytes;
            typename Ty::Ctx c0, c1;
            Ty::prepare(b0, c0);
            Ty::prepare(b1, c1);
            block_step_simd<Ty, 0, T>(b0, c0, x + b * kStep, x_stride, even);
            block_step_simd<Ty, 0, T>(b1, c1, x + (b + 1) * kStep, x_stride, odd);
            mins(c0, b);
            mins(c1, b + 1);
        }
        if (b < n_blocks) {
            const uint8_t* b0 = row + b * Ty::kBlockBytes;
            typename Ty::Ctx c0;
            Ty::prepare(b0, c0);
            block_step_simd<Ty, 0, T>(b0, c0, x + b * kStep, x_stride, even);
            mins(c0, b);
        }
    } else {
        static_assert(Ty::kSteps % 2 == 0);
        for (int64_t b = 0; b < n_blocks; ++b) {
            const uint8_t* blk = row + b * Ty::kBlockBytes;
            const float* xb = x + b * Ty::kBlockSize;
            typename Ty::Ctx c;
            Ty::prepare(blk, c);
            [&]<int... S>(std::integer_sequence<int, S...>) {
                ((S % 2 ? block_step_simd<Ty, S, T>(blk, c, xb + S * kStep, x_stride, odd)
                        : block_step_simd<Ty, S, T>(blk, c, xb + S * kStep, x_stride, even)),
                 ...);
            }(std::make_integer_sequence<int, Ty::kSteps>{});
            mins(c, b);
        }
    }
    for (int t = 0; t < T; ++t) {
        float r = hsum8(_mm256_add_ps(even[t], odd[t]));
        if constexpr (Ty::kMinVecs > 0) r += hsum8(macc[t]);
        if constexpr (Ty::kScalarMin) r += msum[t];
        out[t] = r;
    }
}

template <class Ty>
struct BlockSimdKernel {
    static constexpr int kMinGroup = Ty::kMinGroup;
    template <int T>
    static TANDEM_ALWAYS_INLINE void tile(const uint8_t* row, int64_t cols, const float* x, int64_t x_stride,
                                          const float* xs, int64_t xs_stride, float* out) {
        tile_blocks_simd<Ty, T>(row, cols, x, x_stride, xs, xs_stride, out);
    }
};

#endif  // TANDEM_QUANT_SIMD

// ---- rows x tokens driver (shared by both kernels) ---------------------------------------------------------------

template <class Kernel, int T>
void rows_tile(const uint8_t* W, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end,
               const float* x, int64_t x_stride, const float* xs, int64_t xs_stride, float* y, int64_t y_stride) {
    for (int64_t r = row_begin; r < row_end; ++r) {
        float out[T];
        Kernel::template tile<T>(W + r * row_bytes, cols, x, x_stride, xs, xs_stride, out);
        for (int t = 0; t < T; ++t) y[t * y_stride + r] = out[t];
    }
}

template <class Kernel>
void dot_rows(const void* W, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end, const float* x,
              int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride) {
    const uint8_t* w = static_cast<const uint8_t*>(W);
    // Sums of x over each kMinGroup elements, for the types whose blocks have a min: per token, in a fixed order,
    // so they are the same numbers whatever the batch. Each thread makes its own (cols adds per token, next to
    // rows * cols multiply-adds).
    const float* xs = nullptr;
    int64_t xs_stride = 0;
    if constexpr (Kernel::kMinGroup > 0) {
        constexpr int G = Kernel::kMinGroup;
        static_assert(G % 8 == 0);
        thread_local std::vector<float> sums;
        xs_stride = cols / G;
        sums.resize(static_cast<size_t>(n_tokens * xs_stride));
        for (int64_t t = 0; t < n_tokens; ++t)
            for (int64_t g = 0; g < xs_stride; ++g) {
                const float* xg = x + t * x_stride + g * G;
                float lanes[8];
                for (int k = 0; k < 8; ++k) lanes[k] = xg[k];
                for (int i = 1; i < G / 8; ++i)
                    for (int k = 0; k < 8; ++k) lanes[k] += xg[8 * i + k];
                sums[static_cast<size_t>(t * xs_stride + g)] = lane_sum8(lanes);
            }
        xs = sums.data();
    }
    // One token tile (decode, short verification) streams the whole range once; more tiles reuse chunks from L2.
    const size_t chunk_rows = std::max<size_t>(1, kRowChunkBytes / std::max<size_t>(1, row_bytes));
    const int64_t chunk = n_tokens <= kTokenTile ? std::max<int64_t>(1, row_end - row_begin)
                                                 : static_cast<int64_t>(chunk_rows);
    for (int64_t r0 = row_begin; r0 < row_end; r0 += chunk) {
        const int64_t r1 = std::min(row_end, r0 + chunk);
        for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenTile) {
            const float* xt = x + t0 * x_stride;
            const float* st = xs ? xs + t0 * xs_stride : nullptr;
            float* yt = y + t0 * y_stride;
            switch (std::min<int64_t>(kTokenTile, n_tokens - t0)) {
                case 4: rows_tile<Kernel, 4>(w, row_bytes, cols, r0, r1, xt, x_stride, st, xs_stride, yt, y_stride); break;
                case 3: rows_tile<Kernel, 3>(w, row_bytes, cols, r0, r1, xt, x_stride, st, xs_stride, yt, y_stride); break;
                case 2: rows_tile<Kernel, 2>(w, row_bytes, cols, r0, r1, xt, x_stride, st, xs_stride, yt, y_stride); break;
                default: rows_tile<Kernel, 1>(w, row_bytes, cols, r0, r1, xt, x_stride, st, xs_stride, yt, y_stride); break;
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
    void (*quantize)(const float*, void*, int64_t) = nullptr;
    if constexpr (requires { &Ty::quantize; }) quantize = &Ty::quantize;
    return TypeKernels{Ty::kType, Ty::kBlockSize, Ty::kBlockBytes, quantize, &Ty::dequantize,
                       fast,      &dot_rows<ScalarKernel<Ty>>};
}

template <class Ty>
constexpr TypeKernels make_block_kernels() {
#ifdef TANDEM_QUANT_SIMD
    constexpr DotRowsFn fast = &dot_rows<BlockSimdKernel<Ty>>;
#else
    constexpr DotRowsFn fast = &dot_rows<BlockScalarKernel<Ty>>;
#endif
    return TypeKernels{Ty::kType, Ty::kBlockSize, Ty::kBlockBytes, nullptr, &Ty::dequantize,
                       fast,      &dot_rows<BlockScalarKernel<Ty>>};
}

constexpr TypeKernels kKernels[] = {
    make_kernels<quant_detail::F32Traits>(),        make_kernels<quant_detail::F16Traits>(),
    make_kernels<quant_detail::BF16Traits>(),       make_kernels<quant_detail::Q8_0Traits>(),
    make_kernels<quant_detail::Q4_0Traits>(),       make_block_kernels<quant_detail::Q4_1Traits>(),
    make_block_kernels<quant_detail::Q5_0Traits>(), make_block_kernels<quant_detail::Q5_1Traits>(),
    make_block_kernels<quant_detail::Q2_KTraits>(), make_block_kernels<quant_detail::Q3_KTraits>(),
    make_block_kernels<quant_detail::Q4_KTraits>(), make_block_kernels<quant_detail::Q5_KTraits>(),
    make_block_kernels<quant_detail::Q6_KTraits>(),
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

void unpack_scale_min_k4(const uint8_t* q, uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 4; ++j) {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
        sc[j + 4] = static_cast<uint8_t>((q[j + 8] & 0xF) | ((q[j] >> 6) << 4));
        m[j + 4] = static_cast<uint8_t>((q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4));
    }
}

void unpack_scales_q3_k(const uint8_t* s, int sc[16]) {
    for (int i = 0; i < 16; ++i) {
        const int lo = i < 8 ? (s[i] & 0xF) : (s[i - 8] >> 4);
        const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        sc[i] = (lo | (hi << 4)) - 32;
    }
}

const TypeKernels* find_kernels(GgmlType type) {
    for (const TypeKernels& k : kKernels)
        if (k.type == type) return &k;
    return nullptr;
}

bool cpu_supports(GgmlType type) { return find_kernels(type) != nullptr; }

bool cpu_can_quantize(GgmlType type) {
    const TypeKernels* k = find_kernels(type);
    return k && k->quantize;
}

void requantize_row(GgmlType from, const void* src, GgmlType to, void* dst, int64_t n, float* scratch) {
    dequantize_row(from, src, scratch, n);
    quantize_row(to, scratch, dst, n);
}

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
    const TypeKernels& k = require_kernels(type, n, "quantize_row");
    if (!k.quantize)
        throw Error(std::string("quantize_row: tandem reads ") + ggml_type_name(type) +
                    " weights but cannot write them (it quantizes to f32, f16, q8_0, q4_0)");
    k.quantize(src, dst, n);
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
