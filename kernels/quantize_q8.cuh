// Quantizing fp32 activations to the 8-bit route's blocks (kernels.h, matvec_q8): one warp per block, so any kernel
// that has a row in global memory can quantize it in place of a separate launch (quantize_activations in
// matvec_q8.cu; the fused outputs of rms_norm.cu and swiglu.cu), or, for Q8_1, eight lanes per block from float4s a
// kernel holds in registers (rms_norm.cu's register kernel). The operations are the CPU's (cpu/quant_q8.cpp): the
// maximum |x| (exact in any order), one IEEE division for the inverse scale, one rounding multiply, round half to
// even, a clamp to +-127; so the codes and scales come out bitwise the same.
#pragma once
#include "common.cuh"

namespace tandem::cuda::q8 {

constexpr int kQ8_1Bytes = 36;   // fp16 d, fp16 s, 32 codes
constexpr int kQ8_KBytes = 292;  // fp32 d, 256 codes, 16 int16 sums
constexpr int kQ8_KCodes = 4, kQ8_KSums = 260;
constexpr int kQuantWarps = 4;  // warps (blocks quantized at once) per CUDA block of the one-warp-per-block kernels

// The format the 8-bit route quantizes a weight type's input to (kernels.h q8_activation_format), for host and
// device code.
__host__ __device__ constexpr Q8Format format_for(GgmlType type) {
    switch (type) {
        case GgmlType::Q8_0:
        case GgmlType::Q4_0:
        case GgmlType::Q4_1:
        case GgmlType::Q5_0:
        case GgmlType::Q5_1: return Q8Format::Q8_1;
        case GgmlType::Q2_K:
        case GgmlType::Q3_K:
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
        case GgmlType::Q6_K: return Q8Format::Q8_K;
        default: return Q8Format::None;
    }
}

// A format's block: Q8_K (k_quant) 256 elements in 292 bytes, Q8_1 32 in 36.
__host__ __device__ constexpr int block_elems(bool k_quant) { return k_quant ? 256 : 32; }
__host__ __device__ constexpr int block_bytes(bool k_quant) { return k_quant ? kQ8_KBytes : kQ8_1Bytes; }

// A kernel's optional quantized output, checked on the host: q8_for has the 8-bit route, rows of `row_elems` are
// whole blocks of its format, xq is 4-byte aligned. Returns whether the format is Q8_K.
inline bool checked_output(GgmlType q8_for, const void* xq, int64_t row_elems, const char* what) {
    const Q8Format f = q8_activation_format(q8_for);
    detail::require(f != Q8Format::None, what);
    detail::require(row_elems > 0 && row_elems % block_elems(f == Q8Format::Q8_K) == 0, what);
    detail::require(reinterpret_cast<uintptr_t>(xq) % 4 == 0, what);
    return f == Q8Format::Q8_K;
}

// One 8-bit code: v times the inverse scale, rounded half to even, clamped to +-127 (the CPU's operations).
__device__ __forceinline__ int code_q8(float v, float inverse_scale) {
    const int q = __float2int_rn(v * inverse_scale);
    return q < -127 ? -127 : q > 127 ? 127 : q;
}

// Q8_1: lane j quantizes element j of the 32 at xb into the block at blk. Every lane of the warp calls it.
template <bool kPastL1 = false>
__device__ __forceinline__ void quantize_block_q8_1(const float* xb, uint8_t* blk, int lane) {
    const float v = detail::load_input<kPastL1>(xb + lane);
    const float amax = detail::warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const int q = code_q8(v, id);
    int sum = q;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(detail::kFullMask, sum, offset);
    blk[4 + lane] = static_cast<uint8_t>(static_cast<int8_t>(q));
    if (lane == 0) {
        reinterpret_cast<uint16_t*>(blk)[0] = tandem_float_to_half(d);
        reinterpret_cast<uint16_t*>(blk)[1] = tandem_float_to_half(d * static_cast<float>(sum));
    }
}

// Q8_1 from registers, for a kernel that holds its row as float4s: lane j of each aligned group of eight lanes holds
// elements 4j..4j+3 of one block (v) and writes them into the block at blk (`store`: the group's block is inside the
// row; a group is all in or all out). The same operations as quantize_block_q8_1 (the maximum and the integer sum are
// exact in any order), so the same bytes, without the block's round trip through memory and the barrier before it.
// Every lane of the warp calls it.
__device__ __forceinline__ void quantize_float4_q8_1(float4 v, uint8_t* blk, int part, bool store) {
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int offset = 4; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(detail::kFullMask, amax, offset));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const float e[4] = {v.x, v.y, v.z, v.w};
    uint32_t packed = 0;
    int sum = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int q = code_q8(e[k], id);
        sum += q;
        packed |= static_cast<uint32_t>(q & 0xFF) << (8 * k);
    }
#pragma unroll
    for (int offset = 4; offset > 0; offset >>= 1) sum += __shfl_xor_sync(detail::kFullMask, sum, offset);
    if (!store) return;
    reinterpret_cast<uint32_t*>(blk + 4)[part] = packed;
    if (part == 0) {
        reinterpret_cast<uint16_t*>(blk)[0] = tandem_float_to_half(d);
        reinterpret_cast<uint16_t*>(blk)[1] = tandem_float_to_half(d * static_cast<float>(sum));
    }
}

// Q8_K: lane l quantizes elements 8l..8l+7 of the 256 at xb (16-byte aligned); lanes 2g and 2g+1 make the sum of
// group g. The scale's sign is that of the first element of largest magnitude (ggml's rule, as the CPU's). Every
// lane of the warp calls it.
__device__ __forceinline__ void quantize_block_q8_k(const float* xb, uint8_t* blk, int lane) {
    const float4 v0 = *reinterpret_cast<const float4*>(xb + 8 * lane);
    const float4 v1 = *reinterpret_cast<const float4*>(xb + 8 * lane + 4);
    const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    float local = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) local = fmaxf(local, fabsf(v[k]));
    const float amax = detail::warp_max(local);
    int first = 256;
#pragma unroll
    for (int k = 7; k >= 0; --k)
        if (fabsf(v[k]) == amax) first = 8 * lane + k;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const int other = __shfl_xor_sync(detail::kFullMask, first, offset);
        first = other < first ? other : first;
    }
    const float iscale = amax != 0.0f ? -127.0f / xb[first] : 0.0f;
    uint32_t packed[2] = {0, 0};
    int sum = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const int q = code_q8(v[k], iscale);
        sum += q;
        packed[k / 4] |= static_cast<uint32_t>(q & 0xFF) << (8 * (k % 4));
    }
    reinterpret_cast<uint32_t*>(blk + kQ8_KCodes)[2 * lane] = packed[0];
    reinterpret_cast<uint32_t*>(blk + kQ8_KCodes)[2 * lane + 1] = packed[1];
    sum += __shfl_xor_sync(detail::kFullMask, sum, 1);
    if (lane % 2 == 0) reinterpret_cast<int16_t*>(blk + kQ8_KSums)[lane / 2] = static_cast<int16_t>(sum);
    // An all-zero block is all zeros, d included (the CPU clears it).
    if (lane == 0) *reinterpret_cast<float*>(blk) = amax != 0.0f ? 1.0f / iscale : 0.0f;
}

// Block b of a row in either format: the first `cols / block` blocks of x into the row at out.
__device__ __forceinline__ void quantize_block(bool k_quant, const float* x, uint8_t* out, int b, int lane) {
    const float* xb = x + static_cast<size_t>(block_elems(k_quant)) * b;
    uint8_t* blk = out + static_cast<size_t>(block_bytes(k_quant)) * b;
    if (k_quant)
        quantize_block_q8_k(xb, blk, lane);
    else
        quantize_block_q8_1(xb, blk, lane);
}

}  // namespace tandem::cuda::q8
