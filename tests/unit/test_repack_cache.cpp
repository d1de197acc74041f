// Tests of the repacked-weights cache (cpu/repack_cache.h, RepackedWeights with a RepackCacheSpec): the checksum;
// a cache file's round trip and every way a file is refused (another description or size, truncation, a damaged
// header, no commit); a second RepackedWeights maps the copies the first one made, and they compute the bits the
// file's layout does; a damaged payload is caught by its checksum before use, the file removed and the file's layout
// used; a changed model file is a miss and its stale cache file is removed; a run that ends before the copies are
// made finishes the file for the next one (a killed one leaves a temporary that the next clean-up removes). The
// RepackedWeights cases are skipped (with a message) on a CPU without the kernels.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/matmul.h"
#include "cpu/repack.h"
#include "cpu/repack_cache.h"
#include "cpu/thread_pool.h"
#include "random_blocks.h"
#include "model/weights.h"

using namespace tandem;
using namespace tandem::cpu;
using namespace tandem::test;
namespace fs = std::filesystem;

namespace {

struct TempDir {
    fs::path path;
    TempDir() {
        std::string t = (fs::temp_directory_path() / "tandem-repack-cache-XXXXXX").string();
        REQUIRE(::mkdtemp(t.data()) != nullptr);
        path = t;
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    std::vector<std::string> files() const {
        std::vector<std::string> names;
        for (const auto& e : fs::directory_iterator(path)) names.push_back(e.path().filename().string());
        std::sort(names.begin(), names.end());
        return names;
    }
};

// A "model file": matrices of the repacked types one after another, mapped read-only as a GGUF is. Its name has a
// space: the cache's clean-up reads the model path back from a file's description, and once cut it at the space
// (every other model's cache file was then removed as stale).
struct ModelFile {
    std::string path;
    std::vector<WeightView> views;
    const uint8_t* base = nullptr;
    size_t size = 0;
    static constexpr int kRows = 40, kCols = 512;
    ModelFile(const fs::path& dir, const std::vector<GgmlType>& types) : path((dir / "my model.gguf").string()) {
        std::mt19937 rng(11);
        std::vector<uint8_t> bytes;
        std::vector<size_t> offsets;
        for (GgmlType t : types) {
            bytes.resize((bytes.size() + 63) / 64 * 64);
            offsets.push_back(bytes.size());
            const std::vector<uint8_t> m = random_weight_rows(t, kRows, kCols, rng);
            bytes.insert(bytes.end(), m.begin(), m.end());
        }
        std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
        const int fd = ::open(path.c_str(), O_RDONLY);
        REQUIRE(fd >= 0);
        size = bytes.size();
        void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
        ::close(fd);
        REQUIRE(map != MAP_FAILED);
        base = static_cast<const uint8_t*>(map);
        for (size_t i = 0; i < types.size(); ++i)
            views.push_back(WeightView{base + offsets[i], types[i], kCols, kRows});
    }
    ~ModelFile() { ::munmap(const_cast<uint8_t*>(base), size); }
    std::vector<const WeightView*> ptrs() const {
        std::vector<const WeightView*> p;
        for (const WeightView& v : views) p.push_back(&v);
        return p;
    }
    RepackCacheSpec spec(const fs::path& dir) const { return {dir.string(), path, base}; }
};

std::vector<GgmlType> available_types() {
    std::vector<GgmlType> types;
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0})
        if (RepackedMatrix::available(t)) types.push_back(t);
    return types;
}

// matmul through the copy equals matmul in the file's layout, bit for bit.
void check_same_bits(const WeightView& v, const RepackedMatrix& R) {
    ThreadPool pool(2);
    std::vector<float> x(static_cast<size_t>(v.cols) * 3);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.29f * static_cast<float>(i));
    std::vector<float> want(static_cast<size_t>(v.rows) * 3), got(want.size());
    matmul(v.type, v.data, v.cols, v.rows, x.data(), 3, want.data(), pool, Activations::Int8);
    matmul(R, x.data(), 3, got.data(), pool);
    CHECK(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0);
}

// A model file of every type with a repacked kernel here, and a cache directory beside it.
struct CacheFixture {
    TempDir dir;
    fs::path cache = dir.path / "cache";
    ModelFile model{dir.path, available_types()};
    RepackedWeights weights(std::optional<GgmlType> requantize_to = std::nullopt,
                            std::function<void(const WeightView&)> release = [](const WeightView&) {}) const {
        return RepackedWeights(model.ptrs(), std::move(release), requantize_to, false, model.spec(cache));
    }
    // A first run's cache file, complete: its path.
    fs::path make_file() const {
        {
            RepackedWeights first = weights();
            first.wait();
        }
        return fs::directory_iterator(cache)->path();
    }
};

bool skip_without_kernels() {
    if (!available_types().empty()) return false;
    MESSAGE("no repacked kernel on this build or CPU, not checked");
    return true;
}

}  // namespace

TEST_CASE("repack cache: the checksum sees every byte, at every length") {
    std::vector<uint8_t> a(300);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 37 + 5);
    for (size_t n = 0; n <= 70; ++n) {
        CAPTURE(n);
        const uint64_t sum = repack_checksum(a.data(), n);
        if (n > 0) CHECK(sum != repack_checksum(a.data(), n - 1));  // the length counts
        for (size_t i = 0; i < n; ++i) {
            a[i] ^= 0x10;
            CHECK(repack_checksum(a.data(), n) != sum);
            a[i] ^= 0x10;
        }
        CHECK(repack_checksum(a.data(), n) == sum);
    }
}

TEST_CASE("repack cache: a committed file opens only under its own description and size, and whole") {
    TempDir dir;
    const std::string d = dir.path.string(), description = "model 1 2.3 4 5 /x\nmatrix 0 q4_0 q4_0 64 16\n";
    constexpr size_t kPayload = 3 * 4096 + 64;
    {
        auto f = RepackCacheFile::create(d, "m", description, kPayload, 2);
        REQUIRE(f);
        for (size_t i = 0; i < kPayload; ++i) f->payload()[i] = static_cast<uint8_t>(i * 7);
        f->set_checksum(0, 111);
        f->set_checksum(1, 222);
        CHECK(dir.files().size() == 1);  // the temporary
        CHECK(dir.files()[0][0] == '.');
        REQUIRE(f->commit());
    }
    REQUIRE(dir.files().size() == 1);
    const fs::path file = dir.path / dir.files()[0];
    CHECK(file.extension() == ".repack");
    {
        auto f = RepackCacheFile::open(d, "m", description, kPayload, 2);
        REQUIRE(f);
        CHECK(f->opened());
        CHECK(f->checksum(0) == 111);
        CHECK(f->checksum(1) == 222);
        bool same = true;
        for (size_t i = 0; i < kPayload; ++i) same = same && f->payload()[i] == static_cast<uint8_t>(i * 7);
        CHECK(same);
    }
    CHECK_FALSE(RepackCacheFile::open(d, "m", description + "matrix 9\n", kPayload, 2));
    CHECK_FALSE(RepackCacheFile::open(d, "m", description, kPayload + 64, 2));
    CHECK_FALSE(RepackCacheFile::open(d, "m", description, kPayload, 3));
    // A damaged header (its own checksum) and a truncated file are refused.
    const auto size = fs::file_size(file);
    {
        std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
        io.seekp(50);
        io.put('#');
    }
    CHECK_FALSE(RepackCacheFile::open(d, "m", description, kPayload, 2));
    fs::resize_file(file, size - 64);
    CHECK_FALSE(RepackCacheFile::open(d, "m", description, kPayload, 2));
    // A file never committed leaves nothing behind.
    fs::remove(file);
    { auto f = RepackCacheFile::create(d, "m", description, kPayload, 2); }
    CHECK(dir.files().empty());
}

TEST_CASE("repack cache: the next RepackedWeights maps the copies the first made, and they compute the same bits") {
    if (skip_without_kernels()) return;
    const CacheFixture f;
    const ModelFile& model = f.model;
    std::vector<std::vector<uint8_t>> made;  // the first run's copies
    {
        RepackedWeights first = f.weights();
        CHECK_FALSE(first.from_cache());
        CHECK(first.describe().find("a new cache file") == 0);
        first.wait();
        for (const WeightView& v : model.views) {
            const RepackedMatrix* R = first.find(v.data);
            REQUIRE(R);
            made.emplace_back(R->data(), R->data() + R->bytes());
        }
    }
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(f.cache)) files.push_back(e.path().filename().string());
    REQUIRE(files.size() == 1);
    CHECK(files[0].rfind("my model-", 0) == 0);
    int released = 0;
    RepackedWeights second = f.weights(std::nullopt, [&](const WeightView&) { ++released; });
    CHECK(second.from_cache());
    CHECK(second.describe().find("the cache file") == 0);
    second.wait();
    CHECK(released == static_cast<int>(model.views.size()));
    for (size_t i = 0; i < model.views.size(); ++i) {
        CAPTURE(std::string(ggml_type_name(model.views[i].type)));
        const RepackedMatrix* R = second.find(model.views[i].data);
        REQUIRE(R);
        REQUIRE(R->bytes() == made[i].size());
        CHECK(std::memcmp(R->data(), made[i].data(), made[i].size()) == 0);
        check_same_bits(model.views[i], *R);
    }
    // Requantized copies (a draft's) are another file.
    if (RepackedMatrix::available(GgmlType::Q4_0)) {
        RepackedWeights draft = f.weights(GgmlType::Q4_0);
        CHECK_FALSE(draft.from_cache());
        draft.wait();
    }
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(f.cache)) n += e.path().extension() == ".repack";
    CHECK(n == (RepackedMatrix::available(GgmlType::Q4_0) ? 2u : 1u));
}

TEST_CASE("repack cache: a damaged copy is caught before use, the file removed and the file's layout serves") {
    if (skip_without_kernels()) return;
    const CacheFixture f;
    const fs::path file = f.make_file();
    // One byte of the last bytes of the file: the smallest copy's (the copies are largest first).
    const auto size = fs::file_size(file);
    {
        std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
        io.seekg(static_cast<std::streamoff>(size - 100));
        const char c = static_cast<char>(io.get());
        io.seekp(static_cast<std::streamoff>(size - 100));
        io.put(static_cast<char>(c ^ 1));
    }
    {
        RepackedWeights damaged = f.weights();
        CHECK(damaged.from_cache());
        damaged.wait();
        int published = 0;
        for (const WeightView& v : f.model.views) {
            const RepackedMatrix* R = damaged.find(v.data);
            if (R) check_same_bits(v, *R);  // only checked copies are published
            published += R != nullptr;
        }
        CHECK(published < static_cast<int>(f.model.views.size()));
        CHECK_FALSE(fs::exists(file));
    }
    RepackedWeights again = f.weights();
    CHECK_FALSE(again.from_cache());  // made anew
}

TEST_CASE("repack cache: a changed model file misses, its stale file is removed, a short run finishes the file") {
    if (skip_without_kernels()) return;
    const CacheFixture f;
    const fs::path old_file = f.make_file();
    // The model file "changes" (a new modification time), and a dead process left a temporary behind.
    fs::last_write_time(f.model.path, fs::last_write_time(f.model.path) - std::chrono::hours(1));
    std::ofstream(f.cache / ".my model-0.repack.999999999.tmp") << "x";
    {
        RepackedWeights changed = f.weights();
        CHECK_FALSE(changed.from_cache());
        CHECK_FALSE(fs::exists(old_file));
        CHECK_FALSE(fs::exists(f.cache / ".my model-0.repack.999999999.tmp"));
        changed.wait();
    }
    CHECK(std::distance(fs::directory_iterator(f.cache), fs::directory_iterator()) == 1);
    // Destroyed before any copy is made (a prefill pass elsewhere holds the background thread until just before): the
    // new file is finished, not dropped, and the next one maps it.
    fs::remove_all(f.cache);
    {
        RepackedWeights other_backend({}, [](const WeightView&) {});
        other_backend.begin_forward(/*prefill=*/true);
        auto early = std::make_unique<RepackedWeights>(f.model.ptrs(), [](const WeightView&) {}, std::nullopt, false,
                                                       f.model.spec(f.cache));
        CHECK_FALSE(early->from_cache());
        other_backend.end_forward(/*prefill=*/true);
        early.reset();
    }
    RepackedWeights next = f.weights();
    CHECK(next.from_cache());
}
