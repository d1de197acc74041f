// Fuzz target: a prompt cache entry file (src/prompt_cache/prompt_cache.h) as a run finds it in its cache directory,
// under the name its key looks for. The input is the file's bytes, arbitrary. Loaded into a small in-memory KvCache
// (3 layers of 4-byte rows, the last a sliding-window "ring" of window 6 that needs only its window's positions).
// Properties:
// (Inputs with byte 12 odd get their checksums made right first: fixed_up.)
//   - read_entry_header either throws tandem::Error or gives a header whose sizes add up to the file's;
//   - load_longest_prefix never throws, and either loads m positions, m within [1, the prompt's length - 1], of an
//     entry whose tokens are the prompt's first m and whose rows (every layer, from the positions the cache needs)
//     are the ones written into the cache, with no warning; or loads nothing with the cache left empty, having removed
//     the file with exactly one warning when it is damaged (and quietly kept a sound entry of no use to the prompt).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "backend.h"
#include "cpu/repack_cache.h"
#include "error.h"
#include "fuzz_target.h"
#include "prompt_cache/prompt_cache.h"

namespace {

using tandem::KvCache;
using tandem::fuzz::fail;
namespace pc = tandem::prompt_cache;

constexpr int kLayers = 3, kRowBytes = 4, kCapacity = 1024, kWindow = 6;

// Rows in host vectors; layer 2 counts as a ring that needs only its window (its storage keeps every position).
class FuzzCache : public KvCache {
public:
    FuzzCache() : KvCache(kCapacity) {
        for (auto* v : {&k_, &v_}) v->assign(static_cast<size_t>(kLayers * kCapacity * kRowBytes), 0);
        written_.assign(static_cast<size_t>(kLayers * kCapacity), 0);
    }
    RowFormat row_format() const override { return {"f16", kLayers, kRowBytes}; }
    int held_from(int layer) const override { return layer == 2 ? held_from_ring_ : 0; }
    int needed_from(int layer, int n) const override { return layer == 2 ? std::max(0, n - kWindow + 1) : 0; }
    void read_rows(int layer, int first, int n, uint8_t* keys, uint8_t* values) const override {
        std::memcpy(keys, &k_[at(layer, first)], static_cast<size_t>(n * kRowBytes));
        std::memcpy(values, &v_[at(layer, first)], static_cast<size_t>(n * kRowBytes));
    }
    void write_rows(int layer, int first, int n, const uint8_t* keys, const uint8_t* values) override {
        if (n_committed() != 0 || first < 0 || n < 0 || first + n > kCapacity) fail("write_rows out of its contract");
        std::memcpy(&k_[at(layer, first)], keys, static_cast<size_t>(n * kRowBytes));
        std::memcpy(&v_[at(layer, first)], values, static_cast<size_t>(n * kRowBytes));
        for (int p = first; p < first + n; ++p) written_[static_cast<size_t>(layer * kCapacity + p)] = 1;
    }
    // Fills positions [0, n) with a pattern of `seed` and commits them, as a prefill would.
    void fill(int n, int seed, int ring_from = 0) {
        for (int l = 0; l < kLayers; ++l)
            for (int p = 0; p < n * kRowBytes; ++p) {
                k_[at(l, 0) + static_cast<size_t>(p)] = static_cast<uint8_t>(p * 7 + l + seed);
                v_[at(l, 0) + static_cast<size_t>(p)] = static_cast<uint8_t>(p * 13 + l + seed);
            }
        commit_appended(n);
        held_from_ring_ = ring_from;
    }
    bool wrote(int layer, int pos) const { return written_[static_cast<size_t>(layer * kCapacity + pos)] != 0; }
    const uint8_t* key(int layer, int pos) const { return &k_[at(layer, pos)]; }
    const uint8_t* value(int layer, int pos) const { return &v_[at(layer, pos)]; }

private:
    static size_t at(int layer, int pos) { return static_cast<size_t>((layer * kCapacity + pos) * kRowBytes); }
    std::vector<uint8_t> k_, v_, written_;
    int held_from_ring_ = 0;
};

const pc::Key kKey{"model 1 2.3 4 5 /fuzz/model.gguf\n", "cpu"};

std::vector<int> prompt_tokens() {
    std::vector<int> t;
    for (int i = 0; i < 600; ++i) t.push_back((i * 37) % 1000);
    return t;
}

const std::string& cache_dir() {
    static const std::string dir = [] {
        char t[] = "/tmp/tandem-fuzz-prompt-cache-XXXXXX";
        if (!::mkdtemp(t)) fail("mkdtemp failed");
        return std::string(t);
    }();
    return dir;
}

// The file name a lookup with kKey reads (any tokens' hash will do: the tokens inside are what count).
std::string entry_path() {
    const std::string text = pc::key_text(kKey, "f16", kLayers, kRowBytes);
    return cache_dir() + "/" + pc::entry_file_name(text, std::vector<int>{1});
}

// Checksums stop almost every mutation at the header's. An input whose reserved byte 12 is odd gets its header
// checksum made right (and with bit 1 set, its blocks' checksums too), so that the fields behind them are fuzzed:
// the layout, the tokens, the first positions and the payload's way into the cache.
std::string fixed_up(const uint8_t* data, size_t size) {
    std::string b(reinterpret_cast<const char*>(data), size);
    if (size < 72 || (data[12] & 1) == 0) return b;
    auto* p = reinterpret_cast<uint8_t*>(b.data());
    const auto u64 = [&](size_t at) {
        uint64_t v;
        std::memcpy(&v, p + at, 8);
        return v;
    };
    const auto seal = [&] {
        const uint64_t hb = u64(16);
        if (hb < 8 || hb > size) return;
        const uint64_t sum = tandem::cpu::repack_checksum(p, hb - 8);
        std::memcpy(p + hb - 8, &sum, 8);
    };
    seal();
    if ((data[12] & 2) == 0) return b;
    tandem::fuzz::MemoryFile file(p, size);
    const int fd = ::open(file.path().c_str(), O_RDONLY);
    try {
        const pc::EntryHeader h = pc::read_entry_header(fd, size);
        size_t sums_at = 72 + h.key.size() + 4 * h.tokens.size() + 4 * h.firsts.size(), at = h.header_bytes;
        for (size_t blk = 0; blk < h.block_sums.size(); ++blk, sums_at += 8) {
            uint64_t bytes = 0;
            for (const int first : h.firsts) {
                const int lo = std::max(first, static_cast<int>(blk) * pc::kBlockPositions);
                const int hi =
                    std::min(static_cast<int>(h.tokens.size()), static_cast<int>(blk + 1) * pc::kBlockPositions);
                if (hi > lo) bytes += 2 * h.row_bytes * static_cast<uint64_t>(hi - lo);
            }
            const uint64_t sum = tandem::cpu::repack_checksum(p + at, bytes);
            std::memcpy(p + sums_at, &sum, 8);
            at += bytes;
        }
        seal();
    } catch (const tandem::Error&) {
    }
    ::close(fd);
    return b;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* input, size_t size) {
    const std::string bytes = fixed_up(input, size);
    const uint8_t* data = reinterpret_cast<const uint8_t*>(bytes.data());
    const std::string path = entry_path();
    {
        const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || (size > 0 && ::write(fd, data, size) != static_cast<ssize_t>(size))) fail("cannot write input");
        ::close(fd);
    }
    // The header reader alone.
    std::optional<pc::EntryHeader> header;
    {
        const int fd = ::open(path.c_str(), O_RDONLY);
        try {
            header = pc::read_entry_header(fd, size);
            if (header->header_bytes + header->payload_bytes != size) fail("a header whose sizes miss the file's");
            if (header->tokens.empty() || static_cast<int>(header->firsts.size()) != header->n_layers)
                fail("a header without tokens or a first position per layer");
        } catch (const tandem::Error&) {
        }
        ::close(fd);
    }
    // A run's lookup.
    const std::vector<int> prompt = prompt_tokens();
    std::vector<std::string> warnings;
    pc::PromptCache cache({.dir = cache_dir(), .min_tokens = 1}, [&](const std::string& w) { warnings.push_back(w); });
    FuzzCache kv;
    pc::LoadResult r;
    try {
        r = cache.load_longest_prefix(kKey, prompt, kv, static_cast<int>(prompt.size()) - 1);
    } catch (const std::exception& e) {
        fail(std::string("load_longest_prefix threw: ") + e.what());
    }
    struct stat st {};
    const bool still_there = ::stat(path.c_str(), &st) == 0;
    if (r.n_loaded > 0) {
        if (!header || !warnings.empty()) fail("a load from an entry the header reader refused, or with a warning");
        if (r.n_loaded >= static_cast<int>(prompt.size()) || kv.n_committed() != r.n_loaded) fail("loaded count");
        for (int p = 0; p < r.n_loaded; ++p)
            if (header->tokens.at(static_cast<size_t>(p)) != prompt[static_cast<size_t>(p)]) fail("wrong tokens");
        for (int l = 0; l < kLayers; ++l)
            for (int p = kv.needed_from(l, r.n_loaded); p < r.n_loaded; ++p)
                if (!kv.wrote(l, p)) fail("a needed position not loaded");
        if (!still_there) fail("a loaded entry was removed");
    } else {
        if (kv.n_committed() != 0) fail("nothing loaded, but the cache holds positions");
        if (warnings.size() > 1) fail("more than one warning for one file");
        if (warnings.size() == 1 && still_there) fail("a refused entry was kept");
        if (warnings.empty() && !still_there) fail("an entry removed without a warning");
    }
    ::unlink(path.c_str());
    return 0;
}

namespace tandem::fuzz {

// Sound entries made by PromptCache::store: a prompt's prefix, one that the prompt extends, one with a ring that
// holds only the last positions, and one another prompt's (no use: kept).
std::vector<std::pair<std::string, std::string>> fuzz_seeds() {
    std::vector<std::pair<std::string, std::string>> seeds;
    const auto seed_of = [&](const std::string& name, std::vector<int> tokens, int ring_from) {
        const std::string dir = cache_dir() + "/seed";
        pc::PromptCache cache({.dir = dir, .min_tokens = 1});
        FuzzCache kv;
        kv.fill(static_cast<int>(tokens.size()), static_cast<int>(seeds.size()), ring_from);
        if (!cache.store(kKey, tokens, kv)) fail("seed " + name + " not stored");
        const std::string text = pc::key_text(kKey, "f16", kLayers, kRowBytes);
        const std::string file = dir + "/" + pc::entry_file_name(text, tokens);
        seeds.push_back({name, read_file(file)});
        ::unlink(file.c_str());
        ::rmdir(dir.c_str());
    };
    const std::vector<int> p = prompt_tokens();
    seed_of("prefix-300", std::vector<int>(p.begin(), p.begin() + 300), 0);
    std::vector<int> longer = p;
    longer.push_back(5);
    seed_of("whole-and-more", longer, 0);
    seed_of("ring", std::vector<int>(p.begin(), p.begin() + 520), 400);
    std::vector<int> other(p.begin(), p.begin() + 40);
    other[0] = 999;
    seed_of("other-prompt", other, 0);
    // The same entries with the fix-up bits set (their checksums stay right; mutations of them get fixed).
    const size_t n = seeds.size();
    for (size_t i = 0; i < n; ++i) {
        std::string b = seeds[i].second;
        b[12] = 3;
        seeds.push_back({seeds[i].first + "-fixed-up", b});
    }
    return seeds;
}

}  // namespace tandem::fuzz
