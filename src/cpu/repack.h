// RepackedMatrix: a quantized weight matrix copied once, at load, into a layout with 16 rows interleaved, for the
// row-lane integer kernels (quant_q8_repacked_*.cpp). The one place where tandem keeps a second copy of weights
// instead of using the mapped file (the backend drops the file pages it copied from, so memory does not double).
//
// Why a copy pays for itself. The integer kernels of the file's own layout (quant_q8_kquants*.cpp) hold one row's
// codes across the SIMD lanes: every (row, token, 16-element sub-block) leaves partial sums in several lanes, and
// applying the sub-block scales and adding those lanes costs about as much as the multiplies themselves, per token.
// With row r of a group in lane r, a lane accumulates a whole sub-block of its row, the scales are one multiply per
// sub-block for 16 rows, and nothing is summed across lanes. Interleaving 16 rows on the fly costs a transpose per
// super-block, which a handful of tokens (speculative verification: 2..17) cannot amortise; done once at load it is
// free. Measured gains are in the commit that introduced it and in the README.
//
// Results are bitwise those of the other kernels of the type (find_q8_kernels(type)->dot_rows_scalar): the integer
// sums per super-block are exact however they are formed, and the float steps per (row, token, super-block) are the
// same operations in the same order. So batch invariance, and every fidelity figure, carry over unchanged.
//
// Layout, per group of 16 rows (a last partial group is padded with zero rows) and per super-block, one record:
//   Q4_K (2368 bytes)  [0, 2048)     qs: vector k (k < 32) at 64 k, its dword r the bytes 4k..4k+3 of row r's qs
//                      [2048, 2176)  scales: sub-block j's 16 row scales (6-bit, as bytes) at 2048 + 16 j
//                      [2176, 2304)  mins: pair p (sub-blocks 2p, 2p+1) at 2176 + 32 p, bytes 2r, 2r+1 of row r
//                      [2304, 2336)  d of rows 0..15 (fp16);  [2336, 2368)  dmin of rows 0..15 (fp16)
//   Q6_K (3392 bytes)  [0, 3072)     codes in the order the kernel reads them (a record streams front to back): for
//                                    step s = 2h + half (s < 4) and d = 4 half + i (i < 4), at 64 (12 s + 3 i): the
//                                    ql vectors m = 16h + d and 16h + 8 + d, then the qh vector n = 8h + d, where
//                                    ql vector m's dword r is the bytes 4m..4m+3 of row r's ql, qh vector n's the
//                                    bytes 4n..4n+3 of row r's qh
//                      [3072, 3328)  scales: sub-block j's 16 row scales (int8) at 3072 + 16 j
//                      [3328, 3360)  d of rows 0..15 (fp16);  [3360, 3392) zero (records stay 64-byte aligned)
// The records of a group are consecutive (super-block order), and the groups follow each other.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "ggml_types.h"

namespace tandem::cpu {

class ThreadPool;

class RepackedMatrix {
public:
    static constexpr int kGroupRows = 16;

    // True when this build and CPU have a row-lane kernel for `type` (AVX-512 VNNI; Q4_K and Q6_K) and the
    // environment does not turn repacking off (TANDEM_NO_REPACK=1).
    static bool available(GgmlType type);

    // Repacks a [cols, rows] matrix of `type` (the GGUF layout, W row-major); the work is split across `pool`.
    // Throws tandem::Error when the type has no repacked layout or cols is not a whole number of super-blocks.
    RepackedMatrix(GgmlType type, const void* W, int64_t cols, int64_t rows, ThreadPool& pool);
    ~RepackedMatrix();
    RepackedMatrix(const RepackedMatrix&) = delete;
    RepackedMatrix& operator=(const RepackedMatrix&) = delete;

    GgmlType type() const { return type_; }
    int64_t rows() const { return rows_; }
    int64_t cols() const { return cols_; }
    int64_t n_groups() const { return (rows_ + kGroupRows - 1) / kGroupRows; }
    size_t bytes() const { return bytes_; }

    // y[t * y_stride + r] = dot(row r, quantized activation row t) for the rows of groups [group_begin, group_end)
    // (rows past rows() are not written) and tokens [0, n_tokens); activation row t (Q8_K blocks, as
    // quantize_activations makes them) starts at xq + t * xq_stride. Single-threaded; bitwise equal to
    // find_q8_kernels(type())->dot_rows_scalar for every (row, token).
    void dot_groups(int64_t group_begin, int64_t group_end, const uint8_t* xq, size_t xq_stride, int64_t n_tokens,
                    float* y, int64_t y_stride) const;

private:
    GgmlType type_;
    int64_t rows_, cols_;
    size_t record_bytes_ = 0;
    size_t bytes_ = 0;
    uint8_t* data_ = nullptr;  // 64-byte aligned
};

namespace q8_detail {

// The row-lane kernel behind RepackedMatrix::dot_groups for a type: groups are data + g * group_bytes, each
// n_blocks records; nullptr when the build or the CPU has none.
using RepackedDotFn = void (*)(const uint8_t* data, size_t group_bytes, int64_t n_blocks, int64_t rows,
                               int64_t group_begin, int64_t group_end, const uint8_t* xq, size_t xq_stride,
                               int64_t n_tokens, float* y, int64_t y_stride);
RepackedDotFn repacked_avx512_kernel(GgmlType type);  // quant_q8_repacked_avx512.cpp

// Record layout constants shared by the repacker and the kernels.
namespace q4k16 {
constexpr size_t kQs = 0, kScales = 2048, kMinPairs = 2176, kD = 2304, kDmin = 2336, kBytes = 2368;
}
namespace q6k16 {
constexpr size_t kCodes = 0, kScales = 3072, kD = 3328, kBytes = 3392;
}

}  // namespace q8_detail
}  // namespace tandem::cpu
