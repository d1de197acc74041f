// Prefill attention: tiled causal flash attention over the KV cache (fp16 or Q8_0, kernels.h: KvType) with
// grouped-query heads, for chunks of many tokens (the decode path, split-K over a few queries, is attention.cu).
//
// One block (4 warps) per (tile of BQ queries, head). The block walks the keys 0..(its last query's position) in
// tiles of BK: the K and V rows of the tile are staged in shared memory as the cache holds them (fp16 halves, or
// Q8_0's int8 codes beside the fp32 scales of the blocks the head touches; the kv head indexed, not copied), then
// three phases separated by barriers:
//   scores  S[q][k] = scale * (q . k), -inf where the key is after the query (causal mask) or before its sliding
//           window;
//   softmax one thread per query row: running max m, correction exp(m_old - m_new), P = exp(S - m_new) in place,
//           running sum l;
//   output  warp w owns queries w, w + 4, ..., lane l the dims l + 32j: acc = acc * correction + P . V.
// No shuffles (cheap under the emulation too); all softmax state is fp32.
#include <cmath>
#include <type_traits>

#include "common.cuh"

namespace tandem::cuda {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;

// D: head dims up to 32 * D (lanes past head_dim hold zeros). BQ x BK keeps the static shared memory under 48 KiB
// for every D (the largest, D = 8 with 16 x 16, is ~34 KiB with fp16 tiles, ~27 KiB with Q8_0's) and the
// accumulators at BQ / 4 * D <= 32 registers.
// kSoftcap: gemma2's soft-capped scores. Its instances ask for one resident block per SM at least (without that,
// ptxas held the <64, q8_0, softcap> instance to 96 registers and spilled 8 bytes, sm_80); the others are unchanged.
template <int D, int BQ, int BK, bool Q8, bool kSoftcap>
__global__ void __launch_bounds__(kThreads, kSoftcap ? 1 : 0) attention_prefill_kernel(AttentionArgs a) {
    detail::wait_for_inputs();
    constexpr int HD = 32 * D;
    // Padded strides: the score phase reads K rows (one per lane) and up to two Q rows per warp at the same dim;
    // an odd word stride puts those rows in different banks.
    constexpr int QS = HD + 1, KS = Q8 ? HD + 4 : HD + 2, SS = BK + 1;
    // Q8_0: the scales of the blocks a head's dims touch, per staged row: HD / 32 + 1 when the head does not start
    // on a block boundary (heads narrower than 32, or not a multiple of it).
    constexpr int NB = Q8 ? HD / 32 + 1 : 1;
    using Code = std::conditional_t<Q8, int8_t, uint16_t>;  // what a tile holds per element
    static_assert(BQ % kWarps == 0 && (BQ * BK) % kThreads == 0, "tile shape");
    TANDEM_SHARED(float, q_tile, BQ * QS);
    TANDEM_SHARED(Code, k_tile, BK * KS);
    TANDEM_SHARED(Code, v_tile, BK * HD);
    TANDEM_SHARED(float, k_scale, BK * NB);
    TANDEM_SHARED(float, v_scale, BK * NB);
    TANDEM_SHARED(float, s_tile, BQ * SS);
    TANDEM_SHARED(float, row_m, BQ);
    TANDEM_SHARED(float, row_l, BQ);
    TANDEM_SHARED(float, row_c, BQ);

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int q0 = blockIdx.x * BQ, head = blockIdx.y, hd = a.head_dim;
    const int n_q = a.n_tokens - q0 < BQ ? a.n_tokens - q0 : BQ;
    const int q_dim = a.n_heads * hd, kv_dim = a.n_kv_heads * hd;
    const int kv_head = head / (a.n_heads / a.n_kv_heads);
    const float scale = a.scale != 0.0f ? a.scale : 1.0f / sqrtf(static_cast<float>(hd));
    const int first_pos = a.start_pos + q0;     // position of the tile's query 0
    const int n_keys = first_pos + n_q;         // keys 0..(last query's position)
    const size_t row_bytes = Q8 ? static_cast<size_t>(kv_dim / 32) * 34 : static_cast<size_t>(kv_dim) * 2;
    const int first_block = kv_head * hd / 32;  // Q8_0: the block holding the head's first dim
    // An element of a staged row: the fp16 value, or code * scale (exact in fp32, so the same value split-K reads).
    auto value = [&](const Code* tile, const float* scales, int row, int stride, int d) -> float {
        if constexpr (Q8)
            return scales[row * NB + (kv_head * hd + d) / 32 - first_block] * static_cast<float>(tile[row * stride + d]);
        else
            return tandem_half_to_float(tile[row * stride + d]);
    };

    for (int i = tid; i < BQ * HD; i += kThreads) {
        const int qi = i / HD, d = i % HD;
        q_tile[qi * QS + d] = qi < n_q && d < hd ? a.q[static_cast<size_t>(q0 + qi) * q_dim + head * hd + d] : 0.0f;
    }
    if (tid < BQ) {
        row_m[tid] = -INFINITY;
        row_l[tid] = 0.0f;
    }
    float acc[BQ / kWarps][D];
#pragma unroll
    for (int i = 0; i < BQ / kWarps; ++i)
#pragma unroll
        for (int j = 0; j < D; ++j) acc[i][j] = 0.0f;

    const uint8_t* k_rows = static_cast<const uint8_t*>(a.k_cache);
    const uint8_t* v_rows = static_cast<const uint8_t*>(a.v_cache);
    // A sliding window: key tiles wholly before the tile's first query's window are skipped. Tiles start at multiples
    // of BK either way, so a query meets the same tiles whatever its query tile.
    const int first_key = a.window > 0 && first_pos - a.window + 1 > 0 ? first_pos - a.window + 1 : 0;
    for (int k0 = first_key / BK * BK; k0 < n_keys; k0 += BK) {
        __syncthreads();  // the previous tile's readers are done (first tile: Q and the row state are written)
        // The tile's first row: a sliding-window layer's ring holds position p in row p % ring, and the ring is a
        // multiple of BK (attention_ring_multiple), so the tile's BK positions lie in consecutive rows.
        const int row0 = a.ring > 0 ? k0 % a.ring : k0;
        for (int i = tid; i < BK * HD; i += kThreads) {
            const int kk = i / HD, d = i % HD;
            // Rows before the tile's first window are staged as zeros, as those past its last key: no query reads
            // them (their scores are masked), and P = 0 times a zero stays zero whatever the cache holds there.
            const bool in = k0 + kk >= first_key && k0 + kk < n_keys && d < hd;
            const size_t row = static_cast<size_t>(row0 + kk) * row_bytes;
            const int e = kv_head * hd + d;  // the element's index in the row
            if constexpr (Q8) {
                const size_t off = row + static_cast<size_t>(e / 32) * 34 + 2 + e % 32;
                k_tile[kk * KS + d] = in ? static_cast<int8_t>(k_rows[off]) : int8_t{0};
                v_tile[kk * HD + d] = in ? static_cast<int8_t>(v_rows[off]) : int8_t{0};
            } else {
                const size_t off = row + 2 * static_cast<size_t>(e);
                k_tile[kk * KS + d] = in ? *reinterpret_cast<const uint16_t*>(k_rows + off) : uint16_t{0};
                v_tile[kk * HD + d] = in ? *reinterpret_cast<const uint16_t*>(v_rows + off) : uint16_t{0};
            }
        }
        if constexpr (Q8) {
            // Scales of blocks past the row's end (the padding dims of a head at the end of the row) are 0: their
            // codes are 0 too, and nothing reads a NaN.
            for (int i = tid; i < BK * NB; i += kThreads) {
                const int kk = i / NB, b = first_block + i % NB;
                const bool in = k0 + kk >= first_key && k0 + kk < n_keys && b < kv_dim / 32;
                const size_t off = static_cast<size_t>(row0 + kk) * row_bytes + static_cast<size_t>(b) * 34;
                k_scale[i] = in ? detail::load_half(k_rows + off) : 0.0f;
                v_scale[i] = in ? detail::load_half(v_rows + off) : 0.0f;
            }
        }
        __syncthreads();
        for (int i = tid; i < BQ * BK; i += kThreads) {
            const int qi = i / BK, kk = i % BK;
            // Rows past the chunk take the mask of its last query. (Without a window every row then has key 0, so m
            // is finite after the first tile; with one, the softmax phase guards the rows without a key yet.)
            const int q_pos = first_pos + (qi < n_q ? qi : n_q - 1);
            float s = -INFINITY;
            if (k0 + kk <= q_pos && (a.window <= 0 || q_pos - (k0 + kk) < a.window)) {
                const float* qr = q_tile + qi * QS;
                float dot = 0.0f;
#pragma unroll 8
                for (int d = 0; d < hd; ++d) dot += qr[d] * value(k_tile, k_scale, kk, KS, d);
                s = dot * scale;
            }
            s_tile[qi * SS + kk] = s;
        }
        __syncthreads();
        if (tid < BQ) {
            float* sr = s_tile + tid * SS;
            // gemma2's soft-capping: instances of their own, so that the others compile as before.
            if constexpr (kSoftcap)
                for (int kk = 0; kk < BK; ++kk)
                    if (sr[kk] != -INFINITY) sr[kk] = detail::soft_cap(sr[kk], a.softcap, a.inv_softcap);
            const float m_old = row_m[tid];
            float m_new = m_old;
            for (int kk = 0; kk < BK; ++kk) m_new = fmaxf(m_new, sr[kk]);
            // A tile wholly after this row's query: m_new == m_old, correction exp(0) = 1 and P = 0, so the state
            // is left bitwise unchanged (which makes a query's result independent of its tile). A tile wholly before
            // its window, before any key of it (m_new == -inf): the same, without computing exp(-inf - -inf).
            const bool none = m_new == -INFINITY;
            const float correction = none ? 1.0f : expf(m_old - m_new);
            float sum = 0.0f;
            for (int kk = 0; kk < BK; ++kk) {
                const float p = none ? 0.0f : expf(sr[kk] - m_new);
                sr[kk] = p;
                sum += p;
            }
            row_m[tid] = m_new;
            row_l[tid] = row_l[tid] * correction + sum;
            row_c[tid] = correction;
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < BQ / kWarps; ++i) {
            const int qi = warp + kWarps * i;
            const float correction = row_c[qi];
            const float* pr = s_tile + qi * SS;
#pragma unroll
            for (int j = 0; j < D; ++j) acc[i][j] *= correction;
            for (int kk = 0; kk < BK; ++kk) {
                const float p = pr[kk];
#pragma unroll
                for (int j = 0; j < D; ++j) acc[i][j] += p * value(v_tile, v_scale, kk, HD, lane + 32 * j);
            }
        }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < BQ / kWarps; ++i) {
        const int qi = warp + kWarps * i;
        if (qi >= n_q) break;
        const float l = row_l[qi];
        float* out = a.out + static_cast<size_t>(q0 + qi) * q_dim + head * hd;
#pragma unroll
        for (int j = 0; j < D; ++j)
            if (lane + 32 * j < hd) out[lane + 32 * j] = acc[i][j] / l;
    }
}

// names: the instances' names for the profiler, [2 * q8_0 + soft-capped].
template <int D, int BQ, int BK>
void launch(const char* const (&names)[4], const AttentionArgs& a, Stream stream) {
    const dim3 grid((a.n_tokens + BQ - 1) / BQ, a.n_heads), block(kThreads);
    detail::require(a.ring >= 0 && a.ring % BK == 0, "attention_prefill: a ring's rows must be a multiple of the key tile");
    const bool q8 = a.kv_type == KvType::Q8_0, capped = a.softcap > 0.0f;
    const char* name = names[2 * q8 + capped];
    if (q8 && capped)
        detail::launch_kernel(name, attention_prefill_kernel<D, BQ, BK, true, true>, grid, block, 0, stream, a);
    else if (q8)
        detail::launch_kernel(name, attention_prefill_kernel<D, BQ, BK, true, false>, grid, block, 0, stream, a);
    else if (capped)
        detail::launch_kernel(name, attention_prefill_kernel<D, BQ, BK, false, true>, grid, block, 0, stream, a);
    else
        detail::launch_kernel(name, attention_prefill_kernel<D, BQ, BK, false, false>, grid, block, 0, stream, a);
}

}  // namespace

void attention_prefill(const AttentionArgs& a, Stream stream) {
    detail::require(a.n_tokens > 0 && a.start_pos >= 0, "attention_prefill: bad shape");
    detail::require(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0,
                    "attention_prefill: n_heads must be a multiple of n_kv_heads");
    detail::require(a.n_heads <= 65535, "attention_prefill: grid too large");
    detail::require(a.head_dim > 0 && a.head_dim <= 256, "attention_prefill: head_dim must be 1..256");
    detail::require(kv_type_supports(a.kv_type, a.n_kv_heads * a.head_dim),
                    "attention_prefill: a Q8_0 cache needs n_kv_heads * head_dim to be a multiple of 32");
#define TANDEM_PREFILL_NAMES(hd)                                                                 \
    {"attention_prefill_kernel<" hd ">", "attention_prefill_kernel<" hd ", softcap>",             \
     "attention_prefill_kernel<" hd ", q8_0>", "attention_prefill_kernel<" hd ", q8_0, softcap>"}
    if (a.head_dim <= 32) return launch<1, 32, 32>(TANDEM_PREFILL_NAMES("32"), a, stream);
    if (a.head_dim <= 64) return launch<2, 32, 32>(TANDEM_PREFILL_NAMES("64"), a, stream);
    if (a.head_dim <= 128) return launch<4, 32, 32>(TANDEM_PREFILL_NAMES("128"), a, stream);
    return launch<8, 16, 16>(TANDEM_PREFILL_NAMES("256"), a, stream);
#undef TANDEM_PREFILL_NAMES
}

}  // namespace tandem::cuda
