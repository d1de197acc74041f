// PromptCache (prompt_cache.h): the entry file's format, its reading and checking, lookup, loading, saving and
// eviction.
//
// Entry file "<hash of the key text>-<hash of the tokens>.kv": a header, then the payload. Integers little-endian
// (the machine's: x86-64).
//   [0, 8)    magic "TNDPRCKV"      [8, 12)  format version (u32)   [12, 16) zero
//   [16, 24)  header_bytes (u64)    [24, 32) payload_bytes          [32, 40) key text bytes K
//   [40, 48)  tokens N              [48, 56) layers L               [56, 64) row_bytes R
//   [64, 72)  block positions B
//   [72, 72 + K)  the key text (key_text), then N token ids (i32), L first positions (u32), one checksum (u64) per
//   block of B positions, and a checksum (u64) of every header byte before it.
// Payload: block after block (positions [bB, (b + 1)B) ∩ [0, N)); in a block, layer after layer, the keys then the
// values of the positions the layer stores there ([first, N) of it), R bytes each, position after position.
#include "prompt_cache/prompt_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>
#include <utility>

#include "backend.h"
#include "cpu/repack_cache.h"
#include "error.h"

namespace tandem::prompt_cache {
namespace {

constexpr char kMagic[8] = {'T', 'N', 'D', 'P', 'R', 'C', 'K', 'V'};
constexpr uint32_t kVersion = 1;
constexpr size_t kFixed = 72;
// Bounds a header must keep to be read at all (far above any real model and context).
constexpr uint64_t kMaxKeyBytes = 1 << 16, kMaxTokens = 1 << 22, kMaxLayers = 1 << 12, kMaxRowBytes = 1 << 22;

uint64_t load_u64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}
uint32_t load_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
void put_u64(std::vector<uint8_t>& out, uint64_t v) {
    const size_t at = out.size();
    out.resize(at + 8);
    std::memcpy(out.data() + at, &v, 8);
}
void put_u32(std::vector<uint8_t>& out, uint32_t v) {
    const size_t at = out.size();
    out.resize(at + 4);
    std::memcpy(out.data() + at, &v, 4);
}

uint64_t checksum(const void* p, size_t n) { return cpu::repack_checksum(static_cast<const uint8_t*>(p), n); }

std::string hex16(uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string name_prefix(const std::string& key_text) { return hex16(checksum(key_text.data(), key_text.size())) + "-"; }

size_t header_bytes_for(uint64_t key_bytes, uint64_t n_tokens, uint64_t n_layers, uint64_t n_blocks) {
    return kFixed + key_bytes + 4 * n_tokens + 4 * n_layers + 8 * n_blocks + 8;
}

// The positions [lo, hi) layer l stores in block b.
std::pair<int, int> block_range(int block, int first, int n_tokens) {
    const int lo = std::max(first, block * kBlockPositions);
    const int hi = std::min(n_tokens, (block + 1) * kBlockPositions);
    return {lo, std::max(lo, hi)};
}

uint64_t block_bytes(int block, const std::vector<int>& firsts, int n_tokens, uint64_t row_bytes) {
    uint64_t bytes = 0;
    for (const int first : firsts) {
        const auto [lo, hi] = block_range(block, first, n_tokens);
        bytes += 2 * row_bytes * static_cast<uint64_t>(hi - lo);
    }
    return bytes;
}

int n_blocks_for(uint64_t n_tokens) { return static_cast<int>((n_tokens + kBlockPositions - 1) / kBlockPositions); }

// A file descriptor closed on scope exit.
struct Fd {
    int fd = -1;
    explicit Fd(int f = -1) : fd(f) {}
    Fd(Fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
    Fd& operator=(Fd&& o) noexcept {
        std::swap(fd, o.fd);
        return *this;
    }
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

// pread of exactly n bytes (retrying short reads and EINTR); false on an error or the end of the file.
bool read_at(int fd, void* dst, size_t n, uint64_t offset) {
    auto* p = static_cast<uint8_t*>(dst);
    while (n > 0) {
        const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r;
        n -= static_cast<size_t>(r);
        offset += static_cast<uint64_t>(r);
    }
    return true;
}

// pwrite of exactly n bytes; false with errno set on failure.
bool write_at(int fd, const void* src, size_t n, uint64_t offset) {
    auto* p = static_cast<const uint8_t*>(src);
    while (n > 0) {
        const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (w == 0) errno = EIO;
            return false;
        }
        p += w;
        n -= static_cast<size_t>(w);
        offset += static_cast<uint64_t>(w);
    }
    return true;
}

bool make_dirs(const std::string& dir) {
    for (size_t i = 1; i <= dir.size(); ++i)
        if (i == dir.size() || dir[i] == '/') {
            const std::string prefix = dir.substr(0, i);
            if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return false;
        }
    struct stat st {};
    return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

int64_t mtime_ns(const struct stat& st) {
    return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

struct DirEntry {
    std::string name, path;
    uint64_t bytes = 0;
    int64_t mtime = 0;
};

// The complete entries in `dir` ("*.kv" files not starting with a dot) whose names start with `prefix`.
std::vector<DirEntry> list_entries(const std::string& dir, const std::string& prefix = "") {
    std::vector<DirEntry> out;
    DIR* d = dir.empty() ? nullptr : ::opendir(dir.c_str());
    if (!d) return out;
    while (const dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name.empty() || name[0] == '.' || !ends_with(name, ".kv") || name.compare(0, prefix.size(), prefix) != 0)
            continue;
        DirEntry entry{name, dir + "/" + name};
        struct stat st {};
        if (::stat(entry.path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
        entry.bytes = static_cast<uint64_t>(st.st_size);
        entry.mtime = mtime_ns(st);
        out.push_back(std::move(entry));
    }
    ::closedir(d);
    return out;
}

std::string error_text(int err) { return std::strerror(err); }

}  // namespace

std::string key_text(const Key& key, const std::string& kv_type, int n_layers, uint64_t row_bytes) {
    return "tandem prompt cache " + std::to_string(kVersion) + "\n" + key.model +
           (key.model.empty() || key.model.back() != '\n' ? "\n" : "") + "backend " + key.backend + "\nkv " + kv_type +
           " layers " + std::to_string(n_layers) + " row " + std::to_string(row_bytes) + "\n";
}

std::string entry_file_name(const std::string& key_text, std::span<const int> tokens) {
    return name_prefix(key_text) + hex16(checksum(tokens.data(), tokens.size_bytes())) + ".kv";
}

EntryHeader read_entry_header(int fd, uint64_t file_bytes) {
    uint8_t fixed[kFixed];
    if (file_bytes < kFixed || !read_at(fd, fixed, kFixed, 0)) throw Error("shorter than a header");
    if (std::memcmp(fixed, kMagic, 8) != 0) throw Error("not a prompt cache entry");
    if (load_u32(fixed + 8) != kVersion)
        throw Error("format version " + std::to_string(load_u32(fixed + 8)) + ", this tandem reads " +
                    std::to_string(kVersion));
    EntryHeader h;
    h.header_bytes = load_u64(fixed + 16);
    h.payload_bytes = load_u64(fixed + 24);
    const uint64_t key_bytes = load_u64(fixed + 32), n_tokens = load_u64(fixed + 40), n_layers = load_u64(fixed + 48);
    h.row_bytes = load_u64(fixed + 56);
    const uint64_t block = load_u64(fixed + 64);
    if (key_bytes > kMaxKeyBytes || n_tokens == 0 || n_tokens > kMaxTokens || n_layers == 0 || n_layers > kMaxLayers ||
        h.row_bytes == 0 || h.row_bytes > kMaxRowBytes || block != kBlockPositions)
        throw Error("a header field is out of range");
    const int n_blocks = n_blocks_for(n_tokens);
    if (h.header_bytes != header_bytes_for(key_bytes, n_tokens, n_layers, static_cast<uint64_t>(n_blocks)))
        throw Error("the header's size does not match its fields");
    if (h.header_bytes > file_bytes || file_bytes - h.header_bytes != h.payload_bytes)
        throw Error("truncated or extended: " + std::to_string(file_bytes) + " bytes, the header says " +
                    std::to_string(h.header_bytes) + " + " + std::to_string(h.payload_bytes));
    std::vector<uint8_t> raw(h.header_bytes);
    if (!read_at(fd, raw.data(), raw.size(), 0)) throw Error("cannot read the header");
    const size_t sum_at = raw.size() - 8;
    if (load_u64(raw.data() + sum_at) != checksum(raw.data(), sum_at)) throw Error("the header's checksum is wrong");
    const uint8_t* p = raw.data() + kFixed;
    h.key.assign(reinterpret_cast<const char*>(p), key_bytes);
    p += key_bytes;
    h.tokens.resize(n_tokens);
    std::memcpy(h.tokens.data(), p, 4 * n_tokens);
    p += 4 * n_tokens;
    h.n_layers = static_cast<int>(n_layers);
    h.firsts.resize(n_layers);
    for (uint64_t l = 0; l < n_layers; ++l, p += 4) {
        const uint32_t first = load_u32(p);
        if (first > n_tokens) throw Error("a layer's first position is past the tokens");
        h.firsts[l] = static_cast<int>(first);
    }
    h.block_sums.resize(static_cast<size_t>(n_blocks));
    for (int b = 0; b < n_blocks; ++b, p += 8) h.block_sums[static_cast<size_t>(b)] = load_u64(p);
    uint64_t payload = 0;
    for (int b = 0; b < n_blocks; ++b) payload += block_bytes(b, h.firsts, static_cast<int>(n_tokens), h.row_bytes);
    if (payload != h.payload_bytes) throw Error("the payload's size does not match the layout");
    return h;
}

PromptCache::PromptCache(Options options, Warn warn) : options_(std::move(options)), warn_(std::move(warn)) {
    while (options_.dir.size() > 1 && options_.dir.back() == '/') options_.dir.pop_back();
}

void PromptCache::warn(const std::string& message) const {
    if (warn_)
        warn_(message);
    else
        std::fprintf(stderr, "tandem: warning: prompt cache: %s\n", message.c_str());
}

PromptCache::Usage PromptCache::usage() const {
    Usage u;
    for (const DirEntry& e : list_entries(options_.dir)) {
        ++u.entries;
        u.bytes += e.bytes;
    }
    return u;
}

LoadResult PromptCache::load_longest_prefix(const Key& key, std::span<const int> tokens, KvCache& cache, int max_tokens,
                                            int multiple, int keep) {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point t0 = Clock::now();
    LoadResult result;
    const KvCache::RowFormat format = cache.row_format();
    max_tokens = std::min(max_tokens, static_cast<int>(tokens.size()));
    multiple = std::max(1, multiple);
    if (!enabled() || key.model.empty() || format.type.empty() || keep < 0 || cache.n_committed() != keep ||
        max_tokens <= keep)
        return result;
    const std::string text = key_text(key, format.type, format.n_layers, format.row_bytes);

    struct Candidate {
        DirEntry entry;
        Fd fd;
        EntryHeader header;
        int m = 0;
    };
    std::vector<Candidate> candidates;
    for (DirEntry& e : list_entries(options_.dir, name_prefix(text))) {
        Fd fd(::open(e.path.c_str(), O_RDONLY | O_CLOEXEC));
        if (fd.fd < 0) continue;  // evicted meanwhile
        struct stat st {};
        if (::fstat(fd.fd, &st) != 0) continue;
        EntryHeader h;
        try {
            h = read_entry_header(fd.fd, static_cast<uint64_t>(st.st_size));
            if (h.key != text) throw Error("made for another model or backend");
        } catch (const Error& err) {
            warn(e.path + ": " + err.what() + "; removed it");
            ::unlink(e.path.c_str());
            continue;
        }
        result.bytes += h.header_bytes;
        int m = 0;
        const int limit = std::min(max_tokens, static_cast<int>(h.tokens.size()));
        while (m < limit && h.tokens[static_cast<size_t>(m)] == tokens[static_cast<size_t>(m)]) ++m;
        m -= m % multiple;
        if (m <= keep) continue;
        // Every layer must resume at m from what the entry stored (a ring's last positions only).
        bool usable = true;
        for (int l = 0; l < h.n_layers; ++l)
            usable = usable && h.firsts[static_cast<size_t>(l)] <= cache.needed_from(l, m);
        if (usable) candidates.push_back({std::move(e), std::move(fd), std::move(h), m});
    }
    std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
        return a.m != b.m ? a.m > b.m : a.entry.mtime > b.entry.mtime;
    });

    for (Candidate& c : candidates) {
        cache.truncate(0);  // (what it kept gives way to more)
        if (cache.n_committed() != 0) break;
        const EntryHeader& h = c.header;
        const int n_tokens = static_cast<int>(h.tokens.size()), m = c.m;
        std::vector<int> froms(static_cast<size_t>(h.n_layers));
        for (int l = 0; l < h.n_layers; ++l) froms[static_cast<size_t>(l)] = cache.needed_from(l, m);
        std::vector<uint8_t> block;
        uint64_t offset = h.header_bytes, read = 0;
        std::string trouble;
        for (int b = 0; b * kBlockPositions < m && trouble.empty(); ++b) {
            const uint64_t bytes = block_bytes(b, h.firsts, n_tokens, h.row_bytes);
            block.resize(bytes);
            if (!read_at(c.fd.fd, block.data(), bytes, offset)) {
                trouble = "cannot read it";
            } else if (checksum(block.data(), bytes) != h.block_sums[static_cast<size_t>(b)]) {
                trouble = "block " + std::to_string(b) + "'s checksum is wrong";
            } else {
                const uint8_t* at = block.data();
                for (int l = 0; l < h.n_layers; ++l) {
                    const auto [lo, hi] = block_range(b, h.firsts[static_cast<size_t>(l)], n_tokens);
                    const uint64_t run = static_cast<uint64_t>(hi - lo) * h.row_bytes;
                    const int s = std::max(lo, froms[static_cast<size_t>(l)]), e = std::min(hi, m);
                    if (s < e) {
                        const uint64_t skip = static_cast<uint64_t>(s - lo) * h.row_bytes;
                        cache.write_rows(l, s, e - s, at + skip, at + run + skip);
                    }
                    at += 2 * run;
                }
            }
            offset += bytes;
            read += bytes;
        }
        if (!trouble.empty()) {
            warn(c.entry.path + ": " + trouble + "; removed it");
            ::unlink(c.entry.path.c_str());
            continue;
        }
        cache.finish_load(m, froms);
        ::futimens(c.fd.fd, nullptr);  // used now: eviction keeps the most recently used
        result.n_loaded = m;
        result.bytes += read;
        result.path = c.entry.path;
        break;
    }
    result.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return result;
}

void PromptCache::evict_for(uint64_t incoming) const {
    // Temporary files of processes that ended (".<name>.<pid>.tmp"); a running writer's stay.
    if (DIR* d = ::opendir(options_.dir.c_str())) {
        while (const dirent* e = ::readdir(d)) {
            const std::string name = e->d_name;
            if (name.size() < 6 || name[0] != '.' || !ends_with(name, ".tmp")) continue;
            const size_t dot = name.rfind('.', name.size() - 5);
            if (dot == std::string::npos) continue;
            const long pid = std::strtol(name.c_str() + dot + 1, nullptr, 10);
            if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
                ::unlink((options_.dir + "/" + name).c_str());
        }
        ::closedir(d);
    }
    std::vector<DirEntry> entries = list_entries(options_.dir);
    uint64_t total = 0;
    for (const DirEntry& e : entries) total += e.bytes;
    std::sort(entries.begin(), entries.end(), [](const DirEntry& a, const DirEntry& b) { return a.mtime < b.mtime; });
    for (const DirEntry& e : entries) {
        if (total + incoming <= options_.max_bytes) break;
        ::unlink(e.path.c_str());
        total -= e.bytes;
    }
}

bool PromptCache::store(const Key& key, std::span<const int> tokens, const KvCache& cache) {
    const KvCache::RowFormat format = cache.row_format();
    const int n = static_cast<int>(tokens.size());
    if (!enabled() || key.model.empty() || format.type.empty() || n < 1 || cache.n_committed() < n ||
        static_cast<uint64_t>(n) > kMaxTokens)
        return false;
    const std::string text = key_text(key, format.type, format.n_layers, format.row_bytes);
    std::vector<int> firsts(static_cast<size_t>(format.n_layers));
    bool all_from_zero = true;
    for (int l = 0; l < format.n_layers; ++l) {
        firsts[static_cast<size_t>(l)] = std::min(cache.held_from(l), n);
        all_from_zero = all_from_zero && firsts[static_cast<size_t>(l)] == 0;
    }
    // Of use only if a load could resume at n - 1 at least (a ring that dropped the prompt's end serves nothing).
    if (n < 2) return false;
    for (int l = 0; l < format.n_layers; ++l)
        if (firsts[static_cast<size_t>(l)] > cache.needed_from(l, n - 1)) return false;

    const int n_blocks = n_blocks_for(static_cast<uint64_t>(n));
    std::vector<uint64_t> sizes(static_cast<size_t>(n_blocks));
    uint64_t payload = 0;
    for (int b = 0; b < n_blocks; ++b)
        payload += sizes[static_cast<size_t>(b)] = block_bytes(b, firsts, n, format.row_bytes);
    const uint64_t header_bytes = header_bytes_for(
        text.size(), static_cast<uint64_t>(n), static_cast<uint64_t>(format.n_layers), static_cast<uint64_t>(n_blocks));
    if (header_bytes + payload > options_.max_bytes) return false;  // would never fit the cap

    if (!make_dirs(options_.dir)) {
        warn("cannot create " + options_.dir + ": " + error_text(errno) + " (the prompt is not saved)");
        return false;
    }
    // Entries of this key whose tokens ours extend serve nothing ours does not (where ours holds every layer from
    // position 0): replaced.
    if (all_from_zero)
        for (const DirEntry& e : list_entries(options_.dir, name_prefix(text))) {
            Fd fd(::open(e.path.c_str(), O_RDONLY | O_CLOEXEC));
            if (fd.fd < 0) continue;
            try {
                const EntryHeader h = read_entry_header(fd.fd, e.bytes);
                if (h.key == text && h.tokens.size() < static_cast<size_t>(n) &&
                    std::equal(h.tokens.begin(), h.tokens.end(), tokens.begin()))
                    ::unlink(e.path.c_str());
            } catch (const Error&) {
                // A damaged entry is the loader's to report.
            }
        }
    evict_for(header_bytes + payload);

    const std::string name = entry_file_name(text, tokens);
    const std::string path = options_.dir + "/" + name;
    const std::string temp = options_.dir + "/." + name + "." + std::to_string(::getpid()) + ".tmp";
    Fd fd(::open(temp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    const auto fail = [&](const std::string& what, int err) {
        warn("cannot save the prompt in " + options_.dir + ": " + what + ": " + error_text(err));
        if (fd.fd >= 0) ::unlink(temp.c_str());
        return false;
    };
    if (fd.fd < 0) return fail("creating a file", errno);
    // Space reserved up front: a full disk fails here rather than part way (a filesystem without fallocate goes on,
    // where a full disk fails a write instead).
    if (const int err = ::posix_fallocate(fd.fd, 0, static_cast<off_t>(header_bytes + payload));
        err != 0 && err != EOPNOTSUPP && err != EINVAL)
        return fail("reserving " + std::to_string(header_bytes + payload) + " bytes", err);

    std::vector<uint64_t> sums(static_cast<size_t>(n_blocks));
    std::vector<uint8_t> block;
    uint64_t offset = header_bytes;
    for (int b = 0; b < n_blocks; ++b) {
        block.resize(sizes[static_cast<size_t>(b)]);
        uint8_t* at = block.data();
        for (int l = 0; l < format.n_layers; ++l) {
            const auto [lo, hi] = block_range(b, firsts[static_cast<size_t>(l)], n);
            const uint64_t run = static_cast<uint64_t>(hi - lo) * format.row_bytes;
            if (hi > lo) cache.read_rows(l, lo, hi - lo, at, at + run);
            at += 2 * run;
        }
        sums[static_cast<size_t>(b)] = checksum(block.data(), block.size());
        if (!write_at(fd.fd, block.data(), block.size(), offset)) return fail("writing", errno);
        offset += block.size();
    }
    std::vector<uint8_t> header(kMagic, kMagic + 8);
    put_u32(header, kVersion);
    put_u32(header, 0);
    for (const uint64_t v :
         {header_bytes, payload, static_cast<uint64_t>(text.size()), static_cast<uint64_t>(n),
          static_cast<uint64_t>(format.n_layers), format.row_bytes, static_cast<uint64_t>(kBlockPositions)})
        put_u64(header, v);
    header.insert(header.end(), text.begin(), text.end());
    for (const int t : tokens) put_u32(header, static_cast<uint32_t>(t));
    for (const int f : firsts) put_u32(header, static_cast<uint32_t>(f));
    for (const uint64_t s : sums) put_u64(header, s);
    put_u64(header, checksum(header.data(), header.size()));
    if (header.size() != header_bytes) return fail("laying out the header", EINVAL);
    if (!write_at(fd.fd, header.data(), header.size(), 0)) return fail("writing", errno);
    // Renamed into place whole: a reader sees the old entry, or none, or this one complete.
    if (::rename(temp.c_str(), path.c_str()) != 0) return fail("renaming", errno);
    return true;
}

}  // namespace tandem::prompt_cache
