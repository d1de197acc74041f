// Random test inputs for the CPU kernels: normal floats, and weight rows of any GGUF block type made of random
// bytes with sane fp16 scales (every bit pattern of the other fields is a valid block).
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/fp16.h"
#include "ggml_types.h"

namespace tandem::test {

inline std::vector<float> random_floats(int64_t n, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& f : v) f = normal(rng);
    return v;
}

// Offsets of the fp16 scale fields in a block; every other byte of a block may take any value.
inline std::vector<size_t> scale_offsets(GgmlType type) { return ggml_fp16_scale_offsets(type); }

// `rows` rows of `cols` random valid elements: random bytes, with the scales set to random halves in [-1, 1]/64.
inline std::vector<uint8_t> random_blocks(GgmlType type, int64_t cols, int64_t rows, std::mt19937& rng) {
    const GgmlTypeInfo info = ggml_type_info(type);
    const size_t n_blocks = static_cast<size_t>(cols / info.block_size * rows);
    std::vector<uint8_t> out(n_blocks * info.type_size);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> scale(-1.0f / 64, 1.0f / 64);
    for (uint8_t& b : out) b = static_cast<uint8_t>(byte(rng));
    for (size_t b = 0; b < n_blocks; ++b)
        for (size_t off : scale_offsets(type)) {
            const uint16_t h = cpu::fp32_to_fp16(scale(rng));
            std::memcpy(out.data() + b * info.type_size + off, &h, 2);
        }
    return out;
}

}  // namespace tandem::test
