// Tests for the GGUF reader and writer: the real fixtures in tests/data, writer round trips, and a catalogue of
// malformed files (every truncation, lying counts, bad types, bad offsets) that must each give a tandem::Error.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "error.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "test_paths.h"

using namespace tandem;

namespace {

const std::string kData = TANDEM_TEST_DATA;

// A scratch directory removed at the end of the test.
struct TempDir {
    std::filesystem::path dir;
    TempDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "tandem_gguf_XXXXXX").string();
        REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
        dir = tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
    std::string path(const std::string& name) const { return (dir / name).string(); }
};

std::vector<uint8_t> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE(in.good());
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    REQUIRE(out.good());
}

// Opens `path` expecting a tandem::Error; returns its message ("" when the file opened, which the caller
// then reports). Any other exception type fails the test.
std::string open_error(const std::string& path) {
    try {
        GgufFile::open(path);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// Writes `bytes` to a file and checks that opening it fails with a message naming the file and containing
// every word in `words`.
void expect_error(const std::vector<uint8_t>& bytes, std::initializer_list<const char*> words) {
    INFO("expected words: " << std::string(words.size() ? *words.begin() : ""));
    TempDir tmp;
    const std::string path = tmp.path("bad.gguf");
    write_bytes(path, bytes);
    const std::string msg = open_error(path);
    INFO("message: " << msg);
    REQUIRE(!msg.empty());
    CHECK(msg.rfind(path + ": ", 0) == 0);
    for (const char* w : words) CHECK_MESSAGE(msg.find(w) != std::string::npos, "missing word: " << std::string(w));
}

// Builds GGUF bytes field by field, so a test can write exactly the (broken) file it needs.
struct Raw {
    std::vector<uint8_t> b;

    template <class T>
    Raw& put(T v) {
        uint8_t bytes[sizeof(T)];
        std::memcpy(bytes, &v, sizeof(T));
        b.insert(b.end(), bytes, bytes + sizeof(T));
        return *this;
    }
    Raw& u32(uint32_t v) { return put(v); }
    Raw& u64(uint64_t v) { return put(v); }
    Raw& str(std::string_view s) {
        u64(s.size());
        b.insert(b.end(), s.begin(), s.end());
        return *this;
    }
    Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
        b.insert(b.end(), {'G', 'G', 'U', 'F'});
        return u32(version).u64(n_tensors).u64(n_kv);
    }
    Raw& kv_u32(std::string_view key, uint32_t v) { return str(key).u32(4).u32(v); }
    Raw& tensor(std::string_view name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
        str(name).u32(static_cast<uint32_t>(dims.size()));
        for (uint64_t d : dims) u64(d);
        return u32(type).u64(offset);
    }
    Raw& align(size_t alignment = 32) {
        b.resize((b.size() + alignment - 1) / alignment * alignment, 0);
        return *this;
    }
    Raw& zeros(size_t n) {
        b.resize(b.size() + n, 0);
        return *this;
    }
};

GgufValue scalar_u(GgufValueType t, uint64_t u) {
    GgufValue v;
    v.type = t;
    v.u = u;
    return v;
}
GgufValue scalar_i(GgufValueType t, int64_t i) {
    GgufValue v;
    v.type = t;
    v.i = i;
    return v;
}
GgufValue scalar_f(GgufValueType t, double f) {
    GgufValue v;
    v.type = t;
    v.f = f;
    return v;
}
GgufValue array_of(GgufValueType elem, std::vector<GgufValue> items) {
    GgufValue v;
    v.type = GgufValueType::ARRAY;
    v.elem_type = elem;
    v.arr = std::move(items);
    return v;
}

// Deep equality of the fields that matter for each type.
bool same(const GgufValue& a, const GgufValue& b) {
    if (a.type != b.type) return false;
    switch (a.type) {
        case GgufValueType::STRING: return a.str == b.str;
        case GgufValueType::FLOAT32: case GgufValueType::FLOAT64: return a.f == b.f;
        case GgufValueType::INT8: case GgufValueType::INT16: case GgufValueType::INT32: case GgufValueType::INT64:
            return a.i == b.i;
        case GgufValueType::ARRAY:
            if (a.elem_type != b.elem_type || a.arr.size() != b.arr.size()) return false;
            for (size_t k = 0; k < a.arr.size(); ++k)
                if (!same(a.arr[k], b.arr[k])) return false;
            return true;
        default: return a.u == b.u;
    }
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t k = 0; k < n; ++k) v[k] = static_cast<uint8_t>(seed + k * 31);
    return v;
}

// A small but complete file: metadata of several types and tensors of four types at alignment 64.
GgufWriter small_writer() {
    GgufWriter w;
    w.set_alignment(64);
    w.add_string("general.architecture", "llama");
    w.add_u32("llama.block_count", 2);
    w.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    w.add_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "hello"});
    w.add_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 1});
    w.add_bool("tokenizer.ggml.add_bos_token", true);
    w.add_tensor("a.f32", GgmlType::F32, {3, 2}, pattern(3 * 2 * 4, 1));
    w.add_tensor("b.f16", GgmlType::F16, {5}, pattern(5 * 2, 2));
    w.add_tensor("c.q8_0", GgmlType::Q8_0, {64, 2}, pattern(2 * 2 * 34, 3));
    w.add_tensor("d.q4_0", GgmlType::Q4_0, {32, 1, 1, 3}, pattern(3 * 18, 4));
    return w;
}

// Two F32 tensors, "a" of a_elements and "b" of 8 floats, at the given offsets, data section big enough for both.
std::vector<uint8_t> two_tensor_file(uint64_t offset_a, uint64_t offset_b, std::string_view name_b = "b",
                                     uint64_t a_elements = 8) {
    Raw r;
    r.header(2, 0).tensor("a", {a_elements}, 0, offset_a).tensor(name_b, {8}, 0, offset_b).align().zeros(128);
    return r.b;
}

}  // namespace

// ---- real files -----------------------------------------------------------------------------------------------

TEST_CASE("gguf: stories260K metadata and tensor table") {
    auto f = GgufFile::open(kData + "/stories260K.gguf");
    CHECK(f->version() == 3);
    CHECK(f->alignment() == 32);
    CHECK(f->tensors().size() == 48);
    CHECK(f->get_string("general.architecture") == "llama");
    CHECK(f->get_u32("llama.embedding_length") == 64);
    CHECK(f->get_u32("llama.feed_forward_length") == 172);
    CHECK(f->get_u32("llama.attention.head_count") == 8);
    CHECK(f->get_u32("llama.attention.head_count_kv") == 4);
    CHECK(f->get_u32("llama.block_count") == 5);
    CHECK(f->get_u32("llama.rope.dimension_count") == 8);
    CHECK(f->get_f32("llama.attention.layer_norm_rms_epsilon") == doctest::Approx(1e-5).epsilon(1e-6));
    CHECK(f->get_string_array("tokenizer.ggml.tokens").size() == 512);
    CHECK(f->get_string_array("tokenizer.ggml.tokens")[1] == "<s>");
    CHECK(f->get_f32_array("tokenizer.ggml.scores").size() == 512);
    CHECK(f->get_int_array("tokenizer.ggml.token_type").size() == 512);

    const GgufTensorInfo* emb = f->find_tensor("token_embd.weight");
    REQUIRE(emb != nullptr);
    CHECK(emb->type == GgmlType::F32);
    CHECK(emb->n_dims == 2);
    CHECK(emb->ne[0] == 64);
    CHECK(emb->ne[1] == 512);
    CHECK(emb->shape_string() == "[64, 512]");
    CHECK(emb->n_bytes == 64 * 512 * 4);
    CHECK(f->find_tensor("blk.4.ffn_down.weight") != nullptr);
    CHECK(f->find_tensor("blk.5.ffn_down.weight") == nullptr);
    CHECK(f->data_offset() % 32 == 0);
    for (const GgufTensorInfo& t : f->tensors()) {
        CHECK(t.offset % 32 == 0);
        CHECK(f->data_offset() + t.offset + t.n_bytes <= f->file_size());
        CHECK(t.data - emb->data == static_cast<ptrdiff_t>(t.offset - emb->offset));  // one mapping, one base
    }
}

TEST_CASE("gguf: stories260K token embedding equals the llama2.c checkpoint's") {
    // An independent check of the offsets: llama2.c's .bin is a 7-int32 header followed by the fp32 token
    // embedding table, which must be byte-identical to token_embd.weight.
    auto f = GgufFile::open(kData + "/stories260K.gguf");
    std::vector<uint8_t> bin = read_bytes(kData + "/stories260K.bin");
    REQUIRE(bin.size() > 28);
    int32_t header[7];
    std::memcpy(header, bin.data(), sizeof header);
    CHECK(header[0] == 64);                  // dim
    CHECK(header[1] == 172);                 // hidden_dim
    CHECK(header[2] == 5);                   // n_layers
    CHECK(header[3] == 8);                   // n_heads
    CHECK(header[4] == 4);                   // n_kv_heads
    CHECK(std::abs(header[5]) == 512);       // vocab_size (negative: unshared classifier)
    const GgufTensorInfo* emb = f->find_tensor("token_embd.weight");
    REQUIRE(emb != nullptr);
    REQUIRE(bin.size() >= 28 + emb->n_bytes);
    CHECK(std::memcmp(emb->data, bin.data() + 28, emb->n_bytes) == 0);
    // And the next table in the .bin (rms_att_weight, layer 0) is blk.0.attn_norm.weight.
    const GgufTensorInfo* norm = f->find_tensor("blk.0.attn_norm.weight");
    REQUIRE(norm != nullptr);
    CHECK(std::memcmp(norm->data, bin.data() + 28 + emb->n_bytes, norm->n_bytes) == 0);
}

TEST_CASE("gguf: llama vocabulary file (no tensors, 32000-entry arrays)") {
    auto f = GgufFile::open(kData + "/ggml-vocab-llama-spm.gguf");
    CHECK(f->tensors().empty());
    CHECK(f->get_string("tokenizer.ggml.model") == "llama");
    auto tokens = f->get_string_array("tokenizer.ggml.tokens");
    REQUIRE(tokens.size() == 32000);
    CHECK(tokens[0] == "<unk>");
    CHECK(f->get_f32_array("tokenizer.ggml.scores").size() == 32000);
    CHECK(f->get_int_array("tokenizer.ggml.token_type").size() == 32000);
    CHECK(f->get_bool("tokenizer.ggml.add_bos_token") == true);
    CHECK(f->get_bool_or("tokenizer.ggml.add_eos_token", true) == false);
    CHECK(f->get_u32("llama.vocab_size") == 32000);
    std::string shown = f->find("tokenizer.ggml.tokens")->to_string(2);
    CHECK(shown == "[string \u00d7 32000] '<unk>', '<s>', ...");
}

// ---- getters ------------------------------------------------------------------------------------------------------

TEST_CASE("gguf: typed getters convert what fits and name the key in errors") {
    TempDir tmp;
    const std::string path = tmp.path("getters.gguf");
    GgufWriter w;
    w.add_string("s", "text");
    w.add_i32("neg", -1);
    w.add_i32("five", 5);
    w.add_u64("big", uint64_t(1) << 32);
    w.add_value("huge", scalar_u(GgufValueType::UINT64, std::numeric_limits<uint64_t>::max()));
    w.add_value("f64", scalar_f(GgufValueType::FLOAT64, 0.25));
    w.add_value("byte", scalar_u(GgufValueType::UINT8, 1));
    w.add_f32_array("floats", {1.5f, -2});
    w.add_value("u64s", array_of(GgufValueType::UINT64, {scalar_u(GgufValueType::UINT64, 7),
                                                        scalar_u(GgufValueType::UINT64, uint64_t(1) << 63)}));
    w.add_value("i16s", array_of(GgufValueType::INT16, {scalar_i(GgufValueType::INT16, -3)}));
    w.write(path);
    auto f = GgufFile::open(path);

    auto error_of = [&](auto&& fn) -> std::string {
        try {
            fn();
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    };
    CHECK(f->get_u32("five") == 5);
    CHECK(f->get_i64("neg") == -1);
    CHECK(f->get_u64("big") == (uint64_t(1) << 32));
    CHECK(f->get_f32("f64") == 0.25f);
    CHECK(f->get_int_array("i16s") == std::vector<int64_t>{-3});
    CHECK(f->get_f32_array("floats") == std::vector<float>{1.5f, -2});
    CHECK(f->get_u32_or("absent", 9) == 9);
    CHECK(f->get_f32_or("absent", 0.5f) == 0.5f);
    CHECK(f->get_string_or("absent", "x") == "x");
    CHECK(f->get_string_or("s", "x") == "text");

    std::string e = error_of([&] { f->get_u32("llama.block_count"); });
    CHECK(e == path + ": metadata key 'llama.block_count' is missing");
    e = error_of([&] { f->get_u32("s"); });
    CHECK(e == path + ": metadata key 's' has type string, expected an integer");
    CHECK(error_of([&] { f->get_u32("neg"); }).find("does not fit") != std::string::npos);
    CHECK(error_of([&] { f->get_u32("big"); }).find("does not fit") != std::string::npos);
    CHECK(error_of([&] { f->get_u64("neg"); }).find("does not fit") != std::string::npos);
    CHECK(error_of([&] { f->get_i64("huge"); }).find("does not fit") != std::string::npos);
    CHECK(error_of([&] { f->get_f32("five"); }).find("expected a float") != std::string::npos);
    CHECK(error_of([&] { f->get_bool("byte"); }).find("has type u8, expected a bool") != std::string::npos);
    CHECK(error_of([&] { f->get_string("five"); }).find("expected a string") != std::string::npos);
    CHECK(error_of([&] { f->get_string_array("floats"); }).find("array of f32, expected an array of strings") !=
          std::string::npos);
    CHECK(error_of([&] { f->get_f32_array("s"); }).find("expected an array of floats") != std::string::npos);
    CHECK(error_of([&] { f->get_int_array("floats"); }).find("expected an array of integers") != std::string::npos);
    CHECK(error_of([&] { f->get_int_array("u64s"); }).find("element 1") != std::string::npos);
    // A key that is present with the wrong type is an error even when a fallback is offered.
    CHECK(error_of([&] { f->get_u32_or("s", 1); }).find("expected an integer") != std::string::npos);
    CHECK(error_of([&] { f->get_bool_or("five", false); }).find("expected a bool") != std::string::npos);
}

// ---- writer -------------------------------------------------------------------------------------------------------

TEST_CASE("gguf writer: every value type, nested arrays and four tensor types round-trip at alignment 64") {
    TempDir tmp;
    const std::string path = tmp.path("round.gguf");

    GgufWriter w = small_writer();
    w.add_u64("u64", std::numeric_limits<uint64_t>::max());
    w.add_bool("no", false);
    w.add_value("u8", scalar_u(GgufValueType::UINT8, 255));
    w.add_value("i8", scalar_i(GgufValueType::INT8, -128));
    w.add_value("u16", scalar_u(GgufValueType::UINT16, 65535));
    w.add_value("i16", scalar_i(GgufValueType::INT16, -32768));
    w.add_value("i64", scalar_i(GgufValueType::INT64, std::numeric_limits<int64_t>::min()));
    w.add_value("f64", scalar_f(GgufValueType::FLOAT64, 3.141592653589793));
    w.add_value("bools", array_of(GgufValueType::BOOL, {scalar_u(GgufValueType::BOOL, 1),
                                                        scalar_u(GgufValueType::BOOL, 0)}));
    w.add_value("empty", array_of(GgufValueType::UINT32, {}));
    GgufValue bytes_a = array_of(GgufValueType::UINT8, {scalar_u(GgufValueType::UINT8, 1),
                                                        scalar_u(GgufValueType::UINT8, 2)});
    GgufValue bytes_b = array_of(GgufValueType::UINT8, {scalar_u(GgufValueType::UINT8, 3)});
    GgufValue nested = array_of(GgufValueType::ARRAY, {bytes_a, bytes_b, array_of(GgufValueType::UINT8, {})});
    w.add_value("nested", nested);
    w.add_value("deeper", array_of(GgufValueType::ARRAY, {nested, nested}));
    {
        // Strings given to add_value are copied: the source may be gone before serialize().
        std::string transient = "short-lived";
        GgufValue s;
        s.type = GgufValueType::STRING;
        s.str = transient;
        w.add_value("copied", array_of(GgufValueType::STRING, {s, s}));
        transient.assign(transient.size(), 'X');
    }
    w.add_u32("llama.block_count", 3);  // replaces the value, keeps the position
    w.write(path);
    CHECK(read_bytes(path) == w.serialize());

    auto f = GgufFile::open(path);
    CHECK(f->version() == 3);
    CHECK(f->alignment() == 64);
    CHECK(f->data_offset() % 64 == 0);
    CHECK(f->get_u32("general.alignment") == 64);
    CHECK(f->metadata()[1].first == "llama.block_count");
    CHECK(f->get_u32("llama.block_count") == 3);
    CHECK(f->get_u64("u64") == std::numeric_limits<uint64_t>::max());
    CHECK(f->get_bool("no") == false);
    CHECK(f->get_bool("tokenizer.ggml.add_bos_token") == true);
    CHECK(f->get_i64("i8") == -128);
    CHECK(f->get_i64("i16") == -32768);
    CHECK(f->get_i64("i64") == std::numeric_limits<int64_t>::min());
    CHECK(f->get_u32("u8") == 255);
    CHECK(f->get_u32("u16") == 65535);
    CHECK(f->find("f64")->f == 3.141592653589793);
    CHECK(f->find("f64")->type == GgufValueType::FLOAT64);
    CHECK(f->get_f32("llama.attention.layer_norm_rms_epsilon") == 1e-5f);
    CHECK(f->get_string_array("copied") == std::vector<std::string_view>{"short-lived", "short-lived"});
    CHECK(f->get_string_array("tokenizer.ggml.tokens") ==
          std::vector<std::string_view>{"<unk>", "<s>", "</s>", "hello"});
    CHECK(f->get_int_array("tokenizer.ggml.token_type") == std::vector<int64_t>{2, 3, 3, 1});
    CHECK(same(*f->find("bools"), array_of(GgufValueType::BOOL, {scalar_u(GgufValueType::BOOL, 1),
                                                                 scalar_u(GgufValueType::BOOL, 0)})));
    CHECK(same(*f->find("empty"), array_of(GgufValueType::UINT32, {})));
    CHECK(same(*f->find("nested"), nested));
    CHECK(same(*f->find("deeper"), array_of(GgufValueType::ARRAY, {nested, nested})));
    CHECK(f->find("nested")->to_string() ==
          "[array \u00d7 3] {[u8 \u00d7 2] 1, 2}, {[u8 \u00d7 1] 3}, {[u8 \u00d7 0]}");

    REQUIRE(f->tensors().size() == 4);
    const char* names[] = {"a.f32", "b.f16", "c.q8_0", "d.q4_0"};
    GgmlType types[] = {GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0};
    size_t sizes[] = {24, 10, 136, 54};
    for (int k = 0; k < 4; ++k) {
        const GgufTensorInfo& t = f->tensors()[k];
        CAPTURE(t.name);
        CHECK(t.name == names[k]);
        CHECK(t.type == types[k]);
        CHECK(t.n_bytes == sizes[k]);
        CHECK(t.offset % 64 == 0);
        CHECK(std::vector<uint8_t>(t.data, t.data + t.n_bytes) == pattern(sizes[k], uint8_t(k + 1)));
    }
    CHECK(f->find_tensor("d.q4_0")->shape_string() == "[32, 1, 1, 3]");
    CHECK(f->find_tensor("d.q4_0")->n_elements() == 96);
}

TEST_CASE("gguf writer: output is laid out exactly as ggml writes it") {
    GgufWriter w;
    w.add_u32("k", 7);
    std::vector<uint8_t> data = pattern(8, 9);
    w.add_tensor("t", GgmlType::F32, {2}, data);
    w.add_tensor("u", GgmlType::F32, {1}, pattern(4, 1));
    Raw r;
    r.header(2, 1).kv_u32("k", 7).tensor("t", {2}, 0, 0).tensor("u", {1}, 0, 32).align();
    r.b.insert(r.b.end(), data.begin(), data.end());
    r.align();
    std::vector<uint8_t> u = pattern(4, 1);
    r.b.insert(r.b.end(), u.begin(), u.end());
    r.align();  // ggml pads after the last tensor too
    CHECK(w.serialize() == r.b);
}

TEST_CASE("gguf writer: re-serializing stories260K reproduces the file byte for byte") {
    std::vector<uint8_t> original = read_bytes(kData + "/stories260K.gguf");
    GgufWriter w;
    {
        auto f = GgufFile::open(kData + "/stories260K.gguf");
        for (const auto& [key, value] : f->metadata()) w.add_value(key, value);
        for (const GgufTensorInfo& t : f->tensors())
            w.add_tensor(t.name, t.type, std::vector<uint64_t>(t.ne, t.ne + t.n_dims),
                         std::vector<uint8_t>(t.data, t.data + t.n_bytes));
    }  // the file is unmapped here: the writer must own every string it was given
    GgufWriter copy = w;
    w = GgufWriter();
    CHECK(copy.serialize() == original);
}

TEST_CASE("gguf writer: rejects inconsistent tensors and values") {
    GgufWriter w;
    CHECK_THROWS_AS(w.add_tensor("t", GgmlType::F32, {4}, pattern(15, 0)), Error);
    CHECK_THROWS_AS(w.add_tensor("t", GgmlType::Q8_0, {16}, pattern(17, 0)), Error);  // not a whole block
    CHECK_THROWS_AS(w.add_tensor("t", GgmlType::F32, {}, {}), Error);
    CHECK_THROWS_AS(w.add_tensor("t", GgmlType::F32, {1, 1, 1, 1, 1}, pattern(4, 0)), Error);
    CHECK_THROWS_AS(w.add_tensor("t", GgmlType::F32, {0}, {}), Error);
    CHECK_THROWS_AS(w.add_tensor("", GgmlType::F32, {1}, pattern(4, 0)), Error);
    CHECK_THROWS_AS(w.add_tensor("t", GgmlType::F32, {uint64_t(1) << 40, uint64_t(1) << 40}, {}), Error);
    w.add_tensor("t", GgmlType::F32, {1}, pattern(4, 0));
    CHECK_THROWS_AS(w.add_tensor("t", GgmlType::F32, {1}, pattern(4, 0)), Error);  // duplicate name
    try {
        w.add_tensor("x", GgmlType::F16, {3}, pattern(4, 0));
        FAIL("no error");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("'x'") != std::string::npos);
        CHECK(std::string(e.what()).find("needs 6") != std::string::npos);
    }
    CHECK_THROWS_AS(w.add_value("v", scalar_u(GgufValueType::UINT8, 256)), Error);
    CHECK_THROWS_AS(w.add_value("v", array_of(GgufValueType::UINT8, {scalar_u(GgufValueType::UINT16, 1)})), Error);
    CHECK_THROWS_AS(w.add_u32("", 1), Error);
    w.set_alignment(24);
    CHECK_THROWS_AS(w.serialize(), Error);
}

TEST_CASE("gguf writer: a failed write reports the path and leaves no file behind") {
    TempDir tmp;
    GgufWriter w = small_writer();
    const std::string missing_dir = tmp.path("no/such/dir/model.gguf");
    try {
        w.write(missing_dir);
        FAIL("no error");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find(missing_dir) != std::string::npos);
    }
    // A destination that cannot be renamed over (a non-empty directory): the temp file must be removed.
    const std::string dir_target = tmp.path("occupied");
    std::filesystem::create_directories(std::filesystem::path(dir_target) / "child");
    CHECK_THROWS_AS(w.write(dir_target), Error);
    using std::filesystem::directory_iterator;
    CHECK(std::distance(directory_iterator(tmp.dir), directory_iterator()) == 1);  // only "occupied" itself
}

TEST_CASE("gguf writer: a failing write (file size limit) is an error and removes the temporary file") {
    // RLIMIT_FSIZE makes write() stop part-way (a short write, then EFBIG), like a disk filling up.
    TempDir tmp;
    GgufWriter w = small_writer();
    rlimit old_limit{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // otherwise exceeding the limit kills the process
    rlimit limit = old_limit;
    limit.rlim_cur = 100;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &limit) == 0);
    std::string msg;
    try {
        w.write(tmp.path("big.gguf"));
    } catch (const Error& e) {
        msg = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &old_limit);
    std::signal(SIGXFSZ, old_handler);
    CHECK(msg.find(tmp.path("big.gguf") + ": write failed") == 0);
    CHECK(std::filesystem::is_empty(tmp.dir));
}

// ---- malformed files ----------------------------------------------------------------------------------------------

TEST_CASE("gguf: every truncation of a small file is an error") {
    TempDir tmp;
    const std::string path = tmp.path("t.gguf");
    const std::vector<uint8_t> full = small_writer().serialize();
    write_bytes(path, full);
    auto f = GgufFile::open(path);
    const GgufTensorInfo& last = f->tensors().back();
    const uint64_t data_end = f->data_offset() + last.offset + last.n_bytes;  // then only padding follows
    f.reset();
    // Shrinking one file in place keeps this loop cheap; every prefix up to the end of the last tensor fails.
    for (uint64_t len = data_end; len-- > 0;) {
        REQUIRE(::truncate(path.c_str(), static_cast<off_t>(len)) == 0);
        std::string msg = open_error(path);
        CAPTURE(len);
        REQUIRE(!msg.empty());
        REQUIRE(msg.rfind(path + ": ", 0) == 0);
    }
}

TEST_CASE("gguf: truncations of stories260K through the header, metadata, tensor table and data") {
    TempDir tmp;
    const std::string path = tmp.path("s.gguf");
    const std::vector<uint8_t> full = read_bytes(kData + "/stories260K.gguf");
    const uint64_t header_end = GgufFile::open(kData + "/stories260K.gguf")->data_offset();
    write_bytes(path, full);
    std::vector<uint64_t> lengths = {full.size() - 1, full.size() - 4, full.size() / 2, header_end + 1, header_end};
    for (uint64_t len = header_end; len-- > 0;) lengths.push_back(len);
    for (uint64_t len : lengths) {
        REQUIRE(::truncate(path.c_str(), static_cast<off_t>(len)) == 0);
        std::string msg = open_error(path);
        CAPTURE(len);
        REQUIRE(!msg.empty());
    }
}

TEST_CASE("gguf: random byte corruption of the header and tables never crashes") {
    // Deterministic fuzzing: each corrupted file must either open or give a tandem::Error (run under the
    // sanitizers, this also catches any out-of-bounds read the targeted cases miss).
    TempDir tmp;
    const std::string path = tmp.path("fuzz.gguf");
    const std::vector<uint8_t> full = small_writer().serialize();
    write_bytes(path, full);
    const size_t header_end = GgufFile::open(path)->data_offset();
    std::mt19937 rng(12345);
    size_t errors = 0;
    for (int round = 0; round < 3000; ++round) {
        std::vector<uint8_t> bytes = full;
        for (int flips = 1 + round % 3; flips > 0; --flips) {
            size_t at = rng() % header_end;
            // Small integers and all-ones bytes are the values that hit boundaries in counts and lengths.
            uint8_t choices[] = {0x00, 0x01, 0xff, 0x80, static_cast<uint8_t>(rng())};
            bytes[at] = choices[rng() % 5];
        }
        write_bytes(path, bytes);
        CAPTURE(round);
        try {
            GgufFile::open(path);
        } catch (const Error&) {
            ++errors;
        }
    }
    CHECK(errors > 0);
}

TEST_CASE("gguf: malformed headers") {
    CHECK(open_error(kData + "/no-such-file.gguf").find("cannot open") != std::string::npos);
    expect_error({}, {"empty"});
    expect_error({'G', 'G'}, {"too small"});
    expect_error({'G', 'G', 'U', 'F', 3, 0, 0, 0}, {"truncated header"});
    expect_error({'G', 'G', 'U', 'X', 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {"magic"});
    expect_error(read_bytes(kData + "/stories260K.bin"), {"magic"});
    expect_error(Raw().header(0, 0, 1).b, {"unsupported GGUF version 1"});
    expect_error(Raw().header(0, 0, 4).b, {"unsupported GGUF version 4"});
    expect_error(Raw().header(0, 0, 0x03000000).b, {"big-endian"});
    expect_error(Raw().header(uint64_t(1) << 63, 0).zeros(64).b, {"tensor count 9223372036854775808", "implausible"});
    expect_error(Raw().header(0, uint64_t(1) << 62).zeros(64).b, {"metadata key count 4611686018427387904"});
    expect_error(Raw().header(0, 1).b, {"metadata key count 1"});

    // Version 2 has the same layout for little-endian files and is read too; so is a file with nothing in it.
    TempDir tmp;
    for (uint32_t version : {2u, 3u}) {
        write_bytes(tmp.path("v.gguf"), Raw().header(0, 0, version).b);
        auto f = GgufFile::open(tmp.path("v.gguf"));
        CHECK(f->version() == version);
        CHECK(f->metadata().empty());
    }
    CHECK(open_error(tmp.dir.string()).find("directory") != std::string::npos);
}

TEST_CASE("gguf: malformed metadata") {
    // A string whose length runs past the end of the file.
    expect_error(Raw().header(0, 1).str("key").u32(8).u64(uint64_t(1) << 60).zeros(16).b,
                 {"string value", "metadata key 'key'", "claims a length of 1152921504606846976"});
    // A key whose own length is huge.
    expect_error(Raw().header(0, 1).u64(~uint64_t(0)).zeros(16).b, {"metadata key", "claims a length"});
    // An array count that cannot fit: rejected before anything is reserved for it.
    expect_error(Raw().header(0, 1).str("arr").u32(9).u32(0).u64(uint64_t(1) << 61).zeros(16).b,
                 {"array of 2305843009213693952 u8 elements", "'arr'", "cannot fit"});
    expect_error(Raw().header(0, 1).str("arr").u32(9).u32(8).u64(1000).zeros(7999).b, {"array of 1000 string"});
    expect_error(Raw().header(0, 1).str("t").u32(13).u32(0).b, {"metadata key 't' has unknown value type 13"});
    expect_error(Raw().header(0, 1).str("t").u32(9).u32(13).u64(0).b, {"unknown array element type 13"});
    expect_error(Raw().header(0, 1).str("").u32(4).u32(0).b, {"empty key"});
    expect_error(Raw().header(0, 2).kv_u32("dup", 1).kv_u32("dup", 2).b, {"duplicate metadata key 'dup'"});
    expect_error(Raw().header(0, 1).str("s").u32(8).u64(10).b, {"truncated", "claims a length of 10"});
    expect_error(Raw().header(0, 1).str("s").u32(8).u32(0).b, {"truncated", "a string value in metadata key 's'"});

    // Arrays nested 17 deep (one empty array at the bottom).
    Raw deep;
    deep.header(0, 1).str("deep").u32(9);
    for (int level = 0; level < 17; ++level) deep.u32(9).u64(1);
    deep.u32(0).u64(0);
    expect_error(deep.b, {"nested"});

    expect_error(Raw().header(0, 1).kv_u32("general.alignment", 0).b, {"general.alignment", "power of two"});
    expect_error(Raw().header(0, 1).kv_u32("general.alignment", 3).b, {"general.alignment", "power of two"});
    expect_error(Raw().header(0, 1).str("general.alignment").u32(10).u64(32).b,
                 {"general.alignment", "has type u64, expected u32"});
}

TEST_CASE("gguf: malformed tensor infos") {
    auto one_tensor = [](std::vector<uint64_t> dims, uint32_t type, uint64_t offset = 0, size_t data = 64) {
        return Raw().header(1, 0).tensor("w", std::move(dims), type, offset).align().zeros(data).b;
    };
    // The baseline is valid, so each failure below is caused by the one field changed.
    {
        TempDir tmp;
        write_bytes(tmp.path("ok.gguf"), one_tensor({16}, 0));
        CHECK(GgufFile::open(tmp.path("ok.gguf"))->tensors().size() == 1);
        write_bytes(tmp.path("ok2.gguf"), two_tensor_file(0, 32));
        CHECK(GgufFile::open(tmp.path("ok2.gguf"))->tensors().size() == 2);
    }
    expect_error(one_tensor({16}, 99), {"tensor 'w' has unknown ggml type 99"});
    expect_error(one_tensor({}, 0), {"tensor 'w' has 0 dimensions"});
    expect_error(one_tensor({1, 1, 1, 1, 1}, 0), {"tensor 'w' has 5 dimensions"});
    expect_error(one_tensor({16, 0}, 0), {"dimension 1 equal to 0"});
    expect_error(one_tensor({uint64_t(1) << 32, uint64_t(1) << 32}, 0), {"overflows"});
    expect_error(one_tensor({uint64_t(1) << 62, 4}, 0), {"overflows"});
    expect_error(one_tensor({uint64_t(1) << 63}, 0), {"too large"});
    // Element count fits, byte count does not: 2^62 f32 elements are 2^64 bytes.
    expect_error(one_tensor({uint64_t(1) << 31, uint64_t(1) << 31}, 0), {"overflows"});
    expect_error(one_tensor({16}, 8), {"tensor 'w'", "q8_0", "not a multiple of the block size 32"});
    expect_error(one_tensor({16}, 0, 64), {"tensor 'w' data [offset 64, 64 bytes] extends past the end of the file"});
    expect_error(one_tensor({16}, 0, ~uint64_t(0) - 31), {"extends past the end"});
    expect_error(one_tensor({16}, 0, 0, 63), {"extends past the end"});
    expect_error(one_tensor({16}, 0, 4), {"offset 4 is not a multiple of the alignment 32"});
    expect_error(Raw().header(1, 0).str("").u32(1).u64(1).u32(0).u64(0).align().zeros(4).b, {"empty name"});
    expect_error(Raw().header(1, 0).str("wwwwwwwwwwwwwwww").u32(1).u64(16).b,
                 {"truncated", "a tensor type in tensor info 0 ('wwwwwwwwwwwwwwww')"});
    expect_error(two_tensor_file(0, 0), {"tensors 'a'", "'b'", "overlap"});
    expect_error(two_tensor_file(0, 32, "b", 16), {"tensors 'a' [offset 0, 64 bytes] and 'b' [offset 32", "overlap"});
    expect_error(two_tensor_file(32, 64, "b", 16), {"tensors 'a' [offset 32, 64 bytes] and 'b' [offset 64", "overlap"});
    expect_error(two_tensor_file(0, 32, "a"), {"duplicate tensor name 'a'"});
    // Alignment from the metadata decides where data starts and which offsets are legal.
    Raw aligned;
    aligned.header(1, 1).kv_u32("general.alignment", 64).tensor("w", {8}, 0, 32).align(64).zeros(128);
    expect_error(aligned.b, {"not a multiple of the alignment 64"});
}

TEST_CASE("gguf: to_string renders scalars and abbreviates arrays") {
    CHECK(scalar_u(GgufValueType::UINT32, 7).to_string() == "7");
    CHECK(scalar_i(GgufValueType::INT8, -3).to_string() == "-3");
    CHECK(scalar_f(GgufValueType::FLOAT32, 1e-5f).to_string() == "1e-05");
    CHECK(scalar_f(GgufValueType::FLOAT64, 0.1).to_string() == "0.1");
    CHECK(scalar_u(GgufValueType::BOOL, 1).to_string() == "true");
    GgufValue s;
    s.type = GgufValueType::STRING;
    s.str = std::string_view("a'b\\\n\x01", 6);  // quote, backslash, newline, control byte
    CHECK(s.to_string() == R"('a\'b\\\n\x01')");
    GgufValue arr = array_of(GgufValueType::UINT8, {scalar_u(GgufValueType::UINT8, 1),
                                                    scalar_u(GgufValueType::UINT8, 2),
                                                    scalar_u(GgufValueType::UINT8, 3)});
    CHECK(arr.to_string(2) == "[u8 \u00d7 3] 1, 2, ...");
    CHECK(arr.to_string(3) == "[u8 \u00d7 3] 1, 2, 3");
    CHECK(arr.to_string(0) == "[u8 \u00d7 3] ...");
}
