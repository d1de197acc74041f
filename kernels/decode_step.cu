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
#include "matvec_dots_q8.cuh"
#include "online_softmax.cuh"
#include "rms_norm.cuh"
#include "rope_kv.cuh"

namespace tandem::cuda {
namespace {

using namespace matvec_detail;

constexpr int kThreads = 256, kWarpsPerBlock = kThreads / 32;
// Attention: keys a warp takes per step, and the fewest a split has (two steps: below that a warp's partial costs
// more to combine than to compute).
constexpr int kKeysPerStep = 4, kMinSplitKeys = 2 * kKeysPerStep;

// This lane's share of one row's dot product with x (shared memory, 16-byte aligned), by the row's type, each lane
// loading its share of the row from global memory (MatvecLoads::Direct: the matvec kernels' direct walk). Inlined
// into the kernel's row walk: as a call (__noinline__), ptxas kept the caller's live registers in a stack frame
// across it (8-48 bytes of local memory, a build error).
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

// ---- staged rows (kernels.h DecodeStepRows: the default) ---------------------------------------------------------
// Why: a warp of the direct walk has one walk step of its row in flight at a time (a 4096-wide Q4_0 row: 72 bytes a
// step, 288 with nvcc's unroll by 4, eight memory latencies a row), and this kernel holds only 16 warps per SM (two
// blocks of 8), where the matvec launches hold 24-64: by Little's law about 16 x 288 bytes = 4.6 KB in flight per
// SM against the ~26 KB that 4.2 TB/s over 132 SMs asks at a ~0.8 us latency. Staged, each warp copies its row into
// its own 2 KiB of shared memory a chunk at a time with 16-byte loads (load_slot, as the matvec staged kernel), the
// next chunk -- or, at a row's last chunk, the warp's next row's first chunk, in
// the same phase or the next one: the weights never change, so a load may cross a grid barrier -- in flight while the
// lanes walk the current one with the same Dot from shared memory: 16 x 2 KiB = 32 KiB in flight per SM. A chunk is
// a whole number of the walk's steps, so the sums are bitwise the direct walk's (tested). The float types (F32, F16,
// BF16: 8- and 16-byte loads already) keep the direct walk. The 8-bit sets (StagesInt8*) walk the same chunks with
// matvec_q8's walks against the phase's input quantized in shared memory (quantize_into): kernels.h DecodeStepRows
// says why.

// 16-byte slots of shared memory per warp, 2 KiB: a chunk in flight is kStepPerLane 16-byte loads per lane.
constexpr int kStepSlots = 128, kStepPerLane = kStepSlots / 32;

// Blocks per chunk: whole steps of the walk (so the sums are the direct walk's), as many as kStepSlots slots hold
// wherever in its first slot the chunk starts. (The matvec staged kernel's chunks, staged_chunk_blocks, also keep
// every chunk at the row's offset within a slot, which for Q6_K's 210-byte blocks means 8-block units; here each
// chunk has its own offset, so any whole walk steps fit.)
template <class Dot>
__host__ __device__ constexpr int step_chunk_blocks() {
    constexpr int fit = (kStepSlots * 16 - 15) / Dot::kBlockBytes;
    static_assert(fit >= Dot::kStepBlocks, "a chunk must hold one step of the walk");
    return fit / Dot::kStepBlocks * Dot::kStepBlocks;
}

// A weight row as the walks see it; begin null: none.
struct RowRef {
    const uint8_t* begin;
    int bytes;
    GgmlType type;
};
__device__ __forceinline__ RowRef row_ref(const DecodeMatrix& M, int r) {
    return {static_cast<const uint8_t*>(M.data) + static_cast<size_t>(r) * M.row_bytes, static_cast<int>(M.row_bytes),
            M.type};
}
__device__ __forceinline__ RowRef no_row() { return {nullptr, 0, GgmlType::F32}; }

template <class Dot>
__host__ __device__ constexpr int chunk_bytes() {
    return step_chunk_blocks<Dot>() * Dot::kBlockBytes;
}

// The block types a staged kernel copies through shared memory, each a GGUF type with its walk. Every call site of
// the row walk inlines each of its types' walks, and ptxas kept a kernel within 128 registers with no spill only
// for some types together, so there are two sets (kernels.h DecodeStepRows): one for the legacy types and Q4_K_M's
// mixtures, one for Q5_K_M's; Q2_K and Q3_K rows have only the direct kernel. An empty set: the direct kernel.
template <GgmlType T, class W>
struct StagedType {
    static constexpr GgmlType kType = T;
    using Dot = W;
};
template <class... S>
struct Stages {
    static constexpr bool kAny = sizeof...(S) > 0;
    static constexpr bool has([[maybe_unused]] GgmlType type) { return ((S::kType == type) || ... || false); }
    // Whether a walk of the set reads 8-bit activations: the step then quantizes each phase's input in shared
    // memory, to the formats the phase's matrices read (quantize_into).
    static constexpr bool kInt8 = (!std::is_same_v<typename S::Dot::Input, FloatInput> || ... || false);
};
struct DirectRows : Stages<> {};
struct StagesQ4K : Stages<StagedType<GgmlType::Q8_0, DotQ8_0>, StagedType<GgmlType::Q4_0, DotQ4_0>,
                          StagedType<GgmlType::Q4_1, DotQ4_1>, StagedType<GgmlType::Q5_0, DotQ5_0>,
                          StagedType<GgmlType::Q5_1, DotQ5_1>, StagedType<GgmlType::Q4_K, DotQ4_K>,
                          StagedType<GgmlType::Q6_K, DotQ6_K>> {};
struct StagesQ5K : Stages<StagedType<GgmlType::Q8_0, DotQ8_0>, StagedType<GgmlType::Q5_0, DotQ5_0>,
                          StagedType<GgmlType::Q5_1, DotQ5_1>, StagedType<GgmlType::Q4_K, DotQ4_K>,
                          StagedType<GgmlType::Q5_K, DotQ5_K>, StagedType<GgmlType::Q6_K, DotQ6_K>> {};
// 8-bit activations (kernels.h DecodeStepRows::Int8*): matvec_q8's walks (matvec_dots_q8.cuh) against Q8_1 (the
// 32-element types) or Q8_K (the k-quants) rows that each block quantizes into its shared memory. Two types a
// kernel: on sm_80 a Q4_0-only kernel took 119 registers, and every set of three of Q5_0, Q8_0, Q4_K, Q6_K spilled
// 8-16 bytes (four: 84; the legacy five: 32), where the fp32 walks fit seven; Q5_K with Q6_K spilled 12 bytes on a
// later architecture, so Q5_K_M's rows stay fp32.
struct StagesInt8Q4_0 : Stages<StagedType<GgmlType::Q4_0, DotQ4_0Q8>, StagedType<GgmlType::Q8_0, DotQ8_0Q8>> {};
struct StagesInt8Q4K : Stages<StagedType<GgmlType::Q4_K, DotQ4_KQ8>, StagedType<GgmlType::Q6_K, DotQ6_KQ8>> {};

// A phase's input as each walk reads it: fp32 (xs, always), and with an 8-bit set the same row as Q8_1 and Q8_K
// blocks (where the phase's matrices read them), at these byte offsets from xs.
struct StepInput {
    float* f;
    int q8_1, q8_k;
    __device__ __forceinline__ uint8_t* q8_1_row() const { return reinterpret_cast<uint8_t*>(f) + q8_1; }
    __device__ __forceinline__ uint8_t* q8_k_row() const { return reinterpret_cast<uint8_t*>(f) + q8_k; }
};
template <class Dot>
__device__ __forceinline__ const typename Dot::X* input_for(const StepInput& x) {
    if constexpr (std::is_same_v<typename Dot::Input, FloatInput>) return x.f;
    else if constexpr (std::is_same_v<typename Dot::Input, Q8_1Input>) return x.q8_1_row();
    else return x.q8_k_row();
}

// A staged type's chunk size in bytes; 0 for the types the set walks directly.
template <class... S>
__device__ __forceinline__ int staged_chunk_bytes(Stages<S...>, GgmlType type) {
    int bytes = 0;
    (void)type;  // (unused in the direct kernel's empty set)
    (void)((type == S::kType && (bytes = chunk_bytes<typename S::Dot>(), true)) || ... || false);
    return bytes;
}

// Where a chunk starts within its first 16-byte slot.
__device__ __forceinline__ int slot_lead(const uint8_t* p) { return static_cast<int>(reinterpret_cast<uintptr_t>(p) % 16); }

// The `bytes` bytes of a row from `start` into buf, from the 16-byte slot holding start on (slot lane + 32 k in
// buf[k]); bytes at or past the row's end are not read (load_slot).
__device__ __forceinline__ void load_chunk(uint4 (&buf)[kStepPerLane], const uint8_t* start, int bytes,
                                           const uint8_t* end, int lane) {
    const int lead = slot_lead(start), n = (lead + bytes + 15) / 16;
    const uint8_t* first = start - lead;
#pragma unroll
    for (int k = 0; k < kStepPerLane; ++k)
        if (lane + 32 * k < n) buf[k] = load_slot(first + 16 * (lane + 32 * k), end);
}

// Requests row's first chunk into buf (nothing for no row or a type walked directly).
template <class Set>
__device__ __forceinline__ void prefetch_row(Set set, const RowRef& row, uint4 (&buf)[kStepPerLane], int lane) {
    const int chunk = staged_chunk_bytes(set, row.type);
    if (!row.begin || chunk == 0) return;
    load_chunk(buf, row.begin, row.bytes < chunk ? row.bytes : chunk, row.begin + row.bytes, lane);
}

// This lane's share of cur . x, cur's first chunk already in buf (prefetch_row); the first chunk of next() (the
// warp's next row, computed only then: a RowRef kept through the walk took registers ptxas did not have) is
// requested before cur's last chunk is walked.
template <class Dot, class Set, class Next>
__device__ __forceinline__ float staged_lane_dot(Set set, const RowRef& cur, Next&& next, int cols,
                                                 const typename Dot::X* x, uint4* stage, uint4 (&buf)[kStepPerLane],
                                                 int lane) {
    constexpr int kChunkBlocks = step_chunk_blocks<Dot>();
    constexpr int kChunkBytes = kChunkBlocks * Dot::kBlockBytes, kChunkCols = kChunkBlocks * Dot::kBlockCols;
    const uint8_t* end = cur.begin + cur.bytes;
    const int n_blocks = cols / Dot::kBlockCols, n_chunks = (n_blocks + kChunkBlocks - 1) / kChunkBlocks;
    float acc[1] = {0.0f};
    for (int c = 0; c < n_chunks; ++c) {
        const int blocks = n_blocks - c * kChunkBlocks < kChunkBlocks ? n_blocks - c * kChunkBlocks : kChunkBlocks;
        const int lead = slot_lead(cur.begin + static_cast<size_t>(c) * kChunkBytes);
        const int n = (lead + blocks * Dot::kBlockBytes + 15) / 16;
#pragma unroll
        for (int k = 0; k < kStepPerLane; ++k)
            if (lane + 32 * k < n) stage[lane + 32 * k] = buf[k];
        __syncwarp();
        if (c + 1 < n_chunks) {
            const int rest = n_blocks - (c + 1) * kChunkBlocks;
            load_chunk(buf, cur.begin + static_cast<size_t>(c + 1) * kChunkBytes,
                       (rest < kChunkBlocks ? rest : kChunkBlocks) * Dot::kBlockBytes, end, lane);
        } else {
            prefetch_row(set, next(), buf, lane);
        }
        Dot::template dot<1, false>(reinterpret_cast<const uint8_t*>(stage) + lead, blocks * Dot::kBlockCols,
                                    x + Dot::x_units(c * kChunkCols), 0, 1, lane, acc);
        __syncwarp();  // every lane is done with the copy before the next chunk overwrites it
    }
    return acc[0];
}

// This lane's share of cur . x for a type that `set` walks directly: the float types (next's first chunk requested
// first).
template <class Set, class Next>
__device__ __forceinline__ float unstaged_lane_dot(Set set, const RowRef& cur, Next&& next, int cols, const float* x,
                                                   uint4 (&buf)[kStepPerLane], int lane) {
    prefetch_row(set, next(), buf, lane);
    float acc[1] = {0.0f};
    if (cur.type == GgmlType::F32) DotF32::dot<1, false>(cur.begin, cols, x, 0, 1, lane, acc);
    if (cur.type == GgmlType::F16) DotF16::dot<1, false>(cur.begin, cols, x, 0, 1, lane, acc);
    if (cur.type == GgmlType::BF16) DotBF16::dot<1, false>(cur.begin, cols, x, 0, 1, lane, acc);
    return acc[0];
}

// The whole warp's cur . x (every lane gets it): staged for the set's block types (next's first chunk requested on
// the way), direct for the float types and for every type in the direct kernel (an empty set).
template <class... S, class Next>
__device__ __forceinline__ float row_dot(Stages<S...> set, const RowRef& cur, Next&& next, int cols,
                                         const StepInput& x, uint4* stage, uint4 (&buf)[kStepPerLane], int lane) {
    float v = 0.0f;
    if constexpr (!Stages<S...>::kAny) {
        v = lane_dot(cur.type, cur.begin, cols, x.f, lane);
    } else {
        const bool staged =
            ((cur.type == S::kType ? (v = staged_lane_dot<typename S::Dot>(set, cur, next, cols,
                                                                           input_for<typename S::Dot>(x), stage, buf,
                                                                           lane),
                                      true)
                                   : false) ||
             ...);
        if (!staged) v = unstaged_lane_dot(set, cur, next, cols, x.f, buf, lane);  // decode_step_stages refuses others
    }
    return detail::warp_sum(v);
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
// a step (attend::online_softmax_step, attention.cu's arithmetic), lane j holding dims lane + 32 i (i < D); the
// split's partial written out. The head's last split to finish (counted in a.head_counters: the
// threadFenceReduction pattern, as the attention kernel's splits) combines the head's splits into att and resets
// its counter.
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
        const auto key = [&](int u, int i) {
            return tandem_half_to_float(__ldcg(k_rows + static_cast<size_t>(t0 + u) * kv_dim + e0 + lane + 32 * i));
        };
        const auto value = [&](int u, int i) {
            return tandem_half_to_float(__ldcg(v_rows + static_cast<size_t>(t0 + u) * kv_dim + e0 + lane + 32 * i));
        };
        attend::online_softmax_step<D, U>(q, n_u, hd, lane, scale, 0.0f, 0.0f, key, value, m, l, acc);
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

// Per block: each warp's 2 KiB stage for the staged walks (the start of the dynamic shared memory), then xs (the
// phase's input in fp32, as wide as the widest), then with an 8-bit set the same as Q8_1 and as Q8_K rows.
constexpr size_t kStageBytes = static_cast<size_t>(kWarpsPerBlock) * kStepSlots * sizeof(uint4);
struct SharedLayout {
    size_t xs, q8_1, q8_k, bytes;
};
__host__ __device__ constexpr size_t round_up_16(size_t n) { return (n + 15) / 16 * 16; }
__host__ __device__ inline SharedLayout shared_layout(int widest, bool staged, bool int8) {
    const size_t w = static_cast<size_t>(widest);
    SharedLayout l{};
    l.xs = staged ? kStageBytes : 0;
    l.q8_1 = l.xs + round_up_16(w * sizeof(float));
    l.q8_k = l.q8_1 + (int8 ? round_up_16(w / q8::block_elems(false) * q8::block_bytes(false)) : 0);
    l.bytes = int8 ? l.q8_k + round_up_16(w / q8::block_elems(true) * q8::block_bytes(true)) : l.q8_1;
    return l;
}
__host__ __device__ inline int widest_input(int dim, int hidden_dim, int q_dim) {
    const int most = dim > hidden_dim ? dim : hidden_dim;
    return q_dim > most ? q_dim : most;
}

// The 8-bit formats a matrix's walk reads (bit 1: Q8_1, bit 2: Q8_K; none for the float types).
__device__ __forceinline__ unsigned q8_formats(const DecodeMatrix& M) {
    const Q8Format f = q8::format_for(M.type);
    return f == Q8Format::Q8_1 ? 1u : f == Q8Format::Q8_K ? 2u : 0u;
}

// An 8-bit set's phase input: xs quantized, by the block's warps a block each in turn, into the formats the phase's
// matrices read (q8::quantize_block: the CPU's and quantize_activations' bytes for the same floats); ends with a
// barrier where it wrote anything. cols is a whole number of each format's blocks where a matrix reads it (the
// matrices' rows are whole blocks of their types).
__device__ __forceinline__ void quantize_into(const StepInput& in, int cols, unsigned formats) {
    if (formats == 0) return;
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    if (formats & 1u)
        for (int b = warp; b < cols / q8::block_elems(false); b += kWarpsPerBlock)
            q8::quantize_block(false, in.f, in.q8_1_row(), b, lane);
    if (formats & 2u)
        for (int b = warp; b < cols / q8::block_elems(true); b += kWarpsPerBlock)
            q8::quantize_block(true, in.f, in.q8_k_row(), b, lane);
    __syncthreads();
}

// The four phases of a layer that walk weight rows, and the rows a warp walks in each: rows warp, warp + n_warps,
// ... of the phase's matrices (Q, K and V one after another; gate/up: gate r then up r, for SwiGLU).
enum Phase { kQkv, kAttnOut, kGateUp, kDown, kPhases };
struct StepRows {
    const DecodeStepArgs& a;
    int warp, n_warps, q_dim, kv_dim;
    __device__ __forceinline__ int rows(int phase) const {
        return phase == kQkv ? q_dim + 2 * kv_dim : phase == kGateUp ? a.hidden_dim : a.dim;
    }
    __device__ __forceinline__ int cols(int phase) const {
        return phase == kAttnOut ? q_dim : phase == kDown ? a.hidden_dim : a.dim;
    }
    __device__ __forceinline__ int per_row(int phase) const { return phase == kGateUp ? 2 : 1; }
    // The row of the warp's item k in `phase` (valid while has(phase, k)).
    __device__ __forceinline__ int row(int phase, int k) const { return warp + k / per_row(phase) * n_warps; }
    __device__ __forceinline__ bool has(int phase, int k) const { return row(phase, k) < rows(phase); }
    __device__ __forceinline__ RowRef item(const DecodeStepLayer* layer, int phase, int k) const {
        const DecodeStepLayer& L = *layer;
        const int r = row(phase, k);
        switch (phase) {
            case kQkv:
                return r < q_dim ? row_ref(L.wq, r) : r < q_dim + kv_dim ? row_ref(L.wk, r - q_dim)
                                                                         : row_ref(L.wv, r - q_dim - kv_dim);
            case kAttnOut: return row_ref(L.wo, r);
            case kGateUp: return row_ref(k % 2 == 0 ? L.gate : L.up, r);
            default: return row_ref(L.down, r);
        }
    }
    // The warp's first row of `phase` (kPhases: the next layer's first), if any.
    __device__ __forceinline__ RowRef first(const DecodeStepLayer* layer, int phase) const {
        if (phase == kPhases) {
            ++layer;
            phase = kQkv;
        }
        return layer < a.layers + a.n_layers && has(phase, 0) ? item(layer, phase, 0) : no_row();
    }
    // What follows item k: the phase's next, else the next phase's first (none after Q/K/V: attention follows,
    // and a chunk held across attention's registers would crowd them).
    __device__ __forceinline__ RowRef after(const DecodeStepLayer* layer, int phase, int k) const {
        if (has(phase, k + 1)) return item(layer, phase, k + 1);
        return phase == kQkv ? no_row() : first(layer, phase + 1);
    }
};

// Set: the block types whose rows are staged through shared memory (above); an empty set, the direct walk. Two blocks
// per SM, so ptxas keeps to 128 registers. The four weight phases of a layer are one loop around one row walk: each
// call site of the walk inlines every type's (as separate loops, 4 copies took nvcc minutes and ptxas spilled).
template <int D, class Set>
__global__ void __launch_bounds__(kThreads, 2) decode_step_kernel(DecodeStepArgs a, int max_splits) {
    constexpr bool kStaged = Set::kAny;
    const Set set;
    TANDEM_DYNAMIC_SHARED(unsigned char, dynamic_shared);
    uint4* stage = reinterpret_cast<uint4*>(dynamic_shared) + (threadIdx.x / 32) * kStepSlots;
    TANDEM_SHARED(float, scratch, 32);
    TANDEM_SHARED(int, pending, kDecodeStepMaxHeads);  // the heads this block ropes in the current layer
    TANDEM_SHARED(int, n_pending, 1);
    const int lane = static_cast<int>(threadIdx.x) % 32;
    const int warp = static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x) / 32;
    const int n_warps = static_cast<int>(gridDim.x) * kWarpsPerBlock;
    const int dim = a.dim, hd = a.head_dim, q_dim = a.n_heads * hd, kv_dim = a.n_kv_heads * hd;
    const StepRows rows{a, warp, n_warps, q_dim, kv_dim};
    const SharedLayout shared = shared_layout(widest_input(dim, a.hidden_dim, q_dim), kStaged, Set::kInt8);
    const StepInput in{reinterpret_cast<float*>(dynamic_shared + shared.xs),
                       static_cast<int>(shared.q8_1 - shared.xs), static_cast<int>(shared.q8_k - shared.xs)};
    float* xs = in.f;
    // The staged walks' chunk in flight: always the first chunk of the warp's next row, requested by the walk of the
    // row before it or, where that row is the warp's first in a phase, after the phase before.
    uint4 buf[kStepPerLane];
    if (kStaged) prefetch_row(set, rows.first(a.layers, kQkv), buf, lane);
    // The layer by its pointer (as an index too, ptxas spilled the index).
    for (const DecodeStepLayer* layer = a.layers; layer != a.layers + a.n_layers; ++layer) {
        const DecodeStepLayer& L = *layer;
#pragma unroll 1
        for (int phase = kQkv; phase < kPhases; ++phase) {
            // What the phase's rows read, into xs (each ends with a block barrier).
            if (phase == kQkv) {
                if (threadIdx.x == 0) n_pending[0] = 0;  // before the barrier that ends normalize_into
                normalize_into(xs, a.x, L.attn_norm, dim, a.eps, scratch);
            } else if (phase == kAttnOut) {
                copy_into(xs, a.att, q_dim);
            } else if (phase == kGateUp) {
                normalize_into(xs, a.x, L.ffn_norm, dim, a.eps, scratch);
            } else {
                copy_into(xs, a.h, a.hidden_dim);
            }
            const int cols = rows.cols(phase);
            if constexpr (Set::kInt8)
                quantize_into(in, cols,
                              phase == kQkv      ? q8_formats(L.wq) | q8_formats(L.wk) | q8_formats(L.wv)
                              : phase == kAttnOut ? q8_formats(L.wo)
                              : phase == kGateUp  ? q8_formats(L.gate) | q8_formats(L.up)
                                                  : q8_formats(L.down));
            float gate = 0.0f;
            for (int k = 0; rows.has(phase, k); ++k) {
                const float y = row_dot(
                    set, rows.item(layer, phase, k), [&] { return rows.after(layer, phase, k); }, cols, in, stage,
                    buf, lane);
                const int r = rows.row(phase, k);
                if (phase == kQkv) {
                    // Q, K, V with their biases; each head roped (or V copied into the cache) by the block that
                    // writes its last row.
                    const int which = r < q_dim ? 0 : r < q_dim + kv_dim ? 1 : 2;
                    const int row = which == 0 ? r : which == 1 ? r - q_dim : r - q_dim - kv_dim;
                    const float* bias = which == 0 ? L.bq : which == 1 ? L.bk : L.bv;
                    if (lane == 0) {
                        (which == 0 ? a.q : which == 1 ? a.k : a.v)[row] = bias ? y + bias[row] : y;
                        // Q heads, then K heads, then V heads: r / head_dim is the head's index among them.
                        const int head = r / hd;
                        __threadfence();  // the row visible to the device before it is counted
                        if (atomicAdd(a.rope_counters + head, 1u) + 1 == static_cast<unsigned>(hd)) {
                            a.rope_counters[head] = 0;  // every row of the head has counted
                            pending[atomicAdd(n_pending, 1)] = head;
                        }
                    }
                } else if (phase == kGateUp) {
                    if (k % 2 == 0) gate = y;
                    else if (lane == 0) a.h[r] = detail::silu_times(gate, y);
                } else if (lane == 0) {  // attn_output and ffn_down add into the stream
                    a.x[r] = __ldcg(a.x + r) + y;
                }
            }
            // A warp without rows here still requests its first of the next phase (the others' last walk did).
            if (kStaged && !rows.has(phase, 0) && phase != kQkv)
                prefetch_row(set, rows.first(layer, phase + 1), buf, lane);
            if (phase == kQkv) {
                // The heads whose last row this block wrote, by the whole block (in the row loop, the RoPE code made
                // ptxas spill the walks' registers).
                __syncthreads();
                if (n_pending[0] > 0) {
                    RopeKvArgs rope{a.q,        a.k,        a.v,          L.k_cache,  L.v_cache,
                                    a.inv_freq, 1,          0,            a.n_heads,  a.n_kv_heads,
                                    a.head_dim, a.rope_dim, a.mode,       KvType::F16};
                    rope.device_start_pos = a.device_pos;
                    rope.trig = a.trig;
                    __threadfence();
                    for (int i = 0; i < n_pending[0]; ++i) rope::head_epilogue(rope, pending[i], a.q, a.k, a.v, 0, 1);
                }
                tandem_grid_sync();
                // Attention, a warp per (head, split); each head's last split combines the head's.
                // The keys read here, not held through the layer (registers).
                const int n_keys = *a.device_pos + 1;
                const Splits sp = key_splits(n_keys, max_splits);
                for (int item = warp; item < a.n_heads * sp.count; item += n_warps)
                    attend_split<D>(a, L, item / sp.count, item % sp.count, sp, n_keys, max_splits, lane);
                if (kStaged) prefetch_row(set, rows.first(layer, kAttnOut), buf, lane);  // in flight through the barrier
            }
            tandem_grid_sync();
        }
    }
    if (blockIdx.x != 0) return;
    normalize_into(xs, a.x, a.output_norm, dim, a.eps, scratch);
    for (int i = static_cast<int>(threadIdx.x); i < dim; i += kThreads) a.out[i] = xs[i];
}

// The kernel for a head size (lanes hold dims lane + 32 i, i < D) and row walk.
using DecodeStepKernel = void (*)(DecodeStepArgs, int);
// (The Q5_K set's kernel for heads of 32 spilled 68-80 bytes on sm_80-90: such heads take its kernel for 64, whose
// lanes past the head sit attention out, the same sums.)
// The 8-bit kernels have none either (on sm_80 they fit the registers for 32 too, 2026-12-04): two fewer
// instantiations for nvcc, the same sums.
template <class Set>
constexpr bool kHasNarrowHeads = !Set::kInt8;
template <>
constexpr bool kHasNarrowHeads<StagesQ5K> = false;
template <class Set>
DecodeStepKernel kernel_for(int head_dim) {
    if constexpr (kHasNarrowHeads<Set>)
        if (head_dim <= 32) return decode_step_kernel<1, Set>;
    if (head_dim <= 64) return decode_step_kernel<2, Set>;
    return decode_step_kernel<4, Set>;
}
// f(set) for the kernel set of `rows` (DirectRows for Direct): the one map from kernels.h's names to the sets, from
// which the host's answers (kernel, shared memory, 8-bit or not) are derived as the kernel derives its own.
template <class F>
auto with_set(DecodeStepRows rows, F&& f) {
    switch (rows) {
        case DecodeStepRows::StagedQ4K: return f(StagesQ4K{});
        case DecodeStepRows::StagedQ5K: return f(StagesQ5K{});
        case DecodeStepRows::Int8Q4_0: return f(StagesInt8Q4_0{});
        case DecodeStepRows::Int8Q4K: return f(StagesInt8Q4K{});
        case DecodeStepRows::Direct: break;
    }
    return f(DirectRows{});
}

DecodeStepKernel kernel_for(int head_dim, DecodeStepRows rows) {
    return with_set(rows, [&](auto set) { return kernel_for<decltype(set)>(head_dim); });
}

// The kernel's own layout (shared_layout of its Set's kAny and kInt8).
size_t shared_bytes_for(const DecodeStepShape& s, DecodeStepRows rows) {
    const int widest = widest_input(s.dim, s.hidden_dim, s.n_heads * s.head_dim);
    return with_set(rows, [&](auto set) {
        using Set = decltype(set);
        return shared_layout(widest, Set::kAny, Set::kInt8).bytes;
    });
}

// Lets the kernel take `bytes` of dynamic shared memory beside its static arrays (scratch, pending: under 2 KiB),
// beyond 48 KiB in all only with the opt-in.
void allow_shared(DecodeStepKernel kernel, size_t bytes) {
    constexpr size_t kStaticBound = 2048;
    if (bytes + kStaticBound <= 48 * 1024) return;
#if defined(__CUDACC__)
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        throw std::runtime_error(std::string("tandem::cuda: decode_step: ") + std::to_string(bytes) +
                                 " bytes of shared memory: " + cudaGetErrorString(err));
    }
#else
    // The emulation checks static + dynamic against the opt-in.
    emu::set_max_dynamic_shared(reinterpret_cast<const void*>(kernel), bytes + kStaticBound);
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

bool decode_step_stages(DecodeStepRows rows, GgmlType type) {
    // The direct kernel walks every type; a staged one its set's block types and the float types (directly).
    return rows == DecodeStepRows::Direct || ggml_is_float_type(type) ||
           with_set(rows, [&](auto set) { return decltype(set)::has(type); });
}

bool decode_step_int8(DecodeStepRows rows) {
    return with_set(rows, [](auto set) { return decltype(set)::kInt8; });
}

const char* decode_step_rows_name(DecodeStepRows rows) {
    switch (rows) {
        case DecodeStepRows::StagedQ4K: return "staged, Q4_K set";
        case DecodeStepRows::StagedQ5K: return "staged, Q5_K set";
        case DecodeStepRows::Int8Q4_0: return "staged, 8-bit activations, Q4_0 set";
        case DecodeStepRows::Int8Q4K: return "staged, 8-bit activations, Q4_K set";
        case DecodeStepRows::Direct: break;
    }
    return "walked directly";
}

DecodeStepPlan decode_step_plan(const DecodeStepShape& s, int blocks, DecodeStepRows rows) {
    detail::require(decode_step_supports(s), "decode_step: unsupported shape (head_dim <= 128, at most 256 Q, K and V heads, fp16 cache)");
    DecodeStepKernel kernel = kernel_for(s.head_dim, rows);
    const size_t shared = shared_bytes_for(s, rows);
    allow_shared(kernel, shared);
    const int most = cooperative_max_blocks(reinterpret_cast<const void*>(kernel), kThreads, shared);
    detail::require(most > 0, "decode_step: no block of the kernel fits on the device");
    // Two blocks per SM by default: the most a 256-thread block's registers usually leave room for, and enough warps
    // in flight to keep loads queued; every block must be resident (a cooperative launch).
    if (blocks <= 0) blocks = 2 * multiprocessor_count();
    DecodeStepPlan plan;
    plan.blocks = blocks < most ? blocks : most;
    plan.threads = kThreads;
    plan.rows = rows;
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
    detail::launch_cooperative_kernel("decode_step_kernel", kernel_for(a.head_dim, plan.rows), dim3(plan.blocks),
                                      dim3(kThreads), plan.shared_bytes, stream, a, plan.max_splits);
}

}  // namespace tandem::cuda
