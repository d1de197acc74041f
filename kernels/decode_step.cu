// The persistent decode step: one token through every layer of a llama model in a single cooperative launch
// (kernels.h decode_step). Each block stays resident for the whole step and the grid meets at a grid-wide barrier
// between the phases that depend on the whole of the phase before them, five per layer:
//   1. RMSNorm of the residual stream (every block computes it into its shared memory: no barrier needed), then
//      the rows of Q, K and V, a warp per row, with their biases; the block that writes a head's last row (counted
//      with an atomic per head, as the Q/K/V launch's epilogue counts them) then applies RoPE to it, Q in place and
//      K into the fp16 cache, or copies V there (rope::head_epilogue, the same functions as that epilogue);
//   2. attention: a warp per (head, split of the key positions), each split's online-softmax partial written out
//      and the head's last split to finish combining the head's (counted with an atomic, as attention.cu does);
//   3. the attention output copied into each block's shared memory, then the rows of attn_output, each added into
//      the residual stream by the warp that computes it;
//   4. RMSNorm again, then gate and up rows in pairs (the same warp computes both and applies SwiGLU);
//   5. the FFN activations copied into each block's shared memory, then the rows of ffn_down added into the stream.
// After the last layer block 0 applies the output norm. The embedding before and the output head after stay
// separate launches (the head has its restricted-logit and pick variants); the rest of a decode step's ~5 kernels a
// layer become one launch, whose blocks never wait for a launch or a ramp-up between kernels. (Hazy Research, "Look
// Ma, No Bubbles!", 2025-05-27: a 1B model's whole forward pass in one kernel reached 78% of an H100's memory
// bandwidth at batch 1, where each of its ~100 kernels a step had cost ~1.3 us of launch and drain even under CUDA
// graphs.)
//
// Each matrix row is computed with its type's walk (matvec_dots.cuh), the same as the matvec kernels' one-token
// walk, and reduced across the warp the same way; the norms' and attention's sums are in other orders than the
// separate kernels', so the step is within float rounding of the usual one, not bitwise (kernels.h says where it
// is used). Data that other blocks wrote during the launch (the residual stream, Q/K/V, the cache row, the
// partials, the attention output, the FFN activations) is read past L1 (__ldcg), which is not coherent across SMs; the weights are read
// through it.
#include <cmath>

#include "common.cuh"
#include "matvec_dots.cuh"
#include "rms_norm.cuh"
#include "rope_kv.cuh"

namespace tandem::cuda {
namespace {

using namespace matvec_detail;

constexpr int kThreads = 256, kWarpsPerBlock = kThreads / 32;
// Attention: keys a warp takes per step, and the fewest a split has (two steps: below that a warp's partial costs
// more to combine than to compute).
constexpr int kKeysPerStep = 4, kMinSplitKeys = 2 * kKeysPerStep;

// This lane's share of one row's dot product with x (shared memory, 16-byte aligned), by the row's type. Inlined into
// each of the kernel's row loops: as a call (__noinline__, one copy of the walks), ptxas kept the callers' live
// registers in a stack frame across it (8-48 bytes of local memory, a build error).
__device__ __forceinline__ float lane_dot(GgmlType type, const uint8_t* row, int cols, const float* x, int lane) {
    float acc[1] = {0.0f};
    switch (type) {
        case GgmlType::F32: DotF32::dot<1, false>(row, cols, x, 0, 1, lane, acc); break;
        case GgmlType::F16: DotF16::dot<1, false>(row, cols, x, 0, 1, lane, acc); break;
        case GgmlType::BF16: DotBF16::dot<1, false>(row, cols, x, 0, 1, lane, acc); break;
        case GgmlType::Q8_0: DotQ8_0::dot<1, false>(row, cols, x, 0, 1, lane, acc); break;
        case GgmlType::Q4_0: DotQ4_0::dot<1, false>(row, cols, x, 0, 1, lane, acc); break;
        case GgmlType::Q4_1: DotQ4_1::dot<1, false>(row, cols, x, 0, 1, lane, acc); break;
        case GgmlType::Q5_0: DotQ5_0::dot<1, false>(row, cols, x, 0, 1, lane, acc); break;
        case GgmlType::Q5_1: DotQ5_1::dot<1, false>(row, cols, x, 0, 1, lane, acc); break;
        case GgmlType::Q2_K: DotQ2_K::dot<1, false>(row, cols, x, 0, 1, lane, acc); break;
        case GgmlType::Q3_K: DotQ3_K::dot<1, false>(row, cols, x, 0, 1, lane, acc); break;
        case GgmlType::Q4_K: DotQ4_K::dot<1, false>(row, cols, x, 0, 1, lane, acc); break;
        case GgmlType::Q5_K: DotQ5_K::dot<1, false>(row, cols, x, 0, 1, lane, acc); break;
        case GgmlType::Q6_K: DotQ6_K::dot<1, false>(row, cols, x, 0, 1, lane, acc); break;
        default: break;  // decode_step_supports refused it on the host
    }
    return acc[0];
}

// Row r of M dotted with x, the whole warp's sum (every lane gets it).
__device__ __forceinline__ float row_dot(const DecodeMatrix& M, int r, int cols, const float* x, int lane) {
    const uint8_t* row = static_cast<const uint8_t*>(M.data) + static_cast<size_t>(r) * M.row_bytes;
    return detail::warp_sum(lane_dot(M.type, row, cols, x, lane));
}

// xs = RMSNorm(x) * weight for one row of `cols` (x written by other blocks: read past L1), by every thread of the
// block; ends with a barrier, so xs is ready for every warp.
__device__ __forceinline__ void normalize_into(float* xs, const float* x, const float* weight, int cols, float eps,
                                               float* scratch) {
    const int tid = static_cast<int>(threadIdx.x);
    float ss = 0.0f;
    for (int i = tid; i < cols; i += kThreads) {
        const float v = __ldcg(x + i);
        xs[i] = v;
        ss += v * v;
    }
    const float scale = norm::inverse_rms(detail::block_sum(ss, scratch), cols, eps);
    for (int i = tid; i < cols; i += kThreads) xs[i] = weight[i] * (scale * xs[i]);
    __syncthreads();
}

// xs = v (n floats other blocks wrote), by every thread of the block; ends with a barrier.
__device__ __forceinline__ void copy_into(float* xs, const float* v, int n) {
    for (int i = static_cast<int>(threadIdx.x); i < n; i += kThreads) xs[i] = __ldcg(v + i);
    __syncthreads();
}

// The splits of a step's keys: as many as give every warp of the grid about one (head, split), at most max_splits
// (the workspace's) and at least kMinSplitKeys keys each; the split size is then the keys over the splits, rounded
// up, and the count what that size needs (so no split is empty).
struct Splits {
    int count, size;
};
__device__ __forceinline__ Splits key_splits(int n_keys, int max_splits) {
    int count = (n_keys + kMinSplitKeys - 1) / kMinSplitKeys;
    if (count > max_splits) count = max_splits;
    const int size = (n_keys + count - 1) / count;
    return {(n_keys + size - 1) / size, size};
}

// The partial of (head, split): [m, l, acc[head_dim]].
__device__ __forceinline__ float* partial(float* ws, int head, int split, int max_splits, int hd) {
    return ws + (static_cast<size_t>(head) * max_splits + split) * (hd + 2);
}

// att[head] from the head's splits' partials (written by other warps of the grid), by one warp.
__device__ __forceinline__ void combine_head(const DecodeStepArgs& a, int head, Splits sp, int max_splits, int lane) {
    const int hd = a.head_dim;
    float M = -INFINITY;
    for (int s = 0; s < sp.count; ++s) M = fmaxf(M, __ldcg(partial(a.workspace, head, s, max_splits, hd)));
    for (int d = lane; d < hd; d += 32) {
        float sum_l = 0.0f, sum_acc = 0.0f;
        for (int s = 0; s < sp.count; ++s) {
            const float* p = partial(a.workspace, head, s, max_splits, hd);
            const float w = expf(__ldcg(p) - M);
            sum_l += __ldcg(p + 1) * w;
            sum_acc += __ldcg(p + 2 + d) * w;
        }
        a.att[head * hd + d] = sum_acc / sum_l;
    }
}

// One warp's (head, split): the online softmax of q . k / sqrt(head_dim) over the split's keys, kKeysPerStep keys
// a step (their K loads issued together, one update of the running max for them, then their V loads: a warp waits
// for memory twice a step, not twice a key), lane j holding dims lane + 32 i (i < D); the split's partial written
// out. The head's last split to finish (counted in a.head_counters: the threadFenceReduction pattern, as the
// attention kernel's splits) combines the head's splits into att and resets its counter.
template <int D>
__device__ __forceinline__ void attend_split(const DecodeStepArgs& a, const DecodeStepLayer& L, int head, int split,
                                             Splits sp, int n_keys, int max_splits, int lane) {
    // Heads over 64 (D = 4) take two keys a step: with four, ptxas (which kept the kernel at 128 registers) spilled 4
    // bytes on sm_80.
    constexpr int U = D >= 4 ? kKeysPerStep / 2 : kKeysPerStep;
    const int hd = a.head_dim, kv_dim = a.n_kv_heads * hd;
    const int e0 = (head / (a.n_heads / a.n_kv_heads)) * hd;  // the kv head's first element in a cache row
    const float scale = 1.0f / sqrtf(static_cast<float>(hd));
    const uint16_t* k_rows = static_cast<const uint16_t*>(L.k_cache);
    const uint16_t* v_rows = static_cast<const uint16_t*>(L.v_cache);
    float q[D], acc[D];
#pragma unroll
    for (int i = 0; i < D; ++i) {
        const int d = lane + 32 * i;
        q[i] = d < hd ? __ldcg(a.q + head * hd + d) : 0.0f;
        acc[i] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const int begin = split * sp.size, end = begin + sp.size < n_keys ? begin + sp.size : n_keys;
    for (int t0 = begin; t0 < end; t0 += U) {
        const int n_u = end - t0 < U ? end - t0 : U;  // >= 1, the same for the whole warp
        float s[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            s[u] = 0.0f;
            if (u >= n_u) continue;
            const uint16_t* k = k_rows + static_cast<size_t>(t0 + u) * kv_dim + e0;
#pragma unroll
            for (int i = 0; i < D; ++i)
                if (lane + 32 * i < hd) s[u] += q[i] * tandem_half_to_float(__ldcg(k + lane + 32 * i));
        }
        float m_new = m;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            s[u] = detail::warp_sum(s[u]) * scale;
            if (u < n_u) m_new = fmaxf(m_new, s[u]);
        }
        const float correction = expf(m - m_new);
        float p[U], p_sum = 0.0f;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            p[u] = u < n_u ? expf(s[u] - m_new) : 0.0f;
            p_sum += p[u];
        }
        l = l * correction + p_sum;
#pragma unroll
        for (int i = 0; i < D; ++i) {
            if (lane + 32 * i >= hd) continue;
            float pv = 0.0f;
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (u < n_u)
                    pv += p[u] * tandem_half_to_float(
                                     __ldcg(v_rows + static_cast<size_t>(t0 + u) * kv_dim + e0 + lane + 32 * i));
            acc[i] = acc[i] * correction + pv;
        }
        m = m_new;
    }
    float* out = partial(a.workspace, head, split, max_splits, hd);
    if (lane == 0) {
        out[0] = m;
        out[1] = l;
    }
#pragma unroll
    for (int i = 0; i < D; ++i)
        if (lane + 32 * i < hd) out[2 + lane + 32 * i] = acc[i];
    // Each lane's fence makes its share of the partial visible to the device before lane 0 counts the split.
    __threadfence();
    __syncwarp();
    unsigned last = 0;
    if (lane == 0) {
        last = atomicAdd(a.head_counters + head, 1u) + 1 == static_cast<unsigned>(sp.count) ? 1u : 0u;
        if (last) a.head_counters[head] = 0;  // every split of the head has counted
    }
    if (!__shfl_sync(detail::kFullMask, last, 0)) return;
    __threadfence();
    combine_head(a, head, sp, max_splits, lane);
}

template <int D>
__global__ void __launch_bounds__(kThreads) decode_step_kernel(DecodeStepArgs a, int max_splits) {
    TANDEM_DYNAMIC_SHARED(float, xs);
    TANDEM_SHARED(float, scratch, 32);
    TANDEM_SHARED(int, pending, kDecodeStepMaxHeads);  // the heads this block ropes in the current layer
    TANDEM_SHARED(int, n_pending, 1);
    const int lane = static_cast<int>(threadIdx.x) % 32;
    const int warp = static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x) / 32;
    const int n_warps = static_cast<int>(gridDim.x) * kWarpsPerBlock;
    const int pos = *a.device_pos, n_keys = pos + 1;
    const int dim = a.dim, hd = a.head_dim, q_dim = a.n_heads * hd, kv_dim = a.n_kv_heads * hd;
    const Splits sp = key_splits(n_keys, max_splits);
    for (int layer = 0; layer < a.n_layers; ++layer) {
        const DecodeStepLayer& L = a.layers[layer];

        // 1. Q, K, V (rows of the three one after another) from the normalized stream, each head roped (or V
        //    copied into the cache) by the block that writes its last row.
        RopeKvArgs rope{a.q,          a.k,          a.v,       L.k_cache, L.v_cache, a.inv_freq, 1, 0, a.n_heads,
                        a.n_kv_heads, a.head_dim,   a.rope_dim, a.mode,   KvType::F16};
        rope.device_start_pos = a.device_pos;
        rope.trig = a.trig;
        if (threadIdx.x == 0) n_pending[0] = 0;  // before the barrier that ends normalize_into
        normalize_into(xs, a.x, L.attn_norm, dim, a.eps, scratch);
        for (int r = warp; r < q_dim + 2 * kv_dim; r += n_warps) {
            const int which = r < q_dim ? 0 : r < q_dim + kv_dim ? 1 : 2;
            const int row = which == 0 ? r : which == 1 ? r - q_dim : r - q_dim - kv_dim;
            const DecodeMatrix& M = which == 0 ? L.wq : which == 1 ? L.wk : L.wv;
            const float* bias = which == 0 ? L.bq : which == 1 ? L.bk : L.bv;
            float y = row_dot(M, row, dim, xs, lane);
            if (bias) y += bias[row];
            if (lane == 0) {
                (which == 0 ? a.q : which == 1 ? a.k : a.v)[row] = y;
                // Q heads, then K heads, then V heads: r / head_dim is the head's index among them.
                const int head = r / hd;
                __threadfence();  // the row visible to the device before it is counted
                if (atomicAdd(a.rope_counters + head, 1u) + 1 == static_cast<unsigned>(hd)) {
                    a.rope_counters[head] = 0;  // every row of the head has counted
                    pending[atomicAdd(n_pending, 1)] = head;
                }
            }
        }
        // The heads whose last row this block wrote, by the whole block (in the row loop, the RoPE code made ptxas
        // spill the walks' registers).
        __syncthreads();
        if (n_pending[0] > 0) {
            __threadfence();
            for (int i = 0; i < n_pending[0]; ++i) rope::head_epilogue(rope, pending[i], a.q, a.k, a.v, 0, 1);
        }
        tandem_grid_sync();

        // 2. Attention, a warp per (head, split); each head's last split combines the head's.
        for (int item = warp; item < a.n_heads * sp.count; item += n_warps)
            attend_split<D>(a, L, item / sp.count, item % sp.count, sp, n_keys, max_splits, lane);
        tandem_grid_sync();

        // 3. attn_output added into the stream.
        copy_into(xs, a.att, q_dim);
        for (int r = warp; r < dim; r += n_warps) {
            const float y = row_dot(L.wo, r, q_dim, xs, lane);
            if (lane == 0) a.x[r] = __ldcg(a.x + r) + y;
        }
        tandem_grid_sync();

        // 4. gate and up from the normalized stream, SwiGLU.
        normalize_into(xs, a.x, L.ffn_norm, dim, a.eps, scratch);
        for (int r = warp; r < a.hidden_dim; r += n_warps) {
            const float g = row_dot(L.gate, r, dim, xs, lane), u = row_dot(L.up, r, dim, xs, lane);
            if (lane == 0) a.h[r] = detail::silu_times(g, u);
        }
        tandem_grid_sync();

        // 5. ffn_down added into the stream.
        copy_into(xs, a.h, a.hidden_dim);
        for (int r = warp; r < dim; r += n_warps) {
            const float y = row_dot(L.down, r, a.hidden_dim, xs, lane);
            if (lane == 0) a.x[r] = __ldcg(a.x + r) + y;
        }
        tandem_grid_sync();
    }
    if (blockIdx.x != 0) return;
    normalize_into(xs, a.x, a.output_norm, dim, a.eps, scratch);
    for (int i = static_cast<int>(threadIdx.x); i < dim; i += kThreads) a.out[i] = xs[i];
}

// The kernel for a head size (lanes hold dims lane + 32 i, i < D).
using DecodeStepKernel = void (*)(DecodeStepArgs, int);
DecodeStepKernel kernel_for(int head_dim) {
    if (head_dim <= 32) return decode_step_kernel<1>;
    if (head_dim <= 64) return decode_step_kernel<2>;
    return decode_step_kernel<4>;
}

size_t shared_bytes_for(const DecodeStepShape& s) {
    int most = s.dim > s.hidden_dim ? s.dim : s.hidden_dim;
    if (s.n_heads * s.head_dim > most) most = s.n_heads * s.head_dim;
    return static_cast<size_t>(most) * sizeof(float);
}

// Lets the kernel take `bytes` of dynamic shared memory (beyond 48 KiB only with the opt-in).
void allow_shared(DecodeStepKernel kernel, size_t bytes) {
    if (bytes <= 48 * 1024) return;
#if defined(__CUDACC__)
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        throw std::runtime_error(std::string("tandem::cuda: decode_step: ") + std::to_string(bytes) +
                                 " bytes of shared memory: " + cudaGetErrorString(err));
    }
#else
    emu::set_max_dynamic_shared(reinterpret_cast<const void*>(kernel), bytes);
#endif
}

}  // namespace

bool decode_step_supports(const DecodeStepShape& s) {
    return s.n_layers > 0 && s.dim > 0 && s.hidden_dim > 0 && s.n_heads > 0 && s.n_kv_heads > 0 &&
           s.n_heads % s.n_kv_heads == 0 && s.n_heads + 2 * s.n_kv_heads <= kDecodeStepMaxHeads && s.head_dim > 0 &&
           s.head_dim <= kDecodeStepMaxHeadDim &&
           s.kv_type == KvType::F16;
}

bool decode_step_supports(GgmlType type, int cols) {
    return matvec_supports(type) && cols % static_cast<int>(ggml_type_info(type).block_size) == 0;
}

DecodeStepPlan decode_step_plan(const DecodeStepShape& s, int blocks) {
    detail::require(decode_step_supports(s), "decode_step: unsupported shape (head_dim <= 128, at most 256 Q, K and V heads, fp16 cache)");
    DecodeStepKernel kernel = kernel_for(s.head_dim);
    const size_t shared = shared_bytes_for(s);
    allow_shared(kernel, shared);
    const int most = cooperative_max_blocks(reinterpret_cast<const void*>(kernel), kThreads, shared);
    detail::require(most > 0, "decode_step: no block of the kernel fits on the device");
    // Two blocks per SM by default: the most a 256-thread block's registers usually leave room for, and enough warps
    // in flight to keep loads queued; every block must be resident (a cooperative launch).
    if (blocks <= 0) blocks = 2 * multiprocessor_count();
    DecodeStepPlan plan;
    plan.blocks = blocks < most ? blocks : most;
    plan.threads = kThreads;
    plan.shared_bytes = shared;
    const int warps = plan.blocks * kWarpsPerBlock;
    plan.max_splits = warps / s.n_heads > 1 ? warps / s.n_heads : 1;
    plan.workspace_floats = static_cast<size_t>(s.n_heads) * plan.max_splits * (s.head_dim + 2);
    return plan;
}

void decode_step(const DecodeStepArgs& a, const DecodeStepPlan& plan, Stream stream) {
    detail::require(a.layers && a.x && a.out && a.q && a.k && a.v && a.att && a.h && a.workspace && a.head_counters &&
                        a.rope_counters &&
                        a.device_pos && a.trig && a.inv_freq && a.output_norm,
                    "decode_step: missing buffer");
    detail::require(a.rope_dim % 2 == 0 && a.rope_dim > 0 && a.rope_dim <= a.head_dim,
                    "decode_step: rope_dim must be even and <= head_dim");
    detail::require(plan.blocks > 0 && plan.threads == kThreads && plan.max_splits > 0, "decode_step: bad plan");
    detail::launch_cooperative_kernel("decode_step_kernel", kernel_for(a.head_dim), dim3(plan.blocks),
                                      dim3(kThreads), plan.shared_bytes, stream, a, plan.max_splits);
}

}  // namespace tandem::cuda
