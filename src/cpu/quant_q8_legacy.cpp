// Integer (8-bit activation) dot-product kernels of the 32-element weight types Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0:
// one AVX2 and one portable scalar kernel per type, plugged into the rows x tokens driver of quant_q8_driver.h, and
// the table legacy_q8_kernels() that quant_q8.cpp looks them up in.
//
// Arithmetic (llama.cpp's, so that our products are close to its): a weight block and an activation block give an
// exact integer sum of 32 code products; it becomes a float, is multiplied by d_w * d_x (the product of the two
// fp16 scales, rounded once) and accumulated. The types with an offset (value = q * d + m: Q4_1, Q5_1) pair with
// Q8_1 activations, whose block carries s = d_x * sum(q_x), so the offset costs one m_w * s_x per block.
//
// Batch invariance: a tile decodes each weight block once and then runs the same per-token code on it; every
// token has its own accumulators, chosen by the block's index in the row (never by T or by the token's place in the
// tile), and all float arithmetic is explicit intrinsics (the scalar kernel writes the same expressions in every
// tile width), so a (row, token) result is bitwise the same in any tile.
#include <cstring>
#include <span>

#include "cpu/fp16.h"
#include "cpu/quant.h"
#include "cpu/quant_q8_driver.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TANDEM_Q8L_SIMD 1
#include <immintrin.h>
#endif

#define TANDEM_Q8L_INLINE inline __attribute__((always_inline))

namespace tandem::cpu::q8_detail {
namespace {

TANDEM_Q8L_INLINE uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
TANDEM_Q8L_INLINE uint32_t load_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

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
//   codes(blk, q)              the 32 integer codes in element order (scalar kernel)
//   codes32(blk)               (SIMD) the same as 32 bytes of a register

#ifdef TANDEM_Q8L_SIMD
// qs[16] of the 4-bit types as 32 bytes: low nibbles are elements 0..15, high nibbles elements 16..31. The 16 bytes
// are loaded into both halves; shifting the upper half's 64-bit lanes right by 4 brings each byte's high nibble
// down (the low nibble of the next byte lands in its top half, and the mask removes it).
TANDEM_Q8L_INLINE __m256i nibbles32(const uint8_t* qs) {
    const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
    return _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(0x0F));
}

// Byte e = 0xFF where bit e of the little-endian qh[4] is set, 0 where it is clear: byte e gets a copy of qh byte
// e / 8, keeps only bit e % 8, and is compared with that bit.
TANDEM_Q8L_INLINE __m256i bit_bytes32(const uint8_t* qh) {
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
    const __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(load_u32(qh))), spread);
    return _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
}
#endif

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
#ifdef TANDEM_Q8L_SIMD
    static TANDEM_Q8L_INLINE __m256i codes32(const uint8_t* blk) {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offsetof(BlockQ8_0, qs)));
    }
#endif
};

struct Q4_0W {
    static constexpr GgmlType kType = GgmlType::Q4_0;
    static constexpr size_t kBytes = sizeof(BlockQ4_0);
    static constexpr bool kSigned = true;
    using Act = ActQ8_0;
    static void codes(const uint8_t* blk, int8_t q[32]) {
        unpack_nibbles(blk + offsetof(BlockQ4_0, qs), nullptr, 8, q);
    }
#ifdef TANDEM_Q8L_SIMD
    static TANDEM_Q8L_INLINE __m256i codes32(const uint8_t* blk) {
        return _mm256_sub_epi8(nibbles32(blk + offsetof(BlockQ4_0, qs)), _mm256_set1_epi8(8));
    }
#endif
};

struct Q4_1W {
    static constexpr GgmlType kType = GgmlType::Q4_1;
    static constexpr size_t kBytes = sizeof(BlockQ4_1);
    static constexpr bool kSigned = false;
    using Act = ActQ8_1;
    static void codes(const uint8_t* blk, int8_t q[32]) {
        unpack_nibbles(blk + offsetof(BlockQ4_1, qs), nullptr, 0, q);
    }
#ifdef TANDEM_Q8L_SIMD
    static TANDEM_Q8L_INLINE __m256i codes32(const uint8_t* blk) { return nibbles32(blk + offsetof(BlockQ4_1, qs)); }
#endif
};

struct Q5_0W {
    static constexpr GgmlType kType = GgmlType::Q5_0;
    static constexpr size_t kBytes = sizeof(BlockQ5_0);
    static constexpr bool kSigned = true;
    using Act = ActQ8_0;
    static void codes(const uint8_t* blk, int8_t q[32]) {
        unpack_nibbles(blk + offsetof(BlockQ5_0, qs), blk + offsetof(BlockQ5_0, qh), 16, q);
    }
#ifdef TANDEM_Q8L_SIMD
    // q5 - 16 = nibble - 16 * (1 - bit): where the fifth bit is clear the result is the nibble minus 16, which as
    // an int8 is the nibble with the top four bits set (0xF0 | nibble); where it is set it is the nibble itself.
    // So one OR with 0xF0 on the clear bits replaces building q5 and subtracting.
    static TANDEM_Q8L_INLINE __m256i codes32(const uint8_t* blk) {
        const __m256i clear_hi = _mm256_andnot_si256(bit_bytes32(blk + offsetof(BlockQ5_0, qh)),
                                                     _mm256_set1_epi8(static_cast<char>(0xF0)));
        return _mm256_or_si256(nibbles32(blk + offsetof(BlockQ5_0, qs)), clear_hi);
    }
#endif
};

struct Q5_1W {
    static constexpr GgmlType kType = GgmlType::Q5_1;
    static constexpr size_t kBytes = sizeof(BlockQ5_1);
    static constexpr bool kSigned = false;
    using Act = ActQ8_1;
    static void codes(const uint8_t* blk, int8_t q[32]) {
        unpack_nibbles(blk + offsetof(BlockQ5_1, qs), blk + offsetof(BlockQ5_1, qh), 0, q);
    }
#ifdef TANDEM_Q8L_SIMD
    static TANDEM_Q8L_INLINE __m256i codes32(const uint8_t* blk) {
        const __m256i hi = _mm256_and_si256(bit_bytes32(blk + offsetof(BlockQ5_1, qh)), _mm256_set1_epi8(0x10));
        return _mm256_or_si256(nibbles32(blk + offsetof(BlockQ5_1, qs)), hi);
    }
#endif
};

// ---- portable kernel -------------------------------------------------------------------------------------------
// Per token and block: sumi = sum q_w * q_x (int), acc += float(sumi) * (d_w * d_x); the offset types also add
// m_w * s_x into a second accumulator, added to the first at the end. Plain expressions, the same in every tile
// width (a compiler allowed to contract them does so alike for every T).
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
                acc[t] += static_cast<float>(sumi) * (dw * dx);
                if constexpr (!W::kSigned) macc[t] += mw * fp16_to_fp32(load_u16(xb + 2));
            }
        }
        for (int t = 0; t < T; ++t) out[t] = W::kSigned ? acc[t] : acc[t] + macc[t];
    }
};

// ---- AVX2 kernel -------------------------------------------------------------------------------------------------
#ifdef TANDEM_Q8L_SIMD

// Sum of the 8 lanes in a fixed order: (lo128 + hi128), then the two 64-bit halves, then the last pair.
TANDEM_Q8L_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// The integer products. maddubs multiplies unsigned bytes of its first operand by signed bytes of its second and
// adds adjacent pairs into saturating int16; madd with ones then adds adjacent int16 pairs into int32, so each of
// the 8 lanes holds the exact sum of 4 products.
//
// Signed codes (Q4_0, Q5_0, Q8_0) go through the sign trick: |q_w| is unsigned, and sign(q_x, q_w) moves q_w's
// sign onto q_x (zeroing it where q_w = 0), so |q_w| * sign(q_x, q_w) = q_w * q_x. |q_w| <= 128 and the quantizer's
// codes satisfy |q_x| <= 127 (x * 127 / amax rounds to at most 127 in magnitude, so -128 never appears and its
// negation cannot wrap), so a pair is at most 2 * 128 * 127 = 32512: no int16 saturation. Unsigned codes (Q4_1,
// Q5_1: 0..31) go in directly: 2 * 31 * 127 = 7874.
template <bool kSigned>
TANDEM_Q8L_INLINE __m256 dot32(__m256i qw, __m256i aw, __m256i qx) {
    const __m256i pairs = kSigned ? _mm256_maddubs_epi16(aw, _mm256_sign_epi8(qx, qw)) : _mm256_maddubs_epi16(qw, qx);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

// One weight block against T tokens, into acc (the even or the odd set, by the block's index in the row). The
// block's codes and scales are decoded once; the per-token code is the same for every t.
//   weight scales: [d_w, 0, 0, 0] from a 2-byte load, or [d_w, m_w, 0, 0] from the 4 bytes d, m of the offset types
//   token scales:  [d_x, s_x, ...] from the first 4 bytes of its block (d then s; for Q8_0 activations lane 1 is
//                  two codes read as an fp16 and is never used: the signed types multiply lane 0 only)
// The offset types add m_w * s_x (lane 1 of the product) into macc, a separate sum per token as in llama.cpp.
// (Forming the products of 2 blocks x 4 tokens in one vector was tried: no faster, and slower for Q4_1 / Q5_1.)
template <class W, int T>
TANDEM_Q8L_INLINE void block_avx2(const uint8_t* blk, const uint8_t* xb, size_t xq_stride, __m256 (&acc)[T],
                                  __m128 (&macc)[T]) {
    using Act = typename W::Act;
    const __m256i qw = W::codes32(blk);
    const __m256i aw = W::kSigned ? _mm256_sign_epi8(qw, qw) : qw;   // |q_w| (as abs_epi8: -128 gives 128)
    const __m128 ws = W::kSigned ? _mm_cvtph_ps(_mm_cvtsi32_si128(load_u16(blk)))
                                 : _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(load_u32(blk))));
    for (int t = 0; t < T; ++t) {
        const uint8_t* x = xb + t * xq_stride;
        const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + Act::kQs));
        const __m256 sum = dot32<W::kSigned>(qw, aw, qx);
        const __m128 xs = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(load_u32(x))));
        if constexpr (W::kSigned) {
            const __m128 d = _mm_mul_ss(ws, xs);   // d_w * d_x in lane 0
            acc[t] = _mm256_fmadd_ps(sum, _mm256_broadcastss_ps(d), acc[t]);
        } else {
            const __m128 d = _mm_mul_ps(ws, xs);   // [d_w * d_x, m_w * s_x, 0, 0]
            acc[t] = _mm256_fmadd_ps(sum, _mm256_broadcastss_ps(d), acc[t]);
            macc[t] = _mm_add_ps(macc[t], d);      // lane 1 sums m_w * s_x
        }
    }
}

// Tiles of up to 4 tokens: 4 x 2 accumulators (+ 4 offset sums) and the decoded block fit in the 16 registers.
template <class W>
struct Avx2Kernel {
    static constexpr int kMaxTile = 4;
    using Act = typename W::Act;

    // Even and odd blocks go to two accumulator sets, so consecutive blocks do not wait on each other's FMA latency
    // (the split is by block index, the same for every T).
    template <int T>
    static void tile(const uint8_t* row, int64_t cols, const uint8_t* xq, size_t xq_stride, float* out) {
        __m256 even[T], odd[T];
        __m128 macc[T];
        for (int t = 0; t < T; ++t) {
            even[t] = odd[t] = _mm256_setzero_ps();
            macc[t] = _mm_setzero_ps();
        }
        const int64_t n_blocks = cols / 32;
        int64_t b = 0;
        for (; b + 1 < n_blocks; b += 2) {
            block_avx2<W, T>(row + b * W::kBytes, xq + b * Act::kBytes, xq_stride, even, macc);
            block_avx2<W, T>(row + (b + 1) * W::kBytes, xq + (b + 1) * Act::kBytes, xq_stride, odd, macc);
        }
        if (b < n_blocks) block_avx2<W, T>(row + b * W::kBytes, xq + b * Act::kBytes, xq_stride, even, macc);
        for (int t = 0; t < T; ++t) {
            float r = hsum8(_mm256_add_ps(even[t], odd[t]));
            if constexpr (!W::kSigned) r += _mm_cvtss_f32(_mm_movehdup_ps(macc[t]));
            out[t] = r;
        }
    }
};

#endif  // TANDEM_Q8L_SIMD

template <class W>
constexpr Q8TypeKernels make_kernels() {
#ifdef TANDEM_Q8L_SIMD
    constexpr DotRowsQ8Fn fast = &dot_rows<Avx2Kernel<W>>;
#else
    constexpr DotRowsQ8Fn fast = &dot_rows<ScalarKernel<W>>;
#endif
    return Q8TypeKernels{W::kType, W::Act::kFormat, fast, &dot_rows<ScalarKernel<W>>};
}

constexpr Q8TypeKernels kLegacyKernels[] = {
    make_kernels<Q4_0W>(), make_kernels<Q4_1W>(), make_kernels<Q5_0W>(), make_kernels<Q5_1W>(), make_kernels<Q8_0W>(),
};

}  // namespace

std::span<const Q8TypeKernels> legacy_q8_kernels() { return kLegacyKernels; }

}  // namespace tandem::cpu::q8_detail
