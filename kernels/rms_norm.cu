// RMSNorm kernels (fp32), optionally with the residual add fused in and the output also quantized for the 8-bit
// matvec route (quantize_q8.cuh; saves the next matvec's quantize launch): one block per row.
//
// Decode runs one row, so the kernel's time is its chain of dependent memory round trips, not bandwidth. The
// register kernel (rows of whole, 16-byte aligned float4s, up to kMaxVecCols wide: every model tandem knows) has each
// thread load its 1-4 float4s of x, the residual and the weight at once, keep them in registers and write its output
// (and its Q8_1 blocks) from them: one round trip, a block reduction, the stores. The loop kernel (any other width)
// walks its elements twice, reading x again after the reduction.
#include "common.cuh"
#include "quantize_q8.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxVecThreads = 1024;
constexpr int kMaxVecPerThread = 4;
constexpr int kMaxVecCols = 4 * kMaxVecThreads * kMaxVecPerThread;

// With xq, after a barrier (other threads wrote the row) the block's warps quantize the row `o` one block each in
// turn.
__device__ __forceinline__ void quantize_row(const float* o, int cols, bool k_quant, uint8_t* xq_row) {
    __syncthreads();
    const int n_blocks = cols / q8::block_elems(k_quant), lane = threadIdx.x % 32;
    for (int b = threadIdx.x / 32; b < n_blocks; b += blockDim.x / 32) q8::quantize_block(k_quant, o, xq_row, b, lane);
}

// Each thread owns the elements i = threadIdx.x + k * blockDim.x, so the fused residual write-back and the later
// re-read of x need no barrier. Operation order as the CPU backend: mean of squares, + eps, 1/sqrt, then
// weight * (scale * x). With xq, the warps then quantize the row just written, a block each in turn (after a
// barrier: other threads wrote it).
template <bool kAddResidual>
__global__ void __launch_bounds__(kThreads)
    rms_norm_kernel(float* __restrict__ x, const float* __restrict__ residual, const float* __restrict__ weight,
                    float* __restrict__ out, int cols, float eps, bool k_quant, uint8_t* __restrict__ xq,
                    size_t xq_row_bytes) {
    detail::wait_for_inputs();
    TANDEM_SHARED(float, scratch, 32);
    const size_t row = blockIdx.x;
    float* xr = x + row * cols;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = xr[i];
        if (kAddResidual) {
            v += residual[row * cols + i];
            xr[i] = v;
        }
        ss += v * v;
    }
    ss = detail::block_sum(ss, scratch);
    const float scale = 1.0f / sqrtf(ss / static_cast<float>(cols) + eps);
    float* o = out + row * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) o[i] = weight[i] * (scale * xr[i]);
    if (xq) quantize_row(o, cols, k_quant, xq + row * xq_row_bytes);
}

// The register kernel: thread t owns float4 slots t + k * blockDim.x, k < V (coalesced for each k). Its squares are
// summed slot by slot, x y z w, then across the block; the output is the CPU backend's weight * (scale * x). A Q8_1
// output is quantized from the registers by groups of eight lanes (no barrier, no re-read: on the H200 the norm took
// 5.5 us of a 7B layer's ~101 under ncu, against ~3 for the elementwise kernels); Q8_K's 256-element blocks go
// through memory as in the loop kernel.
template <bool kAddResidual, int V>
__global__ void __launch_bounds__(kMaxVecThreads)
    rms_norm_vec_kernel(float* __restrict__ x, const float* __restrict__ residual, const float* __restrict__ weight,
                        float* __restrict__ out, int cols, float eps, bool k_quant, uint8_t* __restrict__ xq,
                        size_t xq_row_bytes) {
    TANDEM_SHARED(float, scratch, 32);
    const size_t row = blockIdx.x;
    const int n4 = cols / 4;
    float4* xr = reinterpret_cast<float4*>(x + row * cols);
    const float4* rr = reinterpret_cast<const float4*>(residual + (kAddResidual ? row * cols : 0));
    const float4* w4 = reinterpret_cast<const float4*>(weight);
    const int tid = threadIdx.x, n_threads = blockDim.x;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    float4 v[V], w[V];
    // The weight is never written by a kernel, so with overlapping launches (common.cuh) its loads, from DRAM after a
    // token's worth of other weights went through L2, are issued while the previous kernel still runs.
#pragma unroll
    for (int k = 0; k < V; ++k) w[k] = tid + k * n_threads < n4 ? w4[tid + k * n_threads] : zero;
    detail::wait_for_inputs();
#pragma unroll
    for (int k = 0; k < V; ++k) {  // every load of the thread issued before any is used
        const int i = tid + k * n_threads;
        v[k] = i < n4 ? xr[i] : zero;
        if (kAddResidual && i < n4) {
            const float4 r = rr[i];
            v[k] = make_float4(v[k].x + r.x, v[k].y + r.y, v[k].z + r.z, v[k].w + r.w);
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < V; ++k) {
        if (kAddResidual && tid + k * n_threads < n4) xr[tid + k * n_threads] = v[k];
        ss += v[k].x * v[k].x;
        ss += v[k].y * v[k].y;
        ss += v[k].z * v[k].z;
        ss += v[k].w * v[k].w;
    }
    ss = detail::block_sum(ss, scratch);
    const float scale = 1.0f / sqrtf(ss / static_cast<float>(cols) + eps);
    float4* o4 = reinterpret_cast<float4*>(out + row * cols);
    float4 o[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const int i = tid + k * n_threads;
        o[k] = make_float4(w[k].x * (scale * v[k].x), w[k].y * (scale * v[k].y), w[k].z * (scale * v[k].z),
                           w[k].w * (scale * v[k].w));
        if (i < n4) o4[i] = o[k];
    }
    if (!xq) return;
    if (k_quant) {  // a Q8_K block spans two warps: through memory
        quantize_row(out + row * cols, cols, k_quant, xq + row * xq_row_bytes);
        return;
    }
    // Q8_1 from the registers: slot i is part i % 8 of block i / 8, and the block size (a multiple of 32 threads)
    // keeps each group of eight lanes on one block for every k.
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const int i = tid + k * n_threads;
        q8::quantize_float4_q8_1(o[k], xq + row * xq_row_bytes + static_cast<size_t>(i / 8) * q8::kQ8_1Bytes, i % 8,
                                 i < n4);
    }
}

// The quantized output's arguments, checked: (k-quant format, row bytes) for `q8_for`, or none without xq.
struct QuantOut {
    bool k_quant = false;
    uint8_t* xq = nullptr;
    size_t row_bytes = 0;
};
QuantOut quant_out(GgmlType q8_for, void* xq, int cols) {
    if (!xq) return {};
    const bool k_quant = q8::checked_output(
        q8_for, xq, cols, "rms_norm: the quantized output needs a type with the 8-bit route, whole blocks, alignment");
    return {k_quant, static_cast<uint8_t*>(xq),
            static_cast<size_t>(cols / q8::block_elems(k_quant)) * q8::block_bytes(k_quant)};
}

template <bool kAddResidual>
void launch_norm(float* x, const float* residual, const float* weight, float* out, int rows, int cols, float eps,
                 const QuantOut& q, Stream stream) {
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vec = cols % 4 == 0 && cols <= kMaxVecCols && aligned(x) && aligned(weight) && aligned(out) &&
                     (!kAddResidual || aligned(residual));
    const auto launch = [&](const char* name, auto kernel, dim3 block) {
        detail::launch_kernel(name, kernel, dim3(rows), block, 0, stream, x, residual, weight, out, cols, eps,
                              q.k_quant, q.xq, q.row_bytes);
    };
    if (!vec) {
        launch(kAddResidual ? "rms_norm_kernel<true>" : "rms_norm_kernel<false>", rms_norm_kernel<kAddResidual>,
               dim3(kThreads));
        return;
    }
    // The fewest float4s per thread that fit in one block, then the fewest whole warps that hold them.
    const int n4 = cols / 4;
    const int per_thread = n4 <= kMaxVecThreads ? 1 : n4 <= 2 * kMaxVecThreads ? 2 : 4;
    const dim3 block(((n4 + per_thread - 1) / per_thread + 31) / 32 * 32);
    if (per_thread == 1)
        launch(kAddResidual ? "rms_norm_vec_kernel<true, 1>" : "rms_norm_vec_kernel<false, 1>",
               rms_norm_vec_kernel<kAddResidual, 1>, block);
    else if (per_thread == 2)
        launch(kAddResidual ? "rms_norm_vec_kernel<true, 2>" : "rms_norm_vec_kernel<false, 2>",
               rms_norm_vec_kernel<kAddResidual, 2>, block);
    else
        launch(kAddResidual ? "rms_norm_vec_kernel<true, 4>" : "rms_norm_vec_kernel<false, 4>",
               rms_norm_vec_kernel<kAddResidual, 4>, block);
}

}  // namespace

void rms_norm(const float* x, const float* weight, float* out, int rows, int cols, float eps, Stream stream,
              GgmlType q8_for, void* xq) {
    detail::require(rows > 0 && cols > 0, "rms_norm: empty shape");
    const QuantOut q = quant_out(q8_for, xq, cols);
    // The non-fused kernels never write x: the cast only lets both variants share one signature.
    launch_norm<false>(const_cast<float*>(x), nullptr, weight, out, rows, cols, eps, q, stream);
}

void add_rms_norm(float* x, const float* residual, const float* weight, float* out, int rows, int cols, float eps,
                  Stream stream, GgmlType q8_for, void* xq) {
    detail::require(rows > 0 && cols > 0, "add_rms_norm: empty shape");
    const QuantOut q = quant_out(q8_for, xq, cols);
    launch_norm<true>(x, residual, weight, out, rows, cols, eps, q, stream);
}

}  // namespace tandem::cuda
