// PromptCache: a prompt's keys and values kept on disk between runs, so that a later run whose prompt starts with a
// saved one loads those positions instead of computing them (tandem's --prompt-cache; docs/prompt-cache.md).
//
// What is exact. The keys and values of positions < m depend only on the tokens < m (attention is causal), so an
// entry saved for "document + question 1" holds, in its first m positions, exactly what a run of "document +
// question 2" computes for them, m being the two prompts' common prefix: loading them and prefilling the rest gives
// the same bits as prefilling everything, provided the same model file and the same numerics made them. The key
// says so: the model file's identity (cpu::repack_model_identity), the backend's KvCache signature
// (Backend::kv_signature: the CPU's bits do not depend on threads, instruction set or chunking; CUDA's prefill calls
// do, hence Backend::resume_multiple), and the cache's row format (KV type, layers, row bytes). A sliding-window
// layer (a ring) keeps only its last positions: an entry holds what the ring held, and serves a prefix only where
// that covers the window before it (KvCache::needed_from).
//
// What is safe. An entry is written under a temporary name (space reserved first with fallocate where the
// filesystem has it, so a full disk fails the write, never the reader) and renamed into place whole; its header
// and each block of positions carry checksums that a load checks before it uses them. A damaged, truncated, foreign
// or stale entry is removed with a one-line warning and the run prefills as without a cache; an unwritable
// directory or a full disk gives a warning and the run goes on. Entries beyond the size cap are evicted least
// recently used first (a load counts as a use).
//
// The API is the CLI's (src/app/prompt_cache_glue) and meant for any runner of prompts (--batch): look up and load
// before prefill, save after.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace tandem {
class KvCache;
}

namespace tandem::prompt_cache {

// Defaults: why these values is in docs/prompt-cache.md.
constexpr uint64_t kDefaultMaxBytes = uint64_t{2} << 30;  // 2 GiB
constexpr int kDefaultMinTokens = 256;
// Positions per checksummed block of an entry: a load reads and checks only the blocks of the prefix it loads.
constexpr int kBlockPositions = 256;

struct Options {
    std::string dir;                        // where entries live; "" turns the cache off
    uint64_t max_bytes = kDefaultMaxBytes;  // all entries together, at most; the least recently used go first
    int min_tokens = kDefaultMinTokens;     // prompts shorter than this are neither looked up nor saved
};

// What decides a cache's keys and values besides the tokens (the file comment). Each model (a target, a draft) has
// its own.
struct Key {
    std::string model;    // cpu::repack_model_identity of the model file ("" = unidentifiable: no caching)
    std::string backend;  // Backend::kv_signature()
};

struct LoadResult {
    int n_loaded = 0;    // positions now in the cache (0: no usable entry)
    uint64_t bytes = 0;  // entry bytes read for them (header and the blocks loaded)
    double seconds = 0;  // lookup and load, wall time
    std::string path;    // the entry loaded from
};

// One entry's header as read back and checked (read_entry_header); exposed for tests and the fuzz target.
struct EntryHeader {
    std::string key;          // the full key text (key_text)
    std::vector<int> tokens;  // positions [0, n) were computed from these
    int n_layers = 0;
    uint64_t row_bytes = 0;
    std::vector<int> firsts;  // [layer]: its first stored position (0 but for a ring)
    uint64_t header_bytes = 0, payload_bytes = 0;
    std::vector<uint64_t> block_sums;  // [block]: checksum of its bytes in the payload
};

// Reads and checks the header of the entry open as `fd` (of `file_bytes` bytes): magic, version, sizes, layout and
// header checksum. Throws tandem::Error saying what is wrong; never reads past the file.
EntryHeader read_entry_header(int fd, uint64_t file_bytes);

// The key text an entry stores (and its file name hashes): the key, the row format, the format version.
std::string key_text(const Key& key, const std::string& kv_type, int n_layers, uint64_t row_bytes);
// The file name of the entry for `key_text` and `tokens`: "<hash of the key text>-<hash of the tokens>.kv". A lookup
// reads the entries whose names start as its key's do.
std::string entry_file_name(const std::string& key_text, std::span<const int> tokens);

class PromptCache {
public:
    using Warn = std::function<void(const std::string&)>;
    // `warn` gets each one-line warning (default: stderr, "tandem: warning: prompt cache: ...").
    explicit PromptCache(Options options, Warn warn = {});

    bool enabled() const { return !options_.dir.empty(); }
    const Options& options() const { return options_; }
    // Whether a prompt of n tokens is looked up and saved at all (min_tokens).
    bool worth_it(size_t n) const { return enabled() && n >= static_cast<size_t>(options_.min_tokens); }

    // Loads into `cache` the most positions of `tokens` that an entry for `key` holds: m is the longest common prefix
    // with an entry, at most `max_tokens` (leave the prompt's last token to prefill: its logits are needed) and
    // rounded down to a multiple of `multiple` (Backend::resume_multiple), where every layer of `cache` can resume at
    // m from what the entry stored. The longest m wins (then the most recently used). An entry found damaged is
    // removed with a warning and the next best tried. Never throws for the cache's own troubles. `cache` holds `keep`
    // positions of `tokens` already (0: it is empty): only an m above keep is loaded, in their place; a cache that
    // held some and whose every candidate turned out damaged is left empty (n_loaded 0: read cache.n_committed()).
    LoadResult load_longest_prefix(const Key& key, std::span<const int> tokens, KvCache& cache, int max_tokens,
                                   int multiple = 1, int keep = 0);

    // Saves positions [0, tokens.size()) of `cache` (which holds at least those, computed from `tokens`) as an
    // entry for `key`, replacing entries of the same key whose tokens it extends, and evicting the least recently
    // used entries beyond the size cap. Returns false (with a warning where something went wrong, quietly where
    // the entry would not be usable or not fit the cap) when nothing was saved.
    bool store(const Key& key, std::span<const int> tokens, const KvCache& cache);

    // Entries (complete files) in the directory and their bytes.
    struct Usage {
        size_t entries = 0;
        uint64_t bytes = 0;
    };
    Usage usage() const;

private:
    void warn(const std::string& message) const;
    // Removes the least recently used entries until `incoming` more bytes fit under the cap, and temporary files of
    // processes that ended.
    void evict_for(uint64_t incoming) const;

    Options options_;
    Warn warn_;
};

}  // namespace tandem::prompt_cache
