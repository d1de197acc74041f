// RoPE on Q and K fused with the KV-cache write: Q is rotated in place, K is rotated straight into the cache and V
// is stored there, in either cache type (kernels.h: KvType): fp16 halves, or ggml Q8_0 blocks quantized in
// registers (a warp per 32-value block). Both pairings: adjacent (2i, 2i+1) and NeoX halves. The fp16 items are
// rope_kv.cuh's, which the Q/K/V matvec's RoPE epilogue (matvec_qkv_rope) shares; so are the angles (cos_sin),
// which rope_trig_table computes once a step for that epilogue.
//
// Grid: (token, slice). A token's work is spread over enough blocks that each thread has about one item (a Q or K
// pair, a tail or V element, a warp's Q8_0 block): a decode step has one token, and one block would walk its
// thousands of elements one after another, a dependent memory round trip for each.
#include <algorithm>

#include "common.cuh"
#include "rope_kv.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxSlices = 64;  // blocks per token at most; past that the threads loop
constexpr int kQ8Block = 32, kQ8BlockBytes = 34;  // ggml block_q8_0: fp16 d, int8 qs[32]

// The fp16 cache. One flat list of a token's items: Q pairs, K pairs, K's elements past rope_dim, V elements.
__global__ void __launch_bounds__(kThreads) rope_kv_kernel(RopeKvArgs a) {
    detail::wait_for_inputs();
    const int tok = blockIdx.x, pos = rope::start_position(a) + tok, half = a.rope_dim / 2, hd = a.head_dim;
    const int kv_dim = a.n_kv_heads * hd, tail = hd - a.rope_dim;
    const int n_q = a.n_heads * half, n_k = a.n_kv_heads * half, n_tail = a.n_kv_heads * tail;
    const int n_items = n_q + n_k + n_tail + kv_dim;
    float* q = a.q + static_cast<size_t>(tok) * a.n_heads * hd;
    const float* k = a.k + static_cast<size_t>(tok) * kv_dim;
    const float* v = a.v + static_cast<size_t>(tok) * kv_dim;
    const int row = a.ring > 0 ? pos % a.ring : pos;  // a sliding-window layer's ring
    uint16_t* kc = static_cast<uint16_t*>(a.k_cache) + static_cast<size_t>(row) * kv_dim;
    uint16_t* vc = static_cast<uint16_t*>(a.v_cache) + static_cast<size_t>(row) * kv_dim;
    const int stride = static_cast<int>(gridDim.y * blockDim.x);
    for (int p = blockIdx.y * blockDim.x + threadIdx.x; p < n_items; p += stride) {
        if (p < n_q) {
            rope::rotate_q_pair<false, false>(a, q, tok, pos, p / half, p % half);
        } else if (p < n_q + n_k) {
            rope::k_pair_f16<false, false>(a, k, kc, tok, pos, (p - n_q) / half, (p - n_q) % half);
        } else if (p < n_q + n_k + n_tail) {
            const int t = p - n_q - n_k;
            const int e = (t / tail) * hd + a.rope_dim + t % tail;
            kc[e] = tandem_float_to_half(k[e]);
        } else {
            const int e = p - n_q - n_k - n_tail;
            vc[e] = tandem_float_to_half(v[e]);
        }
    }
}

// Element e of a K row after RoPE, computed alone (each lane of a Q8_0 block needs its own value, and a pair's two
// elements may lie in different blocks, NeoX halves always), with pair i's cosine and sine from the block's table.
// The expressions are rotate()'s, so the value is the one rotate() gives that element.
__device__ __forceinline__ float rotated_k(const RopeKvArgs& a, const float* k, int e, const float2* angles) {
    const int hd = a.head_dim, j = e % hd, half = a.rope_dim / 2;
    if (j >= a.rope_dim) return k[e];
    const int base = e - j;
    int i, ia, ib;
    if (a.mode == RopeMode::NeoxHalves) {
        i = j < half ? j : j - half;
        ia = i, ib = i + half;
    } else {
        i = j / 2;
        ia = 2 * i, ib = 2 * i + 1;
    }
    const float c = angles[i].x, s = angles[i].y;
    const float v0 = k[base + ia], v1 = k[base + ib];
    return j == ia ? v0 * c - v1 * s : v0 * s + v1 * c;
}

// One Q8_0 block from 32 values, lane l holding value l, as ggml's quantize_row_q8_0_ref: d = amax / 127 and
// code = round(x * (1 / d)) from the fp32 d, d stored as fp16. The max is exact in any order.
__device__ __forceinline__ void store_q8_0(uint8_t* block, float x, int lane) {
    const float amax = detail::warp_max(fabsf(x));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    block[2 + lane] = static_cast<uint8_t>(static_cast<int8_t>(roundf(x * id)));
    if (lane == 0) *reinterpret_cast<uint16_t*>(block) = tandem_float_to_half(d);  // blocks sit at 2-byte alignment
}

// The Q8_0 cache: a token's blocks first table the position's cosines and sines (one per pair, shared by every Q and
// K head), then rotate its Q pairs, a thread each, then quantize its K and V blocks, a warp each. With the angles
// computed in one place, cosf / sinf's slow path (Payne-Hanek reduction) is in one loop: computed inside both
// rotation loops, its array went to a 32-byte stack frame once the ring's row was added (sm_80-90, 2026-12-07).
constexpr int kMaxPairs = 128;  // rope_dim <= 256 (the attention kernels' largest head)
__global__ void __launch_bounds__(kThreads) rope_kv_q8_0_kernel(RopeKvArgs a) {
    TANDEM_SHARED(float2, angles, kMaxPairs);
    detail::wait_for_inputs();
    const int tok = blockIdx.x, pos = rope::start_position(a) + tok, half = a.rope_dim / 2, hd = a.head_dim;
    for (int i = static_cast<int>(threadIdx.x); i < half; i += static_cast<int>(blockDim.x)) {
        float c, s;
        rope::cos_sin<false>(a, 0, pos, i, c, s);
        angles[i] = make_float2(c, s);
    }
    __syncthreads();
    const int n_q = a.n_heads * half, stride = static_cast<int>(gridDim.y * blockDim.x);
    float* q = a.q + static_cast<size_t>(tok) * a.n_heads * hd;
    for (int p = blockIdx.y * blockDim.x + threadIdx.x; p < n_q; p += stride) {
        int ia, ib;
        rope::pair_of(a, p % half, ia, ib);
        float* head = q + (p / half) * hd;
        float x0 = head[ia], x1 = head[ib];
        const float2 cs = angles[p % half];
        rope::rotate(x0, x1, cs.x, cs.y);
        head[ia] = x0;
        head[ib] = x1;
    }
    const int kv_dim = a.n_kv_heads * hd, n_blocks = kv_dim / kQ8Block;
    const int lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    const int warp = blockIdx.y * n_warps + threadIdx.x / 32, warp_stride = gridDim.y * n_warps;
    const size_t row_bytes = static_cast<size_t>(n_blocks) * kQ8BlockBytes;
    const float* k = a.k + static_cast<size_t>(tok) * kv_dim;
    const float* v = a.v + static_cast<size_t>(tok) * kv_dim;
    const int row = a.ring > 0 ? pos % a.ring : pos;  // a sliding-window layer's ring
    uint8_t* kc = static_cast<uint8_t*>(a.k_cache) + static_cast<size_t>(row) * row_bytes;
    uint8_t* vc = static_cast<uint8_t*>(a.v_cache) + static_cast<size_t>(row) * row_bytes;
    for (int b = warp; b < n_blocks; b += warp_stride) {
        const int e = b * kQ8Block + lane;
        store_q8_0(kc + b * kQ8BlockBytes, rotated_k(a, k, e, angles), lane);
        store_q8_0(vc + b * kQ8BlockBytes, v[e], lane);
    }
}

// The step's angles (rope_trig_table): a thread per (token, pair), the same cos_sin as the kernels above. A
// grid-stride loop, as theirs: written as one item per thread with an early return, ptxas kept the slow path's
// array (cosf / sinf of large arguments) in a 32-byte stack frame; in the loop, as in the kernels above, it did not
// (sm_80-90, 2026-11-29).
__global__ void __launch_bounds__(kThreads) rope_trig_kernel(RopeKvArgs a, float* table) {
    detail::wait_for_inputs();
    const int half = a.rope_dim / 2, n = a.n_tokens * half, pos0 = rope::start_position(a);
    for (int p = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); p < n;
         p += static_cast<int>(gridDim.x * blockDim.x)) {
        const int tok = p / half;
        float c, s;
        rope::cos_sin<false>(a, tok, pos0 + tok, p % half, c, s);
        reinterpret_cast<float2*>(table)[p] = make_float2(c, s);
    }
}

int slices_for(int items, int per_block) {
    const int n = (items + per_block - 1) / per_block;
    return n < 1 ? 1 : n > kMaxSlices ? kMaxSlices : n;
}

}  // namespace

size_t kv_row_bytes(KvType type, int kv_dim) {
    return type == KvType::Q8_0 ? static_cast<size_t>(kv_dim / kQ8Block) * kQ8BlockBytes
                                : static_cast<size_t>(kv_dim) * sizeof(uint16_t);
}

bool kv_type_supports(KvType type, int kv_dim) { return kv_dim > 0 && (type == KvType::F16 || kv_dim % kQ8Block == 0); }

size_t rope_trig_floats(const RopeKvArgs& a) { return static_cast<size_t>(a.n_tokens) * a.rope_dim; }

void rope_trig_table(const RopeKvArgs& a, float* table, Stream stream) {
    rope::check_args(a);
    detail::require(table != nullptr && reinterpret_cast<uintptr_t>(table) % 8 == 0,
                    "rope_trig_table: the table must be 8-byte aligned");
    const int items = a.n_tokens * (a.rope_dim / 2);
    detail::launch_kernel("rope_trig_kernel", rope_trig_kernel, dim3((items + kThreads - 1) / kThreads),
                          dim3(kThreads), 0, stream, a, table);
}

void rope_kv_write(const RopeKvArgs& a, Stream stream) {
    rope::check_args(a);
    detail::require(a.n_tokens <= 65535, "rope_kv_write: too many tokens for one launch");
    const int half = a.rope_dim / 2, kv_dim = a.n_kv_heads * a.head_dim;
    if (a.kv_type == KvType::Q8_0) {
        detail::require(half <= kMaxPairs, "rope_kv_write: a Q8_0 cache takes rope_dim <= 256");
        const int slices =
            std::max(slices_for(a.n_heads * half, kThreads), slices_for(kv_dim / kQ8Block, kThreads / 32));
        detail::launch_kernel("rope_kv_q8_0_kernel", rope_kv_q8_0_kernel, dim3(a.n_tokens, slices), dim3(kThreads), 0,
                              stream, a);
    } else {
        const int items = (a.n_heads + a.n_kv_heads) * half + a.n_kv_heads * (a.head_dim - a.rope_dim) + kv_dim;
        detail::launch_kernel("rope_kv_kernel", rope_kv_kernel, dim3(a.n_tokens, slices_for(items, kThreads)),
                              dim3(kThreads), 0, stream, a);
    }
}

}  // namespace tandem::cuda
