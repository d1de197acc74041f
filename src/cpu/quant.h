// The CPU weight types: ggml's block layouts, row quantize / dequantize, the dot product of a weight row with fp32
// activations, and the per-type kernel table that matmul dispatches through.
//
// Types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K. Adding one means: a block struct
// here, its traits (dequantize, block decoder) in quant_traits.h, and one line in quant.cpp's table. The dot-product
// and matmul loops are shared templates. Quantizers exist only for the types tandem writes (F32, F16, Q8_0, Q4_0).
#pragma once
#include <cstddef>
#include <cstdint>

#include "gguf/ggml_types.h"

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

// Q4_1: 32 weights, nibbles as in Q4_0 but unsigned with a stored offset: value = q * d + m.
struct BlockQ4_1 {
    uint16_t d, m;
    uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_1) == 20);

// Q5_0: Q4_0's nibbles plus a fifth bit per element, bit j of the little-endian qh for element j (j + 16 for the
// high nibbles): value = (q5 - 16) * d.
struct BlockQ5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_0) == 22);

// Q5_1: Q5_0's codes, unsigned, with an offset: value = q5 * d + m.
struct BlockQ5_1 {
    uint16_t d, m;
    uint8_t qh[4];
    uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_1) == 24);

// ---- k-quants: 256-weight super-blocks (QK_K) with small integer sub-block scales under fp16 super-scales --------
constexpr int kQK_K = 256;

// Q2_K: 16 sub-blocks of 16. scales[i]: low nibble scale, high nibble min of sub-block i. Elements of 32-chunk c
// (0..7) are 2-bit fields at bit 2*(c%4) of qs[32*(c/4) + l]: value = d*(sc&15)*q - dmin*(sc>>4).
struct BlockQ2_K {
    uint8_t scales[16];
    uint8_t qs[64];
    uint16_t d, dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// Q3_K: 16 sub-blocks of 16 with 6-bit signed scales (biased by 32) packed in 12 bytes. Chunk c: low 2 bits at bit
// 2*(c%4) of qs[32*(c/4) + l], and bit c of hmask[l] which, when clear, subtracts 4: value = d*(sc-32)*q.
struct BlockQ3_K {
    uint8_t hmask[32];
    uint8_t qs[64];
    uint8_t scales[12];
    uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// Q4_K: 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes (ggml's get_scale_min_k4). Chunk c is the
// low (c even) or high nibble of qs[32*(c/2) + l]: value = d*sc*q - dmin*m.
struct BlockQ4_K {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[128];
};
static_assert(sizeof(BlockQ4_K) == 144);

// Q5_K: Q4_K plus a fifth bit: bit c of qh[l] for element l of chunk c.
struct BlockQ5_K {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[32];
    uint8_t qs[128];
};
static_assert(sizeof(BlockQ5_K) == 176);

// Q6_K: 16 sub-blocks of 16 with int8 scales. Chunk c = 4h + k: low nibble (k < 2) or high nibble of
// ql[64h + 32(k%2) + l], and bits 2k..2k+1 of qh[32h + l]: value = d*sc*(q6 - 32).
struct BlockQ6_K {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// The packed sub-block scales of the k-quants, unpacked (ggml's get_scale_min_k4 and its Q3_K counterpart):
// Q4_K / Q5_K's 12 bytes hold eight 6-bit scales and eight 6-bit mins (bytes 0..3 the low 6 bits of scales 0..3,
// whose top 2 bits are the high bits of scales 4..7; bytes 4..7 the same for the mins; bytes 8..11 the low 4 bits of
// scales 4..7 (low nibble) and mins 4..7 (high nibble)). Q3_K's 12 bytes hold sixteen 6-bit scales biased by 32:
// low 4 bits in bytes 0..7 (scale i < 8 in the low nibble of byte i, i >= 8 in the high nibble of byte i - 8), high
// 2 bits at bits 2*(i/4) of byte 8 + i%4.
void unpack_scale_min_k4(const uint8_t* q, uint8_t sc[8], uint8_t m[8]);
void unpack_scales_q3_k(const uint8_t* s, int sc[16]);

// ---- row API ----------------------------------------------------------------------------------------------------
// `n` is the number of elements; for block types it must be a multiple of the block size (32, or 256 for k-quants).

// True for the types the CPU kernels compute with (decode and dot products): the list at the top of this file.
bool cpu_supports(GgmlType type);

// True for the types quantize_row can produce: F32, F16, Q8_0, Q4_0.
bool cpu_can_quantize(GgmlType type);

// Encodes n floats as `type`, the way ggml's reference quantizers do (so files match llama.cpp's byte for byte).
// Throws tandem::Error for a type it cannot produce.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

// quantize_row's Q4_0 encoding without SIMD, the definition its AVX2 version must match byte for byte (tests).
void quantize_row_q4_0_scalar(const float* src, void* dst, int64_t n);

// Decodes n elements of `type` to floats. Throws tandem::Error for an unsupported type.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// Re-encodes a row of n elements of `from` as `to` (decoded to floats in `scratch`, n floats, then quantize_row).
void requantize_row(GgmlType from, const void* src, GgmlType to, void* dst, int64_t n, float* scratch);

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
    void (*quantize)(const float* src, void* dst, int64_t n);   // nullptr: tandem reads the type but never writes it
    void (*dequantize)(const void* src, float* dst, int64_t n);
    DotRowsFn dot_rows;          // SIMD when the library is built with AVX2/FMA/F16C, else the scalar one
    DotRowsFn dot_rows_scalar;   // the portable kernel
};

// The kernels of `type`, or nullptr when the CPU backend does not support it.
const TypeKernels* find_kernels(GgmlType type);

}  // namespace tandem::cpu
