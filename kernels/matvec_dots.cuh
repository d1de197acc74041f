// The fp32-activation walks over one weight row, a Dot per type (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
// Q2_K..Q6_K; the contract is in matvec_kernels.cuh), and the row shapes each takes. Shared by matvec.cu's kernels
// and the persistent decode step (decode_step.cu), so that both compute a row with the same walk.
#pragma once
#include "dequant.cuh"
#include "matvec_kernels.cuh"

namespace tandem::cuda::matvec_detail {


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

// The shapes `type`'s walk takes: rows of whole blocks (and for Q4_K / Q5_K whole 4-byte words, `aligned`).
inline void check_shape(GgmlType type, int cols, bool aligned) {
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

}  // namespace tandem::cuda::matvec_detail
