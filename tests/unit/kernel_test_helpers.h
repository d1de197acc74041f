// Helpers shared by the emulated kernel tests (test_cuda_kernels.cpp, test_cuda_matvec_epilogues.cpp,
// test_cuda_matvec_pairs.cpp, test_cuda_emu_runtime.cpp, test_cuda_emu_cooperative.cpp): the NaN that output buffers
// start as, normal random floats, the thread orders and a launch's error message, a thread order's name for INFO,
// RoPE's frequencies, and the outputs of a Q/K/V launch with RoPE.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "emu/cuda_emu.h"
#include "kernels.h"

namespace tandem::kernel_test {

inline const float kNaN = std::numeric_limits<float>::quiet_NaN();

inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float scale = 1.0f) {
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
}

// Forward, Reverse and two shuffles: the orders the emulation runtime's own tests run their kernels in.
inline const emu::LaunchOptions kFourOrders[] = {{emu::ThreadOrder::Forward, 0},
                                                 {emu::ThreadOrder::Reverse, 0},
                                                 {emu::ThreadOrder::Shuffled, 1},
                                                 {emu::ThreadOrder::Shuffled, 2}};

// The message of the tandem::emu::Error that f() throws, or "" when it throws none.
inline std::string launch_error(auto&& f) {
    try {
        f();
    } catch (const emu::Error& e) {
        return e.what();
    }
    return "";
}

inline const char* order_name(const emu::LaunchOptions& o) {
    return o.order == emu::ThreadOrder::Forward ? "Forward" : o.order == emu::ThreadOrder::Reverse ? "Reverse"
                                                                                                   : "Shuffled";
}

// theta^(-2i/rope_dim) in double, rounded to float (the CPU backend's RoPE frequencies).
inline std::vector<float> inv_freqs(int rope_dim, float theta) {
    std::vector<float> f;
    for (int i = 0; i < rope_dim / 2; ++i)
        f.push_back(static_cast<float>(std::pow(static_cast<double>(theta), -2.0 * i / rope_dim)));
    return f;
}

// What a Q/K/V launch with RoPE writes for n tokens: q, k and v (NaN before), and the K and V caches (0xA5 bytes
// before: a row the launch forgot to write stays so).
struct QkvRopeOut {
    std::vector<float> q, k, v;
    std::vector<uint8_t> kc, vc;
    QkvRopeOut(int n, int q_dim, int kv_dim, size_t cache_bytes)
        : q(static_cast<size_t>(n) * q_dim, kNaN), k(static_cast<size_t>(n) * kv_dim, kNaN),
          v(static_cast<size_t>(n) * kv_dim, kNaN), kc(cache_bytes, 0xA5), vc(cache_bytes, 0xA5) {}
};

// RoPE's arguments for those outputs: the start position by value, or (device_start) read from memory, then 0 is
// the bound; with `trig`, the step's table for the in-launch epilogue.
struct QkvRopeShape {
    int n_heads, n_kv, head_dim, rope_dim;
    cuda::RopeMode mode;
    cuda::KvType kv;
};
inline cuda::RopeKvArgs rope_args(QkvRopeOut& o, const QkvRopeShape& s, const std::vector<float>& freq, int n,
                                  int start, const int* device_start, const std::vector<float>& trig) {
    cuda::RopeKvArgs a{o.q.data(), o.k.data(), o.v.data(), o.kc.data(), o.vc.data(), freq.data(), n,
                       device_start ? 0 : start, s.n_heads, s.n_kv, s.head_dim, s.rope_dim, s.mode, s.kv};
    if (device_start) a.device_start_pos = device_start;
    if (!trig.empty()) a.trig = trig.data();
    return a;
}

}  // namespace tandem::kernel_test
