// The 8-bit-activation walks over one weight row, a Dot per block type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 against Q8_1
// activations; Q2_K..Q6_K against Q8_K; the contract is in matvec_kernels.cuh): exact integer dp4a sums scaled once
// per block, as the CPU's integer kernels. Shared by matvec_q8.cu's kernels and the persistent decode step's 8-bit
// rows (decode_step.cu), so that both compute a row with the same walk; `row` may point into global or shared memory.
#pragma once
#include "dequant.cuh"
#include "matvec_kernels.cuh"
#include "quantize_q8.cuh"

namespace tandem::cuda::matvec_detail {

using q8::kQ8_1Bytes;
using q8::kQ8_KBytes;
using q8::kQ8_KCodes;
using q8::kQ8_KSums;
constexpr int kOnes = 0x01010101;  // dp4a(kOnes, x, 0): the sum of x's four codes

// ---- activation formats as Dot inputs ----------------------------------------------------------------------------
struct Q8_1Input : WalkDefaults {
    using Input = Q8_1Input;  // what a DotPair's two walks must share
    using X = uint8_t;
    static __host__ __device__ __forceinline__ size_t x_units(int cols) {
        return static_cast<size_t>(cols / q8::block_elems(false)) * q8::block_bytes(false);
    }
};
struct Q8_KInput : WalkDefaults {
    using Input = Q8_KInput;
    using X = uint8_t;
    static __host__ __device__ __forceinline__ size_t x_units(int cols) {
        return static_cast<size_t>(cols / q8::block_elems(true)) * q8::block_bytes(true);
    }
};

__device__ __forceinline__ int load_i32(const uint8_t* p) { return *reinterpret_cast<const int*>(p); }
__device__ __forceinline__ int load_i32_from_u16(const uint8_t* p) {
    return static_cast<int>(detail::load_u32_from_u16(p));
}

// ---- the 32-element types against Q8_1 -----------------------------------------------------------------------------
// Four lanes per block, eight blocks per warp iteration. Lane k = l % 4 takes bytes 4k..4k+3 of qs: their low
// nibbles are elements 4k..4k+3, their high nibbles 16 + 4k..16 + 4k + 3. Signed codes with a bias (Q4_0: 8, Q5_0:
// 16) take it out through the activations' sum: sum((u - bias) x) = sum(u x) - bias * sum(x), exact in int32.
template <int kBytes, int kQs, bool kMin, bool kFifth, int kQh, int kBias>
struct DotLegacyQ8 : Q8_1Input {
    static constexpr int kBlockBytes = kBytes, kBlockCols = 32, kStepBlocks = 8;
    static constexpr bool kDirectExit = true;  // kExitDirect: Q4_0's direct 8-token walk spilled without the exit
    template <int NT, bool kExit>
    static __device__ __forceinline__ void dot(const uint8_t* row, int cols, const uint8_t* x, size_t x_stride,
                                               int n_tok, int lane, float (&acc)[NT]) {
        const int nb = cols / 32, k = lane % 4, i = 4 * k;
        for (int ib = lane / 4; ib < nb; ib += 8) {
            const uint8_t* blk = row + kBytes * ib;
            const float d = detail::load_half(blk);
            const float m = kMin ? detail::load_half(blk + 2) : 0.0f;
            const uint32_t q = detail::load_u32_from_u16(blk + kQs + i);
            int lo = static_cast<int>(q & 0x0F0F0F0Fu), hi = static_cast<int>((q >> 4) & 0x0F0F0F0Fu);
            if (kFifth) {
                const uint32_t qh = detail::load_u32_from_u16(blk + kQh);
                lo |= detail::spread_fifth_bits(qh >> i);
                hi |= detail::spread_fifth_bits(qh >> (16 + i));
            }
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (token_exit<kExit>(t, n_tok)) break;
                const size_t xt = static_cast<size_t>(read_token<NT, kExit>(t, n_tok)) * x_stride;
                const uint8_t* xb = x + xt + kQ8_1Bytes * ib;
                const int xl = load_i32(xb + 4 + i), xh = load_i32(xb + 20 + i);
                int sumi = __dp4a(lo, xl, __dp4a(hi, xh, 0));
                if (kBias) sumi -= kBias * __dp4a(kOnes, xl, __dp4a(kOnes, xh, 0));
                acc[t] = fmaf(static_cast<float>(sumi), d * detail::load_half(xb), acc[t]);
                // The offset once per block: m * s, s = d_x * (the sum of the block's codes).
                if (kMin && k == 0) acc[t] = fmaf(m, detail::load_half(xb + 2), acc[t]);
            }
        }
    }
};
using DotQ4_0Q8 = DotLegacyQ8<18, 2, false, false, 0, 8>;
using DotQ4_1Q8 = DotLegacyQ8<20, 4, true, false, 0, 0>;
using DotQ5_0Q8 = DotLegacyQ8<22, 6, false, true, 2, 16>;
using DotQ5_1Q8 = DotLegacyQ8<24, 8, true, true, 4, 0>;

// Q8_0: four lanes per block, lane k = l % 4 takes codes 8k..8k+7.
struct DotQ8_0Q8 : Q8_1Input {
    static constexpr int kBlockBytes = 34, kBlockCols = 32, kStepBlocks = 8;
    template <int NT, bool kExit>
    static __device__ __forceinline__ void dot(const uint8_t* row, int cols, const uint8_t* x, size_t x_stride,
                                               int n_tok, int lane, float (&acc)[NT]) {
        const int nb = cols / 32, j = 8 * (lane % 4);
        for (int ib = lane / 4; ib < nb; ib += 8) {
            const uint8_t* blk = row + 34 * ib;
            const float d = detail::load_half(blk);
            const int w0 = load_i32_from_u16(blk + 2 + j), w1 = load_i32_from_u16(blk + 6 + j);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (token_exit<kExit>(t, n_tok)) break;
                const size_t xt = static_cast<size_t>(read_token<NT, kExit>(t, n_tok)) * x_stride;
                const uint8_t* xb = x + xt + kQ8_1Bytes * ib;
                const int sumi = __dp4a(w0, load_i32(xb + 4 + j), __dp4a(w1, load_i32(xb + 8 + j), 0));
                acc[t] = fmaf(static_cast<float>(sumi), d * detail::load_half(xb), acc[t]);
            }
        }
    }
};

// ---- the k-quants against Q8_K -----------------------------------------------------------------------------------
// As the CPU's integer kernels: per super-block, sumi = sum of scale x (code . x) over the lane's sub-block parts
// (an offset taken out through the activations' sums) and summ = sum of min x sum(x); then d_w d_x sumi and
// dmin_w d_x summ, rounded as floats once per super-block and lane.

__device__ __forceinline__ float load_f32(const uint8_t* p) { return *reinterpret_cast<const float*>(p); }

// Q4_K (144 bytes) and Q5_K (176): eight lanes per super-block, four super-blocks per warp iteration. Both sizes are
// multiples of 16 and W is 16-byte aligned (dispatch_q8 checks the rows), so a lane reads whole 16-byte words: the
// block's first 16 bytes (d, dmin and the twelve bytes of 6-bit scales and mins) and, with k = l % 8, p = k / 2 and
// h = k % 2, the 16 bytes of qs at kQs + 32p + 16h, whose low nibbles are elements 16h.. of chunk 2p (sub-block 2p)
// and high nibbles the same elements of chunk 2p + 1; Q5_K also the 16 bytes of qh at 16 + 16h, a word at a time
// (bit c of qh[e]: the fifth bit of element e of chunk c). The mins' offset takes the activations' sums of those 16
// codes from the Q8_K block (bsums: exact, as the CPU's). Why this walk and not one 4-byte word of codes per lane and super-block
// (until 2026-11-28): a 4096-wide row is 4 warp iterations instead of 16, each lane's loads are 16-byte words
// instead of a word and six single scale bytes, and a lane's products are one exact integer sum per sub-block.
template <int kBytes, int kQs, bool kFifth>
struct DotQK4Q8 : Q8_KInput {
    static constexpr int kBlockBytes = kBytes, kBlockCols = 256, kStepBlocks = 4;
    static constexpr bool kStagedExit = true;  // kExitStaged: Q4_K's staged four-token walk spilled without the exit
    static constexpr bool kNormEpilogue = !kFifth;  // Q5_K's norm-epilogue kernels spilled (matvec_norm_in_launch)
    template <int NT, bool kExit>
    static __device__ __forceinline__ void dot(const uint8_t* row, int cols, const uint8_t* x, size_t x_stride,
                                               int n_tok, int lane, float (&acc)[NT]) {
        constexpr bool kStop = kExit || kFifth;  // token_exit: Q5_K keeps the exit
        const int nb = cols / 256, k = lane % 8, p = k / 2, h = k % 2;
        for (int ib = lane / 8; ib < nb; ib += 4) {
            const uint8_t* blk = row + kBytes * ib;
            const uint4 head = *reinterpret_cast<const uint4*>(blk);
            const uint4 q = *reinterpret_cast<const uint4*>(blk + kQs + 32 * p + 16 * h);
            const float d = tandem_half_to_float(static_cast<uint16_t>(head.x & 0xFFFF));
            const float dmin = tandem_half_to_float(static_cast<uint16_t>(head.x >> 16));
            int sc0, m0, sc1, m1;
            detail::scale_min_k4_words(head.y, head.z, head.w, 2 * p, sc0, m0);
            detail::scale_min_k4_words(head.y, head.z, head.w, 2 * p + 1, sc1, m1);
            const uint32_t words[4] = {q.x, q.y, q.z, q.w};
            int lo[4], hi[4];
#pragma unroll
            for (int n = 0; n < 4; ++n) {
                lo[n] = static_cast<int>(words[n] & 0x0F0F0F0Fu);
                hi[n] = static_cast<int>((words[n] >> 4) & 0x0F0F0F0Fu);
                if (kFifth) {  // word by word: a 16-byte qh beside the codes spilled the staged one-token kernel
                    const uint32_t fifth = *reinterpret_cast<const uint32_t*>(blk + 16 + 16 * h + 4 * n);
                    lo[n] |= static_cast<int>(((fifth >> (2 * p)) & 0x01010101u) << 4);
                    hi[n] |= static_cast<int>(((fifth >> (2 * p + 1)) & 0x01010101u) << 4);
                }
            }
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (token_exit<kStop>(t, n_tok)) break;
                const size_t xt = static_cast<size_t>(read_token<NT, kStop>(t, n_tok)) * x_stride;
                const uint8_t* xb = x + xt + kQ8_KBytes * ib;
                const uint8_t* xa = xb + kQ8_KCodes + 64 * p + 16 * h;  // chunk 2p's codes; 2p + 1's 32 bytes on
                const int16_t* bsums = reinterpret_cast<const int16_t*>(xb + kQ8_KSums);
                const int summ = m0 * bsums[4 * p + h] + m1 * bsums[4 * p + 2 + h];
                int dot_a = 0, dot_b = 0;
#pragma unroll
                for (int n = 0; n < 4; ++n) {
                    dot_a = __dp4a(lo[n], load_i32(xa + 4 * n), dot_a);
                    dot_b = __dp4a(hi[n], load_i32(xa + 32 + 4 * n), dot_b);
                }
                const int sumi = sc0 * dot_a + sc1 * dot_b;
                const float dx = load_f32(xb);
                acc[t] = fmaf(d * dx, static_cast<float>(sumi), acc[t]);
                acc[t] = fmaf(-(dmin * dx), static_cast<float>(summ), acc[t]);
            }
        }
    }
};
using DotQ4_KQ8 = DotQK4Q8<144, 16, false>;
using DotQ5_KQ8 = DotQK4Q8<176, 48, true>;

// Q6_K (210 bytes): one super-block per warp iteration. Lane l covers half h = l / 16; with kk = (l / 8) % 2 and
// i = 4(l % 8) it reads 4 bytes of ql at 64h + 32kk + i (low nibbles: chunk 4h + kk, high: chunk 4h + kk + 2) and
// 4 bytes of qh at 128 + 32h + i (bits 2kk and 2kk + 4 up: the two high bits of those chunks). Codes are u - 32.
struct DotQ6_KQ8 : Q8_KInput {
    static constexpr int kBlockBytes = 210, kBlockCols = 256, kStepBlocks = 1;
    static constexpr bool kNormEpilogue = false;  // its staged norm-epilogue kernel spilled (matvec_norm_in_launch)
    template <int NT, bool kExit>
    static __device__ __forceinline__ void dot(const uint8_t* row, int cols, const uint8_t* x, size_t x_stride,
                                               int n_tok, int lane, float (&acc)[NT]) {
        const int nb = cols / 256, h = lane / 16, kk = (lane / 8) % 2, i = 4 * (lane % 8);
        const int ca = 4 * h + kk, cb = ca + 2;  // the two chunks (of 32) this lane's codes belong to
        for (int ib = 0; ib < nb; ++ib) {
            const uint8_t* blk = row + 210 * ib;
            const float d = detail::load_half(blk + 208);
            const uint32_t ql = detail::load_u32_from_u16(blk + 64 * h + 32 * kk + i);
            const uint32_t qh = detail::load_u32_from_u16(blk + 128 + 32 * h + i);
            const int wa = static_cast<int>((ql & 0x0F0F0F0Fu) | (((qh >> (2 * kk)) & 0x03030303u) << 4));
            const int wb = static_cast<int>(((ql >> 4) & 0x0F0F0F0Fu) | (((qh >> (2 * kk + 4)) & 0x03030303u) << 4));
            const int8_t* scales = reinterpret_cast<const int8_t*>(blk + 192);
            const int sa = scales[2 * ca + (i >= 16)], sb = scales[2 * cb + (i >= 16)];
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (token_exit<kExit>(t, n_tok)) break;
                const size_t xt = static_cast<size_t>(read_token<NT, kExit>(t, n_tok)) * x_stride;
                const uint8_t* xb = x + xt + kQ8_KBytes * ib;
                const int xa = load_i32(xb + kQ8_KCodes + 32 * ca + i), xc = load_i32(xb + kQ8_KCodes + 32 * cb + i);
                const int sumi = sa * (__dp4a(wa, xa, 0) - 32 * __dp4a(kOnes, xa, 0)) +
                                 sb * (__dp4a(wb, xc, 0) - 32 * __dp4a(kOnes, xc, 0));
                acc[t] = fmaf(d * load_f32(xb), static_cast<float>(sumi), acc[t]);
            }
        }
    }
};

// Q2_K (84 bytes) and Q3_K (110): 64 bytes of 2-bit codes, so 16 lanes take a super-block and a warp iteration two.
// Lane r = l % 16 of super-block l / 16, with g = r / 8 and i = 4(r % 8), reads 4 bytes of qs at 32g + i: bits 2s,
// 2s + 1 of each are elements i.. of chunk c = 4g + s (s < 4), in sub-block 2c + (i >= 16). Q2_K: scale and min in
// one byte per sub-block, value = sc u - m. Q3_K: bit c of hmask[e] adds 4 to u, value = sc (u - 4), 6-bit scales
// biased by 32.
template <bool kQ3>
struct DotQ23_KQ8 : Q8_KInput {
    static constexpr int kBlockBytes = kQ3 ? 110 : 84, kBlockCols = 256, kStepBlocks = 2;
    static constexpr bool kStagedExit = true;  // kExitStaged: Q2_K's staged four-token walk spilled without the exit
    static constexpr int kQs = kQ3 ? 32 : 16, kD = kQ3 ? 108 : 80;
    // Q3_K's sixteen 6-bit scales: low 4 bits in bytes 0..7 (two per byte), high 2 bits in bytes 8..11.
    static __device__ __forceinline__ int q3_scale(const uint8_t* s, int j) {
        const int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
        const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        return (lo | (hi << 4)) - 32;
    }
    template <int NT, bool kExit>
    static __device__ __forceinline__ void dot(const uint8_t* row, int cols, const uint8_t* x, size_t x_stride,
                                               int n_tok, int lane, float (&acc)[NT]) {
        constexpr bool kStop = kExit || kQ3;  // token_exit: Q3_K keeps the exit
        const int nb = cols / 256, r = lane % 16, g = r / 8, i = 4 * (r % 8), upper = i >= 16;
        for (int ib = lane / 16; ib < nb; ib += 2) {
            const uint8_t* blk = row + kBlockBytes * ib;
            const float d = detail::load_half(blk + kD);
            const float dmin = kQ3 ? 0.0f : detail::load_half(blk + kD + 2);
            const uint32_t q = detail::load_u32_from_u16(blk + kQs + 32 * g + i);
            const uint32_t hm = kQ3 ? detail::load_u32_from_u16(blk + i) : 0u;
            int w[4], sc[4], mn[4];
#pragma unroll
            for (int s = 0; s < 4; ++s) {
                const int c = 4 * g + s, j = 2 * c + upper;
                uint32_t u = (q >> (2 * s)) & 0x03030303u;
                if (kQ3) u |= ((hm >> c) & 0x01010101u) << 2;
                w[s] = static_cast<int>(u);
                sc[s] = kQ3 ? q3_scale(blk + 96, j) : (blk[j] & 0xF);
                mn[s] = kQ3 ? 0 : (blk[j] >> 4);
            }
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                if (token_exit<kStop>(t, n_tok)) break;
                const size_t xt = static_cast<size_t>(read_token<NT, kStop>(t, n_tok)) * x_stride;
                const uint8_t* xb = x + xt + kQ8_KBytes * ib;
                int sumi = 0, summ = 0;
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    const int xs = load_i32(xb + kQ8_KCodes + 32 * (4 * g + s) + i);
                    const int sx = __dp4a(kOnes, xs, 0);
                    sumi += sc[s] * (__dp4a(w[s], xs, 0) - (kQ3 ? 4 * sx : 0));
                    summ += mn[s] * sx;
                }
                const float dx = load_f32(xb);
                acc[t] = fmaf(d * dx, static_cast<float>(sumi), acc[t]);
                if (!kQ3) acc[t] = fmaf(-(dmin * dx), static_cast<float>(summ), acc[t]);
            }
        }
    }
};
using DotQ2_KQ8 = DotQ23_KQ8<false>;
using DotQ3_KQ8 = DotQ23_KQ8<true>;

}  // namespace tandem::cuda::matvec_detail
