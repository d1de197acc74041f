// The GGUF reader behind gguf.h: maps a file read-only, parses and validates the header, the metadata and the
// tensor table (every read bounds-checked, every size computed with overflow checks), and serves typed getters.
#include "gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <system_error>

#include "error.h"

namespace tandem {

// Values are copied out of the file with memcpy in host byte order; GGUF (as tandem reads it) is little-endian.
static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

namespace {

constexpr uint64_t kHeaderBytes = 4 + 4 + 8 + 8;  // magic, version, n_tensors, n_kv
// The smallest possible encodings, used to reject absurd counts before anything is reserved for them:
// a kv is key length + at least one key byte + value type + at least one value byte; a tensor info is
// name length + at least one name byte + n_dims + one dim + type + offset.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;
// Arrays of arrays are legal; a depth limit keeps a hostile file from exhausting the stack by recursion.
constexpr uint32_t kMaxArrayDepth = 16;
// Each parsed value costs ~80 bytes of memory against as little as 1 byte of file, so the total is capped too:
// real files (the largest vocabularies: tokens + scores + types + merges) hold around a million values.
constexpr uint64_t kMaxMetadataValues = uint64_t(1) << 24;
constexpr uint32_t kMaxDims = 4;

bool is_signed_type(GgufValueType t) {
    return t == GgufValueType::INT8 || t == GgufValueType::INT16 || t == GgufValueType::INT32 ||
           t == GgufValueType::INT64;
}

bool is_integer_type(GgufValueType t) {
    return is_signed_type(t) || t == GgufValueType::UINT8 || t == GgufValueType::UINT16 || t == GgufValueType::UINT32 ||
           t == GgufValueType::UINT64;
}

bool is_valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::FLOAT64); }

// Bytes a scalar occupies in the file; 0 for STRING and ARRAY, whose size depends on their content.
uint64_t scalar_size(GgufValueType t) {
    switch (t) {
        case GgufValueType::UINT8:
        case GgufValueType::INT8:
        case GgufValueType::BOOL: return 1;
        case GgufValueType::UINT16:
        case GgufValueType::INT16: return 2;
        case GgufValueType::UINT32:
        case GgufValueType::INT32:
        case GgufValueType::FLOAT32: return 4;
        case GgufValueType::UINT64:
        case GgufValueType::INT64:
        case GgufValueType::FLOAT64: return 8;
        case GgufValueType::STRING:
        case GgufValueType::ARRAY: return 0;
    }
    return 0;
}

// Smallest encoding of one array element: a string is at least its length field, an array its header.
uint64_t min_element_size(GgufValueType t) {
    if (t == GgufValueType::STRING) return 8;
    if (t == GgufValueType::ARRAY) return 4 + 8;
    return scalar_size(t);
}

// A name for an error message: quoted, control and non-ASCII bytes escaped (a corrupt name is arbitrary bytes),
// cut short so that a garbage name stays readable.
std::string quoted(std::string_view s) {
    constexpr size_t kMax = 80;
    std::string out = "'";
    for (size_t i = 0; i < s.size() && i < kMax; ++i) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        if (c < 0x20 || c >= 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        } else {
            out += static_cast<char>(c);
        }
    }
    if (s.size() > kMax) out += "...";
    return out + "'";
}

std::string type_description(const GgufValue& v) {
    if (v.type == GgufValueType::ARRAY) return std::string("array of ") + gguf_value_type_name(v.elem_type);
    return gguf_value_type_name(v.type);
}

// Bounds-checked sequential reads over the mapping. `where` names the part of the file being parsed, so a
// truncation error says e.g. "... in metadata key 'general.name'".
class Reader {
public:
    Reader(const std::string& path, const uint8_t* base, uint64_t size) : path_(path), base_(base), size_(size) {}

    uint64_t pos() const { return pos_; }
    uint64_t remaining() const { return size_ - pos_; }
    void skip(uint64_t n, const char* what) {
        need(n, what);
        pos_ += n;
    }

    [[noreturn]] void fail(const std::string& problem) const { throw Error(path_ + ": " + problem); }

    void need(uint64_t n, const char* what) const {
        if (n > remaining())
            fail("truncated file: " + std::string(what) + where + " at offset " + std::to_string(pos_) + " needs " +
                 std::to_string(n) + " bytes, but the file is " + std::to_string(size_) + " bytes long");
    }

    template <class T>
    T read(const char* what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, base_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }

    std::string_view read_string(const char* what) {
        uint64_t at = pos_;
        uint64_t len = read<uint64_t>(what);
        if (len > remaining())
            fail(std::string(what) + where + " at offset " + std::to_string(at) + " claims a length of " +
                 std::to_string(len) + " bytes, but only " + std::to_string(remaining()) +
                 " bytes remain in the file (the file is truncated or corrupt)");
        std::string_view s(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(len));
        pos_ += len;
        return s;
    }

    std::string where;

private:
    const std::string& path_;
    const uint8_t* base_;
    uint64_t size_;
    uint64_t pos_ = 0;
};

GgufValue read_value(Reader& r, GgufValueType type, uint32_t depth, uint64_t& values_left) {
    GgufValue v;
    v.type = type;
    switch (type) {
        case GgufValueType::UINT8: v.u = r.read<uint8_t>("a u8 value"); break;
        case GgufValueType::INT8: v.i = r.read<int8_t>("an i8 value"); break;
        case GgufValueType::UINT16: v.u = r.read<uint16_t>("a u16 value"); break;
        case GgufValueType::INT16: v.i = r.read<int16_t>("an i16 value"); break;
        case GgufValueType::UINT32: v.u = r.read<uint32_t>("a u32 value"); break;
        case GgufValueType::INT32: v.i = r.read<int32_t>("an i32 value"); break;
        case GgufValueType::UINT64: v.u = r.read<uint64_t>("a u64 value"); break;
        case GgufValueType::INT64: v.i = r.read<int64_t>("an i64 value"); break;
        case GgufValueType::FLOAT32: v.f = r.read<float>("an f32 value"); break;
        case GgufValueType::FLOAT64: v.f = r.read<double>("an f64 value"); break;
        // ggml writes 0/1; any other byte is read as true rather than rejecting the whole file over it.
        case GgufValueType::BOOL: v.u = r.read<uint8_t>("a bool value") != 0; break;
        case GgufValueType::STRING: v.str = r.read_string("a string value"); break;
        case GgufValueType::ARRAY: {
            if (depth >= kMaxArrayDepth)
                r.fail("arrays nested more than " + std::to_string(kMaxArrayDepth) + " levels deep" + r.where);
            uint64_t at = r.pos();
            uint32_t elem = r.read<uint32_t>("an array element type");
            if (!is_valid_value_type(elem))
                r.fail("unknown array element type " + std::to_string(elem) + r.where + " at offset " +
                       std::to_string(at));
            v.elem_type = static_cast<GgufValueType>(elem);
            uint64_t count = r.read<uint64_t>("an array length");
            if (count > r.remaining() / min_element_size(v.elem_type))
                r.fail("array of " + std::to_string(count) + " " + gguf_value_type_name(v.elem_type) + " elements" +
                       r.where + " at offset " + std::to_string(at) + " cannot fit in the remaining " +
                       std::to_string(r.remaining()) + " bytes of the file");
            if (count > values_left)
                r.fail("metadata holds more than " + std::to_string(kMaxMetadataValues) + " values" + r.where);
            values_left -= count;
            v.arr.reserve(static_cast<size_t>(count));
            for (uint64_t k = 0; k < count; ++k) v.arr.push_back(read_value(r, v.elem_type, depth + 1, values_left));
            break;
        }
    }
    return v;
}

void append_escaped(std::string& out, std::string_view s) {
    for (char ch : s) {
        unsigned char c = static_cast<unsigned char>(ch);
        switch (c) {
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            case '\\': out += "\\\\"; break;
            case '\'': out += "\\'"; break;
            default:
                if (c < 0x20 || c == 0x7f) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\x%02x", c);
                    out += buf;
                } else {
                    out += ch;
                }
        }
    }
}

// Shortest text that reads back as the same number (std::to_chars), so 1e-5f prints as "1e-05", not 9.99e-06.
template <class F>
std::string format_float(F x) {
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, x);
    return std::string(buf, res.ptr);
}

}  // namespace

const char* gguf_value_type_name(GgufValueType type) {
    switch (type) {
        case GgufValueType::UINT8: return "u8";
        case GgufValueType::INT8: return "i8";
        case GgufValueType::UINT16: return "u16";
        case GgufValueType::INT16: return "i16";
        case GgufValueType::UINT32: return "u32";
        case GgufValueType::INT32: return "i32";
        case GgufValueType::FLOAT32: return "f32";
        case GgufValueType::BOOL: return "bool";
        case GgufValueType::STRING: return "string";
        case GgufValueType::ARRAY: return "array";
        case GgufValueType::UINT64: return "u64";
        case GgufValueType::INT64: return "i64";
        case GgufValueType::FLOAT64: return "f64";
    }
    return "unknown";
}

bool GgufValue::is_integer() const { return is_integer_type(type); }

std::string GgufValue::to_string(size_t max_items) const {
    switch (type) {
        case GgufValueType::UINT8:
        case GgufValueType::UINT16:
        case GgufValueType::UINT32:
        case GgufValueType::UINT64: return std::to_string(u);
        case GgufValueType::INT8:
        case GgufValueType::INT16:
        case GgufValueType::INT32:
        case GgufValueType::INT64: return std::to_string(i);
        case GgufValueType::FLOAT32: return format_float(static_cast<float>(f));
        case GgufValueType::FLOAT64: return format_float(f);
        case GgufValueType::BOOL: return u ? "true" : "false";
        case GgufValueType::STRING: {
            std::string out = "'";
            append_escaped(out, str);
            return out + "'";
        }
        case GgufValueType::ARRAY: {
            // "[string × 32000] '<unk>', '<s>', ..."; nested arrays are wrapped in braces to stay unambiguous.
            std::string out =
                "[" + std::string(gguf_value_type_name(elem_type)) + " \u00d7 " + std::to_string(arr.size()) + "]";
            for (size_t k = 0; k < arr.size() && k < max_items; ++k) {
                out += k == 0 ? " " : ", ";
                if (arr[k].type == GgufValueType::ARRAY)
                    out += "{" + arr[k].to_string(max_items) + "}";
                else
                    out += arr[k].to_string(max_items);
            }
            if (arr.size() > max_items) out += max_items == 0 ? " ..." : ", ...";
            return out;
        }
    }
    return "?";
}

std::string GgufTensorInfo::shape_string() const {
    std::string out = "[";
    for (uint32_t d = 0; d < n_dims && d < kMaxDims; ++d) {
        if (d) out += ", ";
        out += std::to_string(ne[d]);
    }
    return out + "]";
}

// ---- opening and parsing ------------------------------------------------------------------------------------

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
    // Constructed here so that a failure part-way through is cleaned up by the destructor.
    std::unique_ptr<GgufFile> file(new GgufFile());
    file->path_ = path;
    auto sys_error = [](int err) { return std::generic_category().message(err); };

    file->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (file->fd_ < 0) file->fail("cannot open: " + sys_error(errno));
    struct stat st {};
    if (::fstat(file->fd_, &st) != 0) file->fail("cannot stat: " + sys_error(errno));
    if (S_ISDIR(st.st_mode)) file->fail("is a directory, not a GGUF file");
    if (!S_ISREG(st.st_mode)) file->fail("is not a regular file (GGUF files are memory-mapped)");
    if (st.st_size == 0) file->fail("file is empty (0 bytes), not a GGUF file");
    file->size_ = static_cast<uint64_t>(st.st_size);

    void* map = ::mmap(nullptr, static_cast<size_t>(file->size_), PROT_READ, MAP_PRIVATE, file->fd_, 0);
    if (map == MAP_FAILED) file->fail("cannot map " + std::to_string(file->size_) + " bytes: " + sys_error(errno));
    file->base_ = static_cast<const uint8_t*>(map);

    file->parse();
    return file;
}

GgufFile::~GgufFile() {
    if (base_) ::munmap(const_cast<uint8_t*>(base_), static_cast<size_t>(size_));
    if (fd_ >= 0) ::close(fd_);
}

void GgufFile::release_pages(const void* p, size_t bytes) const {
    const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    const auto begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
    const auto map_begin = reinterpret_cast<uintptr_t>(base_), map_end = map_begin + size_;
    if (begin < map_begin || end > map_end) return;
    const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
    // MADV_DONTNEED on a private read-only file mapping: the pages return to being file-backed (nothing is lost).
    if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

void GgufFile::fail(const std::string& problem) const { throw Error(path_ + ": " + problem); }

void GgufFile::parse() {
    Reader r(path_, base_, size_);

    // -- header
    if (size_ < 4) fail("file is too small to be a GGUF file (" + std::to_string(size_) + " bytes)");
    if (std::memcmp(base_, "GGUF", 4) != 0)
        fail("bad magic " + quoted(std::string_view(reinterpret_cast<const char*>(base_), 4)) +
             " (expected 'GGUF'): not a GGUF file");
    if (size_ < kHeaderBytes)
        fail("truncated header: the file is " + std::to_string(size_) + " bytes, a GGUF header needs " +
             std::to_string(kHeaderBytes));
    r.skip(4, "the magic");
    version_ = r.read<uint32_t>("the version");
    if (version_ != 2 && version_ != 3) {
        uint32_t swapped = __builtin_bswap32(version_);
        if (swapped == 2 || swapped == 3)
            fail("big-endian GGUF files are not supported (version field reads " + std::to_string(version_) + ")");
        fail("unsupported GGUF version " + std::to_string(version_) + " (tandem reads versions 2 and 3)");
    }
    const uint64_t n_tensors = r.read<uint64_t>("the tensor count");
    const uint64_t n_kv = r.read<uint64_t>("the metadata key count");
    // Both counts are checked against the bytes left before anything is reserved for them.
    auto implausible = [&](const char* what, uint64_t n, const char* items) {
        fail(std::string(what) + " " + std::to_string(n) + " is implausible: the " + std::to_string(r.remaining()) +
             " bytes after the header cannot hold that many " + items + " (the file is truncated or corrupt)");
    };
    if (n_kv > r.remaining() / kMinKvBytes) implausible("metadata key count", n_kv, "entries");
    if (n_tensors > r.remaining() / kMinTensorInfoBytes) implausible("tensor count", n_tensors, "tensor infos");

    // -- metadata
    uint64_t values_left = kMaxMetadataValues;
    kv_.reserve(static_cast<size_t>(n_kv));
    for (uint64_t k = 0; k < n_kv; ++k) {
        r.where = " in metadata entry " + std::to_string(k) + " of " + std::to_string(n_kv);
        uint64_t at = r.pos();
        std::string_view key = r.read_string("a metadata key");
        if (key.empty())
            fail("metadata entry " + std::to_string(k) + " at offset " + std::to_string(at) + " has an empty key");
        r.where = " in metadata key " + quoted(key);
        if (auto it = kv_index_.find(key); it != kv_index_.end())
            fail("duplicate metadata key " + quoted(key) + " (entries " + std::to_string(it->second) + " and " +
                 std::to_string(k) + ")");
        uint32_t type = r.read<uint32_t>("a value type");
        if (!is_valid_value_type(type))
            fail("metadata key " + quoted(key) + " has unknown value type " + std::to_string(type));
        if (values_left == 0) fail("metadata holds more than " + std::to_string(kMaxMetadataValues) + " values");
        --values_left;
        GgufValue value = read_value(r, static_cast<GgufValueType>(type), 0, values_left);
        kv_index_.emplace(std::string(key), kv_.size());
        kv_.emplace_back(std::string(key), std::move(value));
    }
    r.where.clear();

    if (const GgufValue* a = find("general.alignment")) {
        // ggml stores and requires a u32 here; anything else means the writer and tandem disagree on the layout.
        if (a->type != GgufValueType::UINT32)
            fail("metadata key 'general.alignment' has type " + type_description(*a) + ", expected u32");
        if (a->u == 0 || !std::has_single_bit(a->u))
            fail("general.alignment is " + std::to_string(a->u) + "; it must be a non-zero power of two");
        alignment_ = a->u;
    }

    // -- tensor table
    tensors_.reserve(static_cast<size_t>(n_tensors));
    for (uint64_t k = 0; k < n_tensors; ++k) {
        r.where = " in tensor info " + std::to_string(k) + " of " + std::to_string(n_tensors);
        uint64_t at = r.pos();
        std::string_view name_view = r.read_string("a tensor name");
        if (name_view.empty())
            fail("tensor info " + std::to_string(k) + " at offset " + std::to_string(at) + " has an empty name");
        GgufTensorInfo t;
        t.name = std::string(name_view);
        const std::string tq = "tensor " + quoted(t.name);
        r.where = " in tensor info " + std::to_string(k) + " (" + quoted(t.name) + ")";
        if (auto it = tensor_index_.find(t.name); it != tensor_index_.end())
            fail("duplicate tensor name " + quoted(t.name) + " (tensor infos " + std::to_string(it->second) + " and " +
                 std::to_string(k) + ")");

        t.n_dims = r.read<uint32_t>("the number of dimensions");
        if (t.n_dims < 1 || t.n_dims > kMaxDims)
            fail(tq + " has " + std::to_string(t.n_dims) + " dimensions; GGUF tensors have 1 to 4");
        uint64_t n_elements = 1;
        for (uint32_t d = 0; d < t.n_dims; ++d) {
            t.ne[d] = r.read<uint64_t>("a dimension");
            // ggml keeps sizes in int64_t; a zero dimension would make an empty tensor that no model uses and
            // that a loader would then index into, so it is rejected as corruption.
            if (t.ne[d] == 0) fail(tq + " has dimension " + std::to_string(d) + " equal to 0");
            if (t.ne[d] > uint64_t(std::numeric_limits<int64_t>::max()))
                fail(tq + " dimension " + std::to_string(d) + " (" + std::to_string(t.ne[d]) + ") is too large");
            if (__builtin_mul_overflow(n_elements, t.ne[d], &n_elements) ||
                n_elements > uint64_t(std::numeric_limits<int64_t>::max()))
                fail(tq + " shape " + t.shape_string() + " overflows: its element count does not fit in 63 bits");
        }

        uint32_t type_id = r.read<uint32_t>("a tensor type");
        std::optional<GgmlTypeInfo> info = ggml_type_info(type_id);
        if (!info) fail(tq + " has unknown ggml type " + std::to_string(type_id));
        t.type = static_cast<GgmlType>(type_id);
        if (t.ne[0] % info->block_size != 0)
            fail(tq + " of type " + info->name + " has ne[0] = " + std::to_string(t.ne[0]) +
                 ", which is not a multiple of the block size " + std::to_string(info->block_size));
        uint64_t row_bytes = t.ne[0] / info->block_size * info->type_size;  // cannot overflow: type_size <= 292
        uint64_t rows = n_elements / t.ne[0];
        if (__builtin_mul_overflow(row_bytes, rows, &t.n_bytes))
            fail(tq + " shape " + t.shape_string() + " overflows: its size in bytes does not fit in 64 bits");

        t.offset = r.read<uint64_t>("a tensor data offset");
        if (t.offset % alignment_ != 0)
            fail(tq + " data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                 std::to_string(alignment_));
        tensor_index_.emplace(t.name, tensors_.size());
        tensors_.push_back(std::move(t));
    }
    r.where.clear();

    // -- data section: starts at the next multiple of the alignment after the tensor table.
    uint64_t pos = r.pos();
    if (__builtin_add_overflow(pos, alignment_ - 1, &data_offset_)) fail("data section offset overflows");
    data_offset_ -= data_offset_ % alignment_;

    for (GgufTensorInfo& t : tensors_) {
        uint64_t end = 0;
        if (__builtin_add_overflow(t.offset, t.n_bytes, &end) || __builtin_add_overflow(end, data_offset_, &end) ||
            end > size_)
            fail("tensor " + quoted(t.name) + " data [offset " + std::to_string(t.offset) + ", " +
                 std::to_string(t.n_bytes) + " bytes] extends past the end of the file (data section at " +
                 std::to_string(data_offset_) + ", file size " + std::to_string(size_) + ")");
        t.data = base_ + data_offset_ + t.offset;
    }

    // Overlapping tensors would let a write through one view corrupt another and usually mean a broken writer.
    std::vector<size_t> order(tensors_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
    for (size_t k = 1; k < order.size(); ++k) {
        const GgufTensorInfo& prev = tensors_[order[k - 1]];
        const GgufTensorInfo& cur = tensors_[order[k]];
        if (prev.offset + prev.n_bytes > cur.offset)  // no overflow: checked against the file size above
            fail("tensors " + quoted(prev.name) + " [offset " + std::to_string(prev.offset) + ", " +
                 std::to_string(prev.n_bytes) + " bytes] and " + quoted(cur.name) + " [offset " +
                 std::to_string(cur.offset) + ", " + std::to_string(cur.n_bytes) + " bytes] overlap");
    }
}

// ---- lookups ------------------------------------------------------------------------------------------------

const GgufValue* GgufFile::find(std::string_view key) const {
    auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

// Whether an integer value (signed or unsigned type) lies in [lo, hi], without converting between the two.
bool int_in_range(const GgufValue& v, int64_t lo, uint64_t hi) {
    if (is_signed_type(v.type)) return v.i >= lo && (v.i < 0 || uint64_t(v.i) <= hi);
    return lo <= 0 ? v.u <= hi : v.u >= uint64_t(lo) && v.u <= hi;
}

std::string int_text(const GgufValue& v) { return is_signed_type(v.type) ? std::to_string(v.i) : std::to_string(v.u); }

}  // namespace

// Every getter goes through require (missing key) and wrong_type, so each error names the file and the key.
const GgufValue& GgufFile::require(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) fail("metadata key " + quoted(key) + " is missing");
    return *v;
}

void GgufFile::wrong_type(std::string_view key, const GgufValue& v, const char* expected) const {
    fail("metadata key " + quoted(key) + " has type " + type_description(v) + ", expected " + expected);
}

uint32_t GgufFile::get_u32(std::string_view key) const {
    const GgufValue& v = require(key);
    if (!v.is_integer()) wrong_type(key, v, "an integer");
    if (!int_in_range(v, 0, std::numeric_limits<uint32_t>::max()))
        fail("metadata key " + quoted(key) + " value " + int_text(v) + " does not fit in a u32");
    return static_cast<uint32_t>(is_signed_type(v.type) ? uint64_t(v.i) : v.u);
}

uint64_t GgufFile::get_u64(std::string_view key) const {
    const GgufValue& v = require(key);
    if (!v.is_integer()) wrong_type(key, v, "an integer");
    if (!int_in_range(v, 0, std::numeric_limits<uint64_t>::max()))
        fail("metadata key " + quoted(key) + " value " + int_text(v) + " does not fit in a u64");
    return is_signed_type(v.type) ? uint64_t(v.i) : v.u;
}

int64_t GgufFile::get_i64(std::string_view key) const {
    const GgufValue& v = require(key);
    if (!v.is_integer()) wrong_type(key, v, "an integer");
    if (!int_in_range(v, std::numeric_limits<int64_t>::min(), uint64_t(std::numeric_limits<int64_t>::max())))
        fail("metadata key " + quoted(key) + " value " + int_text(v) + " does not fit in an i64");
    return is_signed_type(v.type) ? v.i : int64_t(v.u);
}

float GgufFile::get_f32(std::string_view key) const {
    const GgufValue& v = require(key);
    if (v.type != GgufValueType::FLOAT32 && v.type != GgufValueType::FLOAT64) wrong_type(key, v, "a float");
    return static_cast<float>(v.f);
}

bool GgufFile::get_bool(std::string_view key) const {
    const GgufValue& v = require(key);
    if (v.type != GgufValueType::BOOL) wrong_type(key, v, "a bool");
    return v.u != 0;
}

std::string GgufFile::get_string(std::string_view key) const {
    const GgufValue& v = require(key);
    if (v.type != GgufValueType::STRING) wrong_type(key, v, "a string");
    return std::string(v.str);
}

std::vector<std::string_view> GgufFile::get_string_array(std::string_view key) const {
    const GgufValue& v = require(key);
    if (v.type != GgufValueType::ARRAY || v.elem_type != GgufValueType::STRING)
        wrong_type(key, v, "an array of strings");
    std::vector<std::string_view> out;
    out.reserve(v.arr.size());
    for (const GgufValue& e : v.arr) out.push_back(e.str);
    return out;
}

std::vector<float> GgufFile::get_f32_array(std::string_view key) const {
    const GgufValue& v = require(key);
    if (v.type != GgufValueType::ARRAY ||
        (v.elem_type != GgufValueType::FLOAT32 && v.elem_type != GgufValueType::FLOAT64))
        wrong_type(key, v, "an array of floats");
    std::vector<float> out;
    out.reserve(v.arr.size());
    for (const GgufValue& e : v.arr) out.push_back(static_cast<float>(e.f));
    return out;
}

std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
    const GgufValue& v = require(key);
    if (v.type != GgufValueType::ARRAY || !is_integer_type(v.elem_type)) wrong_type(key, v, "an array of integers");
    std::vector<int64_t> out;
    out.reserve(v.arr.size());
    for (size_t k = 0; k < v.arr.size(); ++k) {
        const GgufValue& e = v.arr[k];
        if (!is_signed_type(e.type) && e.u > uint64_t(std::numeric_limits<int64_t>::max()))
            fail("metadata key " + quoted(key) + " element " + std::to_string(k) + " value " + std::to_string(e.u) +
                 " does not fit in an i64");
        out.push_back(is_signed_type(e.type) ? e.i : int64_t(e.u));
    }
    return out;
}

uint32_t GgufFile::get_u32_or(std::string_view key, uint32_t fallback) const {
    return find(key) ? get_u32(key) : fallback;
}

float GgufFile::get_f32_or(std::string_view key, float fallback) const { return find(key) ? get_f32(key) : fallback; }

bool GgufFile::get_bool_or(std::string_view key, bool fallback) const { return find(key) ? get_bool(key) : fallback; }

std::string GgufFile::get_string_or(std::string_view key, const std::string& fallback) const {
    return find(key) ? get_string(key) : fallback;
}

}  // namespace tandem
