// RepackCacheFile (repack_cache.h): the cache file's format, its validation, creation and clean-up.
//
// File layout: a header of header_bytes (a multiple of 4096), then the payload (the arena, byte for byte).
//   [0, 8)    magic "TNDRPKC1"          [8, 16)   header_bytes (u64)     [16, 24)  payload_bytes (u64)
//   [24, 32)  n_entries (u64)           [32, 40)  description bytes D (u64)
//   [40, 40 + D)  the description       then n_entries u64 checksums, then a u64 checksum of everything before it.
// Integers are the machine's (little-endian x86-64: the copies are only made where the AVX-512 kernels run).
#include "cpu/repack_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

namespace tandem::cpu {
namespace {

constexpr char kMagic[8] = {'T', 'N', 'D', 'R', 'P', 'K', 'C', '1'};
constexpr size_t kFixed = 40;         // bytes before the description
constexpr size_t kKeepPerModel = 4;   // cache files kept per model file (a target's and a draft's, and variants)

size_t header_bytes_for(size_t description_bytes, size_t n_entries) {
    const size_t raw = kFixed + description_bytes + 8 * n_entries + 8;
    return (raw + 4095) / 4096 * 4096;
}

uint64_t load_u64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}

void store_u64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }

std::string hex16(uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

// "<stem>-<hash of the description>.repack": one file per description.
std::string file_name(const std::string& name, const std::string& description) {
    std::string stem = name;
    for (char& ch : stem)
        if (ch == '/' || ch == '\0') ch = '_';
    return stem + "-" + hex16(repack_checksum(reinterpret_cast<const uint8_t*>(description.data()),
                                              description.size())) + ".repack";
}

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The model path of a repack_model_identity line: what follows its five fields ("model", size, modification time,
// device, inode), without the newline. The path may hold spaces; "" when the line is not one.
std::string identity_model_path(const std::string& identity) {
    size_t at = 0;
    for (int field = 0; field < 5 && at != std::string::npos; ++field) {
        at = identity.find(' ', at);
        if (at != std::string::npos) ++at;
    }
    if (at == std::string::npos || identity.size() < at + 2 || identity.back() != '\n') return {};
    return identity.substr(at, identity.size() - at - 1);
}

// The description stored in a cache file's header, or "" when the file is not one of ours.
std::string stored_description(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return {};
    uint8_t fixed[kFixed];
    std::string description;
    if (::pread(fd, fixed, kFixed, 0) == static_cast<ssize_t>(kFixed) && std::memcmp(fixed, kMagic, 8) == 0) {
        const uint64_t d = load_u64(fixed + 32);
        if (d > 0 && d < (1u << 24)) {
            description.resize(d);
            if (::pread(fd, description.data(), d, kFixed) != static_cast<ssize_t>(d)) description.clear();
        }
    }
    ::close(fd);
    return description;
}

// Cache files whose model file is gone or changed, temporary files of processes that ended, and the oldest files of
// a model beyond kKeepPerModel - 1 (one more is being made) are removed. Best effort: errors are ignored.
void clean_up(const std::string& dir) {
    DIR* d = ::opendir(dir.c_str());
    if (!d) return;
    struct Kept {
        std::string path, model;
        int64_t mtime_ns;
    };
    std::vector<Kept> kept;
    while (const dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        const std::string path = dir + "/" + name;
        if (name.size() > 5 && name[0] == '.' && ends_with(name, ".tmp")) {
            // ".<file name>.<pid>.tmp"
            const size_t last = name.rfind('.', name.size() - 5);
            if (last == std::string::npos) continue;
            const long pid = std::strtol(name.c_str() + last + 1, nullptr, 10);
            if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) ::unlink(path.c_str());
            continue;
        }
        if (!ends_with(name, ".repack")) continue;
        const std::string description = stored_description(path);
        // The first line is the model file's identity (repack_model_identity).
        const size_t eol = description.find('\n');
        const std::string identity = description.substr(0, eol == std::string::npos ? 0 : eol + 1);
        const std::string model = identity_model_path(identity);
        if (model.empty() || repack_model_identity(model) != identity) {
            ::unlink(path.c_str());
            continue;
        }
        struct stat st{};
        if (::stat(path.c_str(), &st) != 0) continue;
        kept.push_back({path, model, static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec});
    }
    ::closedir(d);
    std::sort(kept.begin(), kept.end(), [](const Kept& a, const Kept& b) { return a.mtime_ns > b.mtime_ns; });
    std::vector<std::pair<std::string, size_t>> per_model;
    for (const Kept& k : kept) {
        auto it = std::find_if(per_model.begin(), per_model.end(), [&](const auto& p) { return p.first == k.model; });
        if (it == per_model.end()) it = per_model.insert(per_model.end(), {k.model, 0});
        if (++it->second >= kKeepPerModel) ::unlink(k.path.c_str());
    }
}

bool make_dirs(const std::string& dir) {
    for (size_t i = 1; i <= dir.size(); ++i)
        if (i == dir.size() || dir[i] == '/') {
            const std::string prefix = dir.substr(0, i);
            if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return false;
        }
    struct stat st{};
    return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

uint64_t repack_checksum(const uint8_t* p, size_t n) {
    // Four independent lanes of multiply-rotate over 8-byte words (memory-bound on a copy of a gigabyte), then the
    // tail and the length.
    constexpr uint64_t K = 0x9E3779B97F4A7C15ULL;
    auto mix = [](uint64_t h, uint64_t w) {
        h = (h ^ w) * K;
        return (h << 31) | (h >> 33);
    };
    uint64_t h[4] = {0x243F6A8885A308D3ULL, 0x13198A2E03707344ULL, 0xA4093822299F31D0ULL, 0x082EFA98EC4E6C89ULL};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int l = 0; l < 4; ++l) h[l] = mix(h[l], load_u64(p + i + 8 * l));
    for (; i + 8 <= n; i += 8) h[0] = mix(h[0], load_u64(p + i));
    uint64_t tail = 0;
    std::memcpy(&tail, p + i, n - i);  // under 8 bytes
    uint64_t r = mix(mix(mix(mix(h[0], h[1]), h[2]), h[3]), tail);
    return mix(r, n) ^ (r >> 29);
}

RepackCacheUsage repack_cache_usage(const std::string& dir) {
    RepackCacheUsage usage;
    DIR* d = dir.empty() ? nullptr : ::opendir(dir.c_str());
    if (!d) return usage;
    while (const dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        struct stat st{};
        if (name[0] == '.' || !ends_with(name, ".repack") || ::stat((dir + "/" + name).c_str(), &st) != 0) continue;
        ++usage.files;
        usage.bytes += static_cast<uint64_t>(st.st_size);
    }
    ::closedir(d);
    return usage;
}

// (identity_model_path, above, reads the path back: the two follow one format.)
std::string repack_model_identity(const std::string& model_path) {
    char* real = ::realpath(model_path.c_str(), nullptr);
    if (!real) return {};
    const std::string path(real);
    std::free(real);
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || path.find('\n') != std::string::npos) return {};
    char buf[160];
    std::snprintf(buf, sizeof buf, "model %lld %lld.%09ld %llu %llu ", static_cast<long long>(st.st_size),
                  static_cast<long long>(st.st_mtim.tv_sec), static_cast<long>(st.st_mtim.tv_nsec),
                  static_cast<unsigned long long>(st.st_dev), static_cast<unsigned long long>(st.st_ino));
    return buf + path + "\n";
}

std::unique_ptr<RepackCacheFile> RepackCacheFile::open(const std::string& dir, const std::string& name,
                                                       const std::string& description, size_t payload_bytes,
                                                       size_t n_entries) {
    const std::string path = dir + "/" + file_name(name, description);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return nullptr;
    std::unique_ptr<RepackCacheFile> f(new RepackCacheFile);
    f->fd_ = fd;  // closed by the destructor from here on
    f->path_ = path;
    const size_t header = header_bytes_for(description.size(), n_entries);
    struct stat st{};
    if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != header + payload_bytes) return nullptr;
    std::vector<uint8_t> h(header);
    if (::pread(fd, h.data(), header, 0) != static_cast<ssize_t>(header)) return nullptr;
    const size_t checksums_at = kFixed + description.size(), sum_at = checksums_at + 8 * n_entries;
    if (std::memcmp(h.data(), kMagic, 8) != 0 || load_u64(&h[8]) != header || load_u64(&h[16]) != payload_bytes ||
        load_u64(&h[24]) != n_entries || load_u64(&h[32]) != description.size() ||
        std::memcmp(&h[kFixed], description.data(), description.size()) != 0 ||
        load_u64(&h[sum_at]) != repack_checksum(h.data(), sum_at))
        return nullptr;
    if (!f->map(PROT_READ, header, payload_bytes, description, n_entries)) return nullptr;
    for (size_t i = 0; i < n_entries; ++i) f->checksums_[i] = load_u64(&h[checksums_at + 8 * i]);
    ::futimens(fd, nullptr);  // used now: the clean-up keeps the most recently used files
    return f;
}

std::unique_ptr<RepackCacheFile> RepackCacheFile::create(const std::string& dir, const std::string& name,
                                                         const std::string& description, size_t payload_bytes,
                                                         size_t n_entries) {
    if (!make_dirs(dir)) return nullptr;
    clean_up(dir);
    const std::string file = file_name(name, description);
    std::unique_ptr<RepackCacheFile> f(new RepackCacheFile);
    f->path_ = dir + "/" + file;
    f->temp_path_ = dir + "/." + file + "." + std::to_string(::getpid()) + ".tmp";
    const int fd = ::open(f->temp_path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return nullptr;
    f->fd_ = fd;  // from here on the destructor closes and removes it
    f->writable_ = true;
    const size_t header = header_bytes_for(description.size(), n_entries);
    // Blocks reserved now: writing through the mapping can then not fail for want of space (which would be a SIGBUS).
    if (::fallocate(fd, 0, 0, static_cast<off_t>(header + payload_bytes)) != 0) return nullptr;
    if (!f->map(PROT_READ | PROT_WRITE, header, payload_bytes, description, n_entries)) return nullptr;
    return f;
}

bool RepackCacheFile::map(int prot, size_t header_bytes, size_t payload_bytes, const std::string& description,
                          size_t n_entries) {
    void* map = ::mmap(nullptr, header_bytes + payload_bytes, prot, MAP_SHARED, fd_, 0);
    if (map == MAP_FAILED) return false;
    map_ = map;
    map_bytes_ = header_bytes + payload_bytes;
    header_bytes_ = header_bytes;
    payload_bytes_ = payload_bytes;
    payload_ = static_cast<uint8_t*>(map) + header_bytes;
    description_ = description;
    checksums_.assign(n_entries, 0);
    return true;
}

bool RepackCacheFile::commit() {
    if (!writable_ || committed_) return committed_;
    uint8_t* h = static_cast<uint8_t*>(map_);
    std::memset(h, 0, header_bytes_);
    std::memcpy(h, kMagic, 8);
    store_u64(h + 8, header_bytes_);
    store_u64(h + 16, payload_bytes_);
    store_u64(h + 24, checksums_.size());
    store_u64(h + 32, description_.size());
    std::memcpy(h + kFixed, description_.data(), description_.size());
    const size_t checksums_at = kFixed + description_.size(), sum_at = checksums_at + 8 * checksums_.size();
    for (size_t i = 0; i < checksums_.size(); ++i) store_u64(h + checksums_at + 8 * i, checksums_[i]);
    store_u64(h + sum_at, repack_checksum(h, sum_at));
    if (::rename(temp_path_.c_str(), path_.c_str()) != 0) return false;  // the destructor removes the temporary
    committed_ = true;
    return true;
}

void RepackCacheFile::discard() { ::unlink(path_.c_str()); }

RepackCacheFile::~RepackCacheFile() {
    if (map_) ::munmap(map_, map_bytes_);
    if (fd_ >= 0) ::close(fd_);
    if (writable_ && !committed_) ::unlink(temp_path_.c_str());
}

}  // namespace tandem::cpu
