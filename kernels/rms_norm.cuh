// RMSNorm's register-kernel arithmetic (rms_norm.cu's rms_norm_vec_kernel) and the residual add + RMSNorm of whole
// rows that a matvec launch's last block applies to the rows the launch wrote (matvec_kernels.cuh,
// matvec_add_rms_norm): both from these functions and in the same order, so the two give the same bits.
//
// The order is the register kernel's for its block of `threads` threads (vec_layout, fixed by the row width): thread
// t sums the squares of its float4 slots t, t + threads, ... (x, y, z, w in turn), each warp adds its lanes'
// sums (warp_sum), and warp 0's lanes add the warps' (block_sum). A matvec block has fewer threads (kWarps warps),
// so add_rms_norm_rows lets each of its warps play the register kernel's warps w, w + kWarps, ...: the same lanes
// add the same squares into the same sums. Each slot's output comes out of the same expression, and the quantized
// row is quantize_activations' bytes either way.
#pragma once
#include "common.cuh"
#include "quantize_q8.cuh"

namespace tandem::cuda::norm {

constexpr int kMaxVecThreads = 1024;
constexpr int kMaxVecPerThread = 4;
constexpr int kMaxVecCols = 4 * kMaxVecThreads * kMaxVecPerThread;

// The register kernel's block for a row of `cols` floats (cols % 4 == 0, cols <= kMaxVecCols): the fewest float4s
// per thread that fit in one block, then the fewest whole warps that hold them.
struct VecLayout {
    int threads;
    int per_thread;
};
__host__ __device__ inline VecLayout vec_layout(int cols) {
    const int n4 = cols / 4;
    const int per_thread = n4 <= kMaxVecThreads ? 1 : n4 <= 2 * kMaxVecThreads ? 2 : 4;
    return {((n4 + per_thread - 1) / per_thread + 31) / 32 * 32, per_thread};
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

// A thread's running sum of squares, one float4 slot more.
__device__ __forceinline__ float add_squares(float ss, float4 v) {
    ss += v.x * v.x;
    ss += v.y * v.y;
    ss += v.z * v.z;
    ss += v.w * v.w;
    return ss;
}

// 1 / rms from the row's sum of squares, in the CPU backend's order: mean, + eps, 1/sqrt.
__device__ __forceinline__ float inverse_rms(float ss, int cols, float eps) {
    return 1.0f / sqrtf(ss / static_cast<float>(cols) + eps);
}

// The output slot: weight * (scale * x), as the CPU backend.
__device__ __forceinline__ float4 normalized(float4 w, float scale, float4 v) {
    return make_float4(w.x * (scale * v.x), w.y * (scale * v.y), w.z * (scale * v.z), w.w * (scale * v.w));
}

// After a barrier (other threads wrote the output row `o`), the block's warps quantize it one block each in turn.
// Used where the quantizer cannot run from registers: Q8_K's 256-element blocks span two warps of the register
// kernel, the loop kernel's rows have no register layout, and in a matvec launch's epilogue the quantizer's
// divisions in the slot loop made ptxas spill (add_rms_norm_rows).
__device__ __forceinline__ void quantize_row(const float* o, int cols, bool k_quant, uint8_t* xq_row) {
    __syncthreads();
    const int n_blocks = cols / q8::block_elems(k_quant), lane = threadIdx.x % 32;
    for (int b = threadIdx.x / 32; b < n_blocks; b += blockDim.x / 32) q8::quantize_block(k_quant, o, xq_row, b, lane);
}

// The quantized output's arguments, checked (host code): (k-quant format, row bytes) for `q8_for`, or none without xq.
struct QuantOut {
    bool k_quant = false;
    uint8_t* xq = nullptr;
    size_t row_bytes = 0;
};
inline QuantOut quant_out(GgmlType q8_for, void* xq, int cols) {
    if (!xq) return {};
    const bool k_quant = q8::checked_output(
        q8_for, xq, cols, "rms_norm: the quantized output needs a type with the 8-bit route, whole blocks, alignment");
    return {k_quant, static_cast<uint8_t*>(xq),
            static_cast<size_t>(cols / q8::block_elems(k_quant)) * q8::block_bytes(k_quant)};
}

// What a matvec launch's last block needs for the residual add and RMSNorm of the rows the launch wrote
// (MatvecJob::norm; matvec_add_rms_norm fills it).
struct RowsArgs {
    float* x;             // [n_tok][cols]: x += y, written back
    const float* weight;  // [cols]
    float* out;           // [n_tok][cols]
    float eps;
    int cols;             // cols % 4 == 0, <= kMaxVecCols; x, weight, out and y 16-byte aligned
    VecLayout layout;     // vec_layout(cols)
    QuantOut quant;       // xq null: no quantized output
};

// x[t] += y[t] (y written by other blocks of this launch: read past L1), out[t] = RMSNorm(x[t]) * weight, and xq[t]
// quantized from out[t], for t < n_tok: bitwise rms_norm_vec_kernel<true, per_thread> with `threads` threads (the
// order above). Every thread of the block calls it (barriers); scratch: 32 floats of shared memory. Two passes over
// the row (the add and the squares, then the output) and the quantizer's third, where the register kernel keeps
// its slots in registers: the matvec kernels' registers go to their walks.
__device__ __forceinline__ void add_rms_norm_rows(const RowsArgs& a, const float* y, int n_tok, float* scratch) {
    const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
    const int n_warps = static_cast<int>(blockDim.x / 32), v_warps = a.layout.threads / 32;
    const int n4 = a.cols / 4, stride = a.layout.threads;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // the register kernel's slots past the row
    const float4* w4 = reinterpret_cast<const float4*>(a.weight);
    for (int t = 0; t < n_tok; ++t) {
        float4* xr = reinterpret_cast<float4*>(a.x + static_cast<size_t>(t) * a.cols);
        const float4* yr = reinterpret_cast<const float4*>(y + static_cast<size_t>(t) * a.cols);
        // The register kernel's thread vw * 32 + lane: its slots' sum, then its warp's.
        for (int vw = warp; vw < v_warps; vw += n_warps) {
            const int first = vw * 32 + lane;
            float ss = 0.0f;
            for (int k = 0; k < a.layout.per_thread; ++k) {
                const int i = first + k * stride;
                float4 v = zero;
                if (i < n4) {
                    v = add4(xr[i], detail::load_input<true>(yr + i));
                    xr[i] = v;
                }
                ss = add_squares(ss, v);
            }
            ss = detail::warp_sum(ss);
            if (lane == 0) scratch[vw] = ss;
        }
        __syncthreads();
        // block_sum's second step, in every warp (each needs the scale).
        const float scale = inverse_rms(detail::warp_sum(lane < v_warps ? scratch[lane] : 0.0f), a.cols, a.eps);
        float* o = a.out + static_cast<size_t>(t) * a.cols;
        uint8_t* xq_row = a.quant.xq ? a.quant.xq + static_cast<size_t>(t) * a.quant.row_bytes : nullptr;
        // Each slot's output on its own (x as pass one wrote it: the barrier above made it visible to the block).
        for (int i = static_cast<int>(threadIdx.x); i < n4; i += static_cast<int>(blockDim.x))
            reinterpret_cast<float4*>(o)[i] = normalized(w4[i], scale, xr[i]);
        // The quantized row through memory, a block per warp in turn: the same bytes as the register kernel's
        // quantize_float4_q8_1 (both are quantize_activations'). Quantized from registers here, the quantizer's
        // IEEE divisions (a slow-path subroutine call) inside the slot loop made ptxas spill in many matvec kernels.
        if (xq_row) quantize_row(o, a.cols, a.quant.k_quant, xq_row);
        __syncthreads();  // scratch (and the row) is read before the next token's use
    }
}

}  // namespace tandem::cuda::norm
