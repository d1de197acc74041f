// Random test inputs for the CPU kernels: normal floats, and weight rows of any GGUF block type made of random
// bytes with sane fp16 scales (every bit pattern of the other fields is a valid block).
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cpu/fp16.h"
#include "cpu/quant.h"
#include "gguf/ggml_types.h"

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

// `rows` x `cols` weights of `type`, the way GGUF files hold them: normal floats quantized for the types tandem
// writes (every third row at 1/100 of the scale), truncated normal floats for BF16 (no NaN / Inf patterns), random
// valid blocks for the others (Q4_K and Q6_K with positive scales in [0.002, 0.02], the rest as random_blocks).
inline std::vector<uint8_t> random_weight_rows(GgmlType type, int rows, int cols, std::mt19937& rng) {
    const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
    std::vector<uint8_t> m(row_bytes * static_cast<size_t>(rows));
    if (type == GgmlType::BF16) {
        const std::vector<float> v = random_floats(static_cast<int64_t>(rows) * cols, rng);
        for (size_t i = 0; i < v.size(); ++i) {
            uint32_t bits;
            std::memcpy(&bits, &v[i], 4);
            const uint16_t h = static_cast<uint16_t>(bits >> 16);
            std::memcpy(m.data() + 2 * i, &h, 2);
        }
        return m;
    }
    if (type == GgmlType::Q4_K || type == GgmlType::Q6_K) {
        std::uniform_int_distribution<int> byte(0, 255);
        std::uniform_real_distribution<float> scale(0.002f, 0.02f);
        for (uint8_t& b : m) b = static_cast<uint8_t>(byte(rng));
        const size_t block = ggml_type_info(type).type_size;
        for (int r = 0; r < rows; ++r)
            for (int b = 0; b < cols / 256; ++b) {
                uint8_t* blk = m.data() + r * row_bytes + b * block;
                const uint16_t d = cpu::fp32_to_fp16(scale(rng)), dmin = cpu::fp32_to_fp16(scale(rng));
                const std::vector<size_t> offsets = ggml_fp16_scale_offsets(type);
                std::memcpy(blk + offsets[0], &d, 2);
                if (offsets.size() > 1) std::memcpy(blk + offsets[1], &dmin, 2);
            }
        return m;
    }
    if (!cpu::cpu_can_quantize(type)) return random_blocks(type, cols, rows, rng);
    for (int r = 0; r < rows; ++r) {
        std::vector<float> v = random_floats(cols, rng);
        if (r % 3 == 2)
            for (float& x : v) x *= 0.01f;
        cpu::quantize_row(type, v.data(), m.data() + r * row_bytes, cols);
    }
    return m;
}

}  // namespace tandem::test
