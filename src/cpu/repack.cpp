// RepackedMatrix (repack.h): which types and CPUs have a repacked layout, the repacking itself (portable), and the
// dispatch to the row-lane kernels.
#include "cpu/repack.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <string_view>

#include "cpu/quant.h"
#include "cpu/thread_pool.h"
#include "error.h"

namespace tandem::cpu {
namespace {

bool cpu_has_avx512_vnni() {
#if defined(TANDEM_AVX2) && defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
#else
    return false;
#endif
}

q8_detail::RepackedDotFn kernel_for(GgmlType type) {
    static const bool avx512 = cpu_has_avx512_vnni();
    return avx512 ? q8_detail::repacked_avx512_kernel(type) : nullptr;
}

size_t record_bytes_of(GgmlType type) {
    switch (type) {
        case GgmlType::Q4_K: return q8_detail::q4k16::kBytes;
        case GgmlType::Q6_K: return q8_detail::q6k16::kBytes;
        default: return 0;
    }
}

// One Q4_K super-block of the 16 rows `src[r]` (nullptr: a padding row, all zero) into a record.
void repack_q4_k(const uint8_t* const (&src)[RepackedMatrix::kGroupRows], uint8_t* rec) {
    using namespace q8_detail::q4k16;
    std::memset(rec, 0, kBytes);
    for (int r = 0; r < RepackedMatrix::kGroupRows; ++r) {
        if (!src[r]) continue;
        BlockQ4_K blk;
        std::memcpy(&blk, src[r], sizeof blk);
        for (int k = 0; k < 32; ++k) std::memcpy(rec + kQs + 64 * k + 4 * r, blk.qs + 4 * k, 4);
        uint8_t sc[8], m[8];
        unpack_scale_min_k4(blk.scales, sc, m);
        for (int j = 0; j < 8; ++j) rec[kScales + 16 * j + r] = sc[j];
        for (int p = 0; p < 4; ++p) {
            rec[kMinPairs + 32 * p + 2 * r] = m[2 * p];
            rec[kMinPairs + 32 * p + 2 * r + 1] = m[2 * p + 1];
        }
        std::memcpy(rec + kD + 2 * r, &blk.d, 2);
        std::memcpy(rec + kDmin + 2 * r, &blk.dmin, 2);
    }
}

// One Q6_K super-block of the 16 rows into a record, as repack_q4_k.
void repack_q6_k(const uint8_t* const (&src)[RepackedMatrix::kGroupRows], uint8_t* rec) {
    using namespace q8_detail::q6k16;
    std::memset(rec, 0, kBytes);
    for (int r = 0; r < RepackedMatrix::kGroupRows; ++r) {
        if (!src[r]) continue;
        BlockQ6_K blk;
        std::memcpy(&blk, src[r], sizeof blk);
        for (int step = 0; step < 4; ++step)
            for (int i = 0; i < 4; ++i) {
                const int h = step / 2, d = 4 * (step % 2) + i;
                uint8_t* v = rec + kCodes + 64 * (12 * step + 3 * i) + 4 * r;
                std::memcpy(v, blk.ql + 4 * (16 * h + d), 4);
                std::memcpy(v + 64, blk.ql + 4 * (16 * h + 8 + d), 4);
                std::memcpy(v + 128, blk.qh + 4 * (8 * h + d), 4);
            }
        for (int j = 0; j < 16; ++j) std::memcpy(rec + kScales + 16 * j + r, &blk.scales[j], 1);
        std::memcpy(rec + kD + 2 * r, &blk.d, 2);
    }
}

}  // namespace

bool RepackedMatrix::available(GgmlType type) {
    static const bool off = [] {
        const char* v = std::getenv("TANDEM_NO_REPACK");
        return v && std::string_view(v) == "1";
    }();
    return !off && kernel_for(type) != nullptr;
}

RepackedMatrix::RepackedMatrix(GgmlType type, const void* W, int64_t cols, int64_t rows, ThreadPool& pool)
    : type_(type), rows_(rows), cols_(cols), record_bytes_(record_bytes_of(type)) {
    if (record_bytes_ == 0 || !kernel_for(type))
        throw Error(std::string("RepackedMatrix: no repacked layout or kernel for ") + ggml_type_name(type) +
                    " on this CPU");
    if (cols <= 0 || cols % kQK_K != 0 || rows <= 0)
        throw Error("RepackedMatrix: bad shape " + std::to_string(cols) + " x " + std::to_string(rows));
    const int64_t n_blocks = cols / kQK_K;
    const size_t group_bytes = static_cast<size_t>(n_blocks) * record_bytes_;
    bytes_ = group_bytes * static_cast<size_t>(n_groups());
    data_ = static_cast<uint8_t*>(std::aligned_alloc(64, (bytes_ + 63) / 64 * 64));
    if (!data_) throw Error("RepackedMatrix: out of memory for " + std::to_string(bytes_) + " bytes");
    const uint8_t* w = static_cast<const uint8_t*>(W);
    const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
    const size_t block_bytes = ggml_type_info(type).type_size;
    auto repack = type == GgmlType::Q4_K ? &repack_q4_k : &repack_q6_k;
    pool.parallel_for(n_groups(), [&](int64_t g0, int64_t g1, int) {
        for (int64_t g = g0; g < g1; ++g)
            for (int64_t b = 0; b < n_blocks; ++b) {
                const uint8_t* src[kGroupRows];
                for (int r = 0; r < kGroupRows; ++r) {
                    const int64_t row = g * kGroupRows + r;
                    src[r] = row < rows ? w + row * row_bytes + b * block_bytes : nullptr;
                }
                repack(src, data_ + g * group_bytes + b * record_bytes_);
            }
    });
}

RepackedMatrix::~RepackedMatrix() { std::free(data_); }

void RepackedMatrix::dot_groups(int64_t group_begin, int64_t group_end, const uint8_t* xq, size_t xq_stride,
                                int64_t n_tokens, float* y, int64_t y_stride) const {
    const int64_t n_blocks = cols_ / kQK_K;
    kernel_for(type_)(data_, static_cast<size_t>(n_blocks) * record_bytes_, n_blocks, rows_, group_begin, group_end,
                      xq, xq_stride, n_tokens, y, y_stride);
}

}  // namespace tandem::cpu
