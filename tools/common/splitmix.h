// SplitMix64: the fixed pseudo-random stream of the tools' generated files (synthetic models, architecture
// fixtures). Tiny, fast and the same on every machine and library, so a generated file is the same bytes everywhere
// (std:: distributions are not).
#pragma once
#include <cstdint>

namespace tandem {

struct SplitMix64 {
    uint64_t state;
    uint64_t next() {
        uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    // Uniform in [-1, 1), 24 bits.
    float uniform_pm1() { return static_cast<float>(next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }
};

}  // namespace tandem
