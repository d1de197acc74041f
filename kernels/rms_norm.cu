// RMSNorm kernels (fp32), optionally with the residual add fused in: one block per row.
#include "common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

// Each thread owns the elements i = threadIdx.x + k * blockDim.x, so the fused residual write-back and the later
// re-read of x need no barrier. Operation order as the CPU backend: mean of squares, + eps, 1/sqrt, then
// weight * (scale * x).
template <bool kAddResidual>
__global__ void __launch_bounds__(kThreads)
    rms_norm_kernel(float* __restrict__ x, const float* __restrict__ residual, const float* __restrict__ weight,
                    float* __restrict__ out, int cols, float eps) {
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
}

}  // namespace

void rms_norm(const float* x, const float* weight, float* out, int rows, int cols, float eps, Stream stream) {
    detail::require(rows > 0 && cols > 0, "rms_norm: empty shape");
    // The non-fused kernel never writes x: the cast only lets both variants share one signature.
    detail::launch_kernel("rms_norm_kernel<false>", rms_norm_kernel<false>, dim3(rows), dim3(kThreads), 0, stream,
                          const_cast<float*>(x), nullptr, weight, out, cols, eps);
}

void add_rms_norm(float* x, const float* residual, const float* weight, float* out, int rows, int cols, float eps,
                  Stream stream) {
    detail::require(rows > 0 && cols > 0, "add_rms_norm: empty shape");
    detail::launch_kernel("rms_norm_kernel<true>", rms_norm_kernel<true>, dim3(rows), dim3(kThreads), 0, stream, x,
                          residual, weight, out, cols, eps);
}

}  // namespace tandem::cuda
