// Per-element dequantization of a GGUF row on the device, for every type the kernels read (F32, F16, BF16, Q8_0,
// Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K). Shared by the embedding gather (embedding.cu), the prefill GEMM's weight
// tiles and the dequantize-to-fp16 kernel (gemm.cu); its block helpers (scales, fifth bits) also serve the matvec
// Dots (matvec.cu, matvec_q8.cu) and the 8-bit GEMM (gemm_q8.cu). Element by element: with a compile-time type the switch
// folds away and the block's scale loads are common subexpressions of neighbouring elements.
#pragma once
#include "common.cuh"

namespace tandem::cuda::detail {

// Q4_K / Q5_K's 6-bit scale and min of sub-block j (ggml's get_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(const uint8_t* s, int j, int& sc, int& m) {
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// The same from the twelve scale bytes held in three words, bytes 0-3 (a), 4-7 (b) and 8-11 (c): j's byte in each
// is j % 4, picked with shifts (an array indexed by a lane-dependent j would go to local memory).
__device__ __forceinline__ void scale_min_k4_words(uint32_t a, uint32_t b, uint32_t c, int j, int& sc, int& m) {
    const int shift = 8 * (j % 4);
    const int sa = static_cast<int>((a >> shift) & 0xFF), sb = static_cast<int>((b >> shift) & 0xFF);
    const int s_hi = static_cast<int>((c >> shift) & 0xFF);  // byte j + 4 for j >= 4
    if (j < 4) {
        sc = sa & 63;
        m = sb & 63;
    } else {
        sc = (s_hi & 0xF) | ((sa >> 6) << 4);
        m = (s_hi >> 4) | ((sb >> 6) << 4);
    }
}

// Bit j (j < 4) of b moved to bit 4 of byte j: the fifth bits of four Q5_0 / Q5_1 codes.
__device__ __forceinline__ int spread_fifth_bits(uint32_t b) {
    return static_cast<int>(((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25));
}

// Element e of a row, decoded one at a time: its callers touch each weight once per row gather or per GEMM tile, so
// simplicity wins over the shared-load tricks of matvec. Layouts as in src/cpu/quant.h.
__device__ __forceinline__ float dequant_element(GgmlType type, const uint8_t* row, int e) {
    switch (type) {
        case GgmlType::F32: return reinterpret_cast<const float*>(row)[e];
        case GgmlType::F16: return tandem_half_to_float(reinterpret_cast<const uint16_t*>(row)[e]);
        case GgmlType::BF16: return __uint_as_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(row)[e]) << 16);
        case GgmlType::Q8_0: {
            const uint8_t* blk = row + 34 * (e / 32);
            return detail::load_half(blk) * static_cast<float>(static_cast<int8_t>(blk[2 + e % 32]));
        }
        case GgmlType::Q4_0:
        case GgmlType::Q4_1:
        case GgmlType::Q5_0:
        case GgmlType::Q5_1: {
            // Byte j of qs holds element j (low nibble) and j + 16 (high nibble); Q5 adds bit e of qh.
            const bool has_min = type == GgmlType::Q4_1 || type == GgmlType::Q5_1;
            const bool fifth = type == GgmlType::Q5_0 || type == GgmlType::Q5_1;
            const int bytes = type == GgmlType::Q4_0 ? 18 : type == GgmlType::Q4_1 ? 20 : type == GgmlType::Q5_0 ? 22 : 24;
            const int qh_off = has_min ? 4 : 2, qs_off = (has_min ? 4 : 2) + (fifth ? 4 : 0);
            const uint8_t* blk = row + bytes * (e / 32);
            const int j = e % 32;
            int q = j < 16 ? (blk[qs_off + j] & 0xF) : (blk[qs_off + j - 16] >> 4);
            if (fifth) q |= ((blk[qh_off + j / 8] >> (j % 8)) & 1) << 4;
            const float d = detail::load_half(blk);
            if (has_min) return d * static_cast<float>(q) + detail::load_half(blk + 2);
            return d * static_cast<float>(q - (fifth ? 16 : 8));
        }
        case GgmlType::Q2_K: {
            const uint8_t* blk = row + 84 * (e / 256);
            const int r = e % 256, c = r / 32, l = r % 32;
            const int sc = blk[2 * c + (l >= 16)];
            const int q = (blk[16 + 32 * (c / 4) + l] >> (2 * (c % 4))) & 3;
            return detail::load_half(blk + 80) * static_cast<float>(sc & 0xF) * static_cast<float>(q) -
                   detail::load_half(blk + 82) * static_cast<float>(sc >> 4);
        }
        case GgmlType::Q3_K: {
            const uint8_t* blk = row + 110 * (e / 256);
            const int r = e % 256, c = r / 32, l = r % 32, i = 2 * c + (l >= 16);
            const uint8_t* s = blk + 96;
            const int sc = ((i < 8 ? (s[i] & 0xF) : (s[i - 8] >> 4)) | (((s[8 + i % 4] >> (2 * (i / 4))) & 3) << 4)) - 32;
            const int q = ((blk[32 + 32 * (c / 4) + l] >> (2 * (c % 4))) & 3) - (((blk[l] >> c) & 1) ? 0 : 4);
            return detail::load_half(blk + 108) * static_cast<float>(sc) * static_cast<float>(q);
        }
        case GgmlType::Q4_K:
        case GgmlType::Q5_K: {
            const bool q5 = type == GgmlType::Q5_K;
            const uint8_t* blk = row + (q5 ? 176 : 144) * (e / 256);
            const int r = e % 256, c = r / 32, l = r % 32;
            int sc, m;
            scale_min_k4(blk + 4, c, sc, m);
            int q = (blk[(q5 ? 48 : 16) + 32 * (c / 2) + l] >> (4 * (c % 2))) & 0xF;
            if (q5) q |= ((blk[16 + l] >> c) & 1) << 4;
            return detail::load_half(blk) * static_cast<float>(sc) * static_cast<float>(q) -
                   detail::load_half(blk + 2) * static_cast<float>(m);
        }
        default: {  // Q6_K: chunk c = 4h + k of 32; low 4 bits in ql, high 2 bits in qh, int8 scale per 16
            const uint8_t* blk = row + 210 * (e / 256);
            const int r = e % 256, h = r / 128, k = (r % 128) / 32, l = r % 32;
            const int lo = (blk[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xF;
            const int hi = (blk[128 + 32 * h + l] >> (2 * k)) & 3;
            const int sc = static_cast<int8_t>(blk[192 + 2 * (4 * h + k) + (l >= 16)]);
            return detail::load_half(blk + 208) * static_cast<float>(sc) * static_cast<float>((lo | (hi << 4)) - 32);
        }
    }
}

}  // namespace tandem::cuda::detail
