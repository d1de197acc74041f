// Small elementwise kernels of the forward pass that no other family owns: the Q/K/V bias add (qwen2), the scale
// of the token embeddings (gemma), the soft-capping of logits (gemma2) and the column fill that writes -inf over the
// logits a restricted output leaves out.
#include <cmath>

#include "common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

// One grid-stride loop over rows × width; the bias is re-read per row (it is tiny and stays in cache).
__global__ void __launch_bounds__(kThreads) add_bias_kernel(float* __restrict__ rows, const float* __restrict__ bias,
                                                            int64_t n, int width) {
    detail::wait_for_inputs();
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        rows[i] += bias[i % width];
}

__global__ void __launch_bounds__(kThreads) scale_kernel(float* __restrict__ x, int64_t n, float factor) {
    detail::wait_for_inputs();
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) x[i] *= factor;
}

__global__ void __launch_bounds__(kThreads) scale_leading_kernel(float* __restrict__ x, int width, int dims,
                                                                 int64_t n, float factor) {
    detail::wait_for_inputs();
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        x[(i / dims) * width + i % dims] *= factor;
}

// One grid-stride loop over n_rows × width elements.
__global__ void __launch_bounds__(kThreads) soft_cap_kernel(float* __restrict__ rows, size_t stride, int width,
                                                            int64_t n, float cap, float inv_cap) {
    detail::wait_for_inputs();
    const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
        float& x = rows[static_cast<size_t>(i / width) * stride + i % width];
        if (x != -INFINITY) x = detail::soft_cap(x, cap, inv_cap);
    }
}

// One grid-stride loop over n_rows × (end - begin) elements.
__global__ void __launch_bounds__(kThreads) fill_columns_kernel(float* __restrict__ rows, size_t stride, int begin,
                                                                int width, int64_t n, float value) {
    detail::wait_for_inputs();
    const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
        rows[static_cast<size_t>(i / width) * stride + begin + i % width] = value;
}

}  // namespace

void add_bias(float* rows, const float* bias, int n_rows, int width, Stream stream) {
    detail::require(n_rows > 0 && width > 0, "add_bias: empty shape");
    const int64_t n = static_cast<int64_t>(n_rows) * width, blocks = (n + kThreads - 1) / kThreads;
    detail::launch_kernel("add_bias_kernel", add_bias_kernel, dim3(static_cast<unsigned>(blocks < 4096 ? blocks : 4096)),
                          dim3(kThreads), 0, stream, rows, bias, n, width);
}

void fill_columns(float* rows, int n_rows, size_t stride, int begin, int end, float value, Stream stream) {
    detail::require(n_rows >= 0 && begin >= 0 && begin <= end && static_cast<size_t>(end) <= stride,
                    "fill_columns: columns outside the rows");
    if (n_rows == 0 || begin == end) return;
    const int64_t n = static_cast<int64_t>(n_rows) * (end - begin), blocks = (n + kThreads - 1) / kThreads;
    detail::launch_kernel("fill_columns_kernel", fill_columns_kernel,
                          dim3(static_cast<unsigned>(blocks < 4096 ? blocks : 4096)), dim3(kThreads), 0, stream, rows,
                          stride, begin, end - begin, n, value);
}

void soft_cap(float* rows, int n_rows, size_t stride, int width, float cap, Stream stream) {
    detail::require(n_rows >= 0 && width >= 0 && static_cast<size_t>(width) <= stride && cap > 0.0f,
                    "soft_cap: bad shape or cap");
    if (n_rows == 0 || width == 0) return;
    const int64_t n = static_cast<int64_t>(n_rows) * width, blocks = (n + kThreads - 1) / kThreads;
    detail::launch_kernel("soft_cap_kernel", soft_cap_kernel, dim3(static_cast<unsigned>(blocks < 4096 ? blocks : 4096)),
                          dim3(kThreads), 0, stream, rows, stride, width, n, cap, 1.0f / cap);
}

void scale(float* x, int64_t n, float factor, Stream stream) {
    detail::require(n > 0, "scale: empty vector");
    const int64_t blocks = (n + kThreads - 1) / kThreads;
    detail::launch_kernel("scale_kernel", scale_kernel, dim3(static_cast<unsigned>(blocks < 4096 ? blocks : 4096)),
                          dim3(kThreads), 0, stream, x, n, factor);
}

void scale_leading(float* x, int rows, int width, int dims, float factor, Stream stream) {
    detail::require(rows > 0 && dims > 0 && dims <= width, "scale_leading: bad shape");
    const int64_t n = static_cast<int64_t>(rows) * dims, blocks = (n + kThreads - 1) / kThreads;
    detail::launch_kernel("scale_leading_kernel", scale_leading_kernel,
                          dim3(static_cast<unsigned>(blocks < 4096 ? blocks : 4096)), dim3(kThreads), 0, stream, x,
                          width, dims, n, factor);
}

}  // namespace tandem::cuda
