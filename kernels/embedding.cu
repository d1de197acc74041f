// Embedding gather: one token-table row per block, dequantized to fp32 (every table type matvec handles) by the
// per-element decoder of dequant.cuh.
#include "common.cuh"
#include "dequant.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    embedding_kernel(GgmlType type, const uint8_t* __restrict__ table, size_t row_bytes, int n_vocab, int dim,
                     const int* __restrict__ tokens, float* __restrict__ out) {
    detail::wait_for_inputs();
    const int token = tokens[blockIdx.x];
    float* o = out + static_cast<size_t>(blockIdx.x) * dim;
    if (token < 0 || token >= n_vocab) {  // no way to throw from the device: a NaN row is impossible to miss
        for (int e = threadIdx.x; e < dim; e += blockDim.x) o[e] = __int_as_float(0x7FC00000);
        return;
    }
    const uint8_t* row = table + static_cast<size_t>(token) * row_bytes;
    for (int e = threadIdx.x; e < dim; e += blockDim.x) o[e] = detail::dequant_element(type, row, e);
}

}  // namespace

// dequant.cuh decodes every type the matvec walks: the one list is matvec_supports'.
bool embedding_supports(GgmlType type) { return matvec_supports(type); }

void embedding(GgmlType type, const void* table, size_t row_bytes, int n_vocab, int dim, const int* tokens,
               int n_tokens, float* out, Stream stream) {
    detail::require(embedding_supports(type), "embedding: unsupported table type");
    detail::require(n_tokens > 0 && dim > 0, "embedding: empty shape");
    detail::require(dim % static_cast<int>(ggml_type_info(type).block_size) == 0,
                    "embedding: block-quantized rows are whole blocks");
    detail::launch_kernel("embedding_kernel", embedding_kernel, dim3(n_tokens), dim3(kThreads), 0, stream, type,
                          static_cast<const uint8_t*>(table), row_bytes, n_vocab, dim, tokens, out);
}

}  // namespace tandem::cuda
