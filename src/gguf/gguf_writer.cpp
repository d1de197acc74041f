// GgufWriter (gguf_writer.h): lays out and writes GGUF v3 files byte-for-byte the way ggml's gguf writer does
// (metadata in insertion order, tensor infos, aligned data section with zero padding after every tensor).
#include "gguf/gguf_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "error.h"

namespace tandem {
namespace {

constexpr uint32_t kDefaultAlignment = 32;
constexpr const char* kAlignmentKey = "general.alignment";

uint64_t align_up(uint64_t n, uint64_t alignment) { return (n + alignment - 1) / alignment * alignment; }

// Little-endian append helpers (the host is little-endian: gguf.cpp asserts it).
template <class T>
void put_raw(std::vector<uint8_t>& out, T v) {
    uint8_t bytes[sizeof(T)];
    std::memcpy(bytes, &v, sizeof(T));
    out.insert(out.end(), bytes, bytes + sizeof(T));
}

void put_string(std::vector<uint8_t>& out, std::string_view s) {
    put_raw<uint64_t>(out, s.size());
    out.insert(out.end(), s.begin(), s.end());
}

// The value's payload without its type tag (array elements carry no tags: the array header names their type).
void put_value(std::vector<uint8_t>& out, const GgufValue& v) {
    switch (v.type) {
        case GgufValueType::UINT8: put_raw<uint8_t>(out, static_cast<uint8_t>(v.u)); break;
        case GgufValueType::INT8: put_raw<int8_t>(out, static_cast<int8_t>(v.i)); break;
        case GgufValueType::UINT16: put_raw<uint16_t>(out, static_cast<uint16_t>(v.u)); break;
        case GgufValueType::INT16: put_raw<int16_t>(out, static_cast<int16_t>(v.i)); break;
        case GgufValueType::UINT32: put_raw<uint32_t>(out, static_cast<uint32_t>(v.u)); break;
        case GgufValueType::INT32: put_raw<int32_t>(out, static_cast<int32_t>(v.i)); break;
        case GgufValueType::UINT64: put_raw<uint64_t>(out, v.u); break;
        case GgufValueType::INT64: put_raw<int64_t>(out, v.i); break;
        case GgufValueType::FLOAT32: put_raw<float>(out, static_cast<float>(v.f)); break;
        case GgufValueType::FLOAT64: put_raw<double>(out, v.f); break;
        case GgufValueType::BOOL: put_raw<uint8_t>(out, v.u ? 1 : 0); break;
        case GgufValueType::STRING: put_string(out, v.str); break;
        case GgufValueType::ARRAY:
            put_raw<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
            put_raw<uint64_t>(out, v.arr.size());
            for (const GgufValue& e : v.arr) put_value(out, e);
            break;
    }
}

// Checks that a value will serialize to what it says: a known type, integers within their type's range, and
// array elements of the array's declared element type.
void check_value(const std::string& key, const GgufValue& v) {
    auto bad = [&](const std::string& why) { throw Error("GGUF writer: metadata key '" + key + "': " + why); };
    auto fits_u = [&](uint64_t max) {
        if (v.u > max) bad(std::to_string(v.u) + " does not fit in " + gguf_value_type_name(v.type));
    };
    auto fits_i = [&](int64_t min, int64_t max) {
        if (v.i < min || v.i > max) bad(std::to_string(v.i) + " does not fit in " + gguf_value_type_name(v.type));
    };
    switch (v.type) {
        case GgufValueType::UINT8: fits_u(UINT8_MAX); break;
        case GgufValueType::UINT16: fits_u(UINT16_MAX); break;
        case GgufValueType::UINT32: fits_u(UINT32_MAX); break;
        case GgufValueType::INT8: fits_i(INT8_MIN, INT8_MAX); break;
        case GgufValueType::INT16: fits_i(INT16_MIN, INT16_MAX); break;
        case GgufValueType::INT32: fits_i(INT32_MIN, INT32_MAX); break;
        case GgufValueType::UINT64:
        case GgufValueType::INT64:
        case GgufValueType::FLOAT32:
        case GgufValueType::FLOAT64:
        case GgufValueType::BOOL:
        case GgufValueType::STRING: break;
        case GgufValueType::ARRAY:
            if (static_cast<uint32_t>(v.elem_type) > static_cast<uint32_t>(GgufValueType::FLOAT64))
                bad("unknown array element type " + std::to_string(static_cast<uint32_t>(v.elem_type)));
            for (const GgufValue& e : v.arr) {
                if (e.type != v.elem_type)
                    bad(std::string("array of ") + gguf_value_type_name(v.elem_type) + " holds a " +
                        gguf_value_type_name(e.type) + " element");
                check_value(key, e);
            }
            break;
        default: bad("unknown value type " + std::to_string(static_cast<uint32_t>(v.type)));
    }
}

GgufValue scalar(GgufValueType type) {
    GgufValue v;
    v.type = type;
    return v;
}

}  // namespace

// ---- metadata -----------------------------------------------------------------------------------------------

std::string_view GgufWriter::own(std::string_view s) {
    if (!strings_) strings_ = std::make_shared<std::deque<std::string>>();  // a moved-from writer reused
    return strings_->emplace_back(s);
}

GgufValue GgufWriter::own(const GgufValue& v) {
    GgufValue copy = v;
    if (v.type == GgufValueType::STRING) copy.str = own(v.str);
    for (GgufValue& e : copy.arr) e = own(e);
    return copy;
}

void GgufWriter::put(const std::string& key, GgufValue v) {
    if (key.empty()) throw Error("GGUF writer: empty metadata key");
    check_value(key, v);
    if (key == kAlignmentKey) {
        // The key and the layout must agree, so the key is only a way to set the alignment; serialize() writes
        // the alignment actually used, as a u32 (which is what ggml requires).
        const bool is_signed = v.type == GgufValueType::INT8 || v.type == GgufValueType::INT16 ||
                               v.type == GgufValueType::INT32 || v.type == GgufValueType::INT64;
        if (!v.is_integer() || (is_signed ? v.i < 0 || v.i > int64_t(UINT32_MAX) : v.u > UINT32_MAX))
            throw Error("GGUF writer: general.alignment must be a u32");
        alignment_ = static_cast<uint32_t>(is_signed ? uint64_t(v.i) : v.u);
        v = scalar(GgufValueType::UINT32);
    }
    for (auto& [k, old] : kv_) {
        if (k == key) {
            old = std::move(v);
            return;
        }
    }
    kv_.emplace_back(key, std::move(v));
}

void GgufWriter::add_u32(const std::string& key, uint32_t x) {
    GgufValue v = scalar(GgufValueType::UINT32);
    v.u = x;
    put(key, std::move(v));
}

void GgufWriter::add_i32(const std::string& key, int32_t x) {
    GgufValue v = scalar(GgufValueType::INT32);
    v.i = x;
    put(key, std::move(v));
}

void GgufWriter::add_u64(const std::string& key, uint64_t x) {
    GgufValue v = scalar(GgufValueType::UINT64);
    v.u = x;
    put(key, std::move(v));
}

void GgufWriter::add_f32(const std::string& key, float x) {
    GgufValue v = scalar(GgufValueType::FLOAT32);
    v.f = x;
    put(key, std::move(v));
}

void GgufWriter::add_bool(const std::string& key, bool x) {
    GgufValue v = scalar(GgufValueType::BOOL);
    v.u = x ? 1 : 0;
    put(key, std::move(v));
}

void GgufWriter::add_string(const std::string& key, const std::string& x) {
    GgufValue v = scalar(GgufValueType::STRING);
    v.str = own(x);
    put(key, std::move(v));
}

void GgufWriter::add_string_array(const std::string& key, const std::vector<std::string>& xs) {
    GgufValue v = scalar(GgufValueType::ARRAY);
    v.elem_type = GgufValueType::STRING;
    v.arr.reserve(xs.size());
    for (const std::string& x : xs) {
        GgufValue e = scalar(GgufValueType::STRING);
        e.str = own(x);
        v.arr.push_back(std::move(e));
    }
    put(key, std::move(v));
}

void GgufWriter::add_f32_array(const std::string& key, const std::vector<float>& xs) {
    GgufValue v = scalar(GgufValueType::ARRAY);
    v.elem_type = GgufValueType::FLOAT32;
    v.arr.reserve(xs.size());
    for (float x : xs) {
        GgufValue e = scalar(GgufValueType::FLOAT32);
        e.f = x;
        v.arr.push_back(std::move(e));
    }
    put(key, std::move(v));
}

void GgufWriter::add_i32_array(const std::string& key, const std::vector<int32_t>& xs) {
    GgufValue v = scalar(GgufValueType::ARRAY);
    v.elem_type = GgufValueType::INT32;
    v.arr.reserve(xs.size());
    for (int32_t x : xs) {
        GgufValue e = scalar(GgufValueType::INT32);
        e.i = x;
        v.arr.push_back(std::move(e));
    }
    put(key, std::move(v));
}

void GgufWriter::add_value(const std::string& key, const GgufValue& v) { put(key, own(v)); }

// ---- tensors ------------------------------------------------------------------------------------------------

void GgufWriter::add_tensor(const std::string& name, GgmlType type, const std::vector<uint64_t>& dims,
                            std::vector<uint8_t> data) {
    const std::string where = "GGUF writer: tensor '" + name + "': ";
    if (name.empty()) throw Error("GGUF writer: empty tensor name");
    for (const Tensor& t : tensors_)
        if (t.name == name) throw Error(where + "duplicate tensor name");
    std::optional<GgmlTypeInfo> info = ggml_type_info(static_cast<uint32_t>(type));
    if (!info) throw Error(where + "unknown ggml type " + std::to_string(static_cast<uint32_t>(type)));
    if (dims.empty() || dims.size() > 4)
        throw Error(where + std::to_string(dims.size()) + " dimensions; GGUF tensors have 1 to 4");
    uint64_t rows = 1;
    for (size_t d = 0; d < dims.size(); ++d) {
        if (dims[d] == 0) throw Error(where + "dimension " + std::to_string(d) + " is 0");
        if (d > 0 && __builtin_mul_overflow(rows, dims[d], &rows)) throw Error(where + "shape overflows");
    }
    if (dims[0] % info->block_size != 0)
        throw Error(where + "ne[0] = " + std::to_string(dims[0]) + " is not a multiple of the " + info->name +
                    " block size " + std::to_string(info->block_size));
    uint64_t expected = 0;
    if (__builtin_mul_overflow(ggml_row_bytes(type, dims[0]), rows, &expected)) throw Error(where + "shape overflows");
    if (data.size() != expected)
        throw Error(where + "data holds " + std::to_string(data.size()) + " bytes, but the " + info->name +
                    " shape needs " + std::to_string(expected));
    tensors_.push_back(Tensor{name, type, dims, std::move(data)});
}

// ---- serialization ------------------------------------------------------------------------------------------

GgufWriter::Layout GgufWriter::layout() const {
    if (alignment_ == 0 || !std::has_single_bit(alignment_))
        throw Error("GGUF writer: alignment " + std::to_string(alignment_) + " is not a non-zero power of two");

    Layout l;
    std::vector<uint8_t>& out = l.head;
    const bool alignment_listed = [&] {
        for (const auto& kv : kv_)
            if (kv.first == kAlignmentKey) return true;
        return false;
    }();
    const bool append_alignment = !alignment_listed && alignment_ != kDefaultAlignment;

    out.insert(out.end(), {'G', 'G', 'U', 'F'});
    put_raw<uint32_t>(out, 3);
    put_raw<uint64_t>(out, tensors_.size());
    put_raw<uint64_t>(out, kv_.size() + (append_alignment ? 1 : 0));

    GgufValue alignment_value = scalar(GgufValueType::UINT32);
    alignment_value.u = alignment_;
    for (const auto& [key, value] : kv_) {
        const GgufValue& v = key == kAlignmentKey ? alignment_value : value;
        put_string(out, key);
        put_raw<uint32_t>(out, static_cast<uint32_t>(v.type));
        put_value(out, v);
    }
    if (append_alignment) {
        put_string(out, kAlignmentKey);
        put_raw<uint32_t>(out, static_cast<uint32_t>(GgufValueType::UINT32));
        put_value(out, alignment_value);
    }

    uint64_t offset = 0;
    for (const Tensor& t : tensors_) {
        put_string(out, t.name);
        put_raw<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
        for (uint64_t d : t.dims) put_raw<uint64_t>(out, d);
        put_raw<uint32_t>(out, static_cast<uint32_t>(t.type));
        put_raw<uint64_t>(out, offset);
        l.offsets.push_back(offset);
        offset = align_up(offset + t.data.size(), alignment_);
    }
    l.data_bytes = offset;
    out.resize(align_up(out.size(), alignment_), 0);
    return l;
}

std::vector<uint8_t> GgufWriter::serialize() const {
    Layout l = layout();
    std::vector<uint8_t> out = std::move(l.head);
    const size_t data_start = out.size();
    out.resize(data_start + l.data_bytes, 0);
    for (size_t k = 0; k < tensors_.size(); ++k)
        std::memcpy(out.data() + data_start + l.offsets[k], tensors_[k].data.data(), tensors_[k].data.size());
    return out;
}

void GgufWriter::write(const std::string& path) const {
    // Streams the pieces instead of calling serialize(), so a multi-gigabyte model is not held twice in memory.
    Layout l = layout();
    const std::string tmp = path + ".tmp." + std::to_string(::getpid());
    auto fail = [&](const std::string& what, int err) {
        ::unlink(tmp.c_str());
        throw Error(path + ": " + what + ": " + std::generic_category().message(err));
    };

    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int err = errno;
        throw Error(path + ": cannot create " + tmp + ": " + std::generic_category().message(err));
    }
    auto write_all = [&](const uint8_t* p, size_t n) {
        while (n > 0) {
            ssize_t w = ::write(fd, p, n);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                int err = w < 0 ? errno : EIO;
                ::close(fd);
                fail("write failed", err);
            }
            p += w;
            n -= static_cast<size_t>(w);
        }
    };

    write_all(l.head.data(), l.head.size());
    static const uint8_t zeros[256] = {};
    uint64_t pos = 0;  // within the data section
    auto pad_to = [&](uint64_t target) {
        while (pos < target) {
            size_t n = static_cast<size_t>(std::min<uint64_t>(target - pos, sizeof zeros));
            write_all(zeros, n);
            pos += n;
        }
    };
    for (size_t k = 0; k < tensors_.size(); ++k) {
        pad_to(l.offsets[k]);
        write_all(tensors_[k].data.data(), tensors_[k].data.size());
        pos += tensors_[k].data.size();
    }
    pad_to(l.data_bytes);

    // fsync before rename: otherwise a crash can leave the final name pointing at a file with missing data.
    if (::fsync(fd) != 0) {
        int err = errno;
        ::close(fd);
        fail("fsync failed", err);
    }
    if (::close(fd) != 0) fail("close failed", errno);
    if (::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot rename " + tmp + " to it", errno);
}

}  // namespace tandem
