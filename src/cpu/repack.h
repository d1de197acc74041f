// RepackedMatrix: a quantized weight matrix copied once, at load, into a layout with 16 rows interleaved, for the
// row-lane integer kernels (quant_q8_repacked_*.cpp). The one place where tandem keeps a second copy of weights
// instead of using the mapped file (the backend drops the file pages it copied from, so memory does not double).
//
// Why a copy pays for itself. The integer kernels of the file's own layout (quant_q8_kquants*.cpp) hold one row's
// codes across the SIMD lanes: every (row, token, 16-element sub-block) leaves partial sums in several lanes, and
// applying the sub-block scales and adding those lanes costs about as much as the multiplies themselves, per token.
// With row r of a group in lane r, a lane accumulates a whole sub-block of its row, the scales are one multiply per
// sub-block for 16 rows, and nothing is summed across lanes. Interleaving 16 rows on the fly costs a transpose per
// super-block, which a handful of tokens (speculative verification: 2..17) cannot amortise; done once at load it is
// free. Measured gains are in the commit that introduced it and in docs/cpu-backend.md.
//
// Results are bitwise those of the other kernels of the type (find_q8_kernels(type)->dot_rows_scalar): the integer
// sums per super-block are exact however they are formed, and the float steps per (row, token, super-block) are the
// same operations in the same order. So batch invariance, and every fidelity figure, carry over unchanged.
// The one exception is asked for by name: a speculative draft's copies may be requantized (requantized_type), which
// changes its logits (never the output, which the target verifies) for fewer bytes per draft step.
//
// Layout, per group of 16 rows (a last partial group is padded with zero rows) and per super-block, one record:
//   Q4_K (2368 bytes)  [0, 2048)     qs: vector k (k < 32) at 64 k, its dword r the bytes 4k..4k+3 of row r's qs
//                      [2048, 2176)  scales: sub-block j's 16 row scales (6-bit, as bytes) at 2048 + 16 j
//                      [2176, 2304)  mins: pair p (sub-blocks 2p, 2p+1) at 2176 + 32 p, bytes 2r, 2r+1 of row r
//                      [2304, 2336)  d of rows 0..15 (fp16);  [2336, 2368)  dmin of rows 0..15 (fp16)
//   Q6_K (3392 bytes)  [0, 3072)     codes in the order the kernel reads them (a record streams front to back): for
//                                    step s = 2h + half (s < 4) and d = 4 half + i (i < 4), at 64 (12 s + 3 i): the
//                                    ql vectors m = 16h + d and 16h + 8 + d, then the qh vector n = 8h + d, where
//                                    ql vector m's dword r is the bytes 4m..4m+3 of row r's ql, qh vector n's the
//                                    bytes 4n..4n+3 of row r's qh
//                      [3072, 3328)  scales: sub-block j's 16 row scales (int8) at 3072 + 16 j
//                      [3328, 3360)  d of rows 0..15 (fp16);  [3360, 3392) zero (records stay 64-byte aligned)
//   Q4_0, Q5_0, Q8_0: one record per pair of 32-element blocks (cols a multiple of 64), block h = 0, 1 after each
//   other, then the scales:
//     Q4_0 (576 bytes)   block h at 256 h: code vector k (k < 4) at 64 k, its dword r the bytes 4k..4k+3 of row r's qs
//                        (low nibbles elements 4k..4k+3, high nibbles 16 + 4k..)
//     Q5_0 (704 bytes)   block h at 320 h: the 4 code vectors as Q4_0's, then at 256 + 16 k the fifth bits as two
//                        64-bit byte masks, bit 4r + j set when element 4k + j (first mask) or 16 + 4k + j (second)
//                        of row r has it: a masked byte add of 16 applies them
//     Q8_0 (1088 bytes)  block h at 512 h: code vector k (k < 8) at 64 k, its dword r the bytes 4k..4k+3 of row r's
//                        qs, each xor 0x80 (unsigned, as the kernel multiplies them)
//                        then at 2 * (block bytes) + 32 h: d of rows 0..15 of block h (fp16)
// The records of a group are consecutive (super-block order), and the groups follow each other.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "gguf/ggml_types.h"
#include "model/weights.h"

namespace tandem::cpu {

class ThreadPool;
class RepackCacheFile;

struct RepackCancelled {};

// Where a RepackedWeights keeps its copies between runs (repack_cache.h). An empty dir keeps them in memory only.
struct RepackCacheSpec {
    std::string dir;
    std::string model_path;             // the file the weight views point into
    const void* model_base = nullptr;   // its mapping's first byte (a matrix is described by its offset from here)
};

class RepackedMatrix {
public:
    static constexpr int kGroupRows = 16;

    // True when this build and CPU have a row-lane kernel for `type` (Q4_K, Q6_K, Q4_0, Q5_0 and Q8_0, where
    // avx512_kernels_enabled() of quant_q8.h) and the process does not turn repacking off (dispatch.h:
    // TANDEM_NO_REPACK=1).
    static bool available(GgmlType type);
    // available(type), and rows of `cols` elements are whole records (the legacy types' pairs of blocks).
    static bool available(GgmlType type, int64_t cols);
    // Elements of a row per record: 256 (a K-quant super-block) or 64 (a pair of legacy blocks).
    static int64_t record_elements(GgmlType type);

    // The type a matrix of `type` is copied as when copies are requantized to `target`: `target` where its repacked
    // layout fits the rows and the matrix has more bytes per element than `target` (the copy is smaller, so
    // reading it is faster), else `type` itself.
    static GgmlType requantized_type(GgmlType type, int64_t cols, GgmlType target);

    // Bytes the repacked copy of a [cols, rows] matrix of `type` takes (a multiple of 64).
    static size_t storage_bytes(GgmlType type, int64_t cols, int64_t rows);

    // Repacks a [cols, rows] matrix of `type` (the GGUF layout, W row-major); the work is split across `pool`. The
    // copy goes to `storage` (storage_bytes(...) of 64-byte aligned memory that outlives the matrix), or to memory
    // of its own when `storage` is null. Throws tandem::Error when the type has no repacked layout or kernel, or
    // cols is not a whole number of super-blocks.
    // `proceed`, when given, is called between row groups (it may block: the background repacking pauses there);
    // once it returns false the constructor throws RepackCancelled and the copy is unusable.
    // With `requantize_to` (a type with a repacked layout), the copy holds the matrix requantized to that type
    // instead: each row decoded to floats and encoded again (quantize_row), then repacked. Lossy: only for a
    // speculative draft, whose proposals the target verifies (see requantized_type).
    RepackedMatrix(GgmlType type, const void* W, int64_t cols, int64_t rows, ThreadPool& pool,
                   uint8_t* storage = nullptr, const std::function<bool()>& proceed = {},
                   std::optional<GgmlType> requantize_to = std::nullopt);
    // A copy made before (by the constructor above, with copy type `type`) and kept in `storage` (a cache file's
    // mapping, which outlives the matrix): nothing is repacked.
    RepackedMatrix(GgmlType type, int64_t cols, int64_t rows, const uint8_t* storage);
    ~RepackedMatrix();
    RepackedMatrix(const RepackedMatrix&) = delete;
    RepackedMatrix& operator=(const RepackedMatrix&) = delete;

    GgmlType type() const { return type_; }  // of the copy (the requantized type, if any)
    int64_t rows() const { return rows_; }
    int64_t cols() const { return cols_; }
    int64_t n_groups() const { return (rows_ + kGroupRows - 1) / kGroupRows; }
    size_t bytes() const { return bytes_; }
    const uint8_t* data() const { return data_; }

    // y[t * y_stride + r] = dot(row r, quantized activation row t) for the rows of groups [group_begin, group_end)
    // (rows past rows() are not written) and tokens [0, n_tokens); activation row t (in the type's activation
    // format, find_q8_kernels(type)->act: Q8_K or Q8_0 blocks, as quantize_activations makes them) starts at xq + t * xq_stride. Single-threaded; bitwise equal to
    // find_q8_kernels(type())->dot_rows_scalar for every (row, token).
    void dot_groups(int64_t group_begin, int64_t group_end, const uint8_t* xq, size_t xq_stride, int64_t n_tokens,
                    float* y, int64_t y_stride) const;

private:
    GgmlType type_;
    int64_t rows_, cols_;
    size_t record_bytes_ = 0;
    size_t bytes_ = 0;
    const uint8_t* data_ = nullptr;  // 64-byte aligned
    bool owns_ = false;        // data_ is ours to free (std::aligned_alloc)
};

// The repacked matrices of one backend, made on a background thread at idle priority that starts with the backend.
// Results are bitwise the same with or without a repacked copy (unless requantized, for a draft, which waits for
// every copy before it drafts), so each matrix switches to its copy as soon as it is
// published (an atomic pointer), and forward passes do not wait for the rest (CpuBackend::forward waits only in a
// step long enough for the copies to pay for the wait). Memory stays near the file's size: a matrix's file pages are
// released as soon as its copy is published, and again when a forward pass that was running then (and may have
// read them back) ends, so every weight is resident about once, from the file or from a copy. The copies share one
// anonymous mapping, on transparent huge pages when asked. How long the copies take to make depends mostly on how
// fast fresh pages fault in: the 1.5B's 953 MB took 0.18-0.31 s on huge pages with memory freed moments before, but
// 1.4 s on huge pages and 0.3 s on small ones once this Firecracker VM's host had taken the freed memory back
// (a test program: 1 GB first touched in 2.2 s on huge pages, 0.41 s on small).
// With a RepackCacheSpec the copies are kept in a cache file (repack_cache.h) instead of anonymous memory: the first
// run makes them into the file (committed once every copy is made), later runs map it, and the background thread
// checks each matrix's checksum before publishing it, so that nothing unchecked is ever read as weights (a damaged
// file is removed and the file's layout serves for the rest of that run).
class RepackedWeights {
public:
    // Plans a copy of every view whose type is available() and starts repacking them, largest first, calling
    // release(view) from the background thread once a copy is in use (the backend drops the file pages: the
    // resident size then stays near the file's). With nothing to repack, or no memory for the copies, nothing
    // is repacked and the backend keeps the file's layout.
    // With `requantize_to`, the copies are requantized where RepackedMatrix::requantized_type says so (a draft's).
    // `huge_pages`: ask for transparent huge pages for the copies (see CpuBackendOptions::huge_pages; not for a
    // cache file's, which the page cache holds).
    RepackedWeights(const std::vector<const WeightView*>& views, std::function<void(const WeightView&)> release,
                    std::optional<GgmlType> requantize_to = std::nullopt, bool huge_pages = false,
                    const RepackCacheSpec& cache = {});
    // Stops the background thread after the matrix in progress; copies going into a new cache file are finished
    // first (the next run maps them).
    ~RepackedWeights();
    RepackedWeights(const RepackedWeights&) = delete;
    RepackedWeights& operator=(const RepackedWeights&) = delete;

    // The repacked copy of the tensor at `data` once it is ready, else nullptr.
    const RepackedMatrix* find(const void* data) const;
    // The type the tensor at `data` is (being) copied as: its own, or the requantized one; nullopt when it has no
    // copy planned (then its file's layout serves for good).
    std::optional<GgmlType> copy_type(const void* data) const;
    // Blocks until every copy is ready (or the repacking gave up), repacking the matrices not yet started on the
    // calling thread beside the background one; cheap once done.
    void wait() const;
    // Bracket a forward pass that may read the file's layout of matrices find() did not return yet: the pages of
    // those published meanwhile are released once more after it ends. While a `prefill` pass runs (the time to
    // first token waits on it), background repacking pauses in every backend of the process; during decode and
    // verification it goes on at idle priority. Calls come from the backend's one calling thread, never nested.
    void begin_forward(bool prefill);
    void end_forward(bool prefill);
    size_t bytes() const { return bytes_; }  // planned
    // The copies come from a cache file made by an earlier run (checked matrix by matrix before use).
    bool from_cache() const { return from_cache_; }
    // Where the copies are: "memory", "the cache file PATH", or "a new cache file PATH"; for -v.
    std::string describe() const;

private:
    struct Entry {
        size_t index;  // in entries_ (and the cache file's checksums)
        const WeightView* view;
        GgmlType copy_type;  // view->type, or the type it is requantized to
        uint8_t* storage;
        std::unique_ptr<RepackedMatrix> matrix;  // set by the worker before `ready`
        std::atomic<const RepackedMatrix*> ready{nullptr};
    };
    void run();
    // Claims the next matrix not started and repacks it on `pool`; false when none is left (or after a failure).
    bool repack_next(ThreadPool& pool);
    std::vector<std::unique_ptr<Entry>> entries_;  // largest first
    std::unordered_map<const void*, const Entry*> by_data_;
    std::function<void(const WeightView&)> release_;
    void* arena_ = nullptr;  // anonymous memory, unless cache_file_ holds the copies
    size_t bytes_ = 0;
    std::unique_ptr<RepackCacheFile> cache_file_;
    bool from_cache_ = false;
    std::atomic<bool> stop_{false};
    mutable std::mutex mutex_;  // guards next_, busy_, gave_up_, done_, in_forward_, pending_release_
    size_t next_ = 0;           // entries_[next_] is the next matrix to repack
    int busy_ = 0;              // matrices being repacked now (background thread, a waiting caller)
    bool gave_up_ = false;
    bool in_forward_ = false;
    bool proceed() const;  // between row groups: false once stopping; blocks while a prefill pass runs
    std::vector<const WeightView*> pending_release_;  // published during the forward pass in flight
    mutable std::condition_variable done_cv_;
    bool done_ = false;
    std::atomic<bool> done_flag_{false};  // done_, readable without the mutex
    std::thread worker_;
};

namespace q8_detail {

// The row-lane kernel behind RepackedMatrix::dot_groups for a type: groups are data + g * group_bytes, each
// n_blocks records; nullptr when the build or the CPU has none.
using RepackedDotFn = void (*)(const uint8_t* data, size_t group_bytes, int64_t n_blocks, int64_t rows,
                               int64_t group_begin, int64_t group_end, const uint8_t* xq, size_t xq_stride,
                               int64_t n_tokens, float* y, int64_t y_stride);
RepackedDotFn repacked_avx512_kernel(GgmlType type);  // quant_q8_repacked_avx512.cpp

// Writes the records of super-blocks [0, n_blocks) of one group: row r of the group is rows + r * row_bytes (the
// caller passes valid_rows < 16 for a last partial group; the missing rows become zero rows). 16 x 16 dword
// transposes in AVX-512 registers; nullptr where repacked_avx512_kernel is.
using RepackGroupFn = void (*)(const uint8_t* rows, size_t row_bytes, int valid_rows, int64_t n_blocks, uint8_t* out);
RepackGroupFn repack_avx512(GgmlType type);

// Record layout constants shared by the repacker and the kernels.
namespace q4k16 {
constexpr size_t kQs = 0, kScales = 2048, kMinPairs = 2176, kD = 2304, kDmin = 2336, kBytes = 2368;
}
namespace q6k16 {
constexpr size_t kCodes = 0, kScales = 3072, kD = 3328, kBytes = 3392;
}
namespace legacy16 {  // records of a pair of 32-element blocks
constexpr size_t kQ4_0Bytes = 576, kQ5_0Bytes = 704, kQ8_0Bytes = 1088;
}

}  // namespace q8_detail
}  // namespace tandem::cpu
