// Internal to the integer kernels (quant_q8*.cpp): the rows x tokens driver every type's kernel plugs into, and the
// per-family kernel tables that quant_q8.cpp assembles.
//
// A Kernel provides
//   static constexpr int kMaxTile;                 // tokens per tile, 1..16
//   template <int T> static void tile(const uint8_t* row, int64_t cols, const uint8_t* xq, size_t xq_stride,
//                                     float* out);  // out[t] = dot(row, activation row t), t < T
// and must compute out[t] with a sequence of operations that does not depend on T or t (decode each weight block
// once, then run the same per-token code on it): that is the batch-invariance argument of quant_q8.h.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "cpu/quant_q8.h"

namespace tandem::cpu::q8_detail {

// With more tokens than one tile, rows go in chunks of about this many weight bytes, and every token tile sweeps a
// chunk before the next: the chunk stays in L2 while the quantized activations stream past it.
constexpr size_t kRowChunkBytes = 128 * 1024;

// A scratch buffer of the calling thread, 64-byte aligned, for kernels that repack the activations of a call (the
// AVX-512 k-quant kernels); grown, never shrunk, as matmul's activation buffer. Defined here, outside any kernel
// file's target pragma, so that the std::vector code it instantiates is compiled for the default target.
inline uint8_t* scratch_buffer(size_t bytes) {
    thread_local std::vector<uint8_t> buffer;
    if (buffer.size() < bytes + 64) buffer.resize(bytes + 64);
    const auto addr = reinterpret_cast<uintptr_t>(buffer.data());
    return buffer.data() + ((64 - addr % 64) % 64);
}

template <class Kernel, int T>
void rows_tile(const uint8_t* W, size_t row_bytes, int64_t cols, int64_t r0, int64_t r1, const uint8_t* xq,
               size_t xq_stride, float* y, int64_t y_stride) {
    for (int64_t r = r0; r < r1; ++r) {
        float out[T];
        Kernel::template tile<T>(W + r * row_bytes, cols, xq, xq_stride, out);
        for (int t = 0; t < T; ++t) y[t * y_stride + r] = out[t];
    }
}

template <class Kernel, int T>
void rows_tile_upto(int n, const uint8_t* W, size_t row_bytes, int64_t cols, int64_t r0, int64_t r1,
                    const uint8_t* xq, size_t xq_stride, float* y, int64_t y_stride) {
    if constexpr (T > 1) {
        if (n < T) return rows_tile_upto<Kernel, T - 1>(n, W, row_bytes, cols, r0, r1, xq, xq_stride, y, y_stride);
    }
    rows_tile<Kernel, T>(W, row_bytes, cols, r0, r1, xq, xq_stride, y, y_stride);
}

template <class Kernel>
void dot_rows(const void* W, size_t row_bytes, int64_t cols, int64_t row_begin, int64_t row_end, const uint8_t* xq,
              size_t xq_stride, int64_t n_tokens, float* y, int64_t y_stride) {
    static_assert(Kernel::kMaxTile >= 1 && Kernel::kMaxTile <= 16);
    constexpr int kTile = Kernel::kMaxTile;
    const uint8_t* w = static_cast<const uint8_t*>(W);
    const int64_t chunk = n_tokens <= kTile
                              ? std::max<int64_t>(1, row_end - row_begin)
                              : static_cast<int64_t>(std::max<size_t>(1, kRowChunkBytes / std::max<size_t>(1, row_bytes)));
    for (int64_t r0 = row_begin; r0 < row_end; r0 += chunk) {
        const int64_t r1 = std::min(row_end, r0 + chunk);
        for (int64_t t0 = 0; t0 < n_tokens; t0 += kTile) {
            const int n = static_cast<int>(std::min<int64_t>(kTile, n_tokens - t0));
            rows_tile_upto<Kernel, kTile>(n, w, row_bytes, cols, r0, r1, xq + t0 * xq_stride, xq_stride,
                                          y + t0 * y_stride, y_stride);
        }
    }
}

// The tables of the two kernel families, each filled by its file with the scalar kernel and, in an AVX2 build, the
// AVX2 one (dot_rows_avx2, also dot_rows); quant_q8.cpp adds the AVX-512 kernels where the CPU runs them.
std::span<const Q8TypeKernels> legacy_q8_kernels();   // quant_q8_legacy.cpp: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
std::span<const Q8TypeKernels> kquant_q8_kernels();   // quant_q8_kquants.cpp: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K

// The AVX2 kernels of the legacy types (weight rows in the lanes: quant_q8_legacy_avx2.cpp), or nullptr in a build
// without AVX2 / FMA / F16C.
DotRowsQ8Fn legacy_q8_avx2_kernel(GgmlType type);

// The AVX-512 VNNI kernels of a type, or nullptr (a type not written yet, or a build without x86 AVX2). They are
// compiled for AVX-512 (a target pragma in their files, not the build flags), so only call them after checking the
// CPU: find_q8_kernels does.
DotRowsQ8Fn legacy_q8_avx512_kernel(GgmlType type);   // quant_q8_legacy_avx512.cpp
DotRowsQ8Fn kquant_q8_avx512_kernel(GgmlType type);   // quant_q8_kquants_avx512.cpp

}  // namespace tandem::cpu::q8_detail
