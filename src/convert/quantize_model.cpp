// Model requantization (quantize_model.h): output types, the block-size fallback rule, row encoding through the
// CPU backend's reference quantizers, and the GGUF → GGUF requantizer behind tandem-quantize.
#include "convert/quantize_model.h"

#include <cstdio>
#include <cstring>
#include <map>

#include "cpu/quant.h"
#include "error.h"

namespace tandem {
namespace {

constexpr GgmlType kOutputTypes[] = {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0};
constexpr GgmlType kFallbackType = GgmlType::F16;

bool is_block_quantized(GgmlType type) { return ggml_type_info(type).block_size > 1; }

std::string mib(uint64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
    return buf;
}

}  // namespace

std::optional<GgmlType> parse_output_type(const std::string& name) {
    std::optional<GgmlType> t = ggml_type_from_name(name);
    if (!t) return std::nullopt;
    for (GgmlType ok : kOutputTypes)
        if (*t == ok) return t;
    return std::nullopt;
}

std::string output_type_names() {
    std::string s;
    for (GgmlType t : kOutputTypes) s += (s.empty() ? "" : ", ") + std::string(ggml_type_name(t));
    return s;
}

uint32_t llama_file_type(GgmlType type) {
    switch (type) {
        case GgmlType::F32: return 0;
        case GgmlType::F16: return 1;
        case GgmlType::Q4_0: return 2;
        case GgmlType::Q8_0: return 7;
        default: throw Error(std::string("no llama file type for tensor type ") + ggml_type_name(type));
    }
}

GgmlType matrix_type_for(GgmlType wanted, uint64_t row_len) {
    return row_len % ggml_type_info(wanted).block_size == 0 ? wanted : kFallbackType;
}

std::vector<uint8_t> encode_rows(GgmlType type, const float* src, uint64_t row_len, uint64_t n_rows) {
    const size_t row_bytes = ggml_row_bytes(type, row_len);
    std::vector<uint8_t> out(row_bytes * n_rows);
    for (uint64_t r = 0; r < n_rows; ++r)
        cpu::quantize_row(type, src + r * row_len, out.data() + r * row_bytes, static_cast<int64_t>(row_len));
    return out;
}

int QuantizeReport::n_fallback() const {
    int n = 0;
    for (const TensorChange& t : tensors) n += t.fell_back ? 1 : 0;
    return n;
}

std::string QuantizeReport::summary() const {
    std::string s;
    if (n_fallback() > 0) {
        s += std::to_string(n_fallback()) + " tensor(s) fell back to " + ggml_type_name(kFallbackType) +
             " (row length not a multiple of the block size):";
        for (const TensorChange& t : tensors)
            if (t.fell_back) s += " " + t.name + " " + t.shape;
        s += "\n";
    }
    std::map<std::string, int> per_type;
    for (const TensorChange& t : tensors) ++per_type[ggml_type_name(t.to)];
    s += std::to_string(tensors.size()) + " tensors:";
    for (const auto& [name, n] : per_type) {
        s += ' ';  // appended piecewise: gcc 12 warns falsely (-Wrestrict) on " " + std::to_string(...)
        s += std::to_string(n);
        s += ' ';
        s += name;
    }
    s += "\n";
    char ratio[32] = "";
    if (bytes_before > 0)
        std::snprintf(ratio, sizeof ratio, " (%.1f%%)",
                      100.0 * static_cast<double>(bytes_after) / static_cast<double>(bytes_before));
    s += "tensor data: " + mib(bytes_before) + " -> " + mib(bytes_after) + ratio + "\n";
    return s;
}

GgufWriter requantize_gguf(const GgufFile& in, GgmlType type, QuantizeReport* report) {
    if (!parse_output_type(ggml_type_name(type)))
        throw Error(std::string("cannot write tensors as ") + ggml_type_name(type) + " (can: " + output_type_names() +
                    ")");
    QuantizeReport local;
    QuantizeReport& rep = report ? *report : local;
    rep = QuantizeReport{};

    GgufWriter w;
    w.set_alignment(static_cast<uint32_t>(in.alignment()));
    bool has_file_type = false;
    for (const auto& [key, value] : in.metadata()) {
        if (key == "general.quantization_version") continue;  // re-added below only when it applies
        if (key == "general.file_type") {
            // Replaced in place, so the key keeps its position among the general.* keys.
            w.add_u32(key, llama_file_type(type));
            has_file_type = true;
            continue;
        }
        w.add_value(key, value);
    }
    if (!has_file_type) w.add_u32("general.file_type", llama_file_type(type));

    std::vector<float> row;
    for (const GgufTensorInfo& t : in.tensors()) {
        TensorChange ch;
        ch.name = t.name;
        ch.shape = t.shape_string();
        ch.from = t.type;
        ch.bytes_before = t.n_bytes;
        std::vector<uint64_t> dims(t.ne, t.ne + t.n_dims);
        const uint64_t row_len = t.ne[0];
        const uint64_t n_rows = row_len ? t.n_elements() / row_len : 0;

        GgmlType to = t.type;
        if (t.n_dims >= 2) to = matrix_type_for(type, row_len);
        ch.to = to;
        ch.fell_back = t.n_dims >= 2 && to != type;

        std::vector<uint8_t> data;
        if (to == t.type) {
            data.assign(t.data, t.data + t.n_bytes);  // same type: copy, requantizing would only add error
        } else {
            if (!cpu::cpu_supports(t.type))
                throw Error(in.path() + ": tensor '" + t.name + "' has type " + ggml_type_name(t.type) +
                            ", which tandem cannot decode (it can: f32, f16, q8_0, q4_0)");
            const size_t src_row_bytes = ggml_row_bytes(t.type, row_len);
            const size_t dst_row_bytes = ggml_row_bytes(to, row_len);
            row.resize(row_len);
            data.resize(dst_row_bytes * n_rows);
            for (uint64_t r = 0; r < n_rows; ++r) {
                cpu::dequantize_row(t.type, t.data + r * src_row_bytes, row.data(), static_cast<int64_t>(row_len));
                cpu::quantize_row(to, row.data(), data.data() + r * dst_row_bytes, static_cast<int64_t>(row_len));
            }
        }
        ch.bytes_after = data.size();
        rep.bytes_before += ch.bytes_before;
        rep.bytes_after += ch.bytes_after;
        w.add_tensor(t.name, to, dims, std::move(data));
        rep.tensors.push_back(std::move(ch));
    }
    bool any_quantized = false;
    for (const TensorChange& c : rep.tensors) any_quantized |= is_block_quantized(c.to);
    if (any_quantized) w.add_u32("general.quantization_version", 2);
    return w;
}

}  // namespace tandem
