// GGUF files: a validating, memory-mapped reader (GgufFile) and a writer (GgufWriter, in gguf_writer.h).
//
// The reader maps the whole file read-only, parses the header, every metadata key/value (all value types,
// nested arrays included) and the tensor table, and checks everything a damaged or hostile file can get wrong
// (magic, version 2 or 3, counts, string lengths, dims, types, offsets and sizes inside the file, arithmetic
// overflow, duplicate keys and tensor names) before anyone reads a byte of tensor data. Any problem is a
// tandem::Error whose message names the file and the problem. Strings and tensor data point into the mapping,
// which lives as long as the GgufFile.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/ggml_types.h"

namespace tandem {

enum class GgufValueType : uint32_t {
    UINT8 = 0,
    INT8 = 1,
    UINT16 = 2,
    INT16 = 3,
    UINT32 = 4,
    INT32 = 5,
    FLOAT32 = 6,
    BOOL = 7,
    STRING = 8,
    ARRAY = 9,
    UINT64 = 10,
    INT64 = 11,
    FLOAT64 = 12,
};
const char* gguf_value_type_name(GgufValueType type);

// One metadata value. Scalars keep their value in the field that fits their type family; arrays keep their
// element type and elements (arrays of arrays nest).
struct GgufValue {
    GgufValueType type = GgufValueType::UINT8;
    uint64_t u = 0;                                  // UINT8..UINT64, BOOL (0/1)
    int64_t i = 0;                                   // INT8..INT64
    double f = 0;                                    // FLOAT32, FLOAT64
    std::string_view str;                            // STRING (points into the mapping)
    GgufValueType elem_type = GgufValueType::UINT8;  // ARRAY
    std::vector<GgufValue> arr;                      // ARRAY

    bool is_integer() const;  // any signed or unsigned integer type
    // Human-readable rendering for the inspector (arrays abbreviated after `max_items`).
    std::string to_string(size_t max_items = 8) const;
};

struct GgufTensorInfo {
    std::string name;
    uint32_t n_dims = 0;
    uint64_t ne[4] = {1, 1, 1, 1};  // ggml order: ne[0] is the contiguous (innermost) dimension
    GgmlType type = GgmlType::F32;
    uint64_t offset = 0;  // relative to the start of the data section
    uint64_t n_bytes = 0;
    const uint8_t* data = nullptr;  // points into the mapping

    uint64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    std::string shape_string() const;  // e.g. "[64, 512]"
};

class GgufFile {
public:
    // Maps and validates `path`; throws tandem::Error("<path>: <problem>") on any failure.
    static std::unique_ptr<GgufFile> open(const std::string& path);
    ~GgufFile();
    GgufFile(const GgufFile&) = delete;
    GgufFile& operator=(const GgufFile&) = delete;

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    uint64_t alignment() const { return alignment_; }
    uint64_t file_size() const { return size_; }
    uint64_t data_offset() const { return data_offset_; }  // start of the tensor data section
    const uint8_t* mapping() const { return base_; }       // the file's first byte, mapped

    // Metadata in file order.
    const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
    const GgufValue* find(std::string_view key) const;  // nullptr when absent

    // Typed getters: throw tandem::Error naming the file and key when the key is missing or has another type.
    // Integer getters accept any integer type whose value fits; float getters accept FLOAT32/FLOAT64.
    uint32_t get_u32(std::string_view key) const;
    uint64_t get_u64(std::string_view key) const;
    int64_t get_i64(std::string_view key) const;
    float get_f32(std::string_view key) const;
    bool get_bool(std::string_view key) const;
    std::string get_string(std::string_view key) const;
    std::vector<std::string_view> get_string_array(std::string_view key) const;
    std::vector<float> get_f32_array(std::string_view key) const;
    std::vector<int64_t> get_int_array(std::string_view key) const;
    // With a default when absent (still an error when present with the wrong type).
    uint32_t get_u32_or(std::string_view key, uint32_t fallback) const;
    float get_f32_or(std::string_view key, float fallback) const;
    bool get_bool_or(std::string_view key, bool fallback) const;
    std::string get_string_or(std::string_view key, const std::string& fallback) const;

    const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

    // Drops the whole pages inside [p, p + bytes) of the mapping from this process's resident set, for data that has
    // been copied elsewhere (a repacked weight matrix): the file stays mapped and a later read of those bytes brings
    // them back from the page cache. Ranges outside the mapping are ignored.
    void release_pages(const void* p, size_t bytes) const;
    const GgufTensorInfo* find_tensor(std::string_view name) const;  // nullptr when absent

private:
    GgufFile() = default;
    void parse();
    [[noreturn]] void fail(const std::string& problem) const;
    const GgufValue& require(std::string_view key) const;  // the value, or an error naming the missing key
    [[noreturn]] void wrong_type(std::string_view key, const GgufValue& v, const char* expected) const;

    std::string path_;
    int fd_ = -1;
    const uint8_t* base_ = nullptr;
    uint64_t size_ = 0;
    uint32_t version_ = 0;
    uint64_t alignment_ = 32;
    uint64_t data_offset_ = 0;
    std::vector<std::pair<std::string, GgufValue>> kv_;
    std::map<std::string, size_t, std::less<>> kv_index_;
    std::vector<GgufTensorInfo> tensors_;
    std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace tandem
