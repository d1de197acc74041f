// matmul / matmul_rows: argument checks and the split of weight rows across the pool; the arithmetic is the
// per-type dot_rows kernel of quant.cpp, which holds the batch-invariance argument.
//
// Threads split rows and never the reduction over cols, so which thread computes y[t][r] changes nothing about
// how it is computed.
#include "cpu/matmul.h"

#include <string>

#include "cpu/quant.h"
#include "cpu/thread_pool.h"
#include "error.h"

namespace tandem::cpu {
namespace {

// Below this many multiply-adds a matmul runs on the calling thread: waking the workers and waiting for them
// costs a few microseconds, more than the work (tiny models such as stories260K have 64 x 64 projections).
constexpr int64_t kMinParallelMacs = 1 << 16;

const TypeKernels& checked_kernels(GgmlType type, int64_t cols, int64_t rows, int64_t n_tokens) {
    const TypeKernels* k = find_kernels(type);
    if (!k) throw Error(std::string("matmul: weight type ") + ggml_type_name(type) + " is not supported on the CPU");
    if (cols <= 0 || rows < 0 || n_tokens < 0 || cols % k->block_size != 0)
        throw Error("matmul: bad shape (cols " + std::to_string(cols) + ", rows " + std::to_string(rows) +
                    ", tokens " + std::to_string(n_tokens) + ") for type " + ggml_type_name(type));
    return *k;
}

}  // namespace

void matmul_rows(GgmlType type, const void* W, int64_t cols, int64_t rows, const float* x, int64_t n_tokens, float* y,
                 int64_t row_begin, int64_t row_end) {
    const TypeKernels& k = checked_kernels(type, cols, rows, n_tokens);
    if (row_begin < 0 || row_end > rows || row_begin > row_end)
        throw Error("matmul_rows: row range [" + std::to_string(row_begin) + ", " + std::to_string(row_end) +
                    ") outside [0, " + std::to_string(rows) + ")");
    k.dot_rows(W, ggml_row_bytes(type, static_cast<uint64_t>(cols)), cols, row_begin, row_end, x, cols, n_tokens, y,
               rows);
}

void matmul(GgmlType type, const void* W, int64_t cols, int64_t rows, const float* x, int64_t n_tokens, float* y,
            ThreadPool& pool) {
    const TypeKernels& k = checked_kernels(type, cols, rows, n_tokens);
    if (rows == 0 || n_tokens == 0) return;
    const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
    auto rows_kernel = [&](int64_t begin, int64_t end, int /*thread*/) {
        k.dot_rows(W, row_bytes, cols, begin, end, x, cols, n_tokens, y, rows);
    };
    if (pool.size() == 1 || rows * cols * n_tokens < kMinParallelMacs)
        rows_kernel(0, rows, 0);
    else
        pool.parallel_for(rows, rows_kernel);
}

}  // namespace tandem::cpu
