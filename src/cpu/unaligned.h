// Loads of a scalar from a byte address of any alignment: the fp16 scales and 32-bit fields that GGUF blocks pack
// at odd offsets, and the cache's Q8_0 block scales. memcpy, which compilers turn into one move.
//
// always_inline, with no target attribute: the SIMD kernels compiled under their own target pragmas (e.g.
// quant_q8_kquants_avx512.cpp) include this before the pragma and still inline these into their loops, and no
// out-of-line copy compiled for a wider instruction set can reach other callers through the linker.
#pragma once

#include <cstdint>
#include <cstring>

namespace tandem::cpu {

inline __attribute__((always_inline)) uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

inline __attribute__((always_inline)) uint32_t load_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

inline __attribute__((always_inline)) float load_f32(const uint8_t* p) {
    float v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

}  // namespace tandem::cpu
