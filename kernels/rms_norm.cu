// RMSNorm kernels (fp32), optionally with the residual add fused in and the output also quantized for the 8-bit
// matvec route (quantize_q8.cuh; saves the next matvec's quantize launch): one block per row.
//
// Decode runs one row, so the kernel's time is its chain of dependent memory round trips, not bandwidth. The
// register kernel (rows of whole, 16-byte aligned float4s, up to kMaxVecCols wide: every model tandem knows) has each
// thread load its 1-4 float4s of x, the residual and the weight at once, keep them in registers and write its output
// (and its Q8_1 blocks) from them: one round trip, a block reduction, the stores. Its arithmetic and order are
// rms_norm.cuh's, which a matvec launch's last block also follows (matvec_add_rms_norm) to give the same bits. The
// loop kernel (any other width) walks its elements twice, reading x again after the reduction.
#include "rms_norm.cuh"

namespace tandem::cuda {
namespace {

using norm::kMaxVecCols;
using norm::kMaxVecThreads;
using norm::quantize_row;
constexpr int kThreads = 256;

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
    const float scale = norm::inverse_rms(detail::block_sum(ss, scratch), cols, eps);
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
            v[k] = norm::add4(v[k], rr[i]);
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < V; ++k) {
        if (kAddResidual && tid + k * n_threads < n4) xr[tid + k * n_threads] = v[k];
        ss = norm::add_squares(ss, v[k]);
    }
    const float scale = norm::inverse_rms(detail::block_sum(ss, scratch), cols, eps);
    float4* o4 = reinterpret_cast<float4*>(out + row * cols);
    float4 o[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
        const int i = tid + k * n_threads;
        o[k] = norm::normalized(w[k], scale, v[k]);
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

template <bool kAddResidual>
void launch_norm(float* x, const float* residual, const float* weight, float* out, int rows, int cols, float eps,
                 const norm::QuantOut& q, Stream stream) {
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
    const norm::VecLayout layout = norm::vec_layout(cols);
    const int per_thread = layout.per_thread;
    const dim3 block(layout.threads);
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

// QK-norm: each row (a token's head) normed in place, one block per row. x is read into registers before the
// reduction's barrier and written after it, so reading and writing the same row needs no second buffer.
constexpr int kInPlaceThreads = 64;
constexpr int kInPlaceMaxPerThread = 4;  // rows of up to 256 floats
__global__ void __launch_bounds__(kInPlaceThreads)
    rms_norm_in_place_kernel(float* x, const float* __restrict__ weight, int cols, float eps) {
    detail::wait_for_inputs();
    TANDEM_SHARED(float, scratch, 32);
    float* xr = x + static_cast<size_t>(blockIdx.x) * cols;
    float v[kInPlaceMaxPerThread];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < kInPlaceMaxPerThread; ++k) {
        const int i = static_cast<int>(threadIdx.x) + k * kInPlaceThreads;
        v[k] = i < cols ? xr[i] : 0.0f;
        ss += v[k] * v[k];
    }
    const float scale = norm::inverse_rms(detail::block_sum(ss, scratch), cols, eps);
#pragma unroll
    for (int k = 0; k < kInPlaceMaxPerThread; ++k) {
        const int i = static_cast<int>(threadIdx.x) + k * kInPlaceThreads;
        if (i < cols) xr[i] = weight[i] * (scale * v[k]);
    }
}

}  // namespace

void rms_norm(const float* x, const float* weight, float* out, int rows, int cols, float eps, Stream stream,
              GgmlType q8_for, void* xq) {
    detail::require(rows > 0 && cols > 0, "rms_norm: empty shape");
    const norm::QuantOut q = norm::quant_out(q8_for, xq, cols);
    // The non-fused kernels never write x: the cast only lets both variants share one signature.
    launch_norm<false>(const_cast<float*>(x), nullptr, weight, out, rows, cols, eps, q, stream);
}

void add_rms_norm(float* x, const float* residual, const float* weight, float* out, int rows, int cols, float eps,
                  Stream stream, GgmlType q8_for, void* xq) {
    detail::require(rows > 0 && cols > 0, "add_rms_norm: empty shape");
    const norm::QuantOut q = norm::quant_out(q8_for, xq, cols);
    launch_norm<true>(x, residual, weight, out, rows, cols, eps, q, stream);
}

void rms_norm_in_place(float* x, const float* weight, int rows, int cols, float eps, Stream stream) {
    detail::require(rows > 0 && cols > 0 && cols <= kInPlaceThreads * kInPlaceMaxPerThread,
                    "rms_norm_in_place: rows must be 1..256 floats wide");
    detail::launch_kernel("rms_norm_in_place_kernel", rms_norm_in_place_kernel, dim3(rows), dim3(kInPlaceThreads), 0,
                          stream, x, weight, cols, eps);
}

}  // namespace tandem::cuda
