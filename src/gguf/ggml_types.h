// The ggml tensor type ids used in GGUF files, with their block geometry (elements per block, bytes per block).
// Ids and sizes follow ggml's public format; `supported` says whether tandem's CPU kernels handle the type.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tandem {

// ggml's ids, a row per family.
// clang-format off
enum class GgmlType : uint32_t {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
    Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
    IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
    I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
    TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};
// clang-format on

struct GgmlTypeInfo {
    const char* name;     // ggml's lower-case name, e.g. "q4_0"
    uint32_t block_size;  // elements per block (1 for plain scalar types)
    uint32_t type_size;   // bytes per block
    bool supported;       // tandem can compute with it
};

// Info for a known type id, or nullopt for an id ggml does not define.
std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type_id);
// Same, for a type known to be valid.
GgmlTypeInfo ggml_type_info(GgmlType type);
const char* ggml_type_name(GgmlType type);
// Parses "f32", "f16", "q8_0", ... (case-insensitive); nullopt when unknown.
std::optional<GgmlType> ggml_type_from_name(const std::string& name);

// Byte offsets of the fp16 scale fields (d, and dmin where the type has one) inside one block of `type`; empty for
// the float types. Every other byte of a quantized block is a valid code whatever its value.
std::vector<size_t> ggml_fp16_scale_offsets(GgmlType type);

// The float weight types tandem computes with (F32, F16, BF16): plain elements, no blocks or scales. The quantized
// matvec routes and the persistent step's staged rows leave them to their float walks.
constexpr bool ggml_is_float_type(GgmlType type) {
    return type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16;
}

// Bytes of one row of `n` elements; n must be a multiple of the block size (checked by the caller).
inline size_t ggml_row_bytes(GgmlType type, uint64_t n) {
    GgmlTypeInfo info = ggml_type_info(type);
    return static_cast<size_t>(n / info.block_size * info.type_size);
}

}  // namespace tandem
