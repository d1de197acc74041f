// RMSNorm kernels (fp32), optionally with the residual add fused in and the output also quantized for the 8-bit
// matvec route (quantize_q8.cuh; saves the next matvec's quantize launch): one block per row.
#include "common.cuh"
#include "quantize_q8.cuh"

namespace tandem::cuda {
namespace {

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
    if (!xq) return;
    __syncthreads();
    const int n_blocks = cols / q8::block_elems(k_quant), lane = threadIdx.x % 32;
    for (int b = threadIdx.x / 32; b < n_blocks; b += blockDim.x / 32)
        q8::quantize_block(k_quant, o, xq + row * xq_row_bytes, b, lane);
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

}  // namespace

void rms_norm(const float* x, const float* weight, float* out, int rows, int cols, float eps, Stream stream,
              GgmlType q8_for, void* xq) {
    detail::require(rows > 0 && cols > 0, "rms_norm: empty shape");
    const QuantOut q = quant_out(q8_for, xq, cols);
    // The non-fused kernel never writes x: the cast only lets both variants share one signature.
    detail::launch_kernel("rms_norm_kernel<false>", rms_norm_kernel<false>, dim3(rows), dim3(kThreads), 0, stream,
                          const_cast<float*>(x), nullptr, weight, out, cols, eps, q.k_quant, q.xq, q.row_bytes);
}

void add_rms_norm(float* x, const float* residual, const float* weight, float* out, int rows, int cols, float eps,
                  Stream stream, GgmlType q8_for, void* xq) {
    detail::require(rows > 0 && cols > 0, "add_rms_norm: empty shape");
    const QuantOut q = quant_out(q8_for, xq, cols);
    detail::launch_kernel("rms_norm_kernel<true>", rms_norm_kernel<true>, dim3(rows), dim3(kThreads), 0, stream, x,
                          residual, weight, out, cols, eps, q.k_quant, q.xq, q.row_bytes);
}

}  // namespace tandem::cuda
