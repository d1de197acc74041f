// Integer (8-bit activation) dot products of the 32-element weight types Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0: the
// portable scalar kernel, which is the definition of their arithmetic, and the table legacy_q8_kernels() that
// quant_q8.cpp looks them up in, with the SIMD kernels of quant_q8_legacy_avx2.cpp (and, chosen at run time,
// quant_q8_legacy_avx512.cpp) that compute the same bits with several weight rows in the SIMD lanes.
//
// Arithmetic (llama.cpp's, so that our products are close to its): a weight block and an activation block give an
// exact integer sum of 32 code products; it becomes a float, is multiplied by d_w * d_x (the product of the two
// fp16 scales, rounded once) and fma-accumulated in block order. The types with an offset (value = q * d + m: Q4_1,
// Q5_1) pair with Q8_1 activations, whose block carries s = d_x * sum(q_x), so the offset costs one m_w * s_x per
// block, accumulated apart and added at the end.
//
// Batch invariance: a (row, token) result is that sequence of operations whatever the tile, the row range or the
// token's place in the call, in every kernel.
#include <cmath>
#include <cstring>
#include <span>

#include "cpu/fp16.h"
#include "cpu/quant.h"
#include "cpu/quant_q8_driver.h"
#include "cpu/unaligned.h"

#define TANDEM_Q8L_INLINE inline __attribute__((always_inline))

namespace tandem::cpu::q8_detail {
namespace {


// ---- activation formats ----------------------------------------------------------------------------------------
// Both start with the fp16 scale d; Q8_1 follows it with the fp16 s. kQs is where the 32 codes start.
struct ActQ8_0 {
    static constexpr ActFormat kFormat = ActFormat::Q8_0;
    static constexpr size_t kBytes = sizeof(BlockQ8_0);
    static constexpr size_t kQs = offsetof(BlockQ8_0, qs);
};
struct ActQ8_1 {
    static constexpr ActFormat kFormat = ActFormat::Q8_1;
    static constexpr size_t kBytes = sizeof(BlockQ8_1);
    static constexpr size_t kQs = offsetof(BlockQ8_1, qs);
};

// ---- weight types ------------------------------------------------------------------------------------------------
// Each provides:
//   kType, kBytes, Act         the block geometry and the activation format it pairs with
//   kSigned                    the codes are signed values (value = q * d); otherwise unsigned with an offset m
//                              right after d (value = q * d + m)
//   codes(blk, q)              the 32 integer codes in element order

// Unpacks qs[16] (and the fifth bits qh, when given) into 32 codes; `bias` is subtracted from each.
inline void unpack_nibbles(const uint8_t* qs, const uint8_t* qh, int bias, int8_t q[32]) {
    uint32_t h = qh ? load_u32(qh) : 0;
    for (int j = 0; j < 16; ++j) {
        q[j] = static_cast<int8_t>(((qs[j] & 0xF) | (((h >> j) & 1) << 4)) - bias);
        q[j + 16] = static_cast<int8_t>(((qs[j] >> 4) | (((h >> (j + 16)) & 1) << 4)) - bias);
    }
}

struct Q8_0W {
    static constexpr GgmlType kType = GgmlType::Q8_0;
    static constexpr size_t kBytes = sizeof(BlockQ8_0);
    static constexpr bool kSigned = true;
    using Act = ActQ8_0;
    static void codes(const uint8_t* blk, int8_t q[32]) { std::memcpy(q, blk + offsetof(BlockQ8_0, qs), 32); }
};

struct Q4_0W {
    static constexpr GgmlType kType = GgmlType::Q4_0;
    static constexpr size_t kBytes = sizeof(BlockQ4_0);
    static constexpr bool kSigned = true;
    using Act = ActQ8_0;
    static void codes(const uint8_t* blk, int8_t q[32]) {
        unpack_nibbles(blk + offsetof(BlockQ4_0, qs), nullptr, 8, q);
    }
};

struct Q4_1W {
    static constexpr GgmlType kType = GgmlType::Q4_1;
    static constexpr size_t kBytes = sizeof(BlockQ4_1);
    static constexpr bool kSigned = false;
    using Act = ActQ8_1;
    static void codes(const uint8_t* blk, int8_t q[32]) {
        unpack_nibbles(blk + offsetof(BlockQ4_1, qs), nullptr, 0, q);
    }
};

struct Q5_0W {
    static constexpr GgmlType kType = GgmlType::Q5_0;
    static constexpr size_t kBytes = sizeof(BlockQ5_0);
    static constexpr bool kSigned = true;
    using Act = ActQ8_0;
    static void codes(const uint8_t* blk, int8_t q[32]) {
        unpack_nibbles(blk + offsetof(BlockQ5_0, qs), blk + offsetof(BlockQ5_0, qh), 16, q);
    }
};

struct Q5_1W {
    static constexpr GgmlType kType = GgmlType::Q5_1;
    static constexpr size_t kBytes = sizeof(BlockQ5_1);
    static constexpr bool kSigned = false;
    using Act = ActQ8_1;
    static void codes(const uint8_t* blk, int8_t q[32]) {
        unpack_nibbles(blk + offsetof(BlockQ5_1, qs), blk + offsetof(BlockQ5_1, qh), 0, q);
    }
};

// ---- portable kernel -------------------------------------------------------------------------------------------
// Per token and block: sumi = sum q_w * q_x (int), acc = fma(float(sumi), d_w * d_x, acc); the offset types also
// accumulate fma(m_w, s_x, macc) into a second sum, added to the first at the end. The fmas are explicit (std::fma),
// so this is the definition on every build, not what a compiler's contraction makes of it: the SIMD kernels of
// quant_q8_legacy_avx2.cpp and quant_q8_legacy_avx512.cpp are bitwise equal to it.
template <class W>
struct ScalarKernel {
    static constexpr int kMaxTile = 4;
    using Act = typename W::Act;

    template <int T>
    static void tile(const uint8_t* row, int64_t cols, const uint8_t* xq, size_t xq_stride, float* out) {
        float acc[T] = {}, macc[T] = {};
        const int64_t n_blocks = cols / 32;
        for (int64_t b = 0; b < n_blocks; ++b) {
            const uint8_t* blk = row + b * W::kBytes;
            int8_t q[32];
            W::codes(blk, q);
            const float dw = fp16_to_fp32(load_u16(blk));
            float mw = 0.0f;
            if constexpr (!W::kSigned) mw = fp16_to_fp32(load_u16(blk + 2));
            for (int t = 0; t < T; ++t) {
                const uint8_t* xb = xq + t * xq_stride + b * Act::kBytes;
                const int8_t* qx = reinterpret_cast<const int8_t*>(xb + Act::kQs);
                int32_t sumi = 0;
                for (int j = 0; j < 32; ++j) sumi += static_cast<int32_t>(q[j]) * qx[j];
                const float dx = fp16_to_fp32(load_u16(xb));
                acc[t] = std::fma(static_cast<float>(sumi), dw * dx, acc[t]);
                if constexpr (!W::kSigned) macc[t] = std::fma(mw, fp16_to_fp32(load_u16(xb + 2)), macc[t]);
            }
        }
        for (int t = 0; t < T; ++t) out[t] = W::kSigned ? acc[t] : acc[t] + macc[t];
    }
};

// dot_rows: the AVX2 kernel when the build has one (quant_q8.cpp swaps in AVX-512 where the CPU runs it).
template <class W>
Q8TypeKernels make_kernels() {
    const DotRowsQ8Fn scalar = &dot_rows<ScalarKernel<W>>;
    const DotRowsQ8Fn avx2 = legacy_q8_avx2_kernel(W::kType);
    return Q8TypeKernels{W::kType, W::Act::kFormat, avx2 ? avx2 : scalar, scalar, avx2};
}

}  // namespace

std::span<const Q8TypeKernels> legacy_q8_kernels() {
    static const Q8TypeKernels table[] = {
        make_kernels<Q4_0W>(), make_kernels<Q4_1W>(), make_kernels<Q5_0W>(), make_kernels<Q5_1W>(), make_kernels<Q8_0W>(),
    };
    return table;
}

}  // namespace tandem::cpu::q8_detail
