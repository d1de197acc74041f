// The prefill GEMM's 8-bit tensor-core route (kernels.h gemm_q8): y[t][r] = dot(row r of W, x[t]) for every
// quantized type whose codes fit int8 (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K), with x quantized once per chunk
// into Q8_1 blocks.
//
// Why: the fp16 route (gemm.cu) first writes every weight of the matrix out as fp16 and reads it back, about 4.5x
// the bytes of a Q4_0 matrix, for each chunk; here the block codes go from the GGUF bytes straight into shared
// memory as int8 and through mma.sync m16n8k32 (s8 x s8 -> exact s32 sums of one 32-element block), and each
// block's integer sum is scaled in fp32 by the two blocks' scales: d_w d_x sum + m_w s_x (m_w: the weight block's
// offset, s_x = d_x * the sum of x's codes). Q2_K, Q3_K and Q6_K scale every 16 elements: their blocks go through
// two m16n8k16 instead, each half with its own scale (and, for Q2_K's offset, the half's own sum of x's codes,
// counted here from the codes). llama.cpp's MMQ kernels work the same way. Which route wins on a given
// GPU is measured by scripts/gpu-check; the emulation runs this kernel's whole logic, with the tensor-core
// instruction computed from the warp's fragments (emu/runtime.cpp).
//
// Tiling: a 128-thread block computes a 64-row x 64-token tile of y, each warp 32 x 32 (2 x 4 mma tiles of 16 x 8).
// Per stage it decodes 64 rows x 4 blocks of W (one block per thread and step: 8 words of codes, d and m, two of
// each for the types scaled every 16 elements) and copies 64 tokens x 4 Q8_1 blocks of x into shared memory; rows
// are padded by 4 words so that a fragment load (8 rows x 4 words per warp) hits 32 different banks.
#include "common.cuh"
#include "dequant.cuh"
#include "quantize_q8.cuh"

namespace tandem::cuda {
namespace {

constexpr int kTileRows = 64, kTileTokens = 64, kStageBlocks = 4, kThreads = 128;
constexpr int kRowWords = kStageBlocks * 8 + 4;  // a row's codes for one stage: 4 blocks x 8 words, and padding

// Four codes 0 .. 2 kBias - 1 per word minus the bias `kBias` (4, 8, 16 or 32), as signed bytes: (u + 128 - bias)
// lies in 0..255 without a carry between bytes, and flipping its top bit subtracts 128 in two's complement.
template <int kBias>
__device__ __forceinline__ uint32_t unbias(uint32_t u) {
    return (u + 0x01010101u * (128 - kBias)) ^ 0x80808080u;
}

// The types whose blocks carry an offset m (values d * code + m), which adds m_w s_x per block.
template <GgmlType T>
constexpr bool kHasOffset = T == GgmlType::Q4_1 || T == GgmlType::Q5_1 || T == GgmlType::Q4_K ||
                            T == GgmlType::Q5_K || T == GgmlType::Q2_K;

// Scales per 32-element block: 2 for the types that scale every 16 elements.
template <GgmlType T>
constexpr int kScales = T == GgmlType::Q2_K || T == GgmlType::Q3_K || T == GgmlType::Q6_K ? 2 : 1;

// One 32-element block of a weight row, decoded: codes[w] holds elements 4w..4w+3 as signed bytes, and the values
// of its part h (of kScales) are d[h] * code + m[h].
template <int kParts>
struct DecodedBlock {
    uint32_t codes[8];
    float d[kParts], m[kParts];
};

template <GgmlType T>
__device__ __forceinline__ void decode_block(const uint8_t* row, int b, DecodedBlock<kScales<T>>& out) {
    if constexpr (T == GgmlType::Q8_0) {
        const uint8_t* blk = row + 34 * b;
        out.d[0] = detail::load_half(blk);
        out.m[0] = 0.0f;
#pragma unroll
        for (int w = 0; w < 8; ++w) out.codes[w] = detail::load_u32_from_u16(blk + 2 + 4 * w);
    } else if constexpr (T == GgmlType::Q4_0 || T == GgmlType::Q4_1 || T == GgmlType::Q5_0 || T == GgmlType::Q5_1) {
        // Byte j of qs: element j (low nibble) and j + 16 (high nibble); Q5 adds bit e of qh as bit 4 of element e.
        constexpr bool kMin = kHasOffset<T>;
        constexpr bool kFifth = T == GgmlType::Q5_0 || T == GgmlType::Q5_1;
        constexpr int kBytes = T == GgmlType::Q4_0 ? 18 : T == GgmlType::Q4_1 ? 20 : T == GgmlType::Q5_0 ? 22 : 24;
        constexpr int kQh = kMin ? 4 : 2, kQs = kQh + (kFifth ? 4 : 0);
        const uint8_t* blk = row + kBytes * b;
        out.d[0] = detail::load_half(blk);
        out.m[0] = kMin ? detail::load_half(blk + 2) : 0.0f;
        const uint32_t qh = kFifth ? detail::load_u32_from_u16(blk + kQh) : 0u;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const uint32_t q = detail::load_u32_from_u16(blk + kQs + 4 * w);
            uint32_t lo = q & 0x0F0F0F0Fu, hi = (q >> 4) & 0x0F0F0F0Fu;
            if (kFifth) {
                lo |= static_cast<uint32_t>(detail::spread_fifth_bits(qh >> (4 * w)));
                hi |= static_cast<uint32_t>(detail::spread_fifth_bits(qh >> (16 + 4 * w)));
            }
            if (!kMin) {  // Q4_0: u - 8, Q5_0: u - 16, exact as signed bytes
                lo = kFifth ? unbias<16>(lo) : unbias<8>(lo);
                hi = kFifth ? unbias<16>(hi) : unbias<8>(hi);
            }
            out.codes[w] = lo;
            out.codes[4 + w] = hi;
        }
    } else if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
        // Q4_K (144 bytes) / Q5_K (176): sub-block j of super-block b / 8 is chunk j: qs byte 32 (j / 2) + e holds
        // element e of chunk j in its low (j even) or high nibble; Q5_K's fifth bit is bit j of qh[e]. Values:
        // d sc_j u - dmin m_j.
        constexpr bool kFifth = T == GgmlType::Q5_K;
        constexpr int kBytes = kFifth ? 176 : 144, kQs = kFifth ? 48 : 16;
        const int j = b % 8;
        const uint8_t* blk = row + kBytes * (b / 8);
        int sc, m;
        detail::scale_min_k4(blk + 4, j, sc, m);
        out.d[0] = detail::load_half(blk) * static_cast<float>(sc);
        out.m[0] = -(detail::load_half(blk + 2) * static_cast<float>(m));
        const int shift = 4 * (j % 2);
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            uint32_t u = (detail::load_u32_from_u16(blk + kQs + 32 * (j / 2) + 4 * w) >> shift) & 0x0F0F0F0Fu;
            if (kFifth) u |= ((detail::load_u32_from_u16(blk + 16 + 4 * w) >> j) & 0x01010101u) << 4;
            out.codes[w] = u;
        }
    } else if constexpr (T == GgmlType::Q2_K) {
        // 84 bytes: scales[16] (low nibble scale, high nibble min, per 16 elements), qs[64], d, dmin. Chunk j of the
        // super-block: element e in bits 2 (j % 4) of qs[32 (j / 4) + e]. Values: d sc u - dmin m, u in 0..3.
        const int j = b % 8;
        const uint8_t* blk = row + 84 * (b / 8);
        const float d = detail::load_half(blk + 80), dmin = detail::load_half(blk + 82);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int sc = blk[2 * j + h];
            out.d[h] = d * static_cast<float>(sc & 0xF);
            out.m[h] = -(dmin * static_cast<float>(sc >> 4));
        }
#pragma unroll
        for (int w = 0; w < 8; ++w)
            out.codes[w] = (detail::load_u32_from_u16(blk + 16 + 32 * (j / 4) + 4 * w) >> (2 * (j % 4))) & 0x03030303u;
    } else if constexpr (T == GgmlType::Q3_K) {
        // 110 bytes: hmask[32], qs[64], scales[12] (16 six-bit scales, biased by 32), d. Chunk j: low bits as Q2_K's,
        // bit j of hmask[e] set means code u, clear means u - 4; so (u | hbit << 2) - 4.
        const int j = b % 8;
        const uint8_t* blk = row + 110 * (b / 8);
        const uint8_t* s = blk + 96;
        const float d = detail::load_half(blk + 108);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int i = 2 * j + h;
            const int sc = ((i < 8 ? (s[i] & 0xF) : (s[i - 8] >> 4)) | (((s[8 + i % 4] >> (2 * (i / 4))) & 3) << 4)) - 32;
            out.d[h] = d * static_cast<float>(sc);
            out.m[h] = 0.0f;
        }
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            uint32_t u = (detail::load_u32_from_u16(blk + 32 + 32 * (j / 4) + 4 * w) >> (2 * (j % 4))) & 0x03030303u;
            u |= ((detail::load_u32_from_u16(blk + 4 * w) >> j) & 0x01010101u) << 2;
            out.codes[w] = unbias<4>(u);
        }
    } else {
        // Q6_K, 210 bytes: ql[128], qh[64], scales[16] (int8, per 16 elements), d. Chunk j = 4 h + k: element e's low
        // 4 bits in ql[64 h + 32 (k % 2) + e] (low nibble for k < 2), its high 2 bits at bit 2 k of qh[32 h + e];
        // code u - 32.
        static_assert(T == GgmlType::Q6_K, "decode_block: no int8 route for this type");
        const int j = b % 8, h = j / 4, k = j % 4;
        const uint8_t* blk = row + 210 * (b / 8);
        const float d = detail::load_half(blk + 208);
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            out.d[p] = d * static_cast<float>(static_cast<int8_t>(blk[192 + 2 * j + p]));
            out.m[p] = 0.0f;
        }
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            uint32_t u = (detail::load_u32_from_u16(blk + 64 * h + 32 * (k % 2) + 4 * w) >> (4 * (k / 2))) & 0x0F0F0F0Fu;
            u |= ((detail::load_u32_from_u16(blk + 128 + 32 * h + 4 * w) >> (2 * k)) & 0x03030303u) << 4;
            out.codes[w] = unbias<32>(u);
        }
    }
}

// At least 4 blocks (16 warps) per SM. Without a minimum ptxas held the kernel to 80 registers and spilled on
// sm_80 / sm_90; with it, 90-100 and no spill.
template <GgmlType T>
__global__ void __launch_bounds__(kThreads, 4)
    gemm_q8_kernel(const uint8_t* __restrict__ W, size_t row_bytes, int rows, int n_blocks,
                   const uint8_t* __restrict__ xq, int n_tokens, float* __restrict__ y) {
    // kS scales per block; scale h of block kb of tile row r at [(r * kStageBlocks + kb) * kS + h], and x's sums
    // s_x likewise (for one scale the Q8_1 block's s, for two the halves' sums counted here).
    constexpr int kS = kScales<T>;
    detail::wait_for_inputs();
    TANDEM_SHARED(uint32_t, w_codes, kTileRows * kRowWords);
    TANDEM_SHARED(uint32_t, x_codes, kTileTokens * kRowWords);
    TANDEM_SHARED(float, w_d, kTileRows * kStageBlocks * kS);
    TANDEM_SHARED(float, w_m, kTileRows * kStageBlocks * kS);
    TANDEM_SHARED(float, x_d, kTileTokens * kStageBlocks);
    TANDEM_SHARED(float, x_s, kTileTokens * kStageBlocks * kS);

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int g = lane / 4, t = lane % 4;
    const int warp_row = (warp % 2) * 32, warp_tok = (warp / 2) * 32;
    const int row0 = blockIdx.x * kTileRows, tok0 = blockIdx.y * kTileTokens;
    const size_t x_row_bytes = static_cast<size_t>(n_blocks) * q8::kQ8_1Bytes;

    float acc[2][4][4] = {};
    for (int b0 = 0; b0 < n_blocks; b0 += kStageBlocks) {
        __syncthreads();  // the previous stage's tiles have been read
        // Each thread fills (row, block) pairs tid and tid + 128 of W's stage, and the same pairs of x's.
#pragma unroll
        for (int p = tid; p < kTileRows * kStageBlocks; p += kThreads) {
            const int r = p / kStageBlocks, kb = p % kStageBlocks, b = b0 + kb;
            DecodedBlock<kS> blk{};
            if (row0 + r < rows && b < n_blocks)
                decode_block<T>(W + static_cast<size_t>(row0 + r) * row_bytes, b, blk);
#pragma unroll
            for (int w = 0; w < 8; ++w) w_codes[r * kRowWords + kb * 8 + w] = blk.codes[w];
#pragma unroll
            for (int h = 0; h < kS; ++h) {
                w_d[p * kS + h] = blk.d[h];
                w_m[p * kS + h] = blk.m[h];
            }

            const int tok = p / kStageBlocks;
            uint32_t codes[8] = {};
            float d = 0.0f, s = 0.0f;
            if (tok0 + tok < n_tokens && b < n_blocks) {
                const uint8_t* xb = xq + static_cast<size_t>(tok0 + tok) * x_row_bytes + q8::kQ8_1Bytes * b;
                d = detail::load_half(xb);
                s = detail::load_half(xb + 2);
#pragma unroll
                for (int w = 0; w < 8; ++w) codes[w] = *reinterpret_cast<const uint32_t*>(xb + 4 + 4 * w);
            }
#pragma unroll
            for (int w = 0; w < 8; ++w) x_codes[tok * kRowWords + kb * 8 + w] = codes[w];
            x_d[p] = d;
            if constexpr (kS == 1) {
                x_s[p] = s;
            } else if constexpr (kHasOffset<T>) {  // Q2_K: each half's own sum, d_x * its codes' sum
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    int sum = 0;
#pragma unroll
                    for (int w = 4 * h; w < 4 * h + 4; ++w) sum = __dp4a(static_cast<int>(codes[w]), 0x01010101, sum);
                    x_s[p * 2 + h] = d * static_cast<float>(sum);
                }
            }
        }
        __syncthreads();

        const int stage_blocks = n_blocks - b0 < kStageBlocks ? n_blocks - b0 : kStageBlocks;
        for (int kb = 0; kb < stage_blocks; ++kb) {
            uint32_t a[2][4], bf[4][2];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                const uint32_t* lo = &w_codes[(warp_row + 16 * mt + g) * kRowWords + kb * 8 + t];
                const uint32_t* hi = lo + 8 * kRowWords;
                a[mt][0] = lo[0], a[mt][1] = hi[0], a[mt][2] = lo[4], a[mt][3] = hi[4];
            }
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const uint32_t* c = &x_codes[(warp_tok + 8 * nt + g) * kRowWords + kb * 8 + t];
                bf[nt][0] = c[0], bf[nt][1] = c[4];
            }
            // The scales of this thread's accumulator rows (g, g + 8 of each row tile, v); a token tile's (2t, 2t + 1)
            // are read next to its products, which keeps 16 registers free.
            float rd[2][2][kS], rm[2][2][kS];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int v = 0; v < 2; ++v)
#pragma unroll
                    for (int h = 0; h < kS; ++h) {
                        const int at = ((warp_row + 16 * mt + 8 * v + g) * kStageBlocks + kb) * kS + h;
                        rd[mt][v][h] = w_d[at];
                        rm[mt][v][h] = kHasOffset<T> ? w_m[at] : 0.0f;
                    }
            const int zero[4] = {0, 0, 0, 0};
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                float td[2], ts[2][kS];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int at = (warp_tok + 8 * nt + 2 * t + e) * kStageBlocks + kb;
                    td[e] = x_d[at];
#pragma unroll
                    for (int h = 0; h < kS; ++h) ts[e][h] = kHasOffset<T> ? x_s[at * kS + h] : 0.0f;
                }
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) {
                    int sum[kS][4];
                    if constexpr (kS == 1) {
                        detail::mma_s8_m16n8k32(sum[0], a[mt], bf[nt], zero);
                    } else {  // k 0..15 and 16..31: the k = 32 fragments' halves (common.cuh)
                        const uint32_t lo[2] = {a[mt][0], a[mt][1]}, hi[2] = {a[mt][2], a[mt][3]};
                        detail::mma_s8_m16n8k16(sum[0], lo, bf[nt][0], zero);
                        detail::mma_s8_m16n8k16(sum[1], hi, bf[nt][1], zero);
                    }
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        const int v = i / 2, e = i % 2;
#pragma unroll
                        for (int h = 0; h < kS; ++h) {
                            acc[mt][nt][i] = fmaf(static_cast<float>(sum[h][i]), rd[mt][v][h] * td[e], acc[mt][nt][i]);
                            if (kHasOffset<T>) acc[mt][nt][i] = fmaf(rm[mt][v][h], ts[e][h], acc[mt][nt][i]);
                        }
                    }
                }
            }
        }
    }

#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = row0 + warp_row + 16 * mt + 8 * (i / 2) + g;
                const int tok = tok0 + warp_tok + 8 * nt + 2 * t + i % 2;
                if (r < rows && tok < n_tokens) y[static_cast<size_t>(tok) * rows + r] = acc[mt][nt][i];
            }
}

}  // namespace

bool gemm_q8_supports(GgmlType type) {
    switch (type) {
        case GgmlType::Q8_0:
        case GgmlType::Q4_0:
        case GgmlType::Q4_1:
        case GgmlType::Q5_0:
        case GgmlType::Q5_1:
        case GgmlType::Q2_K:
        case GgmlType::Q3_K:
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
        case GgmlType::Q6_K: return true;
        default: return false;
    }
}

void gemm_q8(GgmlType type, const void* W, size_t row_bytes, int rows, int cols, const void* xq, int n_tokens,
             float* y, Stream stream) {
    detail::require(rows > 0 && cols > 0 && n_tokens > 0, "gemm_q8: empty shape");
    detail::require(gemm_q8_supports(type), "gemm_q8: no 8-bit route for this weight type");
    detail::require(cols % ggml_type_info(type).block_size == 0, "gemm_q8: cols must be whole blocks");
    detail::require(n_tokens <= 65535 * kTileTokens, "gemm_q8: too many tokens");
    detail::require(reinterpret_cast<uintptr_t>(W) % 2 == 0 && reinterpret_cast<uintptr_t>(xq) % 4 == 0,
                    "gemm_q8: W must be 2-byte and xq 4-byte aligned");
    const dim3 grid((rows + kTileRows - 1) / kTileRows, (n_tokens + kTileTokens - 1) / kTileTokens);
    const auto* w = static_cast<const uint8_t*>(W);
    const auto* x = static_cast<const uint8_t*>(xq);
    const int n_blocks = cols / 32;
    switch (type) {
#define TANDEM_GEMM_Q8_CASE(T)                                                                                     \
    case GgmlType::T:                                                                                              \
        return detail::launch_kernel("gemm_q8_kernel<" #T ">", gemm_q8_kernel<GgmlType::T>, grid, dim3(kThreads), 0, \
                                     stream, w, row_bytes, rows, n_blocks, x, n_tokens, y);
        TANDEM_GEMM_Q8_CASE(Q8_0)
        TANDEM_GEMM_Q8_CASE(Q4_0)
        TANDEM_GEMM_Q8_CASE(Q4_1)
        TANDEM_GEMM_Q8_CASE(Q5_0)
        TANDEM_GEMM_Q8_CASE(Q5_1)
        TANDEM_GEMM_Q8_CASE(Q2_K)
        TANDEM_GEMM_Q8_CASE(Q3_K)
        TANDEM_GEMM_Q8_CASE(Q4_K)
        TANDEM_GEMM_Q8_CASE(Q5_K)
        TANDEM_GEMM_Q8_CASE(Q6_K)
#undef TANDEM_GEMM_Q8_CASE
        default: break;
    }
}

}  // namespace tandem::cuda
