// RoPE on Q and K fused with the KV-cache write: Q is rotated in place, K is rotated straight into the fp16 cache
// and V is converted into it, one block per token. Both pairings: adjacent (2i, 2i+1) and NeoX halves.
#include "common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

// The angle is float(pos) * inv_freq[i] in fp32, as the CPU backend computes it; cosf/sinf are the accurate ones.
__device__ __forceinline__ void rotate(float& a, float& b, float angle) {
    const float c = cosf(angle), s = sinf(angle);
    const float v0 = a, v1 = b;
    a = v0 * c - v1 * s;
    b = v0 * s + v1 * c;
}

__global__ void __launch_bounds__(kThreads) rope_kv_kernel(RopeKvArgs a) {
    const int start = a.device_start_pos ? *a.device_start_pos : a.start_pos;
    const int tok = blockIdx.x, pos = start + tok, half = a.rope_dim / 2, hd = a.head_dim;
    const int q_dim = a.n_heads * hd, kv_dim = a.n_kv_heads * hd;
    const bool neox = a.mode == RopeMode::NeoxHalves;
    float* q = a.q + static_cast<size_t>(tok) * q_dim;
    // One thread per rotated pair; the dims past rope_dim stay as they are.
    for (int p = threadIdx.x; p < a.n_heads * half; p += blockDim.x) {
        const int h = p / half, i = p % half;
        float* v = q + h * hd;
        const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
        rotate(v[ia], v[ib], static_cast<float>(pos) * a.inv_freq[i]);
    }
    const float* k = a.k + static_cast<size_t>(tok) * kv_dim;
    uint16_t* kc = a.k_cache + static_cast<size_t>(pos) * kv_dim;
    for (int p = threadIdx.x; p < a.n_kv_heads * half; p += blockDim.x) {
        const int h = p / half, i = p % half;
        const int ia = h * hd + (neox ? i : 2 * i), ib = h * hd + (neox ? i + half : 2 * i + 1);
        float x0 = k[ia], x1 = k[ib];
        rotate(x0, x1, static_cast<float>(pos) * a.inv_freq[i]);
        kc[ia] = tandem_float_to_half(x0);
        kc[ib] = tandem_float_to_half(x1);
    }
    const int tail = hd - a.rope_dim;
    for (int p = threadIdx.x; p < a.n_kv_heads * tail; p += blockDim.x) {
        const int e = (p / tail) * hd + a.rope_dim + p % tail;
        kc[e] = tandem_float_to_half(k[e]);
    }
    const float* v = a.v + static_cast<size_t>(tok) * kv_dim;
    uint16_t* vc = a.v_cache + static_cast<size_t>(pos) * kv_dim;
    for (int e = threadIdx.x; e < kv_dim; e += blockDim.x) vc[e] = tandem_float_to_half(v[e]);
}

}  // namespace

void rope_kv_write(const RopeKvArgs& a, Stream stream) {
    detail::require(a.n_tokens > 0 && a.start_pos >= 0 && a.n_heads > 0 && a.n_kv_heads > 0 && a.head_dim > 0,
                    "rope_kv_write: bad shape");
    detail::require(a.rope_dim % 2 == 0 && a.rope_dim > 0 && a.rope_dim <= a.head_dim,
                    "rope_kv_write: rope_dim must be even and <= head_dim");
    detail::launch_kernel("rope_kv_kernel", rope_kv_kernel, dim3(a.n_tokens), dim3(kThreads), 0, stream, a);
}

}  // namespace tandem::cuda
