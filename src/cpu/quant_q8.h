// 8-bit activations: the integer path of matmul for quantized weights. Each token's activation row is quantized once
// per matmul into 8-bit blocks (the formats below), and the dot product of a weight block with an activation block
// is an exact integer sum (AVX2 maddubs/madd) times the two scales. This is what llama.cpp's CPU backend does (its
// vec_dot_type); it reads ~4x fewer activation bytes and does integer instead of float multiply-adds, which is what
// lets decode reach the memory-bandwidth roof and prefill run at integer-SIMD speed.
//
// Which format a weight type takes (ggml's pairing): Q8_0 for Q4_0, Q5_0, Q8_0; Q8_1 (with the block sum, for the
// offset m of Q4_1 / Q5_1) for Q4_1, Q5_1; Q8_K (256-element blocks with 16-element sums) for Q2_K..Q6_K. F32, F16
// and BF16 weights keep the fp32 kernels of quant.h.
//
// Batch invariance holds as in quant.h: activation quantization is per token, and each (row, token) dot product is
// one fixed sequence of operations whatever the number of tokens in the tile.
#pragma once
#include <cstddef>
#include <cstdint>

#include "gguf/ggml_types.h"

namespace tandem::cpu {

enum class ActFormat : uint8_t { Q8_0, Q8_1, Q8_K };

// Q8_0 activations use BlockQ8_0 of quant.h (fp16 d, 32 int8). Q8_1: the same plus s = fp16(d * sum(qs)).
struct BlockQ8_1 {
    uint16_t d, s;
    int8_t qs[32];
};
static_assert(sizeof(BlockQ8_1) == 36);

// Q8_K: 256 values, fp32 d, and the sum of each 16 consecutive codes (the k-quants' mins multiply those).
struct BlockQ8_K {
    float d;
    int8_t qs[256];
    int16_t bsums[16];
};
static_assert(sizeof(BlockQ8_K) == 292);

// Elements per block (32 or 256) and bytes per block of a format.
int64_t act_block_size(ActFormat f);
size_t act_block_bytes(ActFormat f);
// Bytes of one quantized activation row of `cols` elements (cols a multiple of the block size).
size_t act_row_bytes(ActFormat f, int64_t cols);

// Quantizes one row of `cols` floats the way llama.cpp's x86 build does (so our products see the same inputs):
// Q8_0 / Q8_1: d = amax / 127, q = round-half-even(x * 127 / amax), d stored as fp16; Q8_K: `max` the element of
// largest magnitude with its sign, q = min(127, round-half-even(x * -127 / max)), d = 1 / (-127 / max) as fp32.
void quantize_activations(ActFormat f, const float* x, void* dst, int64_t cols);
// The values the codes stand for (q * d), for tests.
void dequantize_activations(ActFormat f, const void* src, float* dst, int64_t cols);

// y[t * y_stride + r] = dot(row r of W, quantized activation row t) for rows [row_begin, row_end) and tokens
// [0, n_tokens); activation row t starts at xq + t * xq_stride. Single-threaded; bitwise the same for a given
// (row, token) whatever the row range, n_tokens or the token's place in the batch.
using DotRowsQ8Fn = void (*)(const void* W, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end,
                             const uint8_t* xq, size_t xq_stride, int64_t n_tokens, float* y, int64_t y_stride);

struct Q8TypeKernels {
    GgmlType type;
    ActFormat act;
    DotRowsQ8Fn dot_rows;          // the fastest this CPU runs: AVX-512 VNNI, else AVX2, else the scalar one
    DotRowsQ8Fn dot_rows_scalar;   // portable: the same integer sums, combined in a different float order
    DotRowsQ8Fn dot_rows_avx2 = nullptr;    // the AVX2 kernel (nullptr in a build without AVX2)
    // The AVX-512 VNNI kernel (vpdpbusd on zmm), bitwise equal to the AVX2 one: nullptr when the build or the CPU
    // has none, or the environment sets TANDEM_NO_AVX512=1 (to compare the two).
    DotRowsQ8Fn dot_rows_avx512 = nullptr;
};

// Whether the AVX-512 kernels may run: the build is for x86 with AVX2, the CPU has AVX-512 F/BW/VL/DQ and VNNI (the
// target every AVX-512 kernel file is compiled for), and the process does not turn them off (dispatch.h:
// TANDEM_NO_AVX512=1, to compare with the AVX2 kernels).
bool avx512_kernels_enabled();

// The integer kernels of a weight type, or nullptr when it has none (F32, F16, BF16: fp32 activations).
const Q8TypeKernels* find_q8_kernels(GgmlType type);

// Dot product of one weight row with n floats, through the integer path exactly as matmul computes it (x is
// quantized first). Throws tandem::Error when the type has no integer kernel or n is not whole blocks.
float vec_dot_q8(GgmlType type, int64_t n, const void* row, const float* x);
float vec_dot_q8_scalar(GgmlType type, int64_t n, const void* row, const float* x);

}  // namespace tandem::cpu
