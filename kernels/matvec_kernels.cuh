// The matvec kernels, whatever the weight type and the activations' form: a Dot (a weight type's walk over a row,
// reading fp32 activations in matvec.cu, 8-bit quantized ones in matvec_q8.cu) plugs into the direct kernel (each
// lane loads its share of the row from global memory) or the staged one (each warp streams its row through shared
// memory with 16-byte loads; its persistent variant launches only the blocks the device holds and streams row after
// row) or the split one (a row's walk divided among a block's warps). Included by those two files only.
//
// One warp per weight row (kWarps rows per block; split: a block per row); a launch may cover up to three matrices
// of one type that read the same x (Q/K/V, gate/up: matvec_multi), their rows one after another in the grid, or of
// two types (a DotPair: Q and K of one, V of another, as llama.cpp's quantization mixtures make them). The
// lanes of a warp cover consecutive bytes of the row so each iteration reads one contiguous stretch; every lane
// keeps one partial sum per token (NT registers), and a warp shuffle reduction finishes each token's dot product.
// The tokens share every weight load, which is what makes a few tokens (speculative verification, small prefill
// chunks) cost about as much as one.
//
// A Dot provides
//   using X;                                   the activation element (float, or uint8_t for quantized blocks)
//   static size_t x_units(int cols);           X elements holding `cols` columns of one token (a row's stride)
//   template <int NT, bool kExit> static void dot(const uint8_t* row, int cols, const X* x, size_t x_stride,
//                                     int n_tok, int lane, float (&acc)[NT]);
//                                              acc[t] += this lane's share of row . x[t] (kExit: token_exit)
//   static constexpr bool kStagedExit, kDirectExit;  its staged multi-token / direct 8-token walk keeps the exit
//                                              (kExitStaged, kExitDirect; false from WalkDefaults unless it says so)
//   static constexpr bool kNormEpilogue;       its one-token kernels have the norm epilogue (Epilogue::Norm; true
//                                              from WalkDefaults unless it says so)
// and, for the staged kernel, how it walks a row: kStepBlocks blocks of kBlockBytes bytes (kBlockCols columns) per
// warp iteration, each lane's share visited in ascending order, so that any stretch of whole steps computed alone
// adds the same terms in the same order. Slot t of a walk reads the activations of token read_token<NT, kExit>(t,
// n_tok), an index each walk multiplies by x_stride itself (through a helper returning the pointer, nvcc built the
// kept walks' addresses differently, and ptxas spilled one of them).
#pragma once
#include <type_traits>

#include "common.cuh"
#include "quantize_q8.cuh"
#include "rms_norm.cuh"
#include "rope_kv.cuh"

namespace tandem::cuda::matvec_detail {

constexpr int kWarps = 4;

// The token whose activations slot t of an NT-token walk reads: t while t < n_tok, and past the launch's last token
// that last token again (in bounds; its rows are already in L1), summed into an acc[t] that nobody writes out. So a
// walk has no branch per token: with one (`if (t >= n_tok) break;`, until 2026-11-28) nvcc kept every token's loads
// behind its own branch, and a step's tokens waited for memory one after another (sm_90 SASS of the Q4_K fp32
// 4-token kernel: per token a branch, two LDG.128, the FFMAs). The one-token kernels (kernel_for_tokens gives them
// exactly one token) read token 0 as a constant, and there nvcc had kept a branch before each of the four blocks
// it unrolled (Q4_0 8-bit staged: per block a branch, LDS, LDG, the wait, IDP, FFMA), in a walk the 2026-11-27
// H200 profile found waiting on L1TEX 67% of the time. Without the branches nvcc issues the loads together; a
// live token's operations are the same, so its sums are the same.
// A walk that keeps the exit (kExit, below) has left the loop before any t >= n_tok, so it reads t itself: the
// same code as before the change, for the kernels whose registers are tight.
template <int NT, bool kExit>
__device__ __forceinline__ int read_token(int t, int n_tok) {
    if constexpr (NT == 1)
        return 0;
    else if constexpr (kExit)
        return t;
    else
        return t < n_tok ? t : n_tok - 1;
}

// Where a walk keeps the run-time exit at the first token past n_tok (kKeep), as every walk did until 2026-11-28:
// - the staged, persistent and split kernels for eight tokens (kExitWithBudget): there the branch-free walk issues
//   every token's loads at once, and under those kernels' register budgets ptxas spilled (2026-11-29, sm_80-90:
//   staged Q6_K and Q8_0 fp32, Q4_0, Q5_0 and Q8_0 8-bit, 6-50 bytes; persistent Q2_K 8-bit with the quantized
//   output 100; split Q4_K fp32 4);
// - the direct kernel's eight-token walk of the Dots that declare kDirectExit (kExitDirect): with no budget,
//   ptxas held them at 48 registers and spilled 4 bytes (F16 and BF16 on sm_80, Q4_0 8-bit on sm_86 and sm_89).
//   The other direct walks, the default target's types (Q4_K, Q6_K, Q8_0 fp32) among them, verify up to 8 tokens
//   (a draft of up to 7) with no branch per token;
// - the staged kernel's four-token walk of the Dots that declare kStagedExit (kExitStaged): without the exit ptxas
//   spilled 6-54 bytes of Q8_0 and Q4_K fp32 and of Q4_K and Q2_K 8-bit on some of sm_80-90 (2026-11-29; their
//   persistent and split walks, under other budgets, did not spill);
// - Q5_K (both routes) and Q3_K (8-bit) for one token too: without the exit ptxas spilled their staged one-token
//   kernels under the 64-register budget (10-36 bytes).
template <bool kKeep>
__device__ __forceinline__ bool token_exit(int t, int n_tok) {
    return kKeep && t >= n_tok;
}
template <int NT>
constexpr bool kExitWithBudget = NT > 4;
template <class Dot, int NT>
constexpr bool kExitDirect = NT > 4 && Dot::kDirectExit;
template <class Dot, int NT, bool kPersistent>
constexpr bool kExitStaged = kExitWithBudget<NT> || (NT > 1 && !kPersistent && Dot::kStagedExit);

// What a Dot's walk keeps by default (its activation input derives from this; a Dot that spilled says otherwise).
struct WalkDefaults {
    static constexpr bool kStagedExit = false, kDirectExit = false;
    // Where ptxas spilled a Dot's Epilogue::Norm kernels (2026-11-29, sm_80-90: Q5_K on both routes, Q6_K 8-bit
    // staged, 2-40 bytes; their walks are the tightest, see token_exit), the Dot says false: it has no such
    // kernels and its launches take add_rms_norm after them (matvec_norm_in_launch knows which).
    static constexpr bool kNormEpilogue = true;
};

// One matrix of a launch: where its products go (y[t][row] for t < n_tok, rows y_stride floats apart) and an
// optional bias added to each (bitwise what add_bias would add afterwards).
struct MatvecSegment {
    const uint8_t* W;
    size_t row_bytes;
    float* y;
    size_t y_stride;
    const float* bias;  // device memory, one per row; null: none
    int rows;           // warps the segment takes (its rows, or the number of row_ids)
};

// What a launch computes: up to kMatvecMaxTargets matrices of one type and width applied to the same x (Q, K and
// V; gate and up), their rows one after another in the grid. Warp i computes row i of the first segment, then of
// the second, ...; with row_ids (one segment), row row_ids[i] (a picked subset: the same sum as when every row runs).
struct MatvecJob {
    MatvecSegment seg0, seg1, seg2;  // fields, not an array: a kernel parameter indexed at run time would be copied
                                     // to local memory
    int n_seg;
    int total_rows;
    const int* row_ids;  // device memory; null: rows 0..rows-1
    // DotPair kernels only: the first segment walked with the pair's Last type (the earlier ones take its First).
    int b_seg;
    // SwiGLU epilogue (n_seg 2: gate, up, the same rows; no bias, no row_ids): seg0.y[t][r] = silu(gate) * up for
    // row r, and seg1.y is not written. A block's first kWarps / 2 warps take gate rows, the others the same up
    // rows, so the pair meets in shared memory.
    bool swiglu;
    // With the SwiGLU epilogue on the 8-bit route's staged and persistent kernels, the output also quantized (q8_out
    // not null) as Q8_1 rows for the matvec that reads it next: the last block-row to write an activation block's
    // rows quantizes it, counted in q8_counters (one per activation block, zero between launches; the last resets
    // its counter). Saves the quantize launch between gate/up and down.
    uint8_t* q8_out;
    unsigned* q8_counters;
    // RoPE epilogue (matvec_qkv_rope: n_seg 3, Q, K and V, each whole heads; no row_ids; direct, staged and split
    // kernels): the last block to write a head's rows does to that head what rope_kv_write would do after the
    // launch (rope::head_epilogue, the same functions), counted in rope_counters (one per head of Q, then K, then V;
    // zero between launches, the last resets its counter). rope's q, k and v are the segments' y; token0 is the
    // launch's first token in the call (9..16 tokens take two launches). Saves the RoPE launch between Q/K/V and
    // attention.
    unsigned* rope_counters;
    RopeKvArgs rope;
    int token0;
    // Residual add + RMSNorm epilogue (matvec_add_rms_norm: one segment, one token, no row_ids, whole blocks of
    // rows; direct, staged and split kernels): the launch's last block to finish adds the rows into norm.x and
    // normalizes them as add_rms_norm would after the launch (norm::add_rms_norm_rows, its order), counted in
    // norm_counter (zero between launches; the last resets it). Saves the RMSNorm launch after attn_output and
    // ffn_down.
    unsigned* norm_counter;
    norm::RowsArgs norm;
};

// The work a launch's last blocks do after the products (each a compile-time variant of the kernels, so that the
// kernels without it keep their registers: as run-time branches in every kernel, ptxas spilled some of them):
// QuantOut: SwiGLU's output quantized (quantize_if_last; staged and persistent 8-bit kernels); Rope: RoPE and the
// KV write per head (rope_if_last); Norm: the residual add and RMSNorm (norm_if_last; one token).
enum class Epilogue { None, QuantOut, Rope, Norm };

// Two weight types in one launch: llama.cpp's quantization mixtures give attn_v more bits than attn_q and attn_k in
// some layers (Q4_K_M: Q6_K in half of them, beside Q4_K; in rows that are not whole super-blocks, Q8_0 beside
// Q5_0), and without a pair those layers' Q/K/V took three launches and RoPE a fourth. A DotPair job walks the
// segments below job.b_seg with First's walk and the others with Last's: each row with its own type's walk, so
// bitwise what separate launches of the two types compute. A block's warps may hold rows of both (the branch is per
// warp, around the walk only: the barriers after it are the kernel's own). Both walks read one activation format
// (Input: fp32, Q8_1 or Q8_K). The direct and split kernels only (launch_blocks: the staged and persistent routes
// run a pair on the direct kernel, whose sums are theirs bit for bit), and only matvec_multi's and matvec_qkv_rope's
// jobs (no SwiGLU, norm or picked rows).
template <class A, class B>
struct DotPair {
    using First = A;
    using Last = B;
    using X = typename A::X;
    static_assert(std::is_same_v<typename A::Input, typename B::Input>, "a pair's walks read one activation format");
    static __host__ __device__ __forceinline__ size_t x_units(int cols) { return A::x_units(cols); }
    static constexpr bool kNormEpilogue = false;
};
template <class Dot>
struct IsDotPair : std::false_type {};
template <class A, class B>
struct IsDotPair<DotPair<A, B>> : std::true_type {};

template <class T>
struct WalkTag {
    using type = T;
};

// f(WalkTag<W>{}), W the walk of segment s: the Dot itself, or a pair's First or Last. (A tag, not a template
// lambda: the nvcc build is C++17.)
template <class Dot, class F>
__device__ __forceinline__ void with_walk(const MatvecJob& job, int s, F&& f) {
    if constexpr (IsDotPair<Dot>::value) {
        if (s >= job.b_seg)
            f(WalkTag<typename Dot::Last>{});
        else
            f(WalkTag<typename Dot::First>{});
    } else {
        f(WalkTag<Dot>{});
    }
}

// The segment of the grid's warp `r`, and r made the row within it. Segments are picked field by field where
// used (pick), not copied whole: a copy would hold ~11 registers through the dot product.
__device__ __forceinline__ int segment_of(const MatvecJob& job, int& r) {
    int s = 0;
    if (job.n_seg > 1 && r >= job.seg0.rows) {
        r -= job.seg0.rows;
        s = 1;
        if (job.n_seg > 2 && r >= job.seg1.rows) {
            r -= job.seg1.rows;
            s = 2;
        }
    }
    if (job.row_ids) r = job.row_ids[r];
    return s;
}

// The checks every route makes of a job (its own add the type's block and alignment rules).
inline void check_job(const MatvecJob& job, int cols, int n_tokens) {
    detail::require(cols > 0 && job.n_seg >= 1 && job.n_seg <= kMatvecMaxTargets, "matvec: empty shape");
    detail::require(n_tokens >= 1 && n_tokens <= kMatvecMaxTokens, "matvec: n_tokens must be 1..16");
    for (const MatvecSegment* seg : {&job.seg0, &job.seg1, &job.seg2}) {
        if (seg - &job.seg0 >= job.n_seg) break;
        detail::require(seg->rows > 0 && seg->W && seg->y, "matvec: empty shape");
        detail::require(reinterpret_cast<uintptr_t>(seg->W) % 16 == 0, "matvec: W and x must be 16-byte aligned");
    }
}

// The 8-bit route (matvec_q8.cu): checks the shapes for `type` and launches its kernel over the job's rows, with
// xq quantized by quantize_activations for the type.
void dispatch_q8(GgmlType type, const MatvecJob& job, int cols, const uint8_t* xq, int n_tokens, MatvecLoads loads,
                 Stream stream);
// The same for a job of two types (job.b_seg set; matvec_types_fuse lists the pairs).
void dispatch_q8_pair(MatvecTypes types, const MatvecJob& job, int cols, const uint8_t* xq, int n_tokens,
                      MatvecLoads loads, Stream stream);

constexpr int kSwigluPairs = kWarps / 2;  // (gate, up) row pairs per block with the SwiGLU epilogue

// The warp's segment and row within it in the grid's block-row `block` (blockIdx.x, but for the persistent kernel);
// false: the warp has no row (it still reaches a SwiGLU block's barrier).
__device__ __forceinline__ bool warp_row_in(const MatvecJob& job, unsigned block, int& s, int& row) {
    const int warp = threadIdx.x / 32;
    if (job.swiglu) {
        s = warp / kSwigluPairs;
        row = static_cast<int>(block) * kSwigluPairs + warp % kSwigluPairs;
        return row < job.seg0.rows;
    }
    row = static_cast<int>(block) * kWarps + warp;
    if (row >= job.total_rows) return false;
    s = segment_of(job, row);
    return true;
}

__device__ __forceinline__ bool warp_row(const MatvecJob& job, int& s, int& row) {
    return warp_row_in(job, blockIdx.x, s, row);
}

// Blocks a launch takes for the job's rows.
__host__ __device__ inline unsigned grid_blocks(const MatvecJob& job) {
    return job.swiglu ? (job.seg0.rows + kSwigluPairs - 1) / kSwigluPairs : (job.total_rows + kWarps - 1) / kWarps;
}

template <class T>
__device__ __forceinline__ T pick(int s, T a, T b, T c) {
    return s == 0 ? a : s == 1 ? b : c;
}

__device__ __forceinline__ const uint8_t* row_of(const MatvecJob& job, int s, int row) {
    return pick(s, job.seg0.W, job.seg1.W, job.seg2.W) +
           static_cast<size_t>(row) * pick(s, job.seg0.row_bytes, job.seg1.row_bytes, job.seg2.row_bytes);
}

// Every lane calls this (the shuffles need all 32); lane 0 writes.
template <int NT>
__device__ __forceinline__ void write_sums(float (&acc)[NT], int n_tok, int lane, int row, const MatvecJob& job,
                                           int s) {
    float* y = pick(s, job.seg0.y, job.seg1.y, job.seg2.y);
    const size_t stride = pick(s, job.seg0.y_stride, job.seg1.y_stride, job.seg2.y_stride);
    const float* bias = pick(s, job.seg0.bias, job.seg1.bias, job.seg2.bias);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        if (t >= n_tok) break;
        const float sum = detail::warp_sum(acc[t]);
        if (lane == 0) y[static_cast<size_t>(t) * stride + row] = bias ? sum + bias[row] : sum;
    }
}

// The SwiGLU epilogue: the up warps leave their sums in `up` (kSwigluPairs x NT floats of shared memory), and
// each gate warp's lane 0 writes silu(gate) * up, bitwise what swiglu() computes from the two matvecs' outputs.
// Every warp of the block calls it (a barrier); `valid`: the warp has a row.
template <int NT>
__device__ __forceinline__ void write_swiglu(float (&acc)[NT], int n_tok, int lane, int row, bool valid,
                                             const MatvecJob& job, int s, float* up) {
    const int pair = (threadIdx.x / 32) % kSwigluPairs;
    float sums[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) sums[t] = detail::warp_sum(acc[t]);
    if (valid && s == 1 && lane == 0)
#pragma unroll
        for (int t = 0; t < NT; ++t) up[pair * NT + t] = sums[t];
    __syncthreads();
    if (!valid || s != 0 || lane != 0) return;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        if (t >= n_tok) break;
        job.seg0.y[static_cast<size_t>(t) * job.seg0.y_stride + row] = detail::silu_times(sums[t], up[pair * NT + t]);
    }
}

// Bytes of one token's quantized SwiGLU output row (MatvecJob::q8_out: Q8_1).
__host__ __device__ inline size_t swiglu_q8_row_bytes(const MatvecJob& job) {
    return static_cast<size_t>(job.seg0.rows / q8::block_elems(false)) * q8::block_bytes(false);
}

// After write_swiglu of block-row `block` (rows kSwigluPairs * block..): count the block-row towards its Q8_1 block,
// and if it is the last of that block's 16 to count, quantize the block for every token (warp w: tokens w,
// w + kWarps, ...), reading the rows other blocks wrote past L1. The threadFenceReduction pattern, as attention's
// split combine: each writer's fence before the count, the last block's fence after it. Every thread of the block
// calls this (barriers). The job's rows are whole Q8_1 blocks (matvec_swiglu checks).
__device__ __forceinline__ void quantize_if_last(const MatvecJob& job, unsigned block, int n_tok, int* is_last) {
    constexpr int kGroupRows = q8::block_elems(false);
    const int group = static_cast<int>(block) * kSwigluPairs / kGroupRows;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const bool last = atomicAdd(job.q8_counters + group, 1u) + 1 == kGroupRows / kSwigluPairs;
        if (last) job.q8_counters[group] = 0;  // every block-row of the group has counted
        *is_last = last ? 1 : 0;
    }
    __syncthreads();
    if (!*is_last) return;
    __threadfence();
    const size_t row_bytes = swiglu_q8_row_bytes(job);
    for (int t = static_cast<int>(threadIdx.x / 32); t < n_tok; t += kWarps)
        q8::quantize_block_q8_1<true>(job.seg0.y + static_cast<size_t>(t) * job.seg0.y_stride + kGroupRows * group,
                                      job.q8_out + static_cast<size_t>(t) * row_bytes + q8::kQ8_1Bytes * group,
                                      static_cast<int>(threadIdx.x % 32));
}

// The head (of Q, then K, then V) that row `row` of segment s of a RoPE job lies in.
__device__ __forceinline__ int rope_head(const MatvecJob& job, int s, int row) {
    const int base = s == 0 ? 0 : s == 1 ? job.rope.n_heads : job.rope.n_heads + job.rope.n_kv_heads;
    return base + row / job.rope.head_dim;
}

// After a block of a RoPE job's kernel (Epilogue::Rope) has written its rows (every thread calls this: barriers):
// count the block towards its head (`head`: rope_head of any of the block's rows; head_blocks: the head's blocks), and
// if it is the head's last to count, apply the head's epilogue for the launch's tokens, reading the rows other blocks
// wrote past L1. The threadFenceReduction pattern, as quantize_if_last. The job's heads are whole blocks
// (matvec_qkv_rope checks), so every block lies in one head and no warp of a RoPE job is without a row. The head
// comes from the warp's segment and row, which the write of its sums keeps live anyway: from blockIdx.x, ptxas kept
// one more register across the walk and spilled 4 bytes in a few kernels.
__device__ __forceinline__ void rope_if_last(const MatvecJob& job, int head, int head_blocks, int n_tok,
                                             int* is_last) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const bool last = atomicAdd(job.rope_counters + head, 1u) + 1 == static_cast<unsigned>(head_blocks);
        if (last) job.rope_counters[head] = 0;  // every block of the head has counted
        *is_last = last ? 1 : 0;
    }
    __syncthreads();
    if (!*is_last) return;
    __threadfence();
    rope::head_epilogue(job.rope, head, job.seg0.y, job.seg1.y, job.seg2.y, job.token0, n_tok);
}

// After a block of a norm job's kernel (Epilogue::Norm) has written its rows (every thread calls this: barriers):
// count the block, and if it is the launch's last, add the launch's rows into norm.x and normalize them
// (norm::add_rms_norm_rows), reading the rows other blocks wrote past L1. The threadFenceReduction pattern, as
// rope_if_last; every warp of a norm job has a row (matvec_add_rms_norm checks), so every thread gets here. One
// block does the whole row, as the separate kernel does (one block per row): what goes is the launch boundary.
__device__ __forceinline__ void norm_if_last(const MatvecJob& job, int n_tok, int* is_last, float* scratch) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const bool last = atomicAdd(job.norm_counter, 1u) + 1 == gridDim.x;
        if (last) *job.norm_counter = 0;  // every block has counted
        *is_last = last ? 1 : 0;
    }
    __syncthreads();
    if (!*is_last) return;
    __threadfence();
    norm::add_rms_norm_rows(job.norm, job.seg0.y, n_tok, scratch);
}

// The direct kernel's warp without a row returns as a whole (so the shuffles always have all 32 lanes); with the
// SwiGLU epilogue it first takes part in the block's barrier there (the same call site as the other warps', which
// the emulation requires). An early return, unlike the staged kernel's flag: with the flag around the walk ptxas
// spilled some eight-token kernels.
template <int NT>
__device__ __forceinline__ void idle_warp(const MatvecJob& job, int n_tok, int lane, int s, float* up) {
    if (!job.swiglu) return;
    float none[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) none[t] = 0.0f;
    write_swiglu(none, n_tok, lane, 0, false, job, s, up);
}

// Epilogue::Rope (RoPE jobs only, matvec_qkv_rope) and Epilogue::Norm (norm jobs, one token): rope_if_last or
// norm_if_last at the end. Compile-time variants, so that the kernels without them are unchanged: as a run-time
// branch in every kernel, ptxas spilled 4-8 bytes in some direct and split kernels (sm_80 and sm_90, 2026-11-29;
// "SwiGLU's quantize in the gate/up launch" in docs/cuda-backend.md had found the same), also with the epilogue a call of
// its own.
// Registers: ptxas' own choice (no minimum of blocks), but for the eight-token RoPE variants, where it chose 48-56
// and spilled 4-8 bytes (F32 and Q5_K 8-bit on sm_80, 2026-11-29): a minimum of 6 blocks (85 registers) lets it
// keep everything.
template <int NT, Epilogue kEpi>
constexpr int kDirectMinBlocks = kEpi == Epilogue::Rope && NT > 4 ? 6 : 0;

template <class Dot, int NT, Epilogue kEpi = Epilogue::None>
__global__ void __launch_bounds__(kWarps * 32, kDirectMinBlocks<NT, kEpi>)
    matvec_kernel(MatvecJob job, int cols, const typename Dot::X* __restrict__ x, int n_tok) {
    TANDEM_SHARED(float, up, kSwigluPairs * NT);
    detail::wait_for_inputs();
    int s = 0, row = 0;
    const int lane = threadIdx.x % 32;
    if (!warp_row(job, s, row)) {
        idle_warp<NT>(job, n_tok, lane, s, up);
        return;
    }
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
    with_walk<Dot>(job, s, [&](auto walk) {
        using W = typename decltype(walk)::type;
        W::template dot<NT, kExitDirect<W, NT>>(row_of(job, s, row), cols, x, W::x_units(cols), n_tok, lane, acc);
    });
    if (job.swiglu)
        write_swiglu(acc, n_tok, lane, row, true, job, s, up);
    else
        write_sums(acc, n_tok, lane, row, job, s);
    if constexpr (kEpi == Epilogue::Rope) {
        TANDEM_SHARED(int, is_last, 1);
        rope_if_last(job, rope_head(job, s, row), job.rope.head_dim / kWarps, n_tok, is_last);
    } else if constexpr (kEpi == Epilogue::Norm) {
        TANDEM_SHARED(int, is_last, 1);
        TANDEM_SHARED(float, scratch, 32);
        norm_if_last(job, n_tok, is_last, scratch);
    }
}

// ---- staged loads ---------------------------------------------------------------------------------------------------
// Why: with direct loads a warp has a few 2-byte loads per lane in flight and waits out the memory latency about
// once per warp iteration, so a 7B Q4_0 matvec took as long as an F16 one of 3.6x the bytes (docs/cuda-backend.md).
// Staged, each warp copies its row to shared memory a chunk at a time with 16-byte loads (up to kStagePerLane per
// lane, all issued together, the next chunk's issued before the current one is decoded) and the lanes run the
// same Dot walk on the copy. A chunk is a whole number of the walk's steps, so every lane adds the same terms in
// the same order: the sums are bitwise those of the direct kernel.
constexpr int kStageSlots = 128;  // 16-byte slots of shared memory per warp (2 KiB)
constexpr int kStagePerLane = kStageSlots / 32;

__host__ __device__ constexpr int gcd_int(int a, int b) { return b == 0 ? a : gcd_int(b, a % b); }

// Blocks per chunk: a multiple of the walk's step and of 16 / gcd(block bytes, 16) (so that every chunk starts at
// the same offset within a 16-byte slot as the row), as many as fit in kStageSlots - 1 slots (the spare slot takes
// a row that starts mid-slot).
template <class Dot>
__host__ __device__ constexpr int staged_chunk_blocks() {
    constexpr int align = 16 / gcd_int(Dot::kBlockBytes, 16);
    constexpr int unit = Dot::kStepBlocks / gcd_int(Dot::kStepBlocks, align) * align;
    constexpr int fit = (kStageSlots - 1) * 16 / Dot::kBlockBytes;
    static_assert(fit >= unit, "a staged chunk must hold one step of the walk");
    return fit / unit * unit;
}

// The 16 bytes at p, of which those at or past `end` (2-byte aligned, like every block) are not read but zero.
__device__ __forceinline__ uint4 load_slot(const uint8_t* p, const uint8_t* end) {
    if (p + 16 <= end) return *reinterpret_cast<const uint4*>(p);
    uint32_t w[4] = {0, 0, 0, 0};
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
#pragma unroll
    for (int i = 0; i < 8; ++i)
        if (p + 2 * i < end) w[i / 2] |= static_cast<uint32_t>(h[i]) << (16 * (i % 2));
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// Registers: left to itself, ptxas held the 8-token instances at ~72 registers and spilled a few bytes for some
// types and architectures depending on how equivalent code was written (a build error here). A minimum of blocks
// per SM gives it an explicit budget instead: 8 blocks (64 registers, 32 warps per SM: a 7B matvec's 31 warps in
// one wave) for one token, 6 blocks (85 registers) for more, where each warp has more arithmetic per byte.
// The persistent variant (below) keeps a little more across its walk of several rows, and at those budgets ptxas
// spilled its Q3_K, Q5_K and Q6_K instances; it gets 6 blocks (80 registers) for one token, 5 (96) for more: 24 or
// 20 warps per SM, each keeping a chunk in flight all the time.
template <int NT, bool kPersistent = false>
constexpr int kStagedMinBlocks = kPersistent ? (NT == 1 ? 6 : 5) : (NT == 1 ? 8 : 6);

// Where a staged warp's row lies: its first 16-byte slot (rows are 2-byte aligned, slots 16: the `lead` bytes
// before the row in that slot belong to the previous row; W itself is 16-byte aligned) and its end (bytes past it in
// the last slot are never read: load_slot).
struct StagedRow {
    const uint8_t* base;
    const uint8_t* end;
    int lead;
};

__device__ __forceinline__ StagedRow staged_row(const MatvecJob& job, int s, int row) {
    const uint8_t* begin = row_of(job, s, row);
    const int lead = static_cast<int>(reinterpret_cast<uintptr_t>(begin) % 16);
    return {begin - lead, begin + pick(s, job.seg0.row_bytes, job.seg1.row_bytes, job.seg2.row_bytes), lead};
}

// ---- persistent grid ------------------------------------------------------------------------------------------------
// Why: a matvec of more rows than the device holds warps at once runs in waves (a 7B model's gate/up with SwiGLU:
// 5,504 blocks against 1,056 resident on an H200 at 8 per SM; Q/K/V 3,072), and every wave's warps begin by waiting
// out a whole memory latency for their first chunk, then end in a reduction and a block exit while nothing of the
// next wave is in flight. The persistent variant (kPersistent) launches only the blocks that fit at once (the SMs x
// kStagedMinBlocks, the budget ptxas was held to) and each walks the grid's block-rows blockIdx.x, + gridDim.x, ...;
// a warp requests the next row's first chunk before it decodes the current row's last, so its loads stay in flight
// from one row to the next. Each row's chunks, walk and reduction are the staged kernel's: bitwise its sums. With
// the SwiGLU epilogue the block meets at a barrier once per block-row, and the up sums alternate between two
// buffers, so a warp writing the next block-row's never overwrites what a gate warp has yet to read (a race the
// emulation cannot show: there a thread runs from the barrier to its read without another thread in between).
//
// Epilogue::QuantOut (SwiGLU jobs with q8_out, 8-bit Dots only): quantize_if_last after each block-row. A
// compile-time variant, so the kernels without it keep their registers (as a run-time flag in every kernel it made
// ptxas spill, docs/cuda-backend.md "SwiGLU's quantize in the gate/up launch"). Rope and Norm: as the direct kernel's.
template <class Dot, int NT, bool kPersistent, Epilogue kEpi = Epilogue::None>
__global__ void __launch_bounds__(kWarps * 32, kStagedMinBlocks<NT, kPersistent>)
    matvec_staged_kernel(MatvecJob job, int cols, const typename Dot::X* __restrict__ x, int n_tok) {
    static_assert(!kPersistent || kEpi == Epilogue::None || kEpi == Epilogue::QuantOut,
                  "RoPE and norm jobs take the staged kernel, one block-row per block");
    static_assert(!IsDotPair<Dot>::value, "a pair's rows take the direct kernel");
    constexpr int kChunkBlocks = staged_chunk_blocks<Dot>();
    constexpr int kChunkBytes = kChunkBlocks * Dot::kBlockBytes, kChunkCols = kChunkBlocks * Dot::kBlockCols;
    constexpr int kUpBuffers = kPersistent ? 2 : 1;
    TANDEM_SHARED(uint4, stage, kWarps * kStageSlots);
    TANDEM_SHARED(float, up, kUpBuffers * kSwigluPairs * NT);
    TANDEM_SHARED(int, is_last, 1);
    int s = 0, row = 0;
    const int lane = threadIdx.x % 32;
    // With overlapping launches (common.cuh wait_for_inputs), the first chunk of W is requested before the wait, while
    // the previous kernel still runs: W is never written. Picked rows (row_ids) are device memory a kernel writes, so
    // with them the warp waits first.
    const bool load_before_wait = job.row_ids == nullptr;
    if (!load_before_wait) detail::wait_for_inputs();
    // A warp without a row walks no chunk and goes on to the SwiGLU epilogue's barrier (or returns). Written so,
    // not as the direct kernel's early return: that way ptxas spilled Q6_K's one-token kernel under its
    // 64-register budget. (Only the grid's last block-row has such warps, so a persistent block has no row after.)
    bool valid = warp_row(job, s, row);
    if (!valid && !job.swiglu) {
        if (load_before_wait) detail::wait_for_inputs();
        return;
    }
    uint4* my_stage = stage + (threadIdx.x / 32) * kStageSlots;
    const int n_blocks = cols / Dot::kBlockCols;
    const int n_chunks = (n_blocks + kChunkBlocks - 1) / kChunkBlocks;
    auto chunk_blocks = [&](int c) { return n_blocks - c * kChunkBlocks < kChunkBlocks ? n_blocks - c * kChunkBlocks
                                                                                       : kChunkBlocks; };
    auto slots_of = [&](const StagedRow& r, int c) { return (r.lead + chunk_blocks(c) * Dot::kBlockBytes + 15) / 16; };
    uint4 buf[kStagePerLane];
    // Chunk c of row r into buf: slots_of(r, c) slots from r.base + c * kChunkBytes.
    auto load_chunk = [&](const StagedRow& r, int c) {
        const int n = slots_of(r, c);
        const uint8_t* first = r.base + static_cast<size_t>(c) * kChunkBytes;
#pragma unroll
        for (int k = 0; k < kStagePerLane; ++k)
            if (lane + 32 * k < n) buf[k] = load_slot(first + 16 * (lane + 32 * k), r.end);
    };
    if (valid) load_chunk(staged_row(job, s, row), 0);
    if (load_before_wait) detail::wait_for_inputs();  // x, y and the SwiGLU pairs' y belong to other kernels
    // Registers: the 64-register budget of one token leaves little room, so what the persistent walk adds is
    // recomputed where needed (the grid's block-rows from the job, the turn's parity from b) rather than kept.
    for (unsigned b = blockIdx.x;;) {
        const StagedRow r = staged_row(job, s, valid ? row : 0);  // invalid: a pointer into the matrix, never read
        const unsigned next = b + gridDim.x;
        float acc[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
        for (int c = 0; c < (valid ? n_chunks : 0); ++c) {
            const int n = slots_of(r, c);
#pragma unroll
            for (int k = 0; k < kStagePerLane; ++k)
                if (lane + 32 * k < n) my_stage[lane + 32 * k] = buf[k];
            __syncwarp();
            if (c + 1 < n_chunks) {
                load_chunk(r, c + 1);  // in flight while this chunk is decoded
            } else if (kPersistent && next < grid_blocks(job)) {
                int next_s = 0, next_row = 0;  // the next row's first chunk, in flight while this row's last is decoded
                if (warp_row_in(job, next, next_s, next_row)) load_chunk(staged_row(job, next_s, next_row), 0);
            }
            Dot::template dot<NT, kExitStaged<Dot, NT, kPersistent>>(
                reinterpret_cast<const uint8_t*>(my_stage) + r.lead, chunk_blocks(c) * Dot::kBlockCols,
                x + Dot::x_units(c * kChunkCols), Dot::x_units(cols), n_tok, lane, acc);
            __syncwarp();  // every lane is done with the copy before the next chunk overwrites it
        }
        if (job.swiglu) {
            write_swiglu(acc, n_tok, lane, row, valid, job, s,
                         up + (kPersistent ? (b / gridDim.x) % 2 : 0) * kSwigluPairs * NT);
            if constexpr (kEpi == Epilogue::QuantOut) quantize_if_last(job, b, n_tok, is_last);
        } else {
            write_sums(acc, n_tok, lane, row, job, s);
            if constexpr (kEpi == Epilogue::Rope)
                rope_if_last(job, rope_head(job, s, row), job.rope.head_dim / kWarps, n_tok, is_last);
            if constexpr (kEpi == Epilogue::Norm) {
                TANDEM_SHARED(float, scratch, 32);
                norm_if_last(job, n_tok, is_last, scratch);
            }
        }
        if (!kPersistent || next >= grid_blocks(job)) break;
        b = next;
        valid = warp_row_in(job, b, s, row);
        if (!valid && !job.swiglu) break;
    }
}

// ---- split rows ---------------------------------------------------------------------------------------------------
// Why: the direct kernel gives a row one warp, whose walk over a 7B row waits out the memory latency some 32 times
// one after another, and a 7B matvec has only ~31 warps per SM to hide those waits behind (docs/cuda-backend.md: on an
// H100 giving each warp more rows made it 2-3.6x slower). Split, a block's kWarps warps share one row: each takes a
// contiguous range of whole walk steps (a quarter of the walk), its partial sums meet the others' in shared memory
// and one thread per token adds them in warp order. Four times the warps, each a quarter of the waits. The sums
// are in another order than the direct kernel's, so not its bits; but the order is fixed by the row's width alone,
// so a row's sum is bitwise the same for any token count, launch, row subset (matvec_rows) and fused or separate
// launch (matvec_multi, matvec_swiglu), which speculative verification and the graphs rely on.
//
// The rows of one block: one row of the job's grid, or with the SwiGLU epilogue the gate row and then the up row of
// the same index (each warp walks its range of both), so the pair meets in the block's shared memory.
//
// Registers: left to itself, ptxas held the eight-token Q3_K kernel at 56 registers on sm_80 and spilled 8 bytes (a
// build error here); a minimum of 8 blocks per SM (64 registers) lets it keep everything. One token keeps ptxas'
// own choice (0: no minimum; 32-56 registers): a minimum of 1 let it take 64-72, a minimum of 12 (40) spilled
// Q3_K on sm_80, and one token is where occupancy matters most.
// The RoPE variant (Epilogue::Rope) of the multi-token kernels gets 7 (72 registers): at 64, ptxas spilled 4 bytes
// of the four-token Q2_K 8-bit kernel on sm_80-90 (2026-11-29).
template <int NT, Epilogue kEpi = Epilogue::None>
constexpr int kSplitMinBlocks = NT == 1 ? 0 : kEpi == Epilogue::Rope ? 7 : 8;

// Thread t's token of the split kernel's row (blockIdx.x): the warps' partial sums added in warp order, then
// written as the direct kernel writes them (with its bias), or with the SwiGLU epilogue silu(gate) * up.
template <int NT>
__device__ __forceinline__ void write_split_sums(const MatvecJob& job, const float* part, int t) {
    const auto total = [&](int m) {
        float v = part[m * kWarps * NT + t];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) v += part[(m * kWarps + w) * NT + t];
        return v;
    };
    int row = blockIdx.x;
    if (job.swiglu) {
        job.seg0.y[static_cast<size_t>(t) * job.seg0.y_stride + row] = detail::silu_times(total(0), total(1));
        return;
    }
    const int s = segment_of(job, row);
    float* y = pick(s, job.seg0.y, job.seg1.y, job.seg2.y);
    const size_t stride = pick(s, job.seg0.y_stride, job.seg1.y_stride, job.seg2.y_stride);
    const float* bias = pick(s, job.seg0.bias, job.seg1.bias, job.seg2.bias);
    const float sum = total(0);
    y[static_cast<size_t>(t) * stride + row] = bias ? sum + bias[row] : sum;
}

template <class Dot, int NT, Epilogue kEpi = Epilogue::None>
__global__ void __launch_bounds__(kWarps * 32, kSplitMinBlocks<NT, kEpi>)
    matvec_split_kernel(MatvecJob job, int cols, const typename Dot::X* __restrict__ x, int n_tok) {
    TANDEM_SHARED(float, part, 2 * kWarps * NT);  // [gate or the row, up][warp][token]
    detail::wait_for_inputs();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int n_mat = job.swiglu ? 2 : 1;
    for (int m = 0; m < n_mat; ++m) {
        int row = blockIdx.x;
        const int s = job.swiglu ? m : segment_of(job, row);
        float acc[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
        with_walk<Dot>(job, s, [&](auto walk) {
            using W = typename decltype(walk)::type;
            const int n_blocks = cols / W::kBlockCols;
            const int steps = (n_blocks + W::kStepBlocks - 1) / W::kStepBlocks;
            const int per_warp = (steps + kWarps - 1) / kWarps * W::kStepBlocks;  // blocks
            const int first = warp * per_warp < n_blocks ? warp * per_warp : n_blocks;
            const int last = first + per_warp < n_blocks ? first + per_warp : n_blocks;
            if (last > first)
                W::template dot<NT, kExitWithBudget<NT>>(
                    row_of(job, s, row) + static_cast<size_t>(first) * W::kBlockBytes, (last - first) * W::kBlockCols,
                    x + W::x_units(first * W::kBlockCols), W::x_units(cols), n_tok, lane, acc);
        });
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const float sum = detail::warp_sum(acc[t]);
            if (lane == 0) part[(m * kWarps + warp) * NT + t] = sum;
        }
    }
    __syncthreads();
    const int t = threadIdx.x;  // warp 0's first n_tok threads write a token each
    if constexpr (kEpi == Epilogue::Rope) {
        TANDEM_SHARED(int, is_last, 1);
        if (t < n_tok) write_split_sums<NT>(job, part, t);
        int row = blockIdx.x;
        const int s = segment_of(job, row);
        rope_if_last(job, rope_head(job, s, row), job.rope.head_dim, n_tok, is_last);
    } else if constexpr (kEpi == Epilogue::Norm) {
        TANDEM_SHARED(int, is_last, 1);
        TANDEM_SHARED(float, scratch, 32);
        if (t < n_tok) write_split_sums<NT>(job, part, t);
        norm_if_last(job, n_tok, is_last, scratch);
    } else {
        if (t >= n_tok) return;
        write_split_sums<NT>(job, part, t);
    }
}

template <class Dot, MatvecLoads kLoads, int NT, Epilogue kEpi = Epilogue::None>
auto kernel_for() {
    if constexpr (kLoads == MatvecLoads::Staged || kLoads == MatvecLoads::Persistent)
        return matvec_staged_kernel<Dot, NT, kLoads == MatvecLoads::Persistent, kEpi>;
    else if constexpr (kLoads == MatvecLoads::Split)
        return matvec_split_kernel<Dot, NT, kEpi>;
    else
        return matvec_kernel<Dot, NT, kEpi>;
}

// A block type's kernel names, one per MatvecLoads (for launch errors and profiles).
struct KernelNames {
    const char* direct;
    const char* staged;
    const char* split;
    const char* persistent;
};
// The float types' one kernel, whatever the route asks (their F16 walk already streams 8-byte loads).
inline KernelNames direct_only(const char* name) { return {name, name, name, name}; }

// The persistent route's grid for `blocks` block-rows of an n-token launch on `sms` SMs: 0 where the staged kernel's
// blocks all fit at once (SMs x its kStagedMinBlocks), which then runs instead. Why: there the staged launch is a
// single wave, one block-row per block at 8 blocks per SM for one token, where the persistent kernel's budget (6)
// would leave some blocks two rows one after another (a 7B model's 4,096-row matrices: 1,024 block-rows, 1,056
// staged blocks resident on an H200, 792 persistent ones). Otherwise the blocks it holds at once, each walking
// every gridDim.x-th block-row. Either way the same sums, bit for bit.
__host__ __device__ constexpr unsigned persistent_grid(unsigned blocks, int n_tok, unsigned sms) {
    const int staged_per_sm = n_tok == 1 ? kStagedMinBlocks<1> : kStagedMinBlocks<8>;
    const int per_sm = n_tok == 1 ? kStagedMinBlocks<1, true> : kStagedMinBlocks<8, true>;
    const unsigned staged_resident = sms * static_cast<unsigned>(staged_per_sm);
    const unsigned resident = sms * static_cast<unsigned>(per_sm);
    return blocks <= staged_resident ? 0 : blocks < resident ? blocks : resident;
}

// The kernel for an n-token launch: three instantiations (1, 4, 8 tokens) cover 1..8 tokens with at most 3 idle
// accumulators. The norm epilogue has only the one-token kernel (its last block normalizes token after token, so a
// verification step's tokens take the separate launch: the same bits).
template <class Dot, MatvecLoads kLoads, Epilogue kEpi = Epilogue::None>
auto kernel_for_tokens(int n) {
    if constexpr (kEpi == Epilogue::Norm)
        return kernel_for<Dot, kLoads, 1, kEpi>();
    else
        return n == 1 ? kernel_for<Dot, kLoads, 1, kEpi>()
               : n <= 4 ? kernel_for<Dot, kLoads, 4, kEpi>()
                        : kernel_for<Dot, kLoads, 8, kEpi>();
}

template <class Dot, MatvecLoads kLoads>
void launch_type(const KernelNames& names, const MatvecJob& job, int cols, const typename Dot::X* x, int n_tok,
                 Stream stream) {
    // Split: a block per row (per gate / up pair with the SwiGLU epilogue); else kWarps rows (pairs) per block;
    // persistent: persistent_grid's blocks.
    const unsigned blocks = kLoads != MatvecLoads::Split ? grid_blocks(job)
                            : job.swiglu                 ? static_cast<unsigned>(job.seg0.rows)
                                                         : static_cast<unsigned>(job.total_rows);
    const unsigned sms = kLoads == MatvecLoads::Persistent ? static_cast<unsigned>(multiprocessor_count()) : 0;
    constexpr bool kStagedKernel = kLoads == MatvecLoads::Staged || kLoads == MatvecLoads::Persistent;
    constexpr bool kCanQuantize = kStagedKernel && std::is_same_v<typename Dot::X, uint8_t>;
    detail::require(!job.q8_out || kCanQuantize, "matvec: only the 8-bit staged kernels quantize their output");
    const bool rope = job.rope_counters != nullptr;
    detail::require(!rope || (kLoads != MatvecLoads::Persistent && !job.swiglu && !job.q8_out && !job.row_ids),
                    "matvec: RoPE jobs run on the direct, staged and split kernels");
    // A norm job on the persistent route takes the staged kernel (one block-row per block; the same sums).
    const bool norm = job.norm_counter != nullptr;
    detail::require(!norm || (n_tok == 1 && job.n_seg == 1 && !job.swiglu && !job.q8_out && !job.row_ids && !rope &&
                              job.total_rows % kWarps == 0),
                    "matvec: a norm job is one matrix of whole blocks of rows and one token");
    detail::require(!norm || Dot::kNormEpilogue, "matvec: this type's walk on this route has no norm epilogue");
    detail::require(!IsDotPair<Dot>::value ||
                        (!job.swiglu && !job.row_ids && !norm && job.b_seg >= 1 && job.b_seg < job.n_seg),
                    "matvec: a launch of two types is matvec_multi's or matvec_qkv_rope's, the last target the other");
    // 9..16 tokens take two launches.
    for (int t0 = 0; t0 < n_tok; t0 += 8) {
        const int n = n_tok - t0 < 8 ? n_tok - t0 : 8;
        const typename Dot::X* xt = x + static_cast<size_t>(t0) * Dot::x_units(cols);
        MatvecJob jt = job;
        jt.token0 = t0;
        for (MatvecSegment* s : {&jt.seg0, &jt.seg1, &jt.seg2})
            if (s->y) s->y += static_cast<size_t>(t0) * s->y_stride;
        if (jt.q8_out) jt.q8_out += static_cast<size_t>(t0) * swiglu_q8_row_bytes(job);
        const auto launch = [&](auto kernel, const char* name, unsigned grid) {
            detail::launch_kernel(name, kernel, dim3(grid), dim3(kWarps * 32), 0, stream, jt, cols, xt, n);
        };
        if constexpr (kStagedKernel) {
            const unsigned grid = kLoads == MatvecLoads::Persistent ? persistent_grid(blocks, n, sms) : 0;
            constexpr auto kPersistent = MatvecLoads::Persistent, kStaged = MatvecLoads::Staged;
            if (rope) {
                launch(kernel_for_tokens<Dot, kStaged, Epilogue::Rope>(n), names.staged, blocks);
                continue;
            }
            if (norm) {
                if constexpr (Dot::kNormEpilogue)
                    launch(kernel_for_tokens<Dot, kStaged, Epilogue::Norm>(n), names.staged, blocks);
                continue;
            }
            if constexpr (kCanQuantize) {
                if (jt.q8_out) {
                    if (grid > 0)
                        launch(kernel_for_tokens<Dot, kPersistent, Epilogue::QuantOut>(n), names.persistent, grid);
                    else
                        launch(kernel_for_tokens<Dot, kStaged, Epilogue::QuantOut>(n), names.staged, blocks);
                    continue;
                }
            }
            if (grid > 0)
                launch(kernel_for_tokens<Dot, kPersistent>(n), names.persistent, grid);
            else
                launch(kernel_for_tokens<Dot, kStaged>(n), names.staged, blocks);
        } else {
            const char* name = kLoads == MatvecLoads::Split ? names.split : names.direct;
            if (rope) {
                launch(kernel_for_tokens<Dot, kLoads, Epilogue::Rope>(n), name, blocks);
            } else if (norm) {
                if constexpr (Dot::kNormEpilogue)
                    launch(kernel_for_tokens<Dot, kLoads, Epilogue::Norm>(n), name, blocks);
            } else {
                launch(kernel_for_tokens<Dot, kLoads>(n), name, blocks);
            }
        }
    }
}

// Those names from one spelling: TANDEM_KERNEL_NAMES("matvec", "_kernel", Q4_0) is matvec_kernel<Q4_0>,
// matvec_staged_kernel<Q4_0>, ... (string literals: launch_kernel keeps only the pointer, for its error message).
#define TANDEM_KERNEL_NAMES(prefix, suffix, type)                                          \
    (::tandem::cuda::matvec_detail::KernelNames{prefix suffix "<" #type ">",               \
                                                prefix "_staged" suffix "<" #type ">",     \
                                                prefix "_split" suffix "<" #type ">",      \
                                                prefix "_persistent" suffix "<" #type ">"})

// The block types any way (the float types, whose F16 walk already streams 8-byte loads, always directly).
template <class Dot>
void launch_blocks(const KernelNames& names, MatvecLoads loads, const MatvecJob& job, int cols,
                   const typename Dot::X* x, int n_tok, Stream stream) {
    if constexpr (IsDotPair<Dot>::value) {
        // A pair's rows on the staged and persistent routes take the direct kernel: the same sums, bit for bit
        // (DotPair), and staged pairs (two staged walks in one kernel) spilled under the staged budgets.
        if (loads == MatvecLoads::Split)
            return launch_type<Dot, MatvecLoads::Split>(names, job, cols, x, n_tok, stream);
        return launch_type<Dot, MatvecLoads::Direct>(names, job, cols, x, n_tok, stream);
    } else {
        switch (loads) {
            case MatvecLoads::Staged: return launch_type<Dot, MatvecLoads::Staged>(names, job, cols, x, n_tok, stream);
            case MatvecLoads::Split: return launch_type<Dot, MatvecLoads::Split>(names, job, cols, x, n_tok, stream);
            case MatvecLoads::Persistent:
                return launch_type<Dot, MatvecLoads::Persistent>(names, job, cols, x, n_tok, stream);
            case MatvecLoads::Direct: break;
        }
        launch_type<Dot, MatvecLoads::Direct>(names, job, cols, x, n_tok, stream);
    }
}

}  // namespace tandem::cuda::matvec_detail
