// SwiGLU: out = silu(gate) * up, elementwise over the FFN hidden activations.
#include "common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    swiglu_kernel(const float* gate, const float* __restrict__ up, float* out, int64_t n) {
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];  // the CPU backend's expression
    }
}

}  // namespace

void swiglu(const float* gate, const float* up, float* out, int64_t n, Stream stream) {
    detail::require(n > 0, "swiglu: empty vector");
    const int64_t blocks = (n + kThreads - 1) / kThreads;
    // Capped: a grid-stride loop covers the rest, and the grid stays small enough for any n.
    detail::launch_kernel("swiglu_kernel", swiglu_kernel, dim3(static_cast<unsigned>(blocks < 4096 ? blocks : 4096)),
                          dim3(kThreads), 0, stream, gate, up, out, n);
}

}  // namespace tandem::cuda
