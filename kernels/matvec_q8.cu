// The 8-bit-activation route of matvec (kernels.h): the activation quantizers (Q8_1 for the 32-element types, Q8_K
// for the k-quants, bitwise the CPU backend's) and, per block type, a lane walk whose products are exact integer
// sums (dp4a: four signed byte products and an add per instruction) scaled once per block (matvec_dots_q8.cuh), run
// by the direct and staged kernels of matvec_kernels.cuh.
//
// Why: the fp32 walks of matvec.cu convert every weight code to a float and spend a multiply-add on it and on a
// 4-byte activation; here four codes go through one dp4a against four 1-byte activations, so a row costs about a
// quarter of the instructions and of the activation bytes (llama.cpp's mmvq does the same, with q8_1 throughout).
// The arithmetic is the CPU's (cpu/quant_q8_legacy.cpp, cpu/quant_q8_kquants.cpp): the same codes, the same integer
// sums (a lane holds an exact part of each block's), the same scale products; only the order in which the per-block
// float terms are added differs (lanes, then the warp reduction), so results agree with the CPU backend to float
// rounding.
#include "matvec_dots_q8.cuh"

namespace tandem::cuda {
namespace {

using namespace matvec_detail;

// ---- activation quantizer: one warp per block (quantize_q8.cuh), kQuantWarps blocks per CUDA block ------------
using q8::kQuantWarps;

__global__ void __launch_bounds__(kQuantWarps * 32)
    quantize_kernel(bool k_quant, const float* __restrict__ x, int cols, int n_blocks, uint8_t* __restrict__ xq) {
    detail::wait_for_inputs();
    const int b = blockIdx.x * kQuantWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (b >= n_blocks) return;
    const int per_row = cols / q8::block_elems(k_quant), t = b / per_row;
    const size_t row_bytes = static_cast<size_t>(per_row) * q8::block_bytes(k_quant);
    q8::quantize_block(k_quant, x + static_cast<size_t>(t) * cols, xq + t * row_bytes, b % per_row, lane);
}

}  // namespace

namespace matvec_detail {

namespace {

// The checks of the route for `type`'s walk over segments [first, end) of the job: the width and x's alignment, and
// for Q4_K / Q5_K, whose walk reads 16-byte words (DotQK4Q8), rows of whole 16-byte words.
void check_q8_shape(GgmlType type, const MatvecJob& job, int first, int end, int cols, const uint8_t* xq) {
    q8_activation_row_bytes(type, cols);  // checks the type and the width
    detail::require(reinterpret_cast<uintptr_t>(xq) % 4 == 0, "matvec: quantized x must be 4-byte aligned");
    if (type == GgmlType::Q4_K || type == GgmlType::Q5_K)
        for (const MatvecSegment* seg : {&job.seg0, &job.seg1, &job.seg2})
            if (seg - &job.seg0 >= first && seg - &job.seg0 < end)
                detail::require(seg->row_bytes % 16 == 0, "matvec: Q4_K / Q5_K rows must be 16-byte aligned");
}

}  // namespace

void dispatch_q8(GgmlType type, const MatvecJob& job, int cols, const uint8_t* xq, int n_tokens, MatvecLoads loads,
                 Stream stream) {
    check_job(job, cols, n_tokens);
    check_q8_shape(type, job, 0, job.n_seg, cols, xq);
    const auto blocks = [&](auto launch, const KernelNames& names) {
        launch(names, loads, job, cols, xq, n_tokens, stream);
    };
    switch (type) {
        case GgmlType::Q8_0: return blocks(launch_blocks<DotQ8_0Q8>, TANDEM_KERNEL_NAMES("matvec_q8", "", Q8_0));
        case GgmlType::Q4_0: return blocks(launch_blocks<DotQ4_0Q8>, TANDEM_KERNEL_NAMES("matvec_q8", "", Q4_0));
        case GgmlType::Q4_1: return blocks(launch_blocks<DotQ4_1Q8>, TANDEM_KERNEL_NAMES("matvec_q8", "", Q4_1));
        case GgmlType::Q5_0: return blocks(launch_blocks<DotQ5_0Q8>, TANDEM_KERNEL_NAMES("matvec_q8", "", Q5_0));
        case GgmlType::Q5_1: return blocks(launch_blocks<DotQ5_1Q8>, TANDEM_KERNEL_NAMES("matvec_q8", "", Q5_1));
        case GgmlType::Q2_K: return blocks(launch_blocks<DotQ2_KQ8>, TANDEM_KERNEL_NAMES("matvec_q8", "", Q2_K));
        case GgmlType::Q3_K: return blocks(launch_blocks<DotQ3_KQ8>, TANDEM_KERNEL_NAMES("matvec_q8", "", Q3_K));
        case GgmlType::Q4_K: return blocks(launch_blocks<DotQ4_KQ8>, TANDEM_KERNEL_NAMES("matvec_q8", "", Q4_K));
        case GgmlType::Q5_K: return blocks(launch_blocks<DotQ5_KQ8>, TANDEM_KERNEL_NAMES("matvec_q8", "", Q5_K));
        case GgmlType::Q6_K: return blocks(launch_blocks<DotQ6_KQ8>, TANDEM_KERNEL_NAMES("matvec_q8", "", Q6_K));
        default: detail::require(false, "matvec: the type has no 8-bit route");
    }
}

void dispatch_q8_pair(MatvecTypes types, const MatvecJob& job, int cols, const uint8_t* xq, int n_tokens,
                      MatvecLoads loads, Stream stream) {
    check_job(job, cols, n_tokens);
    check_q8_shape(types.type, job, 0, job.b_seg, cols, xq);
    check_q8_shape(types.last, job, job.b_seg, job.n_seg, cols, xq);
    const auto blocks = [&](auto launch, const KernelNames& names) {
        launch(names, loads, job, cols, xq, n_tokens, stream);
    };
    if (types.type == GgmlType::Q4_K && types.last == GgmlType::Q6_K)
        return blocks(launch_blocks<DotPair<DotQ4_KQ8, DotQ6_KQ8>>, TANDEM_KERNEL_NAMES("matvec_q8", "", Q4_K+Q6_K));
    if (types.type == GgmlType::Q5_0 && types.last == GgmlType::Q8_0)
        return blocks(launch_blocks<DotPair<DotQ5_0Q8, DotQ8_0Q8>>, TANDEM_KERNEL_NAMES("matvec_q8", "", Q5_0+Q8_0));
    detail::require(false, "matvec: no kernel computes this pair of types in one launch");
}

}  // namespace matvec_detail

// The one list of the route's types and formats: the 32-element types read Q8_1, the k-quants Q8_K.
Q8Format q8_activation_format(GgmlType type) { return q8::format_for(type); }

bool matvec_q8_supports(GgmlType type) { return q8_activation_format(type) != Q8Format::None; }

size_t q8_activation_row_bytes(GgmlType type, int cols) {
    const Q8Format f = q8_activation_format(type);
    detail::require(f != Q8Format::None, "quantize_activations: the type has no 8-bit route");
    const bool k_quant = f == Q8Format::Q8_K;
    detail::require(cols > 0 && cols % q8::block_elems(k_quant) == 0,
                    "quantize_activations: cols is not whole blocks of the type");
    return static_cast<size_t>(cols / q8::block_elems(k_quant)) * q8::block_bytes(k_quant);
}

void quantize_activations(GgmlType type, const float* x, int cols, int n_tokens, void* xq, Stream stream) {
    q8_activation_row_bytes(type, cols);  // checks the type and the width
    detail::require(n_tokens >= 1, "quantize_activations: no tokens");
    detail::require(reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(xq) % 4 == 0,
                    "quantize_activations: x must be 16-byte and xq 4-byte aligned");
    const bool k_quant = q8_activation_format(type) == Q8Format::Q8_K;
    const int n_blocks = n_tokens * (cols / q8::block_elems(k_quant));
    const dim3 grid((n_blocks + kQuantWarps - 1) / kQuantWarps), block(kQuantWarps * 32);
    detail::launch_kernel("quantize_kernel", quantize_kernel, grid, block, 0, stream, k_quant, x, cols, n_blocks,
                          static_cast<uint8_t*>(xq));
}

}  // namespace tandem::cuda
