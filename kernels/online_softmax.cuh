// One warp's step of split-K decode attention's online softmax, shared by attention.cu's split kernel and the
// persistent decode step's attention phase (decode_step.cu): the same arithmetic in the same order in both, each
// reading its keys and values its own way (attention.cu: fp16 or Q8_0 cache rows; decode_step.cu: fp16 rows past L1,
// which another block of the launch just wrote).
#pragma once
#include <cmath>

#include "common.cuh"

namespace tandem::cuda::attend {

// Keys t0 .. t0 + n_u - 1 (1 <= n_u <= U, the same for the whole warp) folded into the running max m, sum l and
// unnormalised output acc: their K loads issued together, one update of the running max for them, then their V
// loads (a warp waits for memory twice a step, not twice a key). Lane j holds dims j + 32 i of the head (i < D; only
// those below hd take part); key(u, i) / value(u, i) is that element of key / value u; q is pre-loaded the same way.
// softcap > 0 (gemma2): each score s = scale * q.k becomes softcap * tanh(s * inv_softcap) first.
template <int D, int U, class Key, class Value>
__device__ __forceinline__ void online_softmax_step(const float (&q)[D], int n_u, int hd, int lane, float scale,
                                                    float softcap, float inv_softcap, Key&& key, Value&& value,
                                                    float& m, float& l, float (&acc)[D]) {
    float s[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        s[u] = 0.0f;
        if (u >= n_u) continue;
#pragma unroll
        for (int i = 0; i < D; ++i)
            if (lane + 32 * i < hd) s[u] += q[i] * key(u, i);
    }
    float m_new = m;
#pragma unroll
    for (int u = 0; u < U; ++u) s[u] = detail::warp_sum(s[u]) * scale;
    if (softcap > 0.0f) {
#pragma unroll
        for (int u = 0; u < U; ++u) s[u] = detail::soft_cap(s[u], softcap, inv_softcap);
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
        if (u < n_u) m_new = fmaxf(m_new, s[u]);
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
            if (u < n_u) pv += p[u] * value(u, i);
        acc[i] = acc[i] * correction + pv;
    }
    m = m_new;
}

}  // namespace tandem::cuda::attend
