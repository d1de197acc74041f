// Helpers the benchmark tools share: the quantized types, the median of timed runs, comma-separated lists from
// flags, and random weight matrices of any GGUF block type (random bytes with sane fp16 scales, since every other
// bit pattern is valid).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/fp16.h"
#include "gguf/ggml_types.h"

namespace tandem::bench {

// The types with blocks (every quantized type tandem computes with), as the kernel benchmarks run them.
constexpr GgmlType kBlockTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                                    GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

inline double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline std::vector<std::string> split_list(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream ss(s);
    for (std::string item; std::getline(ss, item, ',');)
        if (!item.empty()) out.push_back(item);
    return out;
}

// rows x cols elements of `type` (cols a multiple of its block size), scales in [-1, 1] / 64.
inline std::vector<uint8_t> random_matrix(GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
    const GgmlTypeInfo info = ggml_type_info(type);
    const size_t n_blocks = static_cast<size_t>(rows * (cols / info.block_size));
    std::vector<uint8_t> w(n_blocks * info.type_size);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> scale(-1.0f / 64, 1.0f / 64);
    for (uint8_t& b : w) b = static_cast<uint8_t>(byte(rng));
    for (size_t b = 0; b < n_blocks; ++b)
        for (size_t off : ggml_fp16_scale_offsets(type)) {  // random scale bytes could be infinities or NaNs
            const uint16_t h = cpu::fp32_to_fp16(scale(rng));
            std::memcpy(w.data() + b * info.type_size + off, &h, 2);
        }
    return w;
}

}  // namespace tandem::bench
