// RoPE and the fp16 KV-cache write per item (a Q or K pair, a K element past rope_dim, a V element), and one head's
// share of a step (head_epilogue): what rope_kv.cu's kernels and the Q/K/V matvec's RoPE epilogue
// (matvec_kernels.cuh, matvec_qkv_rope) both compute, from these functions, so the two give the same bits.
// kPastL1: the inputs were written by other blocks of the same launch (the epilogue), so they are read past L1.
// kTable: each angle's cosine and sine are read from the step's rope_trig_table rather than computed: the same
// values (that kernel computes them with the same expressions), and no cosf / sinf in the matvec kernels, whose
// slow path for large arguments (Payne-Hanek reduction) keeps an array in local memory under their register
// budgets (sm_90, 32 bytes of stack in every matvec kernel; a build error here).
#pragma once
#include "common.cuh"

namespace tandem::cuda::rope {

// The angle of pair i at position pos is float(pos) * inv_freq[i] in fp32, as the CPU backend computes it;
// cosf/sinf are the accurate ones. With kTable, token `tok` of the step (its row in the table) is at pos.
template <bool kTable>
__device__ __forceinline__ void cos_sin(const RopeKvArgs& a, int tok, int pos, int i, float& c, float& s) {
    if constexpr (kTable) {
        const float2 cs = reinterpret_cast<const float2*>(a.trig)[static_cast<size_t>(tok) * (a.rope_dim / 2) + i];
        c = cs.x;
        s = cs.y;
    } else {
        (void)tok;
        const float angle = static_cast<float>(pos) * a.inv_freq[i];
        c = cosf(angle);
        s = sinf(angle);
    }
}

__device__ __forceinline__ void rotate(float& a, float& b, float c, float s) {
    const float v0 = a, v1 = b;
    a = v0 * c - v1 * s;
    b = v0 * s + v1 * c;
}

__device__ __forceinline__ int start_position(const RopeKvArgs& a) {
    return a.device_start_pos ? *a.device_start_pos : a.start_pos;
}

// Where pair i of a head lies: (i, i + half) for NeoX halves, (2i, 2i + 1) for adjacent pairs.
__device__ __forceinline__ void pair_of(const RopeKvArgs& a, int i, int& ia, int& ib) {
    const bool neox = a.mode == RopeMode::NeoxHalves;
    ia = neox ? i : 2 * i;
    ib = neox ? i + a.rope_dim / 2 : 2 * i + 1;
}

// Pair i of head h of token tok's Q row (at position pos), rotated in place; the dims past rope_dim stay as they are.
template <bool kPastL1, bool kTable>
__device__ __forceinline__ void rotate_q_pair(const RopeKvArgs& a, float* q_row, int tok, int pos, int h, int i) {
    float* v = q_row + h * a.head_dim;
    int ia, ib;
    pair_of(a, i, ia, ib);
    float x0 = detail::load_input<kPastL1>(v + ia), x1 = detail::load_input<kPastL1>(v + ib), c, s;
    cos_sin<kTable>(a, tok, pos, i, c, s);
    rotate(x0, x1, c, s);
    v[ia] = x0;
    v[ib] = x1;
}

// Pair i of K head h rotated into the fp16 cache row.
template <bool kPastL1, bool kTable>
__device__ __forceinline__ void k_pair_f16(const RopeKvArgs& a, const float* k_row, uint16_t* cache_row, int tok,
                                           int pos, int h, int i) {
    int ia, ib;
    pair_of(a, i, ia, ib);
    ia += h * a.head_dim;
    ib += h * a.head_dim;
    float x0 = detail::load_input<kPastL1>(k_row + ia), x1 = detail::load_input<kPastL1>(k_row + ib), c, s;
    cos_sin<kTable>(a, tok, pos, i, c, s);
    rotate(x0, x1, c, s);
    cache_row[ia] = tandem_float_to_half(x0);
    cache_row[ib] = tandem_float_to_half(x1);
}

// rope_kv_write's checks of its arguments (host code; matvec_qkv_rope makes them too).
inline void check_args(const RopeKvArgs& a) {
    detail::require(a.n_tokens > 0 && a.start_pos >= 0 && a.n_heads > 0 && a.n_kv_heads > 0 && a.head_dim > 0,
                    "rope_kv_write: bad shape");
    detail::require(a.rope_dim % 2 == 0 && a.rope_dim >= 0 && a.rope_dim <= a.head_dim,
                    "rope_kv_write: rope_dim must be even and <= head_dim");
    detail::require(kv_type_supports(a.kv_type, a.n_kv_heads * a.head_dim),
                    "rope_kv_write: a Q8_0 cache needs n_kv_heads * head_dim to be a multiple of 32");
}

// What rope_kv_write does to head g of tokens token0 .. token0 + n_tok - 1 of a step (g < n_heads: Q head g, then
// the K heads, then the V heads), by every thread of one block: the Q pairs rotated in place, K rotated into the
// fp16 cache, V copied there, the angles from the step's trig table (a.trig). q, k, v: token token0's rows (n_heads
// and n_kv_heads heads wide), written by other blocks of the same launch (read past L1). The fp16 cache only: a
// Q8_0 cache's quantizer divides (an IEEE division calls a slow-path subroutine), and with it in the epilogue
// ptxas spilled 4 bytes in 8-bit kernels on sm_86-90 (2026-11-29); a Q8_0 cache keeps rope_kv_write's launch.
__device__ __forceinline__ void head_epilogue(const RopeKvArgs& a, int g, float* q, const float* k, const float* v,
                                              int token0, int n_tok) {
    const int hd = a.head_dim, half = a.rope_dim / 2, kv_dim = a.n_kv_heads * hd, q_dim = a.n_heads * hd;
    const int pos0 = start_position(a) + token0;
    const int tid = static_cast<int>(threadIdx.x), n_threads = static_cast<int>(blockDim.x);
    if (g < a.n_heads) {
        for (int p = tid; p < n_tok * half; p += n_threads) {
            const int t = p / half;
            rotate_q_pair<true, true>(a, q + static_cast<size_t>(t) * q_dim, token0 + t, pos0 + t, g, p % half);
        }
        return;
    }
    const bool is_k = g < a.n_heads + a.n_kv_heads;
    const int h = g - a.n_heads - (is_k ? 0 : a.n_kv_heads);
    const float* src = is_k ? k : v;
    uint16_t* cache = static_cast<uint16_t*>(is_k ? a.k_cache : a.v_cache);
    // K: its pairs, then its elements past rope_dim; V: its elements.
    const int per_token = is_k ? half + (hd - a.rope_dim) : hd;
    for (int p = tid; p < n_tok * per_token; p += n_threads) {
        const int t = p / per_token, item = p % per_token, pos = pos0 + t;
        const float* row = src + static_cast<size_t>(t) * kv_dim;
        uint16_t* cache_row = cache + static_cast<size_t>(pos) * kv_dim;
        if (is_k && item < half) {
            k_pair_f16<true, true>(a, row, cache_row, token0 + t, pos, h, item);
        } else {
            const int e = h * hd + (is_k ? a.rope_dim + item - half : item);
            cache_row[e] = tandem_float_to_half(detail::load_input<true>(row + e));
        }
    }
}

}  // namespace tandem::cuda::rope
