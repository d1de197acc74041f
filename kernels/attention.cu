// Decode attention over the fp16 KV cache with grouped-query heads, split-K ("flash decoding"): a partial softmax
// per (token, head, split of the key positions), then a kernel that combines the splits.
#include <cmath>

#include "common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 4;

// The position of the call's first token: by value, or (a launch captured into a CUDA graph) read from device
// memory when the kernel runs.
__device__ __forceinline__ int start_position(const AttentionArgs& a) {
    return a.device_start_pos ? *a.device_start_pos : a.start_pos;
}

// Partial results: for each (token, head, split) the running max m, the sum l of exp(s - m) and the unnormalised
// output acc[head_dim] = sum exp(s - m) * v, laid out as [m, l, acc...].
__device__ __forceinline__ float* partial(float* ws, int tok, int head, int split, int n_heads, int n_splits, int hd) {
    return ws + ((static_cast<size_t>(tok) * n_heads + head) * n_splits + split) * (hd + 2);
}

// One block per (split, head, token). Each warp walks every kWarps-th key of the split with an online softmax (lane
// holds dims lane + 32j of q, acc); the warps' states are then merged through shared memory. The template covers
// head dims up to 32 * D; a smaller head (tiny models: 8, 16) leaves the lanes past it holding zeros.
template <int D>
__global__ void __launch_bounds__(kWarps * 32) attention_split_kernel(AttentionArgs a, int n_splits) {
    constexpr int HD = 32 * D;  // shared-memory stride per warp; the real head size is a.head_dim <= HD
    TANDEM_SHARED(float, warp_m, kWarps);
    TANDEM_SHARED(float, warp_l, kWarps);
    TANDEM_SHARED(float, warp_acc, kWarps * HD);
    const int split = blockIdx.x, head = blockIdx.y, tok = blockIdx.z;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, hd = a.head_dim;
    const int kv_dim = a.n_kv_heads * hd, kv_head = head / (a.n_heads / a.n_kv_heads);
    const int n_keys = start_position(a) + tok + 1;
    const int begin = split * a.split_size;
    // A split past this token's last key: the grid is sized for the call's last token (or, replayed from a graph,
    // for a bound on the position), and the combine kernel reads only the splits that hold keys.
    if (begin >= n_keys) return;
    const int end = begin + a.split_size < n_keys ? begin + a.split_size : n_keys;
    const float scale = 1.0f / sqrtf(static_cast<float>(hd));

    float q[D], acc[D];
    const float* qp = a.q + static_cast<size_t>(tok) * a.n_heads * hd + head * hd;
#pragma unroll
    for (int j = 0; j < D; ++j) {
        q[j] = lane + 32 * j < hd ? qp[lane + 32 * j] : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int t = begin + warp; t < end; t += kWarps) {
        const uint16_t* k = a.k_cache + static_cast<size_t>(t) * kv_dim + kv_head * hd;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < D; ++j)
            if (lane + 32 * j < hd) s += q[j] * tandem_half_to_float(k[lane + 32 * j]);
        s = detail::warp_sum(s) * scale;
        const float m_new = fmaxf(m, s);
        const float correction = expf(m - m_new), p = expf(s - m_new);
        l = l * correction + p;
        const uint16_t* v = a.v_cache + static_cast<size_t>(t) * kv_dim + kv_head * hd;
#pragma unroll
        for (int j = 0; j < D; ++j)
            if (lane + 32 * j < hd) acc[j] = acc[j] * correction + p * tandem_half_to_float(v[lane + 32 * j]);
        m = m_new;
    }
    if (lane == 0) {
        warp_m[warp] = m;
        warp_l[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < D; ++j) warp_acc[warp * HD + lane + 32 * j] = acc[j];
    __syncthreads();

    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, warp_m[w]);
    float* out = partial(a.workspace, tok, head, split, a.n_heads, n_splits, hd);
    // A warp without keys (a split shorter than kWarps positions) has m = -inf and contributes nothing; M is
    // finite, the split holding at least one key.
    float weight[kWarps];
#pragma unroll
    for (int w = 0; w < kWarps; ++w) weight[w] = M == -INFINITY ? 0.0f : expf(warp_m[w] - M);
    if (threadIdx.x == 0) {
        float L = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) L += warp_l[w] * weight[w];
        out[0] = M;
        out[1] = L;
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float A = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) A += warp_acc[w * HD + d] * weight[w];
        out[2 + d] = A;
    }
}

// One block per (head, token), one thread per output dim. n_splits is the grid's (the workspace's stride); only the
// splits holding this token's keys were written.
__global__ void __launch_bounds__(256) attention_combine_kernel(AttentionArgs a, int n_splits) {
    const int head = blockIdx.x, tok = blockIdx.y, d = threadIdx.x, hd = a.head_dim;
    const int n_keys = start_position(a) + tok + 1;
    const int needed = (n_keys + a.split_size - 1) / a.split_size;
    const int used = needed < n_splits ? needed : n_splits;
    float M = -INFINITY;
    for (int s = 0; s < used; ++s) M = fmaxf(M, partial(a.workspace, tok, head, s, a.n_heads, n_splits, hd)[0]);
    float L = 0.0f, A = 0.0f;
    for (int s = 0; s < used; ++s) {
        const float* p = partial(a.workspace, tok, head, s, a.n_heads, n_splits, hd);
        if (p[0] == -INFINITY) continue;  // cannot happen (every used split has a key); kept as a guard
        const float w = expf(p[0] - M);
        L += p[1] * w;
        A += p[2 + d] * w;
    }
    a.out[static_cast<size_t>(tok) * a.n_heads * hd + head * hd + d] = A / L;
}

int splits_for(int start_pos, int n_tokens, int split_size) {
    return (start_pos + n_tokens + split_size - 1) / split_size;
}

}  // namespace

size_t attention_workspace_floats(int n_tokens, int start_pos, int n_heads, int head_dim, int split_size) {
    return static_cast<size_t>(n_tokens) * n_heads * splits_for(start_pos, n_tokens, split_size) * (head_dim + 2);
}

void attention(const AttentionArgs& a, Stream stream) {
    detail::require(a.n_tokens > 0 && a.start_pos >= 0 && a.split_size > 0, "attention: bad shape");
    detail::require(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0, "attention: n_heads must be a multiple of n_kv_heads");
    const int n_splits = splits_for(a.start_pos, a.n_tokens, a.split_size);
    detail::require(n_splits <= 65535 && a.n_heads <= 65535 && a.n_tokens <= 65535, "attention: grid too large");
    const dim3 grid(n_splits, a.n_heads, a.n_tokens), block(kWarps * 32);
    detail::require(a.head_dim > 0 && a.head_dim <= 256, "attention: head_dim must be 1..256");
    if (a.head_dim <= 32)
        detail::launch_kernel("attention_split_kernel<1>", attention_split_kernel<1>, grid, block, 0, stream, a, n_splits);
    else if (a.head_dim <= 64)
        detail::launch_kernel("attention_split_kernel<2>", attention_split_kernel<2>, grid, block, 0, stream, a, n_splits);
    else if (a.head_dim <= 128)
        detail::launch_kernel("attention_split_kernel<4>", attention_split_kernel<4>, grid, block, 0, stream, a, n_splits);
    else
        detail::launch_kernel("attention_split_kernel<8>", attention_split_kernel<8>, grid, block, 0, stream, a, n_splits);
    detail::launch_kernel("attention_combine_kernel", attention_combine_kernel, dim3(a.n_heads, a.n_tokens),
                          dim3(a.head_dim), 0, stream, a, n_splits);
}

}  // namespace tandem::cuda
