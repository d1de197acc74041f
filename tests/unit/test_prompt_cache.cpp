// Tests of the on-disk prompt cache (prompt_cache/prompt_cache.h) and the KvCache rows under it: the rows of CPU
// caches of every KV type and of the emulated CUDA cache round-trip through an entry; a prefix of an entry (the
// common prefix with another prompt) loads, and prefilling the rest gives bitwise the logits of a run from position
// 0 (CUDA: at a multiple of its prefill chunk); sliding-window rings (the gemma3 fixture) save what they hold and
// load only a prefix they can resume at; damaged, truncated, foreign and stale entries are refused with a warning
// and removed; least-recently-used eviction under the cap; a writer running beside readers never shows them a part
// of an entry; a full disk and an unwritable directory are warnings.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <doctest/doctest.h>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/repack_cache.h"
#include "cuda/cuda_backend.h"
#include "model/model.h"
#include "prompt_cache/prompt_cache.h"
#include "test_paths.h"

using namespace tandem;
using namespace tandem::prompt_cache;
namespace fs = std::filesystem;

namespace {

const std::string kArch = std::string(TANDEM_TEST_DATA) + "/arch";

struct TempDir {
    fs::path path;
    TempDir() {
        std::string t = (fs::temp_directory_path() / "tandem-prompt-cache-XXXXXX").string();
        REQUIRE(::mkdtemp(t.data()) != nullptr);
        path = t;
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    std::vector<fs::path> entries() const {
        std::vector<fs::path> out;
        for (const auto& e : fs::directory_iterator(path))
            if (e.path().extension() == ".kv") out.push_back(e.path());
        std::sort(out.begin(), out.end());
        return out;
    }
};

// Warnings collected instead of printed.
struct Warnings {
    std::vector<std::string> lines;
    PromptCache::Warn sink() {
        return [this](const std::string& s) { lines.push_back(s); };
    }
};

std::vector<int> tokens_of(int n, int seed, int n_vocab) {
    std::vector<int> t;
    for (int i = 0; i < n; ++i) t.push_back(3 + (i * 7919 + seed * 104729) % (n_vocab - 3));
    return t;
}

// Feeds tokens (after what the cache holds) in calls of `chunk`; returns the last token's logits.
std::vector<float> feed(Backend& backend, KvCache& cache, std::span<const int> tokens, int n_vocab, int chunk = 16) {
    std::vector<float> logits(static_cast<size_t>(n_vocab));
    for (size_t at = 0; at < tokens.size(); at += static_cast<size_t>(chunk)) {
        const size_t n = std::min(static_cast<size_t>(chunk), tokens.size() - at);
        backend.forward(tokens.subspan(at, n), cache, at + n == tokens.size() ? 1 : 0, logits.data());
    }
    return logits;
}

Key key_for(const std::string& path, const Backend& backend) {
    return {cpu::repack_model_identity(path), backend.kv_signature()};
}

// Every layer's rows of positions [first, first + n) of two caches, equal byte for byte.
bool same_rows(const KvCache& a, const KvCache& b, int first, int n) {
    const KvCache::RowFormat f = a.row_format();
    std::vector<uint8_t> ka(n * f.row_bytes), va(ka.size()), kb(ka.size()), vb(ka.size());
    for (int l = 0; l < f.n_layers; ++l) {
        const int from = std::max({first, a.held_from(l), b.held_from(l)});
        if (from >= first + n) continue;
        a.read_rows(l, from, first + n - from, ka.data(), va.data());
        b.read_rows(l, from, first + n - from, kb.data(), vb.data());
        const size_t bytes = static_cast<size_t>(first + n - from) * f.row_bytes;
        if (std::memcmp(ka.data(), kb.data(), bytes) != 0 || std::memcmp(va.data(), vb.data(), bytes) != 0)
            return false;
    }
    return true;
}

void flip_byte(const fs::path& path, uint64_t offset) {
    const int fd = ::open(path.c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    uint8_t b = 0;
    REQUIRE(::pread(fd, &b, 1, static_cast<off_t>(offset)) == 1);
    b ^= 0x40;
    REQUIRE(::pwrite(fd, &b, 1, static_cast<off_t>(offset)) == 1);
    ::close(fd);
}

}  // namespace

TEST_CASE("prompt cache: CPU caches of every KV type load a saved prompt's prefix and go on bitwise as from 0") {
    const std::string path = kArch + "/qwen3.gguf";  // 2 KV heads of 32: head-major slabs, whole Q8_0 blocks
    const auto model = Model::load(path);
    const int V = model->config.n_vocab;
    for (const CpuKvType type : {CpuKvType::F32, CpuKvType::F16, CpuKvType::Q8_0}) {
        CAPTURE(static_cast<int>(type));
        TempDir dir;
        Warnings w;
        PromptCache pc({.dir = dir.path.string(), .min_tokens = 1}, w.sink());
        CpuBackend backend(*model, 2, 16, {.kv_type = type});
        const Key key = key_for(path, backend);
        const std::vector<int> a = tokens_of(100, 1, V);
        std::vector<int> b(a.begin(), a.begin() + 70);  // shares 70 tokens with a, then goes its own way
        for (const int t : tokens_of(30, 2, V)) b.push_back(t);

        auto cache_a = backend.new_cache(200);
        feed(backend, *cache_a, a, V);
        REQUIRE(pc.store(key, a, *cache_a));
        REQUIRE(dir.entries().size() == 1);

        auto cache_b = backend.new_cache(200);
        const LoadResult r = pc.load_longest_prefix(key, b, *cache_b, static_cast<int>(b.size()) - 1);
        CHECK(r.n_loaded == 70);
        CHECK(cache_b->n_committed() == 70);
        CHECK(r.bytes > 0);
        CHECK(same_rows(*cache_a, *cache_b, 0, 70));
        const std::vector<float> hit = feed(backend, *cache_b, std::span<const int>(b).subspan(70), V);
        auto cold_cache = backend.new_cache(200);
        const std::vector<float> cold = feed(backend, *cold_cache, b, V);
        CHECK(std::memcmp(hit.data(), cold.data(), hit.size() * 4) == 0);
        CHECK(same_rows(*cold_cache, *cache_b, 0, 100));

        // The same prompt again: all but its last token (whose logits are needed); a longer one: all of the entry.
        auto again = backend.new_cache(200);
        CHECK(pc.load_longest_prefix(key, a, *again, 99).n_loaded == 99);
        std::vector<int> longer = a;
        longer.push_back(5);
        auto more = backend.new_cache(200);
        CHECK(pc.load_longest_prefix(key, longer, *more, 100).n_loaded == 100);
        // A cache that holds some of the prompt already (a --batch slot): an entry with more replaces it, one with
        // less leaves it as it was.
        auto kept = backend.new_cache(200);
        feed(backend, *kept, std::span<const int>(b).first(20), V);
        CHECK(pc.load_longest_prefix(key, b, *kept, static_cast<int>(b.size()) - 1, 1, 20).n_loaded == 70);
        CHECK(kept->n_committed() == 70);
        CHECK(same_rows(*cache_a, *kept, 0, 70));
        auto ahead = backend.new_cache(200);
        feed(backend, *ahead, std::span<const int>(b).first(80), V);
        CHECK(pc.load_longest_prefix(key, b, *ahead, static_cast<int>(b.size()) - 1, 1, 80).n_loaded == 0);
        CHECK(ahead->n_committed() == 80);
        // Another model file or backend signature, or a prompt that shares nothing: no entry.
        auto none = backend.new_cache(200);
        CHECK(pc.load_longest_prefix({key.model, key.backend + " other"}, a, *none, 99).n_loaded == 0);
        CHECK(pc.load_longest_prefix({cpu::repack_model_identity(kArch + "/llama3.gguf"), key.backend}, a, *none, 99)
                  .n_loaded == 0);
        CHECK(pc.load_longest_prefix(key, tokens_of(50, 9, V), *none, 49).n_loaded == 0);
        CHECK(none->n_committed() == 0);
        // A KV type is part of the key: an f16 entry is not an f32 cache's.
        CpuBackend other(*model, 2, 16, {.kv_type = type == CpuKvType::F16 ? CpuKvType::F32 : CpuKvType::F16});
        auto other_cache = other.new_cache(200);
        CHECK(pc.load_longest_prefix(key, a, *other_cache, 99).n_loaded == 0);
        CHECK(w.lines.empty());
    }
}

TEST_CASE("prompt cache: the emulated CUDA cache saves and loads rows, resuming at a multiple of its prefill chunk") {
    const std::string path = kArch + "/qwen3.gguf";
    const auto model = Model::load(path);
    const int V = model->config.n_vocab;
    TempDir dir;
    Warnings w;
    PromptCache pc({.dir = dir.path.string(), .min_tokens = 1}, w.sink());
    // Prefill chunks of 16 through the GEMM path (calls over 4 tokens): a loaded prefix must end where a run from 0
    // cuts a chunk, so that the rest is prefilled in the calls that run makes.
    CudaBackend gpu(*model, 200, {16, 4});
    CHECK(gpu.resume_multiple() == 16);
    const Key key = key_for(path, gpu);
    const std::vector<int> a = tokens_of(100, 1, V);
    std::vector<int> b(a.begin(), a.begin() + 70);
    for (const int t : tokens_of(30, 2, V)) b.push_back(t);
    auto cache_a = gpu.new_cache(200);
    feed(gpu, *cache_a, a, V);
    REQUIRE(pc.store(key, a, *cache_a));

    auto cache_b = gpu.new_cache(200);
    const LoadResult r =
        pc.load_longest_prefix(key, b, *cache_b, static_cast<int>(b.size()) - 1, gpu.resume_multiple());
    CHECK(r.n_loaded == 64);
    CHECK(same_rows(*cache_a, *cache_b, 0, 64));
    const std::vector<float> hit = feed(gpu, *cache_b, std::span<const int>(b).subspan(64), V);
    auto cold_cache = gpu.new_cache(200);
    const std::vector<float> cold = feed(gpu, *cold_cache, b, V);
    CHECK(std::memcmp(hit.data(), cold.data(), hit.size() * 4) == 0);

    // The CPU's entry of the same prompt is another key: a CUDA run never loads it, nor the CPU the CUDA's.
    CpuBackend cpu_backend(*model, 2, 16, {.kv_type = CpuKvType::F16});
    auto cpu_cache = cpu_backend.new_cache(200);
    CHECK(pc.load_longest_prefix(key_for(path, cpu_backend), a, *cpu_cache, 99).n_loaded == 0);
    CHECK(w.lines.empty());
}

TEST_CASE("prompt cache: sliding-window rings save what they hold and load only a prefix they can resume at") {
    // gemma3's fixture: windowed layers (window 5) keep rings of 5 + 16 + 128 positions, one global layer keeps all.
    const std::string path = kArch + "/gemma3.gguf";
    const auto model = Model::load(path);
    const int V = model->config.n_vocab;
    TempDir dir;
    Warnings w;
    PromptCache pc({.dir = dir.path.string(), .min_tokens = 1}, w.sink());
    CpuBackend backend(*model, 2, 16, {.kv_type = CpuKvType::F16});
    const Key key = key_for(path, backend);
    const std::vector<int> a = tokens_of(400, 1, V);
    auto cache_a = backend.new_cache(700);
    feed(backend, *cache_a, a, V);
    CHECK(cache_a->held_from(0) > 0);   // a ring
    CHECK(cache_a->held_from(5) == 0);  // the global layer
    REQUIRE(pc.store(key, a, *cache_a));

    for (const int shared : {390, 300}) {
        CAPTURE(shared);
        std::vector<int> b(a.begin(), a.begin() + shared);
        for (const int t : tokens_of(20, 3, V)) b.push_back(t);
        auto cache_b = backend.new_cache(700);
        CHECK(pc.load_longest_prefix(key, b, *cache_b, static_cast<int>(b.size()) - 1).n_loaded == shared);
        const std::vector<float> hit = feed(backend, *cache_b, std::span<const int>(b).subspan(shared), V);
        auto cold_cache = backend.new_cache(700);
        const std::vector<float> cold = feed(backend, *cold_cache, b, V);
        CHECK(std::memcmp(hit.data(), cold.data(), hit.size() * 4) == 0);
        // A rollback as speculative decoding makes, then on: still the cold run's bits.
        cache_b->truncate(cache_b->n_committed() - 3);
        cold_cache->truncate(cold_cache->n_committed() - 3);
        const std::vector<int> tail = tokens_of(4, 4, V);
        CHECK(feed(backend, *cache_b, tail, V) == feed(backend, *cold_cache, tail, V));
        // A cut back below what the load wrote into the rings (a chat re-rendering): the cache resumes only where
        // it holds the window (here at 0, as the loaded positions start at shared - 4), and goes on as from 0.
        auto again = backend.new_cache(700);
        REQUIRE(pc.load_longest_prefix(key, b, *again, static_cast<int>(b.size()) - 1).n_loaded == shared);
        again->truncate(shared - 50);
        const int at = again->n_committed();
        CHECK((at == 0 || at == shared - 50));
        const std::vector<float> resumed = feed(backend, *again, std::span<const int>(b).subspan(at), V);
        CHECK(std::memcmp(resumed.data(), cold.data(), cold.size() * 4) == 0);
    }
    // 100 shared tokens: the rings no longer hold the window before position 100. Not loaded (no warning: the entry
    // is sound, only of no use to this prompt).
    std::vector<int> c(a.begin(), a.begin() + 100);
    for (const int t : tokens_of(20, 3, V)) c.push_back(t);
    auto cache_c = backend.new_cache(700);
    CHECK(pc.load_longest_prefix(key, c, *cache_c, static_cast<int>(c.size()) - 1).n_loaded == 0);
    CHECK(cache_c->n_committed() == 0);
    // A ring that has moved past the prompt (a long answer) holds nothing a load could use: not saved.
    const std::vector<int> d = tokens_of(40, 5, V);
    auto cache_d = backend.new_cache(700);
    feed(backend, *cache_d, d, V);
    feed(backend, *cache_d, tokens_of(300, 6, V), V);
    CHECK_FALSE(pc.store(key, d, *cache_d));
    CHECK(w.lines.empty());
}

TEST_CASE("prompt cache: damaged, truncated, foreign and stale entries are refused with a warning and removed") {
    const std::string path = kArch + "/qwen3.gguf";
    const auto model = Model::load(path);
    const int V = model->config.n_vocab;
    CpuBackend backend(*model, 2, 16, {.kv_type = CpuKvType::F16});
    const Key key = key_for(path, backend);
    const std::vector<int> a = tokens_of(300, 1, V);  // two blocks of positions
    auto cache_a = backend.new_cache(400);
    feed(backend, *cache_a, a, V);

    struct Damage {
        const char* what;
        std::function<void(const fs::path&)> apply;
        const char* warning;  // a word of the expected warning
    };
    const std::vector<Damage> damages = {
        {"a payload byte of the first block", [](const fs::path& p) { flip_byte(p, fs::file_size(p) / 3); },
         "checksum"},
        {"a payload byte of the last block", [](const fs::path& p) { flip_byte(p, fs::file_size(p) - 5); }, "checksum"},
        {"a header byte (a token id)", [](const fs::path& p) { flip_byte(p, 72 + 300); }, "checksum"},
        {"truncated", [](const fs::path& p) { fs::resize_file(p, fs::file_size(p) - 1000); }, "truncated"},
        {"emptied", [](const fs::path& p) { fs::resize_file(p, 0); }, "shorter"},
        {"another format version", [](const fs::path& p) { flip_byte(p, 8); }, "version"},
        {"not an entry", [](const fs::path& p) { flip_byte(p, 0); }, "not a prompt cache entry"},
    };
    for (const Damage& d : damages) {
        CAPTURE(d.what);
        TempDir dir;
        Warnings w;
        PromptCache pc({.dir = dir.path.string(), .min_tokens = 1}, w.sink());
        REQUIRE(pc.store(key, a, *cache_a));
        const fs::path entry = dir.entries().at(0);
        d.apply(entry);
        auto cache = backend.new_cache(400);
        const LoadResult r = pc.load_longest_prefix(key, a, *cache, 299);
        CHECK(r.n_loaded == 0);
        CHECK(cache->n_committed() == 0);
        REQUIRE(w.lines.size() == 1);
        CHECK(w.lines[0].find(d.warning) != std::string::npos);
        CHECK(w.lines[0].find(entry.string()) != std::string::npos);
        CHECK_FALSE(fs::exists(entry));
        // The run goes on: a prefill from empty, and the next save makes a sound entry again.
        feed(backend, *cache, a, V);
        CHECK(pc.store(key, a, *cache));
        auto again = backend.new_cache(400);
        CHECK(pc.load_longest_prefix(key, a, *again, 299).n_loaded == 299);
    }

    // An entry of another key under this key's file name (a foreign file renamed, a hash collision): refused too.
    TempDir dir;
    Warnings w;
    PromptCache pc({.dir = dir.path.string(), .min_tokens = 1}, w.sink());
    const Key other{key.model, "another backend"};
    REQUIRE(pc.store(other, a, *cache_a));
    REQUIRE(pc.store(key, a, *cache_a));
    REQUIRE(dir.entries().size() == 2);
    const KvCache::RowFormat f = cache_a->row_format();
    fs::path ours, theirs;
    for (const fs::path& p : dir.entries()) {
        const int fd = ::open(p.c_str(), O_RDONLY);
        const EntryHeader h = read_entry_header(fd, fs::file_size(p));
        ::close(fd);
        (h.key == key_text(key, f.type, f.n_layers, f.row_bytes) ? ours : theirs) = p;
    }
    REQUIRE(!ours.empty());
    REQUIRE(!theirs.empty());
    fs::copy_file(theirs, ours, fs::copy_options::overwrite_existing);
    auto cache = backend.new_cache(400);
    CHECK(pc.load_longest_prefix(key, a, *cache, 299).n_loaded == 0);
    REQUIRE(w.lines.size() == 1);
    CHECK(w.lines[0].find("another model or backend") != std::string::npos);
    CHECK_FALSE(fs::exists(ours));
    CHECK(pc.load_longest_prefix(other, a, *cache, 299).n_loaded == 299);  // the other key's entry is untouched
}

TEST_CASE("prompt cache: the least recently used entries go first when the cap is reached") {
    const std::string path = kArch + "/qwen3.gguf";
    const auto model = Model::load(path);
    const int V = model->config.n_vocab;
    CpuBackend backend(*model, 2, 16, {.kv_type = CpuKvType::F16});
    const Key key = key_for(path, backend);
    TempDir probe_dir;
    PromptCache probe({.dir = probe_dir.path.string(), .min_tokens = 1});
    std::vector<std::vector<int>> prompts;
    std::vector<std::unique_ptr<KvCache>> caches;
    for (int i = 0; i < 3; ++i) {
        prompts.push_back(tokens_of(60, 10 + i, V));
        caches.push_back(backend.new_cache(100));
        feed(backend, *caches.back(), prompts.back(), V);
    }
    REQUIRE(probe.store(key, prompts[0], *caches[0]));
    const uint64_t entry_bytes = probe.usage().bytes;

    TempDir dir;
    Warnings w;
    PromptCache pc({.dir = dir.path.string(), .max_bytes = entry_bytes * 5 / 2, .min_tokens = 1}, w.sink());
    const auto entry_of = [&](int i) {  // the file holding prompt i
        for (const fs::path& p : dir.entries()) {
            const int fd = ::open(p.c_str(), O_RDONLY);
            const EntryHeader h = read_entry_header(fd, fs::file_size(p));
            ::close(fd);
            if (h.tokens == prompts[static_cast<size_t>(i)]) return p;
        }
        return fs::path();
    };
    const auto age = [&](int i, int seconds_ago) {  // mtime is what "recently used" is read from
        const struct timespec now = {::time(nullptr) - seconds_ago, 0};
        const struct timespec times[2] = {now, now};
        REQUIRE(::utimensat(AT_FDCWD, entry_of(i).c_str(), times, 0) == 0);
    };
    REQUIRE(pc.store(key, prompts[0], *caches[0]));
    age(0, 100);
    REQUIRE(pc.store(key, prompts[1], *caches[1]));
    age(1, 50);
    // A load of prompt 0 makes it the most recently used: prompt 1's entry is the one evicted for prompt 2's.
    auto c = backend.new_cache(100);
    REQUIRE(pc.load_longest_prefix(key, prompts[0], *c, 59).n_loaded == 59);
    REQUIRE(pc.store(key, prompts[2], *caches[2]));
    CHECK(dir.entries().size() == 2);
    CHECK_FALSE(entry_of(0).empty());
    CHECK(entry_of(1).empty());
    CHECK_FALSE(entry_of(2).empty());
    CHECK(pc.usage().bytes <= entry_bytes * 5 / 2);
    // An entry larger than the cap is not saved at all (quietly: nothing is wrong).
    PromptCache tiny({.dir = dir.path.string(), .max_bytes = entry_bytes / 2, .min_tokens = 1}, w.sink());
    CHECK_FALSE(tiny.store(key, prompts[1], *caches[1]));
    CHECK(dir.entries().size() == 2);
    // An entry of the same key whose tokens the new one extends is replaced by it.
    std::vector<int> extended = prompts[2];
    for (const int t : tokens_of(20, 7, V)) extended.push_back(t);
    feed(backend, *caches[2], std::span<const int>(extended).subspan(60), V);
    REQUIRE(pc.store(key, extended, *caches[2]));
    CHECK(entry_of(2).empty());
    CHECK(w.lines.empty());
}

TEST_CASE("prompt cache: a writer beside readers never shows them part of an entry") {
    const std::string path = kArch + "/qwen3.gguf";
    const auto model = Model::load(path);
    const int V = model->config.n_vocab;
    CpuBackend backend(*model, 2, 16, {.kv_type = CpuKvType::F16});
    const Key key = key_for(path, backend);
    const std::vector<int> a = tokens_of(250, 1, V);
    auto cache_a = backend.new_cache(300);
    feed(backend, *cache_a, a, V);
    TempDir dir;
    Warnings writer_warnings, reader_warnings;
    std::atomic<bool> done{false};
    std::thread writer([&] {
        PromptCache pc({.dir = dir.path.string(), .min_tokens = 1}, writer_warnings.sink());
        for (int i = 0; i < 40; ++i) pc.store(key, a, *cache_a);  // each a new file renamed over the last
        done = true;
    });
    PromptCache pc({.dir = dir.path.string(), .min_tokens = 1}, reader_warnings.sink());
    int loads = 0, hits = 0;
    while (!done || loads < 10) {
        auto cache = backend.new_cache(300);
        const int n = pc.load_longest_prefix(key, a, *cache, 249).n_loaded;
        ++loads;
        if (n == 0) continue;
        ++hits;
        REQUIRE(n == 249);
        REQUIRE(same_rows(*cache_a, *cache, 0, 249));
    }
    writer.join();
    MESSAGE(loads << " loads beside the writer, " << hits << " hits");
    CHECK(hits > 0);
    CHECK(reader_warnings.lines.empty());
    CHECK(writer_warnings.lines.empty());
    // No temporary left behind.
    for (const auto& e : fs::directory_iterator(dir.path)) CHECK(e.path().extension() == ".kv");
}

TEST_CASE("prompt cache: a full disk and an unwritable directory are warnings, and nothing is left half written") {
    const std::string path = kArch + "/qwen3.gguf";
    const auto model = Model::load(path);
    const int V = model->config.n_vocab;
    CpuBackend backend(*model, 2, 16, {.kv_type = CpuKvType::F16});
    const Key key = key_for(path, backend);
    const std::vector<int> a = tokens_of(100, 1, V);
    auto cache_a = backend.new_cache(200);
    feed(backend, *cache_a, a, V);

    Warnings w;
    PromptCache nowhere({.dir = "/proc/self/no-such-dir/prompts", .min_tokens = 1}, w.sink());
    CHECK_FALSE(nowhere.store(key, a, *cache_a));
    REQUIRE(w.lines.size() == 1);
    CHECK(w.lines[0].find("cannot create") != std::string::npos);
    auto cache = backend.new_cache(200);
    CHECK(nowhere.load_longest_prefix(key, a, *cache, 99).n_loaded == 0);

    // A full disk, as a file size limit makes it: reserving the entry's space fails (EFBIG), the temporary goes.
    TempDir dir;
    PromptCache pc({.dir = dir.path.string(), .min_tokens = 1}, w.sink());
    struct rlimit old_limit {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
    struct sigaction ignore {
    }, old_action{};
    ignore.sa_handler = SIG_IGN;
    REQUIRE(::sigaction(SIGXFSZ, &ignore, &old_action) == 0);
    struct rlimit small = old_limit;
    small.rlim_cur = 4096;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    const bool stored = pc.store(key, a, *cache_a);
    ::setrlimit(RLIMIT_FSIZE, &old_limit);
    ::sigaction(SIGXFSZ, &old_action, nullptr);
    CHECK_FALSE(stored);
    REQUIRE(w.lines.size() == 2);
    CHECK(w.lines[1].find("cannot save") != std::string::npos);
    CHECK(fs::is_empty(dir.path));
}
