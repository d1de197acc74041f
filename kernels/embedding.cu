// Embedding gather: one token-table row per block, dequantized to fp32 (F32, F16, Q8_0, Q4_0 tables).
#include "common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float element(GgmlType type, const uint8_t* row, int e) {
    switch (type) {
        case GgmlType::F32: return reinterpret_cast<const float*>(row)[e];
        case GgmlType::F16: return tandem_half_to_float(reinterpret_cast<const uint16_t*>(row)[e]);
        case GgmlType::Q8_0: {
            const uint8_t* blk = row + 34 * (e / 32);
            return detail::load_half(blk) * static_cast<float>(static_cast<int8_t>(blk[2 + e % 32]));
        }
        default: {  // Q4_0: byte j holds element j (low nibble) and j + 16 (high nibble)
            const uint8_t* blk = row + 18 * (e / 32);
            const int j = e % 32;
            const int q = j < 16 ? (blk[2 + j] & 0xF) : (blk[2 + j - 16] >> 4);
            return detail::load_half(blk) * static_cast<float>(q - 8);
        }
    }
}

__global__ void __launch_bounds__(kThreads)
    embedding_kernel(GgmlType type, const uint8_t* __restrict__ table, size_t row_bytes, int n_vocab, int dim,
                     const int* __restrict__ tokens, float* __restrict__ out) {
    const int token = tokens[blockIdx.x];
    float* o = out + static_cast<size_t>(blockIdx.x) * dim;
    if (token < 0 || token >= n_vocab) {  // no way to throw from the device: a NaN row is impossible to miss
        for (int e = threadIdx.x; e < dim; e += blockDim.x) o[e] = __int_as_float(0x7FC00000);
        return;
    }
    const uint8_t* row = table + static_cast<size_t>(token) * row_bytes;
    for (int e = threadIdx.x; e < dim; e += blockDim.x) o[e] = element(type, row, e);
}

}  // namespace

bool embedding_supports(GgmlType type) {
    return type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::Q8_0 || type == GgmlType::Q4_0;
}

void embedding(GgmlType type, const void* table, size_t row_bytes, int n_vocab, int dim, const int* tokens,
               int n_tokens, float* out, Stream stream) {
    detail::require(embedding_supports(type), "embedding: unsupported table type");
    detail::require(n_tokens > 0 && dim > 0, "embedding: empty shape");
    detail::require(type == GgmlType::F32 || type == GgmlType::F16 || dim % 32 == 0,
                    "embedding: block-quantized rows are whole blocks of 32");
    detail::launch_kernel("embedding_kernel", embedding_kernel, dim3(n_tokens), dim3(kThreads), 0, stream, type,
                          static_cast<const uint8_t*>(table), row_bytes, n_vocab, dim, tokens, out);
}

}  // namespace tandem::cuda
