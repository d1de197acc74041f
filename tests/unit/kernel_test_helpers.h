// Helpers shared by the emulated kernel tests (test_cuda_kernels.cpp, test_cuda_matvec_epilogues.cpp): the NaN that
// output buffers start as, normal random floats, a thread order's name for INFO, and RoPE's frequencies.
#pragma once
#include <cmath>
#include <cstddef>
#include <limits>
#include <random>
#include <vector>

#include "emu/cuda_emu.h"

namespace tandem::kernel_test {

inline const float kNaN = std::numeric_limits<float>::quiet_NaN();

inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float scale = 1.0f) {
    std::normal_distribution<float> normal(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
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

}  // namespace tandem::kernel_test
