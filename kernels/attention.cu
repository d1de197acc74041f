// Decode attention over the KV cache (fp16 or Q8_0, kernels.h: KvType) with grouped-query heads, split-K ("flash
// decoding"): a partial softmax per (token, head, split of the key positions), then the splits combined, by the last
// block of each (token, head) to finish (with AttentionArgs::split_counters) or by a second kernel; the combine can
// also quantize the head's output for the 8-bit matvec route.
#include <cmath>
#include <numeric>

#include "common.cuh"
#include "online_softmax.cuh"
#include "quantize_q8.cuh"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 4;

// The position of the call's first token: by value, or (a launch captured into a CUDA graph) read from device
// memory when the kernel runs.
__device__ __forceinline__ int start_position(const AttentionArgs& a) {
    return a.device_start_pos ? *a.device_start_pos : a.start_pos;
}

// Element e of a cache row: an fp16 value, or code * d of its Q8_0 block (exact in fp32).
template <bool Q8>
__device__ __forceinline__ float kv_value(const uint8_t* row, int e) {
    if constexpr (Q8) {
        const uint8_t* block = row + 34 * (e >> 5);
        return detail::load_half(block) * static_cast<float>(static_cast<int8_t>(block[2 + (e & 31)]));
    } else {
        return tandem_half_to_float(reinterpret_cast<const uint16_t*>(row)[e]);
    }
}

// Partial results: for each (token, head, split) the running max m, the sum l of exp(s - m) and the unnormalised
// output acc[head_dim] = sum exp(s - m) * v, laid out as [m, l, acc...].
__device__ __forceinline__ float* partial(float* ws, int tok, int head, int split, int n_heads, int n_splits, int hd) {
    return ws + ((static_cast<size_t>(tok) * n_heads + head) * n_splits + split) * (hd + 2);
}

// The splits that hold token `tok`'s keys (the grid's n_splits may hold more: its bound is the call's last token).
__device__ __forceinline__ int splits_used(const AttentionArgs& a, int tok, int n_splits) {
    const int n_keys = start_position(a) + tok + 1;
    const int needed = (n_keys + a.split_size - 1) / a.split_size;
    return needed < n_splits ? needed : n_splits;
}

// out[tok][head] from the splits' partial results, dims d0, d0 + step, ... of the head (d0 the thread, step the
// block's size; every thread of the block calls this), and, when `quantize` (a.q8_out set), the head's Q8_1 blocks
// of the quantized row. The partials were written by other blocks: read past L1 (__ldcg), which is not coherent
// across the GPU's SMs.
__device__ __forceinline__ void combine_splits(const AttentionArgs& a, int tok, int head, int n_splits, int d0,
                                               int step, bool quantize) {
    const int hd = a.head_dim, used = splits_used(a, tok, n_splits);
    float M = -INFINITY;
    for (int s = 0; s < used; ++s)
        M = fmaxf(M, __ldcg(partial(a.workspace, tok, head, s, a.n_heads, n_splits, hd)));
    // (Splits before a sliding window are empty, m = -inf; at least one split holds keys, so M is finite.)
    for (int d = d0; d < hd; d += step) {
        float L = 0.0f, A = 0.0f;
        for (int s = 0; s < used; ++s) {
            const float* p = partial(a.workspace, tok, head, s, a.n_heads, n_splits, hd);
            const float m = __ldcg(p);
            if (m == -INFINITY) continue;  // a split wholly before a sliding window: no keys
            const float w = expf(m - M);
            L += __ldcg(p + 1) * w;
            A += __ldcg(p + 2 + d) * w;
        }
        a.out[static_cast<size_t>(tok) * a.n_heads * hd + head * hd + d] = A / L;
    }
    // Quantizing: the block has at least head_dim threads (step >= hd), so the thread of element d0 has written it
    // just above, and warp w (lanes d0 = 32w + l) quantizes block w from its own lanes' values: no barrier. Warps past
    // the head have no block (hd is a multiple of 32, so whole warps).
    if (!quantize || d0 >= hd) return;
    const int per_head = hd / 32, b = d0 / 32;
    const float* head_out = a.out + static_cast<size_t>(tok) * a.n_heads * hd + head * hd;
    uint8_t* head_q = static_cast<uint8_t*>(a.q8_out) +
                      (static_cast<size_t>(tok) * a.n_heads + head) * per_head * q8::kQ8_1Bytes;
    q8::quantize_block_q8_1(head_out + 32 * b, head_q + q8::kQ8_1Bytes * b, d0 % 32);
}

// One block per (split, head, token). Each warp walks the split kKeysPerStep keys at a time (warp w takes keys
// w * kKeysPerStep + i * kWarps * kKeysPerStep + u) with an online softmax (lane holds dims lane + 32j of q, acc):
// the step's K loads are issued together, then its scores are reduced and folded into the running max at once,
// then its V loads, so a warp waits for memory twice a step, not twice a key. The warps' states are then merged
// through shared memory. The template covers head dims up to 32 * D; a smaller head (tiny models: 8, 16) leaves
// the lanes past it holding zeros. Q8: the cache holds Q8_0 blocks.
constexpr int kKeysPerStep = 4;
constexpr int kMaxQuantizedD = 4;  // the split kernels that can quantize their output: head_dim <= 128

template <int D, bool Q8>
__global__ void __launch_bounds__(kWarps * 32) attention_split_kernel(AttentionArgs a, int n_splits) {
    detail::wait_for_inputs();
    constexpr int HD = 32 * D;  // shared-memory stride per warp; the real head size is a.head_dim <= HD
    constexpr int U = kKeysPerStep;
    TANDEM_SHARED(float, warp_m, kWarps);
    TANDEM_SHARED(float, warp_l, kWarps);
    TANDEM_SHARED(float, warp_acc, kWarps * HD);
    TANDEM_SHARED(int, is_last, 1);
    const int split = blockIdx.x, head = blockIdx.y, tok = blockIdx.z;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, hd = a.head_dim;
    const int kv_dim = a.n_kv_heads * hd, kv_head = head / (a.n_heads / a.n_kv_heads);
    const int n_keys = start_position(a) + tok + 1;
    const int split_begin = split * a.split_size;
    // A split past this token's last key: the grid is sized for the call's last token (or, replayed from a graph,
    // for a bound on the position), and the combine kernel reads only the splits that hold keys.
    if (split_begin >= n_keys) return;
    int end = split_begin + a.split_size < n_keys ? split_begin + a.split_size : n_keys;
    // A sliding window starts the keys later: a split wholly before it reads nothing and leaves the empty partial
    // (m = -inf, l = 0), which the combine skips.
    const int first_key = a.window > 0 && n_keys - a.window > 0 ? n_keys - a.window : 0;
    // The loop below walks cache rows, not positions (only their count matters to the softmax): in a sliding-window
    // layer's ring, position t is in row t - shift for the whole split, as the ring is a multiple of the split size.
    // (A per-key t % ring made ptxas spill in the <128, q8_0> instance; this is one modulo per block.)
    const int shift = a.ring > 0 ? split_begin - split_begin % a.ring : 0;
    const int begin = (split_begin > first_key ? split_begin : first_key) - shift;
    end -= shift;
    const float scale = a.scale != 0.0f ? a.scale : 1.0f / sqrtf(static_cast<float>(hd));
    const size_t row_bytes = Q8 ? static_cast<size_t>(kv_dim / 32) * 34 : static_cast<size_t>(kv_dim) * 2;
    const uint8_t* k_rows = static_cast<const uint8_t*>(a.k_cache);
    const uint8_t* v_rows = static_cast<const uint8_t*>(a.v_cache);
    const int e0 = kv_head * hd;  // the head's first element in a row

    float q[D], acc[D];
    const float* qp = a.q + static_cast<size_t>(tok) * a.n_heads * hd + head * hd;
#pragma unroll
    for (int j = 0; j < D; ++j) {
        q[j] = lane + 32 * j < hd ? qp[lane + 32 * j] : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int t0 = begin + warp * U; t0 < end; t0 += kWarps * U) {
        // Rows t0..t0+U-1 that hold keys: n_u >= 1 (t0 < end), the same for the whole warp.
        const int n_u = end - t0 < U ? end - t0 : U;
        const auto key = [&](int u, int j) {
            return kv_value<Q8>(k_rows + static_cast<size_t>(t0 + u) * row_bytes, e0 + lane + 32 * j);
        };
        const auto value = [&](int u, int j) {
            return kv_value<Q8>(v_rows + static_cast<size_t>(t0 + u) * row_bytes, e0 + lane + 32 * j);
        };
        attend::online_softmax_step<D, U>(q, n_u, hd, lane, scale, a.softcap, a.inv_softcap, key, value, m, l, acc);
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
    if (!a.split_counters) return;  // the combine kernel follows

    // The last of this (token, head)'s blocks to count itself combines the splits, and resets the counter for the
    // next launch: the threadFenceReduction pattern. Each thread's fence makes its partial visible to the device
    // before thread 0 counts the block.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* counter = a.split_counters + static_cast<size_t>(tok) * a.n_heads + head;
        const unsigned used = static_cast<unsigned>(splits_used(a, tok, n_splits));
        const bool last = atomicAdd(counter, 1u) + 1 == used;
        if (last) *counter = 0;  // every block of this (token, head) has counted
        is_last[0] = last ? 1 : 0;
    }
    __syncthreads();
    if (!is_last[0]) return;
    __threadfence();
    // Heads over 128 (D = 8) do not quantize: with that code in, ptxas spilled registers of the main loop.
    if constexpr (D <= kMaxQuantizedD)
        combine_splits(a, tok, head, n_splits, threadIdx.x, blockDim.x, a.q8_out != nullptr);
    else
        combine_splits(a, tok, head, n_splits, threadIdx.x, blockDim.x, false);
}

// One block per (head, token), one thread per output dim. n_splits is the grid's (the workspace's stride); only the
// splits holding this token's keys were written.
__global__ void __launch_bounds__(256) attention_combine_kernel(AttentionArgs a, int n_splits) {
    detail::wait_for_inputs();
    combine_splits(a, blockIdx.y, blockIdx.x, n_splits, threadIdx.x, a.head_dim, a.q8_out != nullptr);
}

template <bool Q8>
void launch_split(const AttentionArgs& a, int n_splits, dim3 grid, dim3 block, Stream stream) {
    const char* names[] = {"attention_split_kernel<32>", "attention_split_kernel<64>", "attention_split_kernel<128>",
                           "attention_split_kernel<256>", "attention_split_kernel<32, q8_0>",
                           "attention_split_kernel<64, q8_0>", "attention_split_kernel<128, q8_0>",
                           "attention_split_kernel<256, q8_0>"};
    const char* const* name = names + (Q8 ? 4 : 0);
    if (a.head_dim <= 32)
        detail::launch_kernel(name[0], attention_split_kernel<1, Q8>, grid, block, 0, stream, a, n_splits);
    else if (a.head_dim <= 64)
        detail::launch_kernel(name[1], attention_split_kernel<2, Q8>, grid, block, 0, stream, a, n_splits);
    else if (a.head_dim <= 128)
        detail::launch_kernel(name[2], attention_split_kernel<4, Q8>, grid, block, 0, stream, a, n_splits);
    else
        detail::launch_kernel(name[3], attention_split_kernel<8, Q8>, grid, block, 0, stream, a, n_splits);
}

int splits_for(int start_pos, int n_tokens, int split_size) {
    return (start_pos + n_tokens + split_size - 1) / split_size;
}

}  // namespace

bool attention_quantizes_for(GgmlType q8_for, int head_dim) {
    return q8::format_for(q8_for) == Q8Format::Q8_1 && head_dim > 0 && head_dim % 32 == 0 &&
           head_dim <= 32 * kMaxQuantizedD;
}

size_t attention_workspace_floats(int n_tokens, int start_pos, int n_heads, int head_dim, int split_size) {
    return static_cast<size_t>(n_tokens) * n_heads * splits_for(start_pos, n_tokens, split_size) * (head_dim + 2);
}

int attention_ring_multiple(int split_size) {
    constexpr int kLargestKeyTile = 32;  // attention_prefill.cu's BK
    return std::lcm(split_size, kLargestKeyTile);
}

void attention(const AttentionArgs& a, Stream stream) {
    detail::require(a.n_tokens > 0 && a.start_pos >= 0 && a.split_size > 0, "attention: bad shape");
    detail::require(a.ring >= 0 && a.ring % attention_ring_multiple(a.split_size) == 0,
                    "attention: a ring's rows must be a multiple of attention_ring_multiple(split_size)");
    detail::require(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0, "attention: n_heads must be a multiple of n_kv_heads");
    const int n_splits = splits_for(a.start_pos, a.n_tokens, a.split_size);
    detail::require(n_splits <= 65535 && a.n_heads <= 65535 && a.n_tokens <= 65535, "attention: grid too large");
    const dim3 grid(n_splits, a.n_heads, a.n_tokens), block(kWarps * 32);
    detail::require(a.head_dim > 0 && a.head_dim <= 256, "attention: head_dim must be 1..256");
    detail::require(kv_type_supports(a.kv_type, a.n_kv_heads * a.head_dim),
                    "attention: a Q8_0 cache needs n_kv_heads * head_dim to be a multiple of 32");
    if (a.q8_out) {
        detail::require(attention_quantizes_for(a.q8_for, a.head_dim),
                        "attention: a quantized output needs a Q8_1 type of the 8-bit route and head_dim 32, 64, 96 or 128");
        detail::require(reinterpret_cast<uintptr_t>(a.q8_out) % 4 == 0, "attention: q8_out must be 4-byte aligned");
    }
    if (a.kv_type == KvType::Q8_0)
        launch_split<true>(a, n_splits, grid, block, stream);
    else
        launch_split<false>(a, n_splits, grid, block, stream);
    if (a.split_counters) return;  // the split kernel's last blocks combined
    detail::launch_kernel("attention_combine_kernel", attention_combine_kernel, dim3(a.n_heads, a.n_tokens),
                          dim3(a.head_dim), 0, stream, a, n_splits);
}

}  // namespace tandem::cuda
