// matmul / matmul_rows: argument checks, the quantization of the activations (Int8), and the split of weight rows
// across the pool; the arithmetic is the per-type kernel of quant.cpp / quant_q8*.cpp, which holds the
// batch-invariance argument.
//
// Threads split rows and never the reduction over cols, so which thread computes y[t][r] changes nothing about
// how it is computed. Activation rows are quantized per token, so a token's codes do not depend on the batch.
#include "cpu/matmul.h"

#include <string>
#include <vector>

#include "cpu/quant.h"
#include "cpu/quant_q8.h"
#include "cpu/repack.h"
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

const Q8TypeKernels* integer_kernels(GgmlType type, Activations act) {
    return act == Activations::Int8 ? find_q8_kernels(type) : nullptr;
}

// The quantized activations of one matmul call; grown, never shrunk, one buffer per calling thread (the workers
// only read it during the call).
std::vector<uint8_t>& activation_buffer(size_t bytes) {
    thread_local std::vector<uint8_t> buffer;
    if (buffer.size() < bytes) buffer.resize(bytes);
    return buffer;
}

// The activation rows quantized to `f`, in the calling thread's buffer (valid until its next matmul).
const uint8_t* quantized_activations(ActFormat f, const float* x, int64_t cols, int64_t n_tokens, ThreadPool& pool,
                                     bool serial) {
    const size_t xs = act_row_bytes(f, cols);
    uint8_t* xq = activation_buffer(xs * static_cast<size_t>(n_tokens)).data();
    auto quantize = [&](int64_t begin, int64_t end, int) {
        for (int64_t t = begin; t < end; ++t) quantize_activations(f, x + t * cols, xq + t * xs, cols);
    };
    if (serial || n_tokens == 1)
        quantize(0, n_tokens, 0);
    else
        pool.parallel_for(n_tokens, quantize);
    return xq;
}

}  // namespace

void matmul(const RepackedMatrix& W, const float* x, int64_t n_tokens, float* y, ThreadPool& pool) {
    matmul_first_rows(W, W.rows(), x, n_tokens, y, W.rows(), pool);
}

void matmul_first_rows(const RepackedMatrix& W, int64_t n_rows, const float* x, int64_t n_tokens, float* y,
                       int64_t y_stride, ThreadPool& pool) {
    if (n_rows <= 0 || n_tokens <= 0) return;
    if (n_rows > W.rows()) throw Error("matmul_first_rows: " + std::to_string(n_rows) + " rows of " + std::to_string(W.rows()));
    const int64_t n_groups = (n_rows + RepackedMatrix::kGroupRows - 1) / RepackedMatrix::kGroupRows;
    const bool serial = pool.size() == 1 || n_rows * W.cols() * n_tokens < kMinParallelMacs;
    const ActFormat act = find_q8_kernels(W.type())->act;
    const size_t xs = act_row_bytes(act, W.cols());
    const uint8_t* xq = quantized_activations(act, x, W.cols(), n_tokens, pool, serial);
    auto groups = [&](int64_t begin, int64_t end, int) { W.dot_groups(begin, end, xq, xs, n_tokens, y, y_stride); };
    serial ? groups(0, n_groups, 0) : pool.parallel_for(n_groups, groups);
}

bool uses_int8(GgmlType type, Activations act) { return integer_kernels(type, act) != nullptr; }

void matmul_rows(GgmlType type, const void* W, int64_t cols, int64_t rows, const float* x, int64_t n_tokens, float* y,
                 int64_t row_begin, int64_t row_end, Activations act) {
    const TypeKernels& k = checked_kernels(type, cols, rows, n_tokens);
    if (row_begin < 0 || row_end > rows || row_begin > row_end)
        throw Error("matmul_rows: row range [" + std::to_string(row_begin) + ", " + std::to_string(row_end) +
                    ") outside [0, " + std::to_string(rows) + ")");
    const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
    if (const Q8TypeKernels* q = integer_kernels(type, act)) {
        const size_t xs = act_row_bytes(q->act, cols);
        std::vector<uint8_t> xq(xs * static_cast<size_t>(n_tokens));
        for (int64_t t = 0; t < n_tokens; ++t) quantize_activations(q->act, x + t * cols, xq.data() + t * xs, cols);
        q->dot_rows(W, row_bytes, cols, row_begin, row_end, xq.data(), xs, n_tokens, y, rows);
        return;
    }
    k.dot_rows(W, row_bytes, cols, row_begin, row_end, x, cols, n_tokens, y, rows);
}

void matmul(GgmlType type, const void* W, int64_t cols, int64_t rows, const float* x, int64_t n_tokens, float* y,
            ThreadPool& pool, Activations act) {
    matmul_first_rows(type, W, cols, rows, x, n_tokens, y, rows, pool, act);
}

void matmul_first_rows(GgmlType type, const void* W, int64_t cols, int64_t n_rows, const float* x, int64_t n_tokens,
                       float* y, int64_t y_stride, ThreadPool& pool, Activations act) {
    const TypeKernels& k = checked_kernels(type, cols, n_rows, n_tokens);
    if (n_rows == 0 || n_tokens == 0) return;
    const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
    const bool serial = pool.size() == 1 || n_rows * cols * n_tokens < kMinParallelMacs;
    if (const Q8TypeKernels* q = integer_kernels(type, act)) {
        const size_t xs = act_row_bytes(q->act, cols);
        const uint8_t* xq = quantized_activations(q->act, x, cols, n_tokens, pool, serial);
        auto rows_kernel = [&](int64_t begin, int64_t end, int) {
            q->dot_rows(W, row_bytes, cols, begin, end, xq, xs, n_tokens, y, y_stride);
        };
        serial ? rows_kernel(0, n_rows, 0) : pool.parallel_for(n_rows, rows_kernel);
        return;
    }
    auto rows_kernel = [&](int64_t begin, int64_t end, int) {
        k.dot_rows(W, row_bytes, cols, begin, end, x, cols, n_tokens, y, y_stride);
    };
    serial ? rows_kernel(0, n_rows, 0) : pool.parallel_for(n_rows, rows_kernel);
}

}  // namespace tandem::cpu
