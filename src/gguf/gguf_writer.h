// GgufWriter: builds a GGUF v3 file (metadata, tensor table, aligned data) for the converter, the quantizer,
// the benchmark's synthetic models and the tests' malformed-file generators. write() goes to a temporary name
// and renames on success, so a failed or interrupted write never leaves a file that looks valid.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace tandem {

class GgufWriter {
public:
    void set_alignment(uint32_t alignment) { alignment_ = alignment; }  // also written as general.alignment if != 32

    void add_u32(const std::string& key, uint32_t v);
    void add_i32(const std::string& key, int32_t v);
    void add_u64(const std::string& key, uint64_t v);
    void add_f32(const std::string& key, float v);
    void add_bool(const std::string& key, bool v);
    void add_string(const std::string& key, const std::string& v);
    void add_string_array(const std::string& key, const std::vector<std::string>& v);
    void add_f32_array(const std::string& key, const std::vector<float>& v);
    void add_i32_array(const std::string& key, const std::vector<int32_t>& v);
    // Any value (nested arrays included), e.g. copied from another file's metadata by the quantizer.
    void add_value(const std::string& key, const GgufValue& v);

    // dims in ggml order (dims[0] contiguous); `data` must hold ggml_row_bytes(type, dims[0]) * rows bytes.
    void add_tensor(const std::string& name, GgmlType type, const std::vector<uint64_t>& dims,
                    std::vector<uint8_t> data);

    // The serialized file as bytes (the tests corrupt these to make malformed files).
    std::vector<uint8_t> serialize() const;
    // Writes atomically; throws tandem::Error on I/O failure.
    void write(const std::string& path) const;

private:
    struct Tensor {
        std::string name;
        GgmlType type;
        std::vector<uint64_t> dims;
        std::vector<uint8_t> data;
    };
    // Where everything goes: the header (through the padding before the data section) and each tensor's offset
    // within the data section, whose padded size is data_bytes.
    struct Layout {
        std::vector<uint8_t> head;
        std::vector<uint64_t> offsets;
        uint64_t data_bytes = 0;
    };
    void put(const std::string& key, GgufValue v);  // insert, or replace in place (as ggml's gguf_set_* do)
    GgufValue own(const GgufValue& v);              // deep copy whose strings live in strings_
    std::string_view own(std::string_view s);
    Layout layout() const;

    uint32_t alignment_ = 32;
    std::vector<std::pair<std::string, GgufValue>> kv_;
    // Backing store for the string_views inside kv_ values. A deque never moves its elements, and sharing it
    // keeps the views valid in copies of the writer too (strings are never changed once added).
    std::shared_ptr<std::deque<std::string>> strings_ = std::make_shared<std::deque<std::string>>();
    std::vector<Tensor> tensors_;
};

}  // namespace tandem
