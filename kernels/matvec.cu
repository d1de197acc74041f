// Matrix-vector products y = W x for 1..16 tokens of fp32 activations: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K weights (every type the CPU backend computes with) with the dequantization
// fused into the dot product: each type's walk over a row (a Dot), run by the kernels of matvec_kernels.cuh. The
// public matvec functions also route to the 8-bit-activation Dots of matvec_q8.cu when given quantized x.
#include "dequant.cuh"
#include "matvec_kernels.cuh"
#include "quantize_q8.cuh"

namespace tandem::cuda {
namespace {

using namespace matvec_detail;

// ---- per-type lane dot products: acc[t] += (this lane's share of row . x[t]) for t < n_tok ---------------------
// x[t] starts at x + t * x_stride (16-byte aligned for the block types, whose cols are a multiple of 32). `row` may
// point into global or shared memory (the staged kernel decodes a copy).

// fp32 activations: a token's row is its cols floats.
struct FloatInput : WalkDefaults {
    using Input = FloatInput;  // what a DotPair's two walks must share
    using X = float;
    static __host__ __device__ __forceinline__ size_t x_units(int cols) { return static_cast<size_t>(cols); }
};

struct DotF32 : FloatInput {
    template <int NT, bool kExit>
    static __device__ __forceinline__ void dot(const uint8_t* row, int cols, const float* x, size_t x_stride,
                                               int n_tok, int lane, float (&acc)[NT]) {
        const float* w = reinterpret_cast<const float*>(row);
        const bool vec = cols % 4 == 0 && ((reinterpret_cast<uintptr_t>(w) | reinterpret_cast<uintptr_t>(x)) % 16) == 0;
        int i = 0;
        if (vec) {  // 16-byte loads; the scalar loop below then has nothing left
            for (i = 4 * lane; i + 3 < cols; i += 128) {
                const float4 wv = *reinterpret_cast<const float4*>(w + i);
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    if (token_exit<kExit>(t, n_tok)) break;
                    const size_t xt = static_cast<size_t>(read_token<NT, kExit>(t, n_tok)) * x_stride;
                    const float4 xv = *reinterpret_cast<const float4*>(x + xt + i);
                    acc[t] += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
                }
            }
            i = cols;
        }
        for (int j = i + lane; j < cols; j += 32) {
            const float wv = w[j];
#pragma unroll
            for (int t = 0; t < NT; ++t)
                if (!token_exit<kExit>(t, n_tok))
                    acc[t] += wv * x[static_cast<size_t>(read_token<NT, kExit>(t, n_tok)) * x_stride + j];
        }
    }
};

struct DotF16 : FloatInput {
    static constexpr bool kDirectExit = true;  // kExitDirect: its direct 8-token walk spilled without the exit
    template <int NT, bool kExit>
    static __device__ __forceinline__ void dot(const uint8_t* row, int cols, const float* x, size_t x_stride,
                                               int n_tok, int lane, float (&acc)[NT]) {
        const uint16_t* w = reinterpret_cast<const uint16_t*>(row);
        const bool vec = cols % 4 == 0 && (reinterpret_cast<uintptr_t>(w) % 8) == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0;
        int i = 0;
        if (vec) {  // 8-byte loads of four halves
            for (i = 4 * lane; i + 3 < cols; i += 128) {
                const uint2 raw = *reinterpret_cast<const uint2*>(w + i);
                const float w0 = tandem_half_to_float(raw.x & 0xFFFF), w1 = tandem_half_to_float(raw.x >> 16);
                const float w2 = tandem_half_to_float(raw.y & 0xFFFF), w3 = tandem_half_to_float(raw.y >> 16);
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    if (token_exit<kExit>(t, n_tok)) break;
                    const size_t xt = static_cast<size_t>(read_token<NT, kExit>(t, n_tok)) * x_stride;
                    const float4 xv = *reinterpret_cast<const float4*>(x + xt + i);
                    acc[t] += w0 * xv.x + w1 * xv.y + w2 * xv.z + w3 * xv.w;
                }
            }
            i = cols;
        }
        for (int j = i + lane; j < cols; j += 32) {
            const float wv = tandem_half_to_float(w[j]);
#pragma unroll
            for (int t = 0; t < NT; ++t)
                if (!token_exit<kExit>(t, n_tok))
                    acc[t] += wv * x[static_cast<size_t>(read_token<NT, kExit>(t, n_tok)) * x_stride + j];
        }
    }
};

// Q8_0 (34-byte blocks): 8 lanes per block, 4 weights per lane, 4 blocks per warp iteration.
struct DotQ8_0 : FloatInput {
    static constexpr int kBlockBytes = 34, kBlockCols = 32, kStepBlocks = 4;
    static constexpr bool kStagedExit = true;  // kExitStaged: its staged four-token walk spilled without the exit
    template <int NT, bool kExit>
    static __device__ __forceinline__ void dot(const uint8_t* row, int cols, const float* x, size_t x_stride,
                                               int n_tok, int lane, float (&acc)[NT]) {
        const int nb = cols / 32, j = 4 * (lane % 8);
        for (int ib = lane / 8; ib < nb; ib += 4) {
            const uint8_t* blk = row + 34 * ib;
            const float d = detail::load_half(blk);
            const uint32_t q = detail::load_u32_from_u16(blk + 2 + j);
            const float q0 = detail::sbyte(q, 0), q1 = detail::sbyte(q, 1), q2 = detail::sbyte(q, 2),
                        q3 = detail::sbyte(q, 3);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (token_exit<kExit>(t, n_tok)) break;
                const size_t xt = static_cast<size_t>(read_token<NT, kExit>(t, n_tok)) * x_stride;
                const float4 xv = *reinterpret_cast<const float4*>(x + xt + 32 * ib + j);
                acc[t] += d * (q0 * xv.x + q1 * xv.y + q2 * xv.z + q3 * xv.w);
            }
        }
    }
};

// Q4_0 (18-byte blocks): 8 lanes per block; lane j holds bytes 2j, 2j+1: elements 2j, 2j+1 (low nibbles) and
// 2j+16, 2j+17 (high nibbles).
struct DotQ4_0 : FloatInput {
    static constexpr int kBlockBytes = 18, kBlockCols = 32, kStepBlocks = 4;
    template <int NT, bool kExit>
    static __device__ __forceinline__ void dot(const uint8_t* row, int cols, const float* x, size_t x_stride,
                                               int n_tok, int lane, float (&acc)[NT]) {
        const int nb = cols / 32, j = 2 * (lane % 8);
        for (int ib = lane / 8; ib < nb; ib += 4) {
            const uint8_t* blk = row + 18 * ib;
            const float d = detail::load_half(blk);
            const uint32_t q = *reinterpret_cast<const uint16_t*>(blk + 2 + j);
            const float l0 = static_cast<float>(static_cast<int>(q & 0xF) - 8);
            const float l1 = static_cast<float>(static_cast<int>((q >> 8) & 0xF) - 8);
            const float h0 = static_cast<float>(static_cast<int>((q >> 4) & 0xF) - 8);
            const float h1 = static_cast<float>(static_cast<int>((q >> 12) & 0xF) - 8);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (token_exit<kExit>(t, n_tok)) break;
                const size_t xt = static_cast<size_t>(read_token<NT, kExit>(t, n_tok)) * x_stride;
                const float* xb = x + xt + 32 * ib;
                const float2 lo = *reinterpret_cast<const float2*>(xb + j);
                const float2 hi = *reinterpret_cast<const float2*>(xb + 16 + j);
                acc[t] += d * (l0 * lo.x + l1 * lo.y + h0 * hi.x + h1 * hi.y);
            }
        }
    }
};

// BF16: the upper half of a binary32, so widening is a shift (exact). Same walk as F16.
struct DotBF16 : FloatInput {
    static constexpr bool kDirectExit = true;  // kExitDirect: its direct 8-token walk spilled without the exit
    static __device__ __forceinline__ float widen(uint32_t bits16) { return __uint_as_float(bits16 << 16); }
    template <int NT, bool kExit>
    static __device__ __forceinline__ void dot(const uint8_t* row, int cols, const float* x, size_t x_stride,
                                               int n_tok, int lane, float (&acc)[NT]) {
        const uint16_t* w = reinterpret_cast<const uint16_t*>(row);
        const bool vec = cols % 4 == 0 && (reinterpret_cast<uintptr_t>(w) % 8) == 0 && (reinterpret_cast<uintptr_t>(x) % 16) == 0;
        int i = 0;
        if (vec) {
            for (i = 4 * lane; i + 3 < cols; i += 128) {
                const uint2 raw = *reinterpret_cast<const uint2*>(w + i);
                const float w0 = widen(raw.x & 0xFFFF), w1 = widen(raw.x >> 16);
                const float w2 = widen(raw.y & 0xFFFF), w3 = widen(raw.y >> 16);
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    if (token_exit<kExit>(t, n_tok)) break;
                    const size_t xt = static_cast<size_t>(read_token<NT, kExit>(t, n_tok)) * x_stride;
                    const float4 xv = *reinterpret_cast<const float4*>(x + xt + i);
                    acc[t] += w0 * xv.x + w1 * xv.y + w2 * xv.z + w3 * xv.w;
                }
            }
            i = cols;
        }
        for (int j = i + lane; j < cols; j += 32) {
            const float wv = widen(w[j]);
#pragma unroll
            for (int t = 0; t < NT; ++t)
                if (!token_exit<kExit>(t, n_tok))
                    acc[t] += wv * x[static_cast<size_t>(read_token<NT, kExit>(t, n_tok)) * x_stride + j];
        }
    }
};

// The 32-element legacy types with a fifth bit and / or an offset (Q4_1, Q5_0, Q5_1), walked like Q4_0: 8 lanes per
// block, lane j = 2(l%8) holds bytes j, j+1 of qs: elements j, j+1 (low nibbles) and j+16, j+17 (high nibbles).
// Layout: fp16 d at 0, fp16 m at 2 when kMin, the 32 fifth bits at kQh when kFifth, qs at kQs.
template <int kBytes, int kQs, bool kMin, bool kFifth, int kQh, int kBias>
struct DotLegacy : FloatInput {
    static constexpr int kBlockBytes = kBytes, kBlockCols = 32, kStepBlocks = 4;
    template <int NT, bool kExit>
    static __device__ __forceinline__ void dot(const uint8_t* row, int cols, const float* x, size_t x_stride,
                                               int n_tok, int lane, float (&acc)[NT]) {
        const int nb = cols / 32, j = 2 * (lane % 8);
        for (int ib = lane / 8; ib < nb; ib += 4) {
            const uint8_t* blk = row + kBytes * ib;
            const float d = detail::load_half(blk);
            const float m = kMin ? detail::load_half(blk + 2) : 0.0f;
            const uint32_t q = *reinterpret_cast<const uint16_t*>(blk + kQs + j);
            int l0 = q & 0xF, l1 = (q >> 8) & 0xF, h0 = (q >> 4) & 0xF, h1 = (q >> 12) & 0xF;
            if (kFifth) {
                const uint32_t qh = detail::load_u32_from_u16(blk + kQh);
                l0 |= ((qh >> j) & 1) << 4;
                l1 |= ((qh >> (j + 1)) & 1) << 4;
                h0 |= ((qh >> (j + 16)) & 1) << 4;
                h1 |= ((qh >> (j + 17)) & 1) << 4;
            }
            const float f0 = static_cast<float>(l0 - kBias), f1 = static_cast<float>(l1 - kBias);
            const float g0 = static_cast<float>(h0 - kBias), g1 = static_cast<float>(h1 - kBias);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (token_exit<kExit>(t, n_tok)) break;
                const size_t xt = static_cast<size_t>(read_token<NT, kExit>(t, n_tok)) * x_stride;
                const float* xb = x + xt + 32 * ib;
                const float2 lo = *reinterpret_cast<const float2*>(xb + j);
                const float2 hi = *reinterpret_cast<const float2*>(xb + 16 + j);
                float s = d * (f0 * lo.x + f1 * lo.y + g0 * hi.x + g1 * hi.y);
                if (kMin) s += m * (lo.x + lo.y + hi.x + hi.y);
                acc[t] += s;
            }
        }
    }
};
using DotQ4_1 = DotLegacy<20, 4, true, false, 0, 0>;
using DotQ5_0 = DotLegacy<22, 6, false, true, 2, 16>;
using DotQ5_1 = DotLegacy<24, 8, true, true, 4, 0>;

// Q2_K and Q3_K (256-element super-blocks of 2-bit codes): lane l owns element l of each of the 8 chunks of 32
// (bytes l and 32 + l of qs, and for Q3_K byte l of hmask), so the 32 lanes read 32 consecutive bytes at a time.
// Element l of chunk c sits in sub-block 2c + (l >= 16), which picks its scale.
struct DotQ2_K : FloatInput {
    static constexpr int kBlockBytes = 84, kBlockCols = 256, kStepBlocks = 1;
    template <int NT, bool kExit>
    static __device__ __forceinline__ void dot(const uint8_t* row, int cols, const float* x, size_t x_stride,
                                               int n_tok, int lane, float (&acc)[NT]) {
        const int nb = cols / 256, half = lane >= 16;
        for (int ib = 0; ib < nb; ++ib) {
            const uint8_t* blk = row + 84 * ib;
            const float d = detail::load_half(blk + 80), dmin = detail::load_half(blk + 82);
            const uint32_t q0 = blk[16 + lane], q1 = blk[16 + 32 + lane];
            float w[8];
#pragma unroll
            for (int c = 0; c < 8; ++c) {
                const uint32_t sc = blk[2 * c + half];
                const uint32_t q = ((c < 4 ? q0 : q1) >> (2 * (c % 4))) & 3;
                w[c] = d * static_cast<float>(sc & 0xF) * static_cast<float>(q) - dmin * static_cast<float>(sc >> 4);
            }
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (token_exit<kExit>(t, n_tok)) break;
                const size_t xt = static_cast<size_t>(read_token<NT, kExit>(t, n_tok)) * x_stride;
                const float* xb = x + xt + 256 * ib + lane;
                float s = 0.0f;
#pragma unroll
                for (int c = 0; c < 8; ++c) s += w[c] * xb[32 * c];
                acc[t] += s;
            }
        }
    }
};

struct DotQ3_K : FloatInput {
    static constexpr int kBlockBytes = 110, kBlockCols = 256, kStepBlocks = 1;
    // Sixteen 6-bit scales biased by 32: low 4 bits in bytes 0..7 (two per byte), high 2 bits in bytes 8..11.
    static __device__ __forceinline__ int scale(const uint8_t* s, int i) {
        const int lo = i < 8 ? (s[i] & 0xF) : (s[i - 8] >> 4);
        const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        return (lo | (hi << 4)) - 32;
    }
    template <int NT, bool kExit>
    static __device__ __forceinline__ void dot(const uint8_t* row, int cols, const float* x, size_t x_stride,
                                               int n_tok, int lane, float (&acc)[NT]) {
        const int nb = cols / 256, half = lane >= 16;
        for (int ib = 0; ib < nb; ++ib) {
            const uint8_t* blk = row + 110 * ib;
            const float d = detail::load_half(blk + 108);
            const uint32_t hm = blk[lane], q0 = blk[32 + lane], q1 = blk[64 + lane];
            float w[8];
#pragma unroll
            for (int c = 0; c < 8; ++c) {
                const int q = static_cast<int>(((c < 4 ? q0 : q1) >> (2 * (c % 4))) & 3) - (((hm >> c) & 1) ? 0 : 4);
                w[c] = d * static_cast<float>(scale(blk + 96, 2 * c + half)) * static_cast<float>(q);
            }
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (token_exit<kExit>(t, n_tok)) break;
                const size_t xt = static_cast<size_t>(read_token<NT, kExit>(t, n_tok)) * x_stride;
                const float* xb = x + xt + 256 * ib + lane;
                float s = 0.0f;
#pragma unroll
                for (int c = 0; c < 8; ++c) s += w[c] * xb[32 * c];
                acc[t] += s;
            }
        }
    }
};

// Q4_K (144-byte super-blocks of 256) and Q5_K (176): one super-block per warp iteration. Lane l reads 4 bytes of qs
// at kQs + 32p + 4(l%8), p = l/8: their low nibbles are elements of chunk 2p, their high nibbles of chunk 2p + 1.
// Q5_K's fifth bits: bit c of qh[e] (the 4 bytes at 16 + 4(l%8)) for element e of chunk c.
template <int kBytes, int kQs, bool kFifth>
struct DotQK4 : FloatInput {
    static constexpr int kBlockBytes = kBytes, kBlockCols = 256, kStepBlocks = 1;
    static constexpr bool kStagedExit = true;  // kExitStaged: Q4_K's staged four-token walk spilled without the exit
    static constexpr bool kNormEpilogue = !kFifth;  // Q5_K's norm-epilogue kernels spilled (matvec_norm_in_launch)
    template <int NT, bool kExit>
    static __device__ __forceinline__ void dot(const uint8_t* row, int cols, const float* x, size_t x_stride,
                                               int n_tok, int lane, float (&acc)[NT]) {
        constexpr bool kStop = kExit || kFifth;  // token_exit: Q5_K keeps the exit
        const int nb = cols / 256, p = lane / 8, i = 4 * (lane % 8);
        for (int ib = 0; ib < nb; ++ib) {
            const uint8_t* blk = row + kBytes * ib;
            const float d = detail::load_half(blk), dmin = detail::load_half(blk + 2);
            int sc0, m0, sc1, m1;
            detail::scale_min_k4(blk + 4, 2 * p, sc0, m0);
            detail::scale_min_k4(blk + 4, 2 * p + 1, sc1, m1);
            const float dl0 = d * static_cast<float>(sc0), ml0 = dmin * static_cast<float>(m0);
            const float dl1 = d * static_cast<float>(sc1), ml1 = dmin * static_cast<float>(m1);
            const uint32_t q = *reinterpret_cast<const uint32_t*>(blk + kQs + 32 * p + i);
            const uint32_t qh = kFifth ? *reinterpret_cast<const uint32_t*>(blk + 16 + i) : 0u;
            float lo[4], hi[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                uint32_t l = (q >> (8 * k)) & 0xF, h = (q >> (8 * k + 4)) & 0xF;
                if (kFifth) {
                    l |= ((qh >> (8 * k + 2 * p)) & 1) << 4;
                    h |= ((qh >> (8 * k + 2 * p + 1)) & 1) << 4;
                }
                lo[k] = static_cast<float>(l);
                hi[k] = static_cast<float>(h);
            }
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (token_exit<kStop>(t, n_tok)) break;
                const size_t xt = static_cast<size_t>(read_token<NT, kStop>(t, n_tok)) * x_stride;
                const float* xb = x + xt + 256 * ib + 64 * p + i;
                const float4 xl = *reinterpret_cast<const float4*>(xb);
                const float4 xh = *reinterpret_cast<const float4*>(xb + 32);
                const float dot_lo = lo[0] * xl.x + lo[1] * xl.y + lo[2] * xl.z + lo[3] * xl.w;
                const float dot_hi = hi[0] * xh.x + hi[1] * xh.y + hi[2] * xh.z + hi[3] * xh.w;
                const float sum_lo = xl.x + xl.y + xl.z + xl.w, sum_hi = xh.x + xh.y + xh.z + xh.w;
                acc[t] += dl0 * dot_lo - ml0 * sum_lo + dl1 * dot_hi - ml1 * sum_hi;
            }
        }
    }
};
using DotQ4_K = DotQK4<144, 16, false>;
using DotQ5_K = DotQK4<176, 48, true>;

// Q6_K (210-byte super-blocks of 256): one super-block per warp iteration. Lane l covers half h = l/16 and the
// element pair e = 2(l%16), e+1 of each of the four chunks c = 4h + k of that half.
struct DotQ6_K : FloatInput {
    static constexpr int kBlockBytes = 210, kBlockCols = 256, kStepBlocks = 1;
    template <int NT, bool kExit>
    static __device__ __forceinline__ void dot(const uint8_t* row, int cols, const float* x, size_t x_stride,
                                               int n_tok, int lane, float (&acc)[NT]) {
        const int nb = cols / 256, h = lane / 16, e = 2 * (lane % 16);
        for (int ib = 0; ib < nb; ++ib) {
            const uint8_t* blk = row + 210 * ib;
            const float d = detail::load_half(blk + 208);
            const int8_t* scales = reinterpret_cast<const int8_t*>(blk + 192);
            const uint32_t ql0 = *reinterpret_cast<const uint16_t*>(blk + 64 * h + e);
            const uint32_t ql1 = *reinterpret_cast<const uint16_t*>(blk + 64 * h + 32 + e);
            const uint32_t qh = *reinterpret_cast<const uint16_t*>(blk + 128 + 32 * h + e);
            float w[4][2];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const uint32_t ql = k % 2 ? ql1 : ql0;
                const int c = 4 * h + k;
                const float dl = d * static_cast<float>(scales[2 * c + (e >= 16)]);
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    const int lo = (ql >> (8 * u + 4 * (k / 2))) & 0xF;
                    const int hi = (qh >> (8 * u + 2 * k)) & 3;
                    w[k][u] = dl * static_cast<float>((lo | (hi << 4)) - 32);
                }
            }
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (token_exit<kExit>(t, n_tok)) break;
                const size_t xt = static_cast<size_t>(read_token<NT, kExit>(t, n_tok)) * x_stride;
                const float* xb = x + xt + 256 * ib + 128 * h + e;
                float s = 0.0f;
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const float2 xv = *reinterpret_cast<const float2*>(xb + 32 * k);
                    s += w[k][0] * xv.x + w[k][1] * xv.y;
                }
                acc[t] += s;
            }
        }
    }
};

// Whether segments [first, end) of the job have rows of whole 4-byte words (the Q4_K / Q5_K walks read them so).
bool rows_4_aligned(const MatvecJob& job, int first, int end) {
    bool aligned = true;
    for (const MatvecSegment* seg : {&job.seg0, &job.seg1, &job.seg2})
        if (seg - &job.seg0 >= first && seg - &job.seg0 < end) aligned = aligned && seg->row_bytes % 4 == 0;
    return aligned;
}

// The shapes `type`'s walk takes: rows of whole blocks (and for Q4_K / Q5_K whole 4-byte words, `aligned`).
void check_shape(GgmlType type, int cols, bool aligned) {
    switch (type) {
        case GgmlType::F32:
        case GgmlType::F16:
        case GgmlType::BF16: return;
        case GgmlType::Q8_0: return detail::require(cols % 32 == 0, "matvec: Q8_0 rows are whole blocks of 32");
        case GgmlType::Q4_0: return detail::require(cols % 32 == 0, "matvec: Q4_0 rows are whole blocks of 32");
        case GgmlType::Q4_1: return detail::require(cols % 32 == 0, "matvec: Q4_1 rows are whole blocks of 32");
        case GgmlType::Q5_0: return detail::require(cols % 32 == 0, "matvec: Q5_0 rows are whole blocks of 32");
        case GgmlType::Q5_1: return detail::require(cols % 32 == 0, "matvec: Q5_1 rows are whole blocks of 32");
        case GgmlType::Q2_K: return detail::require(cols % 256 == 0, "matvec: Q2_K rows are whole blocks of 256");
        case GgmlType::Q3_K: return detail::require(cols % 256 == 0, "matvec: Q3_K rows are whole blocks of 256");
        case GgmlType::Q4_K:
            return detail::require(cols % 256 == 0 && aligned, "matvec: Q4_K rows are whole blocks of 256");
        case GgmlType::Q5_K:
            return detail::require(cols % 256 == 0 && aligned, "matvec: Q5_K rows are whole blocks of 256");
        case GgmlType::Q6_K: return detail::require(cols % 256 == 0, "matvec: Q6_K rows are whole blocks of 256");
        default: detail::require(false, "matvec: unsupported weight type");
    }
}

// Checks the shapes for `type` and launches its kernel over the job's rows.
void dispatch(GgmlType type, const MatvecJob& job, int cols, const float* x, int n_tokens, MatvecLoads loads,
              Stream stream) {
    check_job(job, cols, n_tokens);
    detail::require(reinterpret_cast<uintptr_t>(x) % 16 == 0, "matvec: W and x must be 16-byte aligned");
    check_shape(type, cols, rows_4_aligned(job, 0, job.n_seg));
    const auto blocks = [&](auto launch, const KernelNames& names) {
        launch(names, loads, job, cols, x, n_tokens, stream);
    };
    constexpr MatvecLoads kDirect = MatvecLoads::Direct;
    switch (type) {
        case GgmlType::F32:
            return launch_type<DotF32, kDirect>(direct_only("matvec_kernel<F32>"), job, cols, x, n_tokens, stream);
        case GgmlType::F16:
            return launch_type<DotF16, kDirect>(direct_only("matvec_kernel<F16>"), job, cols, x, n_tokens, stream);
        case GgmlType::BF16:
            return launch_type<DotBF16, kDirect>(direct_only("matvec_kernel<BF16>"), job, cols, x, n_tokens, stream);
        case GgmlType::Q8_0: return blocks(launch_blocks<DotQ8_0>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q8_0));
        case GgmlType::Q4_0: return blocks(launch_blocks<DotQ4_0>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q4_0));
        case GgmlType::Q4_1: return blocks(launch_blocks<DotQ4_1>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q4_1));
        case GgmlType::Q5_0: return blocks(launch_blocks<DotQ5_0>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q5_0));
        case GgmlType::Q5_1: return blocks(launch_blocks<DotQ5_1>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q5_1));
        case GgmlType::Q2_K: return blocks(launch_blocks<DotQ2_K>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q2_K));
        case GgmlType::Q3_K: return blocks(launch_blocks<DotQ3_K>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q3_K));
        case GgmlType::Q4_K: return blocks(launch_blocks<DotQ4_K>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q4_K));
        case GgmlType::Q5_K: return blocks(launch_blocks<DotQ5_K>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q5_K));
        case GgmlType::Q6_K: return blocks(launch_blocks<DotQ6_K>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q6_K));
        default: detail::require(false, "matvec: unsupported weight type");
    }
}

// A job of two types (job.b_seg: the first segment of types.last): checks both types' shapes and launches the
// pair's kernel (matvec_types_fuse lists the pairs).
void dispatch_pair(MatvecTypes types, const MatvecJob& job, int cols, const float* x, int n_tokens,
                   MatvecLoads loads, Stream stream) {
    check_job(job, cols, n_tokens);
    detail::require(reinterpret_cast<uintptr_t>(x) % 16 == 0, "matvec: W and x must be 16-byte aligned");
    check_shape(types.type, cols, rows_4_aligned(job, 0, job.b_seg));
    check_shape(types.last, cols, rows_4_aligned(job, job.b_seg, job.n_seg));
    const auto blocks = [&](auto launch, const KernelNames& names) {
        launch(names, loads, job, cols, x, n_tokens, stream);
    };
    if (types.type == GgmlType::Q4_K && types.last == GgmlType::Q6_K)
        return blocks(launch_blocks<DotPair<DotQ4_K, DotQ6_K>>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q4_K+Q6_K));
    if (types.type == GgmlType::Q5_0 && types.last == GgmlType::Q8_0)
        return blocks(launch_blocks<DotPair<DotQ5_0, DotQ8_0>>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q5_0+Q8_0));
    detail::require(false, "matvec: no kernel computes this pair of types in one launch");
}

// x quantized (xq) for a type with an 8-bit route: matvec_q8.cu computes it; else the fp32 kernels here. A job of
// two types (types.last other than types.type) walks its last segment with the other.
void route(MatvecTypes types, MatvecJob job, int cols, const float* x, const void* xq, int n_tokens,
           MatvecLoads loads, Stream stream) {
    const bool int8 = xq && matvec_q8_supports(types.type);
    if (types.last == types.type) {
        if (int8)
            dispatch_q8(types.type, job, cols, static_cast<const uint8_t*>(xq), n_tokens, loads, stream);
        else
            dispatch(types.type, job, cols, x, n_tokens, loads, stream);
        return;
    }
    detail::require(matvec_types_fuse(types.type, types.last) && job.n_seg >= 2,
                    "matvec: no kernel computes this pair of types in one launch");
    job.b_seg = job.n_seg - 1;
    if (int8)
        dispatch_q8_pair(types, job, cols, static_cast<const uint8_t*>(xq), n_tokens, loads, stream);
    else
        dispatch_pair(types, job, cols, x, n_tokens, loads, stream);
}

}  // namespace

bool matvec_types_fuse(GgmlType type, GgmlType last) {
    // The pairs of llama.cpp's Q4_K_M mixture (attn_v in Q6_K beside Q4_K; in rows that are not whole super-blocks,
    // Q8_0 beside Q5_0): the default models'. Both have one activation format per pair, so both routes take them.
    return type == last || (type == GgmlType::Q4_K && last == GgmlType::Q6_K) ||
           (type == GgmlType::Q5_0 && last == GgmlType::Q8_0);
}

bool matvec_supports(GgmlType type) {
    switch (type) {
        case GgmlType::F32:
        case GgmlType::F16:
        case GgmlType::BF16:
        case GgmlType::Q8_0:
        case GgmlType::Q4_0:
        case GgmlType::Q4_1:
        case GgmlType::Q5_0:
        case GgmlType::Q5_1:
        case GgmlType::Q2_K:
        case GgmlType::Q3_K:
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
        case GgmlType::Q6_K: return true;
        default: return false;
    }
}

void matvec(GgmlType type, const void* W, size_t row_bytes, int rows, int cols, const float* x, int n_tokens, float* y,
            Stream stream, size_t y_stride, MatvecLoads loads, const void* xq) {
    detail::require(y_stride == 0 || y_stride >= static_cast<size_t>(rows), "matvec: y_stride is less than rows");
    MatvecJob job{};
    job.seg0 = {static_cast<const uint8_t*>(W), row_bytes, y, y_stride ? y_stride : static_cast<size_t>(rows), nullptr,
                rows};
    job.n_seg = 1;
    job.total_rows = rows;
    route(type, job, cols, x, xq, n_tokens, loads, stream);
}

void matvec_rows(GgmlType type, const void* W, size_t row_bytes, int cols, const int* row_ids, int n_ids,
                 const float* x, int n_tokens, float* y, size_t y_stride, Stream stream, MatvecLoads loads,
                 const void* xq) {
    detail::require(row_ids != nullptr && y_stride > 0, "matvec_rows: row_ids and y_stride are required");
    MatvecJob job{};
    job.seg0 = {static_cast<const uint8_t*>(W), row_bytes, y, y_stride, nullptr, n_ids};
    job.n_seg = 1;
    job.total_rows = n_ids;
    job.row_ids = row_ids;
    route(type, job, cols, x, xq, n_tokens, loads, stream);
}

namespace {

MatvecJob multi_job(const MatvecTarget* targets, int n_targets) {
    detail::require(targets != nullptr && n_targets >= 1 && n_targets <= kMatvecMaxTargets,
                    "matvec_multi: 1..3 targets");
    MatvecJob job{};
    MatvecSegment* segs[] = {&job.seg0, &job.seg1, &job.seg2};
    for (int i = 0; i < n_targets; ++i) {
        const MatvecTarget& t = targets[i];
        *segs[i] = {static_cast<const uint8_t*>(t.W), t.row_bytes, t.y, static_cast<size_t>(t.rows), t.bias, t.rows};
        detail::require(t.rows > 0, "matvec: empty shape");
        job.total_rows += t.rows;
    }
    job.n_seg = n_targets;
    return job;
}

bool is_float_type(GgmlType type) { return type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16; }

}  // namespace

void matvec_multi(MatvecTypes types, const MatvecTarget* targets, int n_targets, int cols, const float* x,
                  int n_tokens, Stream stream, MatvecLoads loads, const void* xq) {
    route(types, multi_job(targets, n_targets), cols, x, xq, n_tokens, loads, stream);
}

size_t matvec_rope_counters(const RopeKvArgs& rope) {
    return static_cast<size_t>(rope.n_heads) + 2 * static_cast<size_t>(rope.n_kv_heads);  // one per head
}

bool matvec_rope_in_launch(GgmlType type, MatvecLoads loads, const RopeKvArgs& rope) {
    // The angles tabled, the fp16 cache (rope_kv.cuh head_epilogue), every block within one head (kWarps rows a
    // block; split: one), and not the persistent kernel, whose blocks walk several block-rows (the float types
    // always load directly).
    return rope.trig && rope.kv_type == KvType::F16 && rope.head_dim % kWarps == 0 &&
           (loads != MatvecLoads::Persistent || is_float_type(type));
}

void matvec_qkv_rope(MatvecTypes types, const MatvecTarget* qkv, int cols, const float* x, int n_tokens,
                     Stream stream, MatvecLoads loads, const void* xq, const RopeKvArgs& rope, unsigned* counters) {
    rope::check_args(rope);
    MatvecJob job = multi_job(qkv, 3);
    const int hd = rope.head_dim;
    detail::require(rope.n_tokens == n_tokens && qkv[0].y == rope.q && qkv[1].y == rope.k && qkv[2].y == rope.v &&
                        qkv[0].rows == rope.n_heads * hd && qkv[1].rows == rope.n_kv_heads * hd &&
                        qkv[2].rows == rope.n_kv_heads * hd,
                    "matvec_qkv_rope: the targets must write rope's q, k and v, whole heads, for its tokens");
    const bool in_launch = counters && matvec_rope_in_launch(types.type, loads, rope) &&
                           matvec_rope_in_launch(types.last, loads, rope);
    if (in_launch) {
        job.rope_counters = counters;
        job.rope = rope;
    }
    route(types, job, cols, x, xq, n_tokens, loads, stream);
    if (!in_launch) rope_kv_write(rope, stream);
}

bool matvec_norm_in_launch(GgmlType type, const void* xq, int rows, int n_tokens, const float* y,
                           const AddRmsNormArgs& norm) {
    // Not the Dots without the epilogue (kNormEpilogue: DotQ5_K, DotQ5_KQ8, DotQ6_KQ8; the route as route() picks
    // it); one token (the epilogue's kernels are the one-token ones); whole blocks of rows, so every warp has one and
    // reaches the epilogue's barriers; the register kernel's layout (rms_norm.cuh), whose order the epilogue follows.
    const bool int8 = xq && matvec_q8_supports(type);
    if (type == GgmlType::Q5_K || (int8 && type == GgmlType::Q6_K)) return false;
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return n_tokens == 1 && rows % kWarps == 0 && rows <= norm::kMaxVecCols && aligned(y) && aligned(norm.x) &&
           aligned(norm.weight) && aligned(norm.out);
}

void matvec_add_rms_norm(GgmlType type, const void* W, size_t row_bytes, int rows, int cols, const float* x,
                         int n_tokens, float* y, Stream stream, MatvecLoads loads, const void* xq,
                         const AddRmsNormArgs& norm, unsigned* counter) {
    detail::require(rows > 0 && norm.x && norm.weight && norm.out, "matvec_add_rms_norm: empty shape");
    MatvecJob job{};
    job.seg0 = {static_cast<const uint8_t*>(W), row_bytes, y, static_cast<size_t>(rows), nullptr, rows};
    job.n_seg = 1;
    job.total_rows = rows;
    const bool in_launch = counter && matvec_norm_in_launch(type, xq, rows, n_tokens, y, norm);
    if (in_launch) {
        job.norm_counter = counter;
        job.norm = {norm.x, norm.weight, norm.out, norm.eps, rows, norm::vec_layout(rows),
                    norm::quant_out(norm.q8_for, norm.xq, rows)};
    }
    route(type, job, cols, x, xq, n_tokens, loads, stream);
    if (!in_launch)
        add_rms_norm(norm.x, y, norm.weight, norm.out, n_tokens, rows, norm.eps, stream, norm.q8_for, norm.xq);
}

size_t matvec_swiglu_counters(int rows) {
    return static_cast<size_t>(rows + q8::block_elems(false) - 1) / q8::block_elems(false);  // one per Q8_1 block
}

void matvec_swiglu(GgmlType type, const void* W_gate, const void* W_up, size_t row_bytes, int rows, int cols,
                   const float* x, int n_tokens, float* out, Stream stream, MatvecLoads loads, const void* xq,
                   const SwigluQuant& quant) {
    detail::require(rows > 0, "matvec: empty shape");
    MatvecJob job{};
    const size_t stride = static_cast<size_t>(rows);
    job.seg0 = {static_cast<const uint8_t*>(W_gate), row_bytes, out, stride, nullptr, rows};
    job.seg1 = {static_cast<const uint8_t*>(W_up), row_bytes, out, stride, nullptr, rows};  // y: never written
    job.n_seg = 2;
    job.total_rows = 2 * rows;
    job.swiglu = true;
    bool quantize_after = false;
    if (quant.out) {
        const bool k_quant = q8::checked_output(quant.q8_for, quant.out, rows,
                                                "matvec_swiglu: the quantized output needs a type with the 8-bit "
                                                "route, whole blocks, alignment");
        const bool in_launch = !k_quant && xq && matvec_q8_supports(type) && quant.counters &&
                               (loads == MatvecLoads::Staged || loads == MatvecLoads::Persistent);
        if (in_launch) {
            job.q8_out = static_cast<uint8_t*>(quant.out);
            job.q8_counters = quant.counters;
        }
        quantize_after = !in_launch;
    }
    route(type, job, cols, x, xq, n_tokens, loads, stream);
    if (quantize_after) quantize_activations(quant.q8_for, out, rows, n_tokens, quant.out, stream);
}

}  // namespace tandem::cuda
