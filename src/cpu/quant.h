// The CPU weight types: ggml's block layouts, row quantize / dequantize, the dot product of a weight row with fp32
// activations, and the per-type kernel table that matmul dispatches through.
//
// Adding a type (Q4_1, Q5_0, Q4_K, Q6_K, ...) means: a block struct here, a quantize / dequantize pair and a block
// decoder in quant.cpp, and one line in its traits table. The dot-product and matmul loops are shared templates.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ggml_types.h"

namespace tandem::cpu {

// ---- ggml block layouts (byte for byte what GGUF files hold) ------------------------------------------------------
// `d` is an IEEE binary16 scale stored as raw bits (see fp16.h); blocks are packed with no padding, so in a row
// they sit at 2-byte alignment only.

// Q8_0: 32 weights, value = qs[j] * d.
struct BlockQ8_0 {
    uint16_t d;
    int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34);

// Q4_0: 32 weights as 4-bit codes with an implicit offset of 8. Byte j holds element j in its low nibble and
// element j + 16 in its high nibble: value = ((qs[j] & 0xF) - 8) * d and ((qs[j] >> 4) - 8) * d.
struct BlockQ4_0 {
    uint16_t d;
    uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_0) == 18);

// ---- row API ----------------------------------------------------------------------------------------------------
// `n` is the number of elements; for block types it must be a multiple of the block size (32).

// True for the types the CPU kernels compute with: F32, F16, Q8_0, Q4_0.
bool cpu_supports(GgmlType type);

// Encodes n floats as `type`, the way ggml's reference quantizers do (so files match llama.cpp's byte for byte).
// Throws tandem::Error for a type it cannot produce.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

// Decodes n elements of `type` to floats. Throws tandem::Error for an unsupported type.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// Dot product of one weight row (n elements of `type`) with n fp32 values. The row is decoded block by block in
// registers, never expanded in memory. Bitwise equal to what matmul computes for the same row and vector.
float vec_dot(GgmlType type, int64_t n, const void* row, const float* x);

// The same dot product through the portable scalar kernels, whatever the build. It sums in a different order from
// the SIMD kernels (so results differ in the last bits) and exists to check them against.
float vec_dot_scalar(GgmlType type, int64_t n, const void* row, const float* x);

// ---- kernel table -------------------------------------------------------------------------------------------------

// Computes y[t * y_stride + r] = dot(row r of W, x + t * x_stride) for rows [row_begin, row_end) and tokens
// [0, n_tokens), single-threaded. Row r of W starts at W + r * row_bytes. For a given row and token the result is
// bitwise the same whatever the row range, n_tokens or the token's place in the batch.
using DotRowsFn = void (*)(const void* W, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end,
                           const float* x, int64_t x_stride, int64_t n_tokens, float* y, int64_t y_stride);

struct TypeKernels {
    GgmlType type;
    int64_t block_size;   // elements per block (1 for F32 / F16: rows of any length)
    size_t block_bytes;   // bytes per block
    void (*quantize)(const float* src, void* dst, int64_t n);
    void (*dequantize)(const void* src, float* dst, int64_t n);
    DotRowsFn dot_rows;          // SIMD when the library is built with AVX2/FMA/F16C, else the scalar one
    DotRowsFn dot_rows_scalar;   // the portable kernel
};

// The kernels of `type`, or nullptr when the CPU backend does not support it.
const TypeKernels* find_kernels(GgmlType type);

}  // namespace tandem::cpu
