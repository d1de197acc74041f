// Batch-invariant matrix multiplication of a GGUF weight matrix (any CPU-supported type, used in place) with a batch
// of fp32 activation rows, split across a ThreadPool by weight rows.
#pragma once
#include <cstdint>

#include "gguf/ggml_types.h"

namespace tandem::cpu {

class ThreadPool;
class RepackedMatrix;

// How quantized weights meet the activations. Int8 (the default, llama.cpp's choice): each token's row is quantized
// to 8-bit blocks once per matmul and multiplied with integer SIMD (cpu/quant_q8.h); F32 / F16 / BF16 weights have
// no integer kernel and always use Float. Float: the fp32-activation kernels of cpu/quant.h, which dequantize the
// weights and keep the activations exact (slower; the reference the integer path is judged against).
enum class Activations : uint8_t { Int8, Float };

// y[t][r] = dot(row r of W, x[t]) for t < n_tokens, r < rows.
//   W: ggml shape [cols, rows] (ne[0] = cols contiguous): row r starts at W + r * ggml_row_bytes(type, cols)
//   x: [n_tokens][cols] fp32, token t at x + t * cols
//   y: [n_tokens][rows] fp32, token t at y + t * rows
// Batch invariance: y[t][r] is bitwise the same whatever n_tokens, whatever place token t has in the batch and
// whatever the pool size, and equals vec_dot(type, cols, row r, x[t]) (Float) or vec_dot_q8 (Int8, for types that
// have an integer kernel). Speculative verification relies on it.
// Throws tandem::Error when the type is unsupported or cols is not a whole number of blocks.
void matmul(GgmlType type, const void* W, int64_t cols, int64_t rows, const float* x, int64_t n_tokens, float* y,
            ThreadPool& pool, Activations act = Activations::Int8);

// The single-threaded core of matmul: computes y[t][r] for rows [row_begin, row_end) only (y still has `rows`
// floats per token). For callers that split work themselves, e.g. several projections in one parallel_for.
void matmul_rows(GgmlType type, const void* W, int64_t cols, int64_t rows, const float* x, int64_t n_tokens, float* y,
                 int64_t row_begin, int64_t row_end, Activations act = Activations::Int8);

// The same product for a matrix repacked at load (cpu/repack.h), always with 8-bit activations: bitwise equal to
// matmul on the original with Activations::Int8 (batch invariance included). Threads split row groups.
void matmul(const RepackedMatrix& W, const float* x, int64_t n_tokens, float* y, ThreadPool& pool);

// matmul restricted to the first n_rows rows of W (n_rows <= rows), writing y[t * y_stride + r]: each result is
// bitwise matmul's. For logits of a vocabulary's first ids only (a draft model's proposals, Backend::restrict_logits).
// The repacked form computes whole row groups: it may also write the rows of the last group past n_rows (still below
// W.rows() and y_stride).
void matmul_first_rows(GgmlType type, const void* W, int64_t cols, int64_t n_rows, const float* x, int64_t n_tokens,
                       float* y, int64_t y_stride, ThreadPool& pool, Activations act = Activations::Int8);
void matmul_first_rows(const RepackedMatrix& W, int64_t n_rows, const float* x, int64_t n_tokens, float* y,
                       int64_t y_stride, ThreadPool& pool);

// True when matmul with `act` runs the integer kernels for this weight type.
bool uses_int8(GgmlType type, Activations act);

}  // namespace tandem::cpu
