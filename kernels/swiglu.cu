// SwiGLU: out = silu(gate) * up, elementwise over the FFN hidden activations; optionally with out also quantized
// for the 8-bit matvec route (quantize_q8.cuh; saves ffn_down's quantize launch).
#include "common.cuh"
#include "quantize_q8.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    swiglu_kernel(const float* gate, const float* __restrict__ up, float* out, int64_t n) {
    detail::wait_for_inputs();
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = detail::silu_times(gate[i], up[i]);
    }
}

// GeGLU (gemma): gelu(gate) * up with GELU's tanh approximation, as the CPU backend computes it (vec_math.h geglu):
// g / (1 + exp(-2 sqrt(2/pi) (g + 0.044715 g^3))) * u.
__global__ void __launch_bounds__(kThreads)
    geglu_kernel(const float* gate, const float* __restrict__ up, float* out, int64_t n) {
    detail::wait_for_inputs();
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float g = gate[i];
        const float inner = g * (1.0f + 0.044715f * (g * g));
        out[i] = g / (1.0f + expf(-1.5957691216057308f * inner)) * up[i];
    }
}

// With the quantized output: one warp per activation block, each lane computing the elements the quantizer has it
// read (Q8_1: element j; Q8_K: elements 8l..8l+7), then the warp quantizing the block.
using q8::kQuantWarps;

__global__ void __launch_bounds__(kQuantWarps * 32)
    swiglu_q8_kernel(const float* gate, const float* __restrict__ up, float* out, int64_t n_blocks, bool k_quant,
                     uint8_t* __restrict__ xq) {
    detail::wait_for_inputs();
    const int64_t b = static_cast<int64_t>(blockIdx.x) * kQuantWarps + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (b >= n_blocks) return;
    const int per_lane = k_quant ? 8 : 1;
    const int64_t first = b * q8::block_elems(k_quant) + lane * per_lane;
    for (int k = 0; k < per_lane; ++k) out[first + k] = detail::silu_times(gate[first + k], up[first + k]);
    __syncwarp();  // the quantizer reads one element another lane wrote (the block's largest, for Q8_K's sign)
    q8::quantize_block(k_quant, out, xq, static_cast<int>(b), lane);
}

}  // namespace

void swiglu(const float* gate, const float* up, float* out, int64_t n, Stream stream, GgmlType q8_for, void* xq) {
    detail::require(n > 0, "swiglu: empty vector");
    if (xq) {
        const char* what = "swiglu: the quantized output needs a type with the 8-bit route, whole blocks, alignment";
        const bool k_quant = q8::checked_output(q8_for, xq, n, what);
        detail::require(reinterpret_cast<uintptr_t>(out) % 16 == 0, what);
        const int64_t n_blocks = n / q8::block_elems(k_quant);
        detail::require(n_blocks < (int64_t{1} << 31) / kQuantWarps, "swiglu: too many blocks");
        detail::launch_kernel("swiglu_q8_kernel", swiglu_q8_kernel,
                              dim3(static_cast<unsigned>((n_blocks + kQuantWarps - 1) / kQuantWarps)),
                              dim3(kQuantWarps * 32), 0, stream, gate, up, out, n_blocks, k_quant,
                              static_cast<uint8_t*>(xq));
        return;
    }
    const int64_t blocks = (n + kThreads - 1) / kThreads;
    // Capped: a grid-stride loop covers the rest, and the grid stays small enough for any n.
    detail::launch_kernel("swiglu_kernel", swiglu_kernel, dim3(static_cast<unsigned>(blocks < 4096 ? blocks : 4096)),
                          dim3(kThreads), 0, stream, gate, up, out, n);
}

void geglu(const float* gate, const float* up, float* out, int64_t n, Stream stream) {
    detail::require(n > 0, "geglu: empty vector");
    const int64_t blocks = (n + kThreads - 1) / kThreads;
    detail::launch_kernel("geglu_kernel", geglu_kernel, dim3(static_cast<unsigned>(blocks < 4096 ? blocks : 4096)),
                          dim3(kThreads), 0, stream, gate, up, out, n);
}

}  // namespace tandem::cuda
