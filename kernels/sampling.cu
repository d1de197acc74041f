// Sampling helpers on the device (declared at the end of kernels.h): greedy argmax, softmax with temperature, top-k,
// the logits of given columns (a repeat penalty's window, beside the top-k candidates), and the two gathers
// speculative verification needs (p(x) of given tokens, the residual max(0, p - q)). They
// follow src/sample/sampler.cpp: a NaN logit is -inf, ties go to the lower token id, the softmax subtracts the max,
// short-cuts the max to exp(0) = 1, sums in double and multiplies by the double reciprocal.
//
// A row of 151,936 logits is too much for one block to read quickly, so every row is cut into splits, a block per
// (split, row), and a small second kernel combines the splits' results through the caller's workspace; the greedy
// picks (argmax, argmax_top_probability) combine them in the last block of each row instead, given counters.
#include <cmath>

#include "common.cuh"

namespace tandem::cuda {
namespace {

using Key = unsigned long long;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kArgChunk = 2048;  // logits per block for argmax / softmax: 8 per thread
constexpr int kArgMaxSplits = 128;
constexpr int kTopKChunk = 4096;  // top-k splits are fewer and larger: every split hands k candidates on
constexpr int kTopKMaxSplits = 64;
static_assert(kTopKMax <= kThreads, "block_top_k ranks each selected key in its own thread");

int splits_for(int n_vocab, int chunk, int max_splits) {
    const int s = (n_vocab + chunk - 1) / chunk;
    return s < max_splits ? s : max_splits;
}
int chunk_for(int n_vocab, int splits) { return (n_vocab + splits - 1) / splits; }

// One 64-bit key per logit, ordered as the CPU sampler's ByLogit: a larger key is a larger logit, and of equal
// logits the lower id. The high half is the logit's bits made monotonic as an unsigned integer (negative floats
// flipped, positive ones offset past them), the low half ~id. NaN counts as -inf (Sampler::load_logits), -0 as +0
// (they compare equal there, so the id decides). Every element's key is > 0: 0 stands for "no element".
__device__ __forceinline__ Key key_of(float v, int id) {
    if (v != v) v = -INFINITY;  // NaN
    if (v == 0.0f) v = 0.0f;    // -0
    unsigned b = __float_as_uint(v);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return (static_cast<Key>(b) << 32) | (0xFFFFFFFFu - static_cast<unsigned>(id));
}
__device__ __forceinline__ float key_value(Key k) {
    const unsigned b = static_cast<unsigned>(k >> 32);
    return __uint_as_float((b & 0x80000000u) ? (b & 0x7FFFFFFFu) : ~b);
}
__device__ __forceinline__ int key_id(Key k) {
    return static_cast<int>(0xFFFFFFFFu - static_cast<unsigned>(k & 0xFFFFFFFFu));
}

__device__ __forceinline__ Key warp_max_key(Key v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const Key o = __shfl_xor_sync(detail::kFullMask, v, offset);
        v = o > v ? o : v;
    }
    return v;
}

// Max over the block, returned to every thread. `scratch` holds kWarps keys of shared memory; the caller must not
// write it again before every thread has passed the next barrier (the top-k rounds alternate two of them).
__device__ __forceinline__ Key block_max_key(Key v, Key* scratch) {
    v = warp_max_key(v);
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    v = scratch[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v = scratch[w] > v ? scratch[w] : v;
    return v;
}

__device__ __forceinline__ double block_sum_double(double v, double* scratch) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(detail::kFullMask, v, offset);
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
    __syncthreads();
    v = 0.0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += scratch[w];
    return v;
}

// Max of keys[0..n) by one warp, returned to every lane.
__device__ __forceinline__ Key warp_max_of(const Key* keys, int n) {
    Key v = 0;
    for (int i = threadIdx.x % 32; i < n; i += 32) v = keys[i] > v ? keys[i] : v;
    return warp_max_key(v);
}

// ---- argmax and softmax -----------------------------------------------------------------------------------------

// The largest key of l[begin, end) over the block, returned to every thread (scratch: block_max_key's).
__device__ __forceinline__ Key split_best_key(const float* l, int begin, int end, Key* scratch) {
    Key best = 0;
    for (int i = begin + static_cast<int>(threadIdx.x); i < end; i += kThreads) {
        const Key k = key_of(l[i], i);
        best = k > best ? k : best;
    }
    return block_max_key(best, scratch);
}

// Stage 1, one block per (split, row): the split's largest key.
__global__ void __launch_bounds__(kThreads) max_key_kernel(const float* __restrict__ logits, int n_vocab, int chunk,
                                                           Key* __restrict__ keys) {
    detail::wait_for_inputs();
    TANDEM_SHARED(Key, scratch, kWarps);
    const int split = blockIdx.x, row = blockIdx.y;
    const float* l = logits + static_cast<size_t>(row) * n_vocab;
    const int begin = split * chunk, end = begin + chunk < n_vocab ? begin + chunk : n_vocab;
    const Key best = split_best_key(l, begin, end, scratch);
    if (threadIdx.x == 0) keys[static_cast<size_t>(row) * gridDim.x + split] = best;
}

// Stage 2 of argmax, one warp per row: the id of the largest key, -1 when the row's best is -inf (every logit
// -inf or NaN: where the CPU sampler throws).
__global__ void __launch_bounds__(32) argmax_final_kernel(const Key* __restrict__ keys, int n_splits,
                                                          int* __restrict__ out) {
    detail::wait_for_inputs();
    const int row = blockIdx.x;
    const Key best = warp_max_of(keys + static_cast<size_t>(row) * n_splits, n_splits);
    if (threadIdx.x == 0) out[row] = key_value(best) == -INFINITY ? -1 : key_id(best);
}

// Stage 3 of argmax_top_probability, one warp per row: the argmax id (-1 as above) and 1 / the sum of the splits'
// softmax sums (added in split order by lane 0, so the result does not depend on the warp's reduction order), NaN
// for a row without a logit above -inf.
__global__ void __launch_bounds__(32) top_probability_final_kernel(const Key* __restrict__ keys,
                                                                   const double* __restrict__ sums, int n_splits,
                                                                   int* __restrict__ out_ids,
                                                                   float* __restrict__ out_top) {
    detail::wait_for_inputs();
    const int row = blockIdx.x;
    const Key best = warp_max_of(keys + static_cast<size_t>(row) * n_splits, n_splits);
    if (threadIdx.x != 0) return;
    const bool none = key_value(best) == -INFINITY;
    double total = 0.0;
    for (int s = 0; s < n_splits; ++s) total += sums[static_cast<size_t>(row) * n_splits + s];
    out_ids[row] = none ? -1 : key_id(best);
    out_top[row] = none ? NAN : static_cast<float>(1.0 / total);
}

// exp((l - mx) / temperature) as Sampler::softmax computes it: l == mx short-cuts exp(0), which also keeps a +inf
// logit from giving inf - inf = NaN.
__device__ __forceinline__ float softmax_term(float l, float mx, float temperature) {
    if (l != l) l = -INFINITY;
    return l == mx ? 1.0f : expf((l - mx) / temperature);
}

// The greedy picks in one launch (argmax, argmax_top_probability given counters), one block per (split, row): the
// split's largest key and, with kConfidence, its sum of exp(l - m_s) in double against its own largest logit m_s
// (the row's is not known yet); then the row's last block to finish (counters[row], the threadFenceReduction
// pattern; it resets the counter) combines them as the final kernels do: the largest key, and the total
// sum_s S_s * exp(m_s - m), the splits added in order in double (the split of the row's max scaled by exactly 1).
// The total is the two-launch sum to float rounding (a term exp(l - m_s) * exp(m_s - m) against exp(l - m)).
template <bool kConfidence>
__global__ void __launch_bounds__(kThreads) argmax_one_launch_kernel(const float* __restrict__ logits, int n_vocab,
                                                                     int chunk, Key* __restrict__ keys,
                                                                     double* __restrict__ sums,
                                                                     unsigned* __restrict__ counters,
                                                                     int* __restrict__ out_ids,
                                                                     float* __restrict__ out_top) {
    detail::wait_for_inputs();
    TANDEM_SHARED(Key, key_scratch, kWarps);
    TANDEM_SHARED(double, sum_scratch, kWarps);
    TANDEM_SHARED(int, is_last, 1);
    const int split = blockIdx.x, row = blockIdx.y, n_splits = gridDim.x;
    const float* l = logits + static_cast<size_t>(row) * n_vocab;
    const int begin = split * chunk, end = begin + chunk < n_vocab ? begin + chunk : n_vocab;
    const Key best = split_best_key(l, begin, end, key_scratch);  // every thread's
    const size_t slot = static_cast<size_t>(row) * n_splits + split;
    if constexpr (kConfidence) {
        const float m = key_value(best);
        double sum = 0.0;
        if (m != -INFINITY)  // a split of -inf / NaN only adds nothing (its terms would short-cut to 1)
            for (int i = begin + threadIdx.x; i < end; i += kThreads) sum += softmax_term(l[i], m, 1.0f);
        sum = block_sum_double(sum, sum_scratch);
        if (threadIdx.x == 0) sums[slot] = sum;
    }
    if (threadIdx.x == 0) keys[slot] = best;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const bool last = atomicAdd(counters + row, 1u) + 1 == static_cast<unsigned>(n_splits);
        if (last) counters[row] = 0;  // every split has counted
        *is_last = last ? 1 : 0;
    }
    __syncthreads();
    if (!*is_last || threadIdx.x >= 32) return;
    __threadfence();
    const Key* row_keys = keys + static_cast<size_t>(row) * n_splits;
    Key top = 0;
    for (int i = threadIdx.x; i < n_splits; i += 32) {
        const Key k = detail::load_input<true>(row_keys + i);
        top = k > top ? k : top;
    }
    top = warp_max_key(top);
    if (threadIdx.x != 0) return;
    const bool none = key_value(top) == -INFINITY;
    out_ids[row] = none ? -1 : key_id(top);
    if constexpr (kConfidence) {
        const float m = key_value(top);
        double total = 0.0;
        for (int i = 0; i < n_splits; ++i) {
            const float m_s = key_value(detail::load_input<true>(row_keys + i));
            const double s_i = detail::load_input<true>(sums + static_cast<size_t>(row) * n_splits + i);
            total += m_s == m ? s_i : s_i * exp(static_cast<double>(m_s) - static_cast<double>(m));
        }
        out_top[row] = none ? NAN : static_cast<float>(1.0 / total);
    }
}

// Stage 2 of softmax, one block per (split, row): the split's sum of terms, in double like the CPU's.
__global__ void __launch_bounds__(kThreads) softmax_sum_kernel(const float* __restrict__ logits, int n_vocab,
                                                               int chunk, const Key* __restrict__ keys,
                                                               float temperature, double* __restrict__ sums) {
    detail::wait_for_inputs();
    TANDEM_SHARED(double, scratch, kWarps);
    const int split = blockIdx.x, row = blockIdx.y, n_splits = gridDim.x;
    const float mx = key_value(warp_max_of(keys + static_cast<size_t>(row) * n_splits, n_splits));
    const float* l = logits + static_cast<size_t>(row) * n_vocab;
    const int begin = split * chunk, end = begin + chunk < n_vocab ? begin + chunk : n_vocab;
    double sum = 0.0;
    for (int i = begin + threadIdx.x; i < end; i += kThreads) sum += softmax_term(l[i], mx, temperature);
    sum = block_sum_double(sum, scratch);
    if (threadIdx.x == 0) sums[static_cast<size_t>(row) * n_splits + split] = sum;
}

// Stage 3, one block per (split, row): probs = term * (1 / total), the product rounded once from double as on the
// CPU. Every block adds the splits' sums in the same order, so they agree on the total. Temperature 0 is the
// greedy distribution (one-hot at the argmax), as Sampler::distribution gives it; a row without a logit above
// -inf is NaN throughout, for the caller to report.
__global__ void __launch_bounds__(kThreads) softmax_write_kernel(const float* __restrict__ logits, int n_vocab,
                                                                 int chunk, const Key* __restrict__ keys,
                                                                 const double* __restrict__ sums, float temperature,
                                                                 float* __restrict__ probs) {
    detail::wait_for_inputs();
    const int split = blockIdx.x, row = blockIdx.y, n_splits = gridDim.x;
    const Key best = warp_max_of(keys + static_cast<size_t>(row) * n_splits, n_splits);
    const float mx = key_value(best);
    const float* l = logits + static_cast<size_t>(row) * n_vocab;
    float* p = probs + static_cast<size_t>(row) * n_vocab;
    const int begin = split * chunk, end = begin + chunk < n_vocab ? begin + chunk : n_vocab;
    if (mx == -INFINITY) {
        for (int i = begin + threadIdx.x; i < end; i += kThreads) p[i] = NAN;
        return;
    }
    if (temperature == 0.0f) {
        const int top = key_id(best);
        for (int i = begin + threadIdx.x; i < end; i += kThreads) p[i] = i == top ? 1.0f : 0.0f;
        return;
    }
    double total = 0.0;
    for (int s = threadIdx.x % 32; s < n_splits; s += 32) total += sums[static_cast<size_t>(row) * n_splits + s];
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) total += __shfl_xor_sync(detail::kFullMask, total, offset);
    const double inv = 1.0 / total;
    for (int i = begin + threadIdx.x; i < end; i += kThreads)
        p[i] = static_cast<float>(static_cast<double>(softmax_term(l[i], mx, temperature)) * inv);
}

// ---- top-k --------------------------------------------------------------------------------------------------------

struct SelectShared {
    unsigned hist[256];
    Key selected[kTopKMax];
    unsigned n_selected;
    unsigned bin, above, in_bin;  // the pass's result, for every thread
};

// The k largest of the keys this block's threads own, best first, into out[0..k). `key_at(j)` is the key of this
// thread's j-th element (j < count); a key of 0 is no element. `total` is the number of elements of the block.
//
// Radix select: 8 bits at a time from the top, count the keys that match the digits chosen so far into a histogram
// and pick the digit holding the k-th largest. Keys are unique, so once the chosen bin holds exactly the keys still
// needed (at the latest after the 8th digit) the k largest are exactly the keys >= the chosen prefix. Usually that is
// after 3 passes instead of the k block-wide rounds of repeated maxima; then the k keys are ranked by comparison.
template <class KeyAt>
__device__ __forceinline__ void block_top_k(int k, int total, int count, KeyAt key_at, SelectShared& sh, Key* out) {
    Key prefix = 0, mask = 0;
    unsigned need = static_cast<unsigned>(k);
    for (int shift = 56; shift >= 0 && total > k; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += kThreads) sh.hist[b] = 0;
        __syncthreads();
        for (int j = 0; j < count; ++j) {
            const Key x = key_at(j);
            if (x != 0 && (x & mask) == prefix) atomicAdd(&sh.hist[(x >> shift) & 255], 1u);
        }
        __syncthreads();
        if (threadIdx.x < 32) {
            // Lane l sums bins 255 - 8l down to 248 - 8l; an inclusive scan over the lanes then counts, from the top,
            // the keys up to each lane's bins, and the lane whose range reaches `need` walks its bins.
            const int lane = threadIdx.x, top_bin = 255 - 8 * lane;
            unsigned mine = 0;
#pragma unroll
            for (int i = 0; i < 8; ++i) mine += sh.hist[top_bin - i];
            unsigned upto = mine;
#pragma unroll
            for (int offset = 1; offset < 32; offset <<= 1) {
                const unsigned u = __shfl_up_sync(detail::kFullMask, upto, offset);
                if (lane >= offset) upto += u;
            }
            const unsigned before = upto - mine;
            if (before < need && need <= upto) {
                unsigned above = before;
                int bin = top_bin;
                while (above + sh.hist[bin] < need) above += sh.hist[bin--];
                sh.bin = static_cast<unsigned>(bin);
                sh.above = above;
                sh.in_bin = sh.hist[bin];
            }
        }
        __syncthreads();
        prefix |= static_cast<Key>(sh.bin) << shift;
        mask |= static_cast<Key>(255) << shift;
        need -= sh.above;
        if (sh.in_bin == need) break;  // the same in every thread
    }
    // Collect the keys >= prefix (all of them when the block has no more than k), then rank them.
    if (threadIdx.x == 0) sh.n_selected = 0;
    __syncthreads();
    for (int j = 0; j < count; ++j) {
        const Key x = key_at(j);
        if (x != 0 && x >= prefix) {
            const unsigned slot = atomicAdd(&sh.n_selected, 1u);
            if (slot < kTopKMax) sh.selected[slot] = x;
        }
    }
    __syncthreads();
    const int n = sh.n_selected < static_cast<unsigned>(k) ? static_cast<int>(sh.n_selected) : k;
    if (static_cast<int>(threadIdx.x) < n) {
        const Key x = sh.selected[threadIdx.x];
        int rank = 0;
        for (int i = 0; i < n; ++i) rank += sh.selected[i] > x;
        out[rank] = x;
    }
    for (int r = n + threadIdx.x; r < k; r += kThreads) out[r] = 0;  // fewer elements than k
}

// Stage 1, one block per (split, row): the split's top k keys into its slot of the workspace.
__global__ void __launch_bounds__(kThreads) top_k_split_kernel(const float* __restrict__ logits, int n_vocab, int chunk,
                                                               int k, Key* __restrict__ candidates) {
    detail::wait_for_inputs();
    TANDEM_SHARED(SelectShared, sh, 1);
    const int split = blockIdx.x, row = blockIdx.y;
    const float* l = logits + static_cast<size_t>(row) * n_vocab;
    const int first = split * chunk, end = first + chunk < n_vocab ? first + chunk : n_vocab;
    const int begin = first + static_cast<int>(threadIdx.x);
    const int count = begin < end ? (end - begin + kThreads - 1) / kThreads : 0;
    block_top_k(
        k, end - first, count, [&](int j) { return key_of(l[begin + j * kThreads], begin + j * kThreads); }, sh[0],
        candidates + (static_cast<size_t>(row) * gridDim.x + split) * k);
}

// Stage 2, one block per row: the top k of the splits' candidates, as (logit, id) pairs. A NaN logit comes back as
// -inf, the value the CPU sampler ranks it by.
__global__ void __launch_bounds__(kThreads) top_k_merge_kernel(const Key* __restrict__ candidates, int n_candidates,
                                                               int k, float* __restrict__ out_logits,
                                                               int* __restrict__ out_ids) {
    detail::wait_for_inputs();
    TANDEM_SHARED(SelectShared, sh, 1);
    TANDEM_SHARED(Key, top, kTopKMax);
    const int row = blockIdx.x;
    const Key* c = candidates + static_cast<size_t>(row) * n_candidates;
    const int begin = static_cast<int>(threadIdx.x);
    const int count = begin < n_candidates ? (n_candidates - begin + kThreads - 1) / kThreads : 0;
    block_top_k(
        k, n_candidates, count, [&](int j) { return c[begin + j * kThreads]; }, sh[0], top);
    __syncthreads();
    for (int r = threadIdx.x; r < k; r += kThreads) {
        out_logits[static_cast<size_t>(row) * k + r] = key_value(top[r]);
        out_ids[static_cast<size_t>(row) * k + r] = key_id(top[r]);
    }
}

// ---- gathers for speculative verification --------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads) gather_kernel(const float* __restrict__ rows, int n_rows, int n_vocab,
                                                          const int* __restrict__ ids, float* __restrict__ out) {
    detail::wait_for_inputs();
    const int r = blockIdx.x * kThreads + threadIdx.x;
    if (r >= n_rows) return;
    const int id = ids[r];
    out[r] = id >= 0 && id < n_vocab ? rows[static_cast<size_t>(r) * n_vocab + id] : NAN;
}

// out[r][j] = rows[r][ids[j]]: one thread per (column, row).
__global__ void __launch_bounds__(kThreads) gather_columns_kernel(const float* __restrict__ rows, int n_vocab,
                                                                  const int* __restrict__ ids, int n_ids,
                                                                  float* __restrict__ out) {
    detail::wait_for_inputs();
    const int j = blockIdx.x * kThreads + threadIdx.x, r = blockIdx.y;
    if (j >= n_ids) return;
    const int id = ids[j];
    out[static_cast<size_t>(r) * n_ids + j] = id >= 0 && id < n_vocab ? rows[static_cast<size_t>(r) * n_vocab + id] : NAN;
}

__global__ void __launch_bounds__(kThreads) residual_kernel(const float* __restrict__ p, const float* __restrict__ q,
                                                            float* __restrict__ out, int n) {
    detail::wait_for_inputs();
    const int i = blockIdx.x * kThreads + threadIdx.x;
    if (i < n) out[i] = fmaxf(0.0f, p[i] - q[i]);  // as speculative.cpp: std::max(0.0f, p - q)
}

void check_rows(const char* what, int n_rows, int n_vocab) {
    detail::require(n_rows > 0 && n_rows <= 65535 && n_vocab > 0, what);
}

// How argmax, softmax and argmax_top_probability cut a row and where their splits' results go in the workspace:
// each (split, row)'s largest key in `keys`, its sum of softmax terms in `sums`.
struct SplitSums {
    int splits, chunk;
    Key* keys;
    double* sums;
};
SplitSums split_sums(int n_rows, int n_vocab, void* workspace) {
    const int splits = splits_for(n_vocab, kArgChunk, kArgMaxSplits);
    Key* keys = static_cast<Key*>(workspace);
    return {splits, chunk_for(n_vocab, splits), keys,
            reinterpret_cast<double*>(keys + static_cast<size_t>(n_rows) * splits)};
}

// Their first stages: the keys, and with temperature > 0 the sums against the row's max.
SplitSums enqueue_split_sums(const float* logits, int n_rows, int n_vocab, float temperature, void* workspace,
                             Stream stream) {
    const SplitSums s = split_sums(n_rows, n_vocab, workspace);
    const dim3 grid(s.splits, n_rows);
    detail::launch_kernel("max_key_kernel", max_key_kernel, grid, dim3(kThreads), 0, stream, logits, n_vocab,
                          s.chunk, s.keys);
    if (temperature > 0.0f)  // greedy needs no sum
        detail::launch_kernel("softmax_sum_kernel", softmax_sum_kernel, grid, dim3(kThreads), 0, stream, logits,
                              n_vocab, s.chunk, static_cast<const Key*>(s.keys), temperature, s.sums);
    return s;
}

// The greedy picks in one launch (argmax_one_launch_kernel), with the confidence when out_top is set.
void launch_one_launch_picks(const float* logits, int n_rows, int n_vocab, int* out_ids, float* out_top,
                             void* workspace, unsigned* counters, Stream stream) {
    const SplitSums s = split_sums(n_rows, n_vocab, workspace);
    const dim3 grid(s.splits, n_rows);
    if (out_top)
        detail::launch_kernel("argmax_one_launch_kernel<true>", argmax_one_launch_kernel<true>, grid, dim3(kThreads),
                              0, stream, logits, n_vocab, s.chunk, s.keys, s.sums, counters, out_ids, out_top);
    else
        detail::launch_kernel("argmax_one_launch_kernel<false>", argmax_one_launch_kernel<false>, grid,
                              dim3(kThreads), 0, stream, logits, n_vocab, s.chunk, s.keys, s.sums, counters, out_ids,
                              out_top);
}

}  // namespace

size_t sampling_workspace_bytes(int n_rows, int n_vocab) {
    if (n_rows <= 0 || n_vocab <= 0) return 0;
    const size_t arg = static_cast<size_t>(splits_for(n_vocab, kArgChunk, kArgMaxSplits)) * (sizeof(Key) + sizeof(double));
    const size_t topk = static_cast<size_t>(splits_for(n_vocab, kTopKChunk, kTopKMaxSplits)) * kTopKMax * sizeof(Key);
    return static_cast<size_t>(n_rows) * (arg > topk ? arg : topk);
}

size_t argmax_counters(int n_rows) { return n_rows > 0 ? static_cast<size_t>(n_rows) : 0; }

void argmax(const float* logits, int n_rows, int n_vocab, int* out_ids, void* workspace, Stream stream,
            unsigned* counters) {
    check_rows("argmax: bad shape", n_rows, n_vocab);
    if (counters)
        return launch_one_launch_picks(logits, n_rows, n_vocab, out_ids, nullptr, workspace, counters, stream);
    const SplitSums s = enqueue_split_sums(logits, n_rows, n_vocab, 0.0f, workspace, stream);  // the keys only
    detail::launch_kernel("argmax_final_kernel", argmax_final_kernel, dim3(n_rows), dim3(32), 0, stream,
                          static_cast<const Key*>(s.keys), s.splits, out_ids);
}

void argmax_top_probability(const float* logits, int n_rows, int n_vocab, int* out_ids, float* out_top,
                            void* workspace, Stream stream, unsigned* counters) {
    check_rows("argmax_top_probability: bad shape", n_rows, n_vocab);
    if (counters)
        return launch_one_launch_picks(logits, n_rows, n_vocab, out_ids, out_top, workspace, counters, stream);
    const SplitSums s = enqueue_split_sums(logits, n_rows, n_vocab, 1.0f, workspace, stream);
    detail::launch_kernel("top_probability_final_kernel", top_probability_final_kernel, dim3(n_rows), dim3(32), 0,
                          stream, static_cast<const Key*>(s.keys), static_cast<const double*>(s.sums), s.splits,
                          out_ids, out_top);
}

void softmax(const float* logits, int n_rows, int n_vocab, float temperature, float* probs, void* workspace,
             Stream stream) {
    check_rows("softmax: bad shape", n_rows, n_vocab);
    detail::require(temperature >= 0.0f && std::isfinite(temperature), "softmax: temperature must be finite and >= 0");
    const SplitSums s = enqueue_split_sums(logits, n_rows, n_vocab, temperature, workspace, stream);
    detail::launch_kernel("softmax_write_kernel", softmax_write_kernel, dim3(s.splits, n_rows), dim3(kThreads), 0,
                          stream, logits, n_vocab, s.chunk, static_cast<const Key*>(s.keys),
                          static_cast<const double*>(s.sums), temperature, probs);
}

void top_k(const float* logits, int n_rows, int n_vocab, int k, float* out_logits, int* out_ids, void* workspace,
           Stream stream) {
    check_rows("top_k: bad shape", n_rows, n_vocab);
    detail::require(k >= 1 && k <= kTopKMax && k <= n_vocab, "top_k: k must be 1..min(kTopKMax, n_vocab)");
    const int splits = splits_for(n_vocab, kTopKChunk, kTopKMaxSplits);
    Key* candidates = static_cast<Key*>(workspace);
    detail::launch_kernel("top_k_split_kernel", top_k_split_kernel, dim3(splits, n_rows), dim3(kThreads), 0, stream,
                          logits, n_vocab, chunk_for(n_vocab, splits), k, candidates);
    detail::launch_kernel("top_k_merge_kernel", top_k_merge_kernel, dim3(n_rows), dim3(kThreads), 0, stream,
                          static_cast<const Key*>(candidates), splits * k, k, out_logits, out_ids);
}

void gather_rows(const float* rows, int n_rows, int n_vocab, const int* ids, float* out, Stream stream) {
    check_rows("gather_rows: bad shape", n_rows, n_vocab);
    detail::launch_kernel("gather_kernel", gather_kernel, dim3((n_rows + kThreads - 1) / kThreads), dim3(kThreads), 0,
                          stream, rows, n_rows, n_vocab, ids, out);
}

void gather_columns(const float* rows, int n_rows, int n_vocab, const int* ids, int n_ids, float* out, Stream stream) {
    check_rows("gather_columns: bad shape", n_rows, n_vocab);
    detail::require(n_ids >= 0, "gather_columns: negative id count");
    if (n_ids == 0) return;
    detail::launch_kernel("gather_columns_kernel", gather_columns_kernel, dim3((n_ids + kThreads - 1) / kThreads, n_rows),
                          dim3(kThreads), 0, stream, rows, n_vocab, ids, n_ids, out);
}

void residual(const float* p, const float* q, float* out, int n, Stream stream) {
    detail::require(n > 0, "residual: empty");
    detail::launch_kernel("residual_kernel", residual_kernel, dim3((n + kThreads - 1) / kThreads), dim3(kThreads), 0,
                          stream, p, q, out, n);
}

}  // namespace tandem::cuda
