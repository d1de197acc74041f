// Model requantization, shared by tandem-quantize and tandem-convert: which types a file can be written in, the
// fallback rule for rows that do not fill whole blocks, encoding fp32 matrices, and GGUF → GGUF requantization
// (metadata copied, general.file_type updated, 2-D+ weights re-encoded, 1-D tensors kept as they are).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gguf/ggml_types.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"

namespace tandem {

// The types tandem can write weights in: f32, f16, q8_0, q4_0 (case-insensitive); nullopt otherwise.
std::optional<GgmlType> parse_output_type(const std::string& name);
// "f32, f16, q8_0, q4_0", for messages.
std::string output_type_names();

// llama.cpp's LLAMA_FTYPE for a file whose matrices are (mostly) `type`: ALL_F32=0, MOSTLY_F16=1,
// MOSTLY_Q4_0=2, MOSTLY_Q8_0=7. Throws tandem::Error for other types.
uint32_t llama_file_type(GgmlType type);

// The type a matrix with rows of `row_len` elements gets when `wanted` is asked for: `wanted` itself when the
// row is a whole number of its blocks, else F16 (as llama.cpp's quantizer falls back: rows are quantized
// block by block and a block may not straddle two rows).
GgmlType matrix_type_for(GgmlType wanted, uint64_t row_len);

// Encodes n_rows rows of row_len floats as `type` (row_len must be a multiple of its block size).
std::vector<uint8_t> encode_rows(GgmlType type, const float* src, uint64_t row_len, uint64_t n_rows);

// One tensor of a requantization.
struct TensorChange {
    std::string name;
    std::string shape;  // e.g. "[172, 64]"
    GgmlType from = GgmlType::F32;
    GgmlType to = GgmlType::F32;
    uint64_t bytes_before = 0;
    uint64_t bytes_after = 0;
    bool fell_back = false;  // `to` is the fallback type, not the requested one
};

struct QuantizeReport {
    std::vector<TensorChange> tensors;
    uint64_t bytes_before = 0;  // tensor data only
    uint64_t bytes_after = 0;
    int n_fallback() const;
    // Multi-line human summary: fallbacks by name, counts per type, sizes before/after.
    std::string summary() const;
};

// Requantizes an opened GGUF: every tensor of 2 or more dimensions is decoded row by row to fp32 and encoded as
// `type` (or its fallback; a tensor already of the target type is copied unchanged, so nothing is lost twice);
// 1-D tensors (norms, biases) are copied as they are. All metadata is copied in order with general.file_type
// set for `type` (and general.quantization_version = 2 when the output holds quantized blocks, as llama.cpp
// writes). The alignment is kept. Throws tandem::Error naming the tensor when its source type cannot be decoded.
// The returned writer refers to no memory of `in`.
GgufWriter requantize_gguf(const GgufFile& in, GgmlType type, QuantizeReport* report = nullptr);

}  // namespace tandem
