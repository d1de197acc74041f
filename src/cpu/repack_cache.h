// RepackCacheFile: the repacked weight copies of one backend (RepackedWeights' arena) kept in a file between runs,
// so that a run starts on the copies instead of making them again.
//
// Why. Making the copies costs a short run more than the repacking itself: fresh memory must be faulted in (on this
// project's VM, whose host takes freed memory back, ~0.4 s per GB), the prompt is prefilled in the file's layout
// meanwhile, and speculative decoding waits for the draft's and the target's copies before its first round (0.9 s
// of a 200-token answer with the default pair). A cache file in the page cache is mapped in microseconds.
//
// What makes a file valid. Its header holds a description of what the arena holds (made by repack.cpp: the model
// file's identity, repack_model_identity below, each matrix's offset in it, type, copy type and shape, and a fingerprint
// of the repacking code's output), which must equal the caller's byte for byte, the payload's size, and a checksum of
// each matrix's bytes, which the caller checks before it uses the matrix: a file that is truncated, overwritten or
// made by other code is never read as weights. A file is written under a temporary name, filled through a shared
// mapping (space reserved up front with fallocate, so that a full disk is an error at creation, never a SIGBUS),
// and renamed into place only once complete.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem::cpu {

// A 64-bit checksum of n bytes (not cryptographic: it tells a damaged or foreign file from the one written).
uint64_t repack_checksum(const uint8_t* p, size_t n);


// The cache files in `dir` (complete ones, not temporaries) and their bytes, for --list-models.
struct RepackCacheUsage {
    size_t files = 0;
    uint64_t bytes = 0;
};
RepackCacheUsage repack_cache_usage(const std::string& dir);

class RepackCacheFile {
public:
    // The valid file for `description` in `dir`, mapped read-only; nullptr when there is none (or it does not
    // match: wrong size, header, description). `name` is a readable stem for the file name (the model's).
    static std::unique_ptr<RepackCacheFile> open(const std::string& dir, const std::string& name,
                                                 const std::string& description, size_t payload_bytes,
                                                 size_t n_entries);
    // A new file to fill, mapped read-write, under a temporary name until commit(); nullptr when it cannot be made
    // (no directory, no space, a filesystem without fallocate). Removes cache files in `dir` whose model file is
    // gone or changed, temporary files of processes that no longer run, and, beyond the newest few, older files of
    // the same model.
    static std::unique_ptr<RepackCacheFile> create(const std::string& dir, const std::string& name,
                                                   const std::string& description, size_t payload_bytes,
                                                   size_t n_entries);
    ~RepackCacheFile();  // unmaps; a created file not committed is removed
    RepackCacheFile(const RepackCacheFile&) = delete;
    RepackCacheFile& operator=(const RepackCacheFile&) = delete;

    uint8_t* payload() const { return payload_; }  // 4096-byte aligned; read-only for an opened file
    const std::string& path() const { return path_; }
    bool opened() const { return !writable_; }

    // The stored checksum of entry i (an opened file), or sets it (a created one).
    uint64_t checksum(size_t i) const { return checksums_[i]; }
    void set_checksum(size_t i, uint64_t sum) { checksums_[i] = sum; }
    // A created file: writes the header and renames the file into place. False (and the file removed) on failure.
    bool commit();
    // An opened file found damaged: removes it, so that the next run makes a new one (the mapping stays valid).
    void discard();

private:
    RepackCacheFile() = default;
    // Maps the whole file (header and payload) and sets the members that describe it; false when mmap fails.
    bool map(int prot, size_t header_bytes, size_t payload_bytes, const std::string& description, size_t n_entries);
    std::string path_, temp_path_, description_;
    int fd_ = -1;
    void* map_ = nullptr;
    size_t map_bytes_ = 0, header_bytes_ = 0, payload_bytes_ = 0;
    uint8_t* payload_ = nullptr;
    bool writable_ = false, committed_ = false;
    std::vector<uint64_t> checksums_;
};

// The first line of a cache file's description: the model file's size, modification time (ns), device, inode and
// real path, "model SIZE MTIME DEV INO PATH\n". Empty when the file cannot be identified (then no cache is used).
std::string repack_model_identity(const std::string& model_path);

}  // namespace tandem::cpu
