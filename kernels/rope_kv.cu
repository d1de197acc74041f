// RoPE on Q and K fused with the KV-cache write: Q is rotated in place, K is rotated straight into the cache and V
// is stored there, in either cache type (kernels.h: KvType): fp16 halves, or ggml Q8_0 blocks quantized in
// registers (a warp per 32-value block). Both pairings: adjacent (2i, 2i+1) and NeoX halves.
//
// Grid: (token, slice). A token's work is spread over enough blocks that each thread has about one item (a Q or K
// pair, a tail or V element, a warp's Q8_0 block): a decode step has one token, and one block would walk its
// thousands of elements one after another, a dependent memory round trip for each.
#include <algorithm>

#include "common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxSlices = 64;  // blocks per token at most; past that the threads loop
constexpr int kQ8Block = 32, kQ8BlockBytes = 34;  // ggml block_q8_0: fp16 d, int8 qs[32]

// The angle is float(pos) * inv_freq[i] in fp32, as the CPU backend computes it; cosf/sinf are the accurate ones.
__device__ __forceinline__ void rotate(float& a, float& b, float angle) {
    const float c = cosf(angle), s = sinf(angle);
    const float v0 = a, v1 = b;
    a = v0 * c - v1 * s;
    b = v0 * s + v1 * c;
}

__device__ __forceinline__ int start_position(const RopeKvArgs& a) {
    return a.device_start_pos ? *a.device_start_pos : a.start_pos;
}

// Q's pair p rotated in place; the dims past rope_dim stay as they are.
__device__ __forceinline__ void rotate_q_pair(const RopeKvArgs& a, int tok, int pos, int p) {
    const int half = a.rope_dim / 2, hd = a.head_dim;
    const bool neox = a.mode == RopeMode::NeoxHalves;
    const int h = p / half, i = p % half;
    float* v = a.q + static_cast<size_t>(tok) * a.n_heads * hd + h * hd;
    const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
    rotate(v[ia], v[ib], static_cast<float>(pos) * a.inv_freq[i]);
}

// The fp16 cache. One flat list of a token's items: Q pairs, K pairs, K's elements past rope_dim, V elements.
__global__ void __launch_bounds__(kThreads) rope_kv_kernel(RopeKvArgs a) {
    detail::wait_for_inputs();
    const int tok = blockIdx.x, pos = start_position(a) + tok, half = a.rope_dim / 2, hd = a.head_dim;
    const int kv_dim = a.n_kv_heads * hd, tail = hd - a.rope_dim;
    const bool neox = a.mode == RopeMode::NeoxHalves;
    const int n_q = a.n_heads * half, n_k = a.n_kv_heads * half, n_tail = a.n_kv_heads * tail;
    const int n_items = n_q + n_k + n_tail + kv_dim;
    const float* k = a.k + static_cast<size_t>(tok) * kv_dim;
    const float* v = a.v + static_cast<size_t>(tok) * kv_dim;
    uint16_t* kc = static_cast<uint16_t*>(a.k_cache) + static_cast<size_t>(pos) * kv_dim;
    uint16_t* vc = static_cast<uint16_t*>(a.v_cache) + static_cast<size_t>(pos) * kv_dim;
    const int stride = static_cast<int>(gridDim.y * blockDim.x);
    for (int p = blockIdx.y * blockDim.x + threadIdx.x; p < n_items; p += stride) {
        if (p < n_q) {
            rotate_q_pair(a, tok, pos, p);
        } else if (p < n_q + n_k) {
            const int h = (p - n_q) / half, i = (p - n_q) % half;
            const int ia = h * hd + (neox ? i : 2 * i), ib = h * hd + (neox ? i + half : 2 * i + 1);
            float x0 = k[ia], x1 = k[ib];
            rotate(x0, x1, static_cast<float>(pos) * a.inv_freq[i]);
            kc[ia] = tandem_float_to_half(x0);
            kc[ib] = tandem_float_to_half(x1);
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
// elements may lie in different blocks, NeoX halves always). The expressions are rotate()'s, so the value is the
// one rotate() gives that element.
__device__ __forceinline__ float rotated_k(const RopeKvArgs& a, const float* k, int e, int pos) {
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
    const float angle = static_cast<float>(pos) * a.inv_freq[i];
    const float c = cosf(angle), s = sinf(angle);
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

// The Q8_0 cache: a token's blocks rotate its Q pairs, a thread each, then quantize its K and V blocks, a warp each.
__global__ void __launch_bounds__(kThreads) rope_kv_q8_0_kernel(RopeKvArgs a) {
    detail::wait_for_inputs();
    const int tok = blockIdx.x, pos = start_position(a) + tok;
    const int n_q = a.n_heads * (a.rope_dim / 2), stride = static_cast<int>(gridDim.y * blockDim.x);
    for (int p = blockIdx.y * blockDim.x + threadIdx.x; p < n_q; p += stride) rotate_q_pair(a, tok, pos, p);
    const int kv_dim = a.n_kv_heads * a.head_dim, n_blocks = kv_dim / kQ8Block;
    const int lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
    const int warp = blockIdx.y * n_warps + threadIdx.x / 32, warp_stride = gridDim.y * n_warps;
    const size_t row_bytes = static_cast<size_t>(n_blocks) * kQ8BlockBytes;
    const float* k = a.k + static_cast<size_t>(tok) * kv_dim;
    const float* v = a.v + static_cast<size_t>(tok) * kv_dim;
    uint8_t* kc = static_cast<uint8_t*>(a.k_cache) + static_cast<size_t>(pos) * row_bytes;
    uint8_t* vc = static_cast<uint8_t*>(a.v_cache) + static_cast<size_t>(pos) * row_bytes;
    for (int b = warp; b < n_blocks; b += warp_stride) {
        const int e = b * kQ8Block + lane;
        store_q8_0(kc + b * kQ8BlockBytes, rotated_k(a, k, e, pos), lane);
        store_q8_0(vc + b * kQ8BlockBytes, v[e], lane);
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

void rope_kv_write(const RopeKvArgs& a, Stream stream) {
    detail::require(a.n_tokens > 0 && a.start_pos >= 0 && a.n_heads > 0 && a.n_kv_heads > 0 && a.head_dim > 0,
                    "rope_kv_write: bad shape");
    detail::require(a.rope_dim % 2 == 0 && a.rope_dim > 0 && a.rope_dim <= a.head_dim,
                    "rope_kv_write: rope_dim must be even and <= head_dim");
    detail::require(kv_type_supports(a.kv_type, a.n_kv_heads * a.head_dim),
                    "rope_kv_write: a Q8_0 cache needs n_kv_heads * head_dim to be a multiple of 32");
    detail::require(a.n_tokens <= 65535, "rope_kv_write: too many tokens for one launch");
    const int half = a.rope_dim / 2, kv_dim = a.n_kv_heads * a.head_dim;
    if (a.kv_type == KvType::Q8_0) {
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
