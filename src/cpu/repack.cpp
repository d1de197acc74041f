// RepackedMatrix and RepackedWeights (repack.h): which types and CPUs have a repacked layout, the allocation and the
// split of the repacking across threads, and the dispatch to the row-lane kernels (the repacking and the kernels
// themselves are in quant_q8_repacked_avx512.cpp).
#include "cpu/repack.h"

#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "cpu/dispatch.h"
#include "cpu/quant.h"
#include "cpu/quant_q8.h"
#include "cpu/repack_cache.h"
#include "cpu/thread_pool.h"
#include "error.h"

namespace tandem::cpu {
namespace {

q8_detail::RepackedDotFn kernel_for(GgmlType type) {
    return avx512_kernels_enabled() ? q8_detail::repacked_avx512_kernel(type) : nullptr;
}

size_t record_bytes_of(GgmlType type) {
    switch (type) {
        case GgmlType::Q4_K: return q8_detail::q4k16::kBytes;
        case GgmlType::Q6_K: return q8_detail::q6k16::kBytes;
        case GgmlType::Q4_0: return q8_detail::legacy16::kQ4_0Bytes;
        case GgmlType::Q5_0: return q8_detail::legacy16::kQ5_0Bytes;
        case GgmlType::Q8_0: return q8_detail::legacy16::kQ8_0Bytes;
        default: return 0;
    }
}

}  // namespace

bool RepackedMatrix::available(GgmlType type) {
    static const bool on = dispatch().repack;
    return on && kernel_for(type) != nullptr;
}

bool RepackedMatrix::available(GgmlType type, int64_t cols) {
    return available(type) && cols > 0 && cols % record_elements(type) == 0;
}

int64_t RepackedMatrix::record_elements(GgmlType type) {
    return type == GgmlType::Q4_K || type == GgmlType::Q6_K ? kQK_K : 64;
}

GgmlType RepackedMatrix::requantized_type(GgmlType type, int64_t cols, GgmlType target) {
    if (type == target || !available(target, cols) || !cpu_supports(type)) return type;
    const GgmlTypeInfo from = ggml_type_info(type), to = ggml_type_info(target);
    // More bytes per element: from.type_size / from.block_size > to.type_size / to.block_size.
    return static_cast<uint64_t>(from.type_size) * to.block_size > static_cast<uint64_t>(to.type_size) * from.block_size
               ? target
               : type;
}

size_t RepackedMatrix::storage_bytes(GgmlType type, int64_t cols, int64_t rows) {
    const size_t groups = static_cast<size_t>((rows + kGroupRows - 1) / kGroupRows);
    return groups * static_cast<size_t>(cols / record_elements(type)) * record_bytes_of(type);  // 64-byte multiples
}

RepackedMatrix::RepackedMatrix(GgmlType source_type, const void* W, int64_t cols, int64_t rows, ThreadPool& pool,
                               uint8_t* storage, const std::function<bool()>& proceed,
                               std::optional<GgmlType> requantize_to)
    : type_(requantize_to.value_or(source_type)), rows_(rows), cols_(cols), record_bytes_(record_bytes_of(type_)) {
    const GgmlType type = type_;
    if (record_bytes_ == 0 || !kernel_for(type) || !q8_detail::repack_avx512(type))
        throw Error(std::string("RepackedMatrix: no repacked layout or kernel for ") + ggml_type_name(type) +
                    " on this CPU");
    const bool requantize = type != source_type;
    if (requantize && (!cpu_supports(source_type) || !cpu_can_quantize(type)))
        throw Error(std::string("RepackedMatrix: cannot requantize ") + ggml_type_name(source_type) + " to " +
                    ggml_type_name(type));
    if (cols <= 0 || cols % record_elements(type) != 0 || rows <= 0)
        throw Error("RepackedMatrix: bad shape " + std::to_string(cols) + " x " + std::to_string(rows));
    const int64_t n_blocks = cols / record_elements(type);
    const size_t group_bytes = static_cast<size_t>(n_blocks) * record_bytes_;
    bytes_ = storage_bytes(type, cols, rows);
    uint8_t* out = storage;
    if (!out) {
        out = static_cast<uint8_t*>(std::aligned_alloc(64, bytes_));
        if (!out) throw Error("RepackedMatrix: out of memory for " + std::to_string(bytes_) + " bytes");
        owns_ = true;
    }
    data_ = out;
    const uint8_t* w = static_cast<const uint8_t*>(W);
    const size_t source_row_bytes = ggml_row_bytes(source_type, static_cast<uint64_t>(cols));
    const size_t row_bytes = ggml_row_bytes(type, static_cast<uint64_t>(cols));
    const q8_detail::RepackGroupFn repack = q8_detail::repack_avx512(type);
    std::atomic<bool> cancelled{false};
    pool.parallel_for(n_groups(), [&](int64_t g0, int64_t g1, int) {
        // Requantizing: a group's rows are decoded and encoded in `type` here, then repacked from there.
        std::vector<float> decoded(requantize ? static_cast<size_t>(cols) : 0);
        std::vector<uint8_t> encoded(requantize ? kGroupRows * row_bytes : 0);
        for (int64_t g = g0; g < g1; ++g) {
            if (proceed && !proceed()) {
                cancelled.store(true, std::memory_order_relaxed);
                return;
            }
            const int valid = static_cast<int>(std::min<int64_t>(kGroupRows, rows - g * kGroupRows));
            const uint8_t* group = w + g * kGroupRows * source_row_bytes;
            if (requantize) {
                for (int r = 0; r < valid; ++r)
                    requantize_row(source_type, group + r * source_row_bytes, type, encoded.data() + r * row_bytes, cols,
                                   decoded.data());
                group = encoded.data();
            }
            repack(group, row_bytes, valid, n_blocks, out + g * group_bytes);
        }
    });
    if (cancelled.load(std::memory_order_relaxed)) {
        if (owns_) std::free(out);
        owns_ = false;
        throw RepackCancelled{};
    }
}

RepackedMatrix::RepackedMatrix(GgmlType type, int64_t cols, int64_t rows, const uint8_t* storage)
    : type_(type), rows_(rows), cols_(cols), record_bytes_(record_bytes_of(type)) {
    if (record_bytes_ == 0 || !kernel_for(type) || cols <= 0 || cols % record_elements(type) != 0 || rows <= 0)
        throw Error(std::string("RepackedMatrix: no repacked layout or kernel for ") + ggml_type_name(type) + " " +
                    std::to_string(cols) + " x " + std::to_string(rows) + " on this CPU");
    bytes_ = storage_bytes(type, cols, rows);
    data_ = storage;
}

RepackedMatrix::~RepackedMatrix() {
    if (owns_) std::free(const_cast<uint8_t*>(data_));
}

void RepackedMatrix::dot_groups(int64_t group_begin, int64_t group_end, const uint8_t* xq, size_t xq_stride,
                                int64_t n_tokens, float* y, int64_t y_stride) const {
    const int64_t n_blocks = cols_ / record_elements(type_);
    kernel_for(type_)(data_, static_cast<size_t>(n_blocks) * record_bytes_, n_blocks, rows_, group_begin, group_end,
                      xq, xq_stride, n_tokens, y, y_stride);
}

}  // namespace tandem::cpu

namespace tandem::cpu {
namespace {

// Prefill passes in flight in the process, over every backend (target and draft each have their own repacking):
// background repacking pauses while any runs. At idle priority it would still take the cycles the pool's threads
// leave between operations and, more, memory bandwidth: a 42-token chat prompt on the 1.5B reached its first token
// in 0.37 s without repacking and 0.58-0.76 s beside it.
std::mutex g_prefill_mutex;
std::condition_variable g_prefill_cv;
int g_prefills = 0;

// A checksum of what this build's repacking makes of a small fixed matrix of `type` (copied as `copy_type`): part of
// a cache file's description, so that a file made by code that repacks or requantizes differently is never read.
// The source bytes are fixed pseudo-random ones with bit 14 of every 16-bit word clear, so that every fp16 field is
// finite; 20 rows cover a padded last group.
uint64_t layout_fingerprint(GgmlType type, GgmlType copy_type) {
    const int64_t cols =
        2 * std::max<int64_t>(RepackedMatrix::record_elements(copy_type), ggml_type_info(type).block_size);
    const int64_t rows = 20;
    std::vector<uint8_t> source(ggml_row_bytes(type, static_cast<uint64_t>(cols)) * rows);
    uint64_t state = 0x9E3779B97F4A7C15ULL ^ static_cast<uint64_t>(type);
    for (size_t i = 0; i + 1 < source.size(); i += 2) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        const auto word = static_cast<uint16_t>((state >> 33) & 0xBFFF);
        source[i] = static_cast<uint8_t>(word);
        source[i + 1] = static_cast<uint8_t>(word >> 8);
    }
    ThreadPool one(1);
    const RepackedMatrix m(type, source.data(), cols, rows, one, nullptr, {},
                           copy_type != type ? std::optional(copy_type) : std::nullopt);
    return repack_checksum(m.data(), m.bytes());
}

// What a cache file for these copies must hold (repack_cache.h): the model file's identity, the layout this build
// makes of each (type, copy type), and every matrix by its place in the file, largest first as the arena has them.
// Empty when the model file cannot be identified.
template <class CopyType>
std::string cache_description(const RepackCacheSpec& cache, const std::vector<const WeightView*>& todo,
                              const CopyType& copy_type) {
    std::string description = repack_model_identity(cache.model_path);
    if (description.empty()) return {};
    std::vector<std::pair<GgmlType, GgmlType>> kinds;
    for (const WeightView* v : todo)
        if (std::find(kinds.begin(), kinds.end(), std::pair(v->type, copy_type(v))) == kinds.end())
            kinds.emplace_back(v->type, copy_type(v));
    char line[160];
    for (const auto& [type, copy] : kinds) {
        std::snprintf(line, sizeof line, "layout %s %s %016llx\n", ggml_type_name(type), ggml_type_name(copy),
                      static_cast<unsigned long long>(layout_fingerprint(type, copy)));
        description += line;
    }
    for (const WeightView* v : todo) {
        std::snprintf(line, sizeof line, "matrix %lld %s %s %lld %lld\n",
                      static_cast<long long>(static_cast<const uint8_t*>(v->data) -
                                             static_cast<const uint8_t*>(cache.model_base)),
                      ggml_type_name(v->type), ggml_type_name(copy_type(v)), static_cast<long long>(v->cols),
                      static_cast<long long>(v->rows));
        description += line;
    }
    return description;
}

}  // namespace

RepackedWeights::RepackedWeights(const std::vector<const WeightView*>& views,
                                 std::function<void(const WeightView&)> release,
                                 std::optional<GgmlType> requantize_to, bool huge_pages, const RepackCacheSpec& cache)
    : release_(std::move(release)) {
    auto copy_type = [&](const WeightView* v) {
        return requantize_to ? RepackedMatrix::requantized_type(v->type, v->cols, *requantize_to) : v->type;
    };
    std::vector<const WeightView*> todo;
    for (const WeightView* v : views)
        if (v->data && RepackedMatrix::available(copy_type(v), v->cols) &&
            std::find_if(todo.begin(), todo.end(), [&](const WeightView* t) { return t->data == v->data; }) ==
                todo.end())
            todo.push_back(v);
    if (todo.empty()) return;
    // Largest first: the output matrix, the largest single read of a step, is ready soonest.
    std::stable_sort(todo.begin(), todo.end(),
                     [](const WeightView* a, const WeightView* b) { return a->n_bytes() > b->n_bytes(); });
    size_t total = 0;
    for (const WeightView* v : todo) total += RepackedMatrix::storage_bytes(copy_type(v), v->cols, v->rows);
    if (!cache.dir.empty() && cache.model_base) {
        const std::string description = cache_description(cache, todo, copy_type);
        std::string name = cache.model_path.substr(cache.model_path.rfind('/') + 1);
        if (name.size() > 5 && name.substr(name.size() - 5) == ".gguf") name.resize(name.size() - 5);
        if (requantize_to) name += std::string("-") + ggml_type_name(*requantize_to);
        if (!description.empty()) {
            cache_file_ = RepackCacheFile::open(cache.dir, name, description, total, todo.size());
            from_cache_ = cache_file_ != nullptr;
            if (!cache_file_) cache_file_ = RepackCacheFile::create(cache.dir, name, description, total, todo.size());
        }
    }
    if (cache_file_) {
        arena_ = cache_file_->payload();
    } else {
        void* arena = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (arena == MAP_FAILED) return;  // no memory for the copies: the file's layout serves
        // A hint; without transparent huge pages nothing changes. Left to the kernel's default (small pages where
        // THP is "madvise", as usual) when the caller does not ask.
        if (huge_pages) ::madvise(arena, total, MADV_HUGEPAGE);
        arena_ = arena;
    }
    bytes_ = total;
    uint8_t* cursor = static_cast<uint8_t*>(arena_);
    for (const WeightView* v : todo) {
        auto e = std::make_unique<Entry>();
        e->index = entries_.size();
        e->view = v;
        e->copy_type = copy_type(v);
        e->storage = cursor;
        cursor += RepackedMatrix::storage_bytes(e->copy_type, v->cols, v->rows);
        by_data_.emplace(v->data, e.get());
        entries_.push_back(std::move(e));
    }
    worker_ = std::thread([this] { run(); });
}

std::string RepackedWeights::describe() const {
    if (!cache_file_) return arena_ ? "memory" : "none";
    return (from_cache_ ? "the cache file " : "a new cache file ") + cache_file_->path();
}

void RepackedWeights::run() {
    // Idle priority: the copies are made with cycles nobody else wants (the rest of start-up, a chat waiting for
    // input, the gaps of a forward), so a forward that goes ahead with the file's layout is never slowed by them.
    // A caller that needs them waits (wait()), and repacks beside this thread meanwhile.
    sched_param idle{};
    ::sched_setscheduler(0, SCHED_IDLE, &idle);  // this thread only (Linux); failure just leaves normal priority
    ThreadPool one(1);  // this thread only: the backend's pool belongs to its forward passes (and the rest of
                        // start-up runs on the other core meanwhile)
    while (repack_next(one)) {
    }
}

bool RepackedWeights::repack_next(ThreadPool& pool) {
    Entry* e = nullptr;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (next_ >= entries_.size() || gave_up_ || stop_.load(std::memory_order_relaxed)) return false;
        e = entries_[next_++].get();
        ++busy_;
    }
    bool ok = true;
    try {
        const WeightView& v = *e->view;
        const size_t bytes = RepackedMatrix::storage_bytes(e->copy_type, v.cols, v.rows);
        if (from_cache_) {
            // Made by an earlier run: used only once its bytes are the ones that run wrote.
            ok = repack_checksum(e->storage, bytes) == cache_file_->checksum(e->index);
            if (ok) {
                e->matrix = std::make_unique<RepackedMatrix>(e->copy_type, v.cols, v.rows, e->storage);
            } else {
                std::fprintf(stderr, "tandem: warning: the repacked-weights cache %s is damaged: removed it (the "
                             "next run makes a new one)\n", cache_file_->path().c_str());
                cache_file_->discard();
            }
        } else {
            e->matrix = std::make_unique<RepackedMatrix>(
                v.type, v.data, v.cols, v.rows, pool, e->storage, [this] { return proceed(); },
                e->copy_type != v.type ? std::optional(e->copy_type) : std::nullopt);
            if (cache_file_) cache_file_->set_checksum(e->index, repack_checksum(e->storage, bytes));
        }
    } catch (...) {
        ok = false;  // cancelled, or out of memory: this and the matrices not started keep the file's layout
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (ok) {
        e->ready.store(e->matrix.get(), std::memory_order_release);
        // Released at once (the pages are the file's, nothing is lost), and once more after a forward pass that
        // was running: it may have faulted some back in, reading the file's layout before the copy was published.
        release_(*e->view);
        if (in_forward_) pending_release_.push_back(e->view);
    } else {
        gave_up_ = true;
    }
    --busy_;
    if (busy_ == 0 && (next_ >= entries_.size() || gave_up_ || stop_.load(std::memory_order_relaxed))) {
        // Every copy made: a new cache file is complete (a rename, under the lock so that it happens once).
        if (cache_file_ && !from_cache_ && !gave_up_ && next_ >= entries_.size()) cache_file_->commit();
        done_ = true;
        done_flag_.store(true, std::memory_order_release);
        done_cv_.notify_all();
    }
    return ok;
}

void RepackedWeights::wait() const {
    if (!worker_.joinable() || done_flag_.load(std::memory_order_acquire)) return;
    // The caller has nothing else to do: it repacks matrices too, at its own (normal) priority, so two threads work
    // on the copies instead of the one at idle priority.
    {
        ThreadPool one(1);
        auto* self = const_cast<RepackedWeights*>(this);  // the copies are the object's cache, not its value
        while (self->repack_next(one)) {
        }
    }
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [this] { return done_; });
}

bool RepackedWeights::proceed() const {
    std::unique_lock<std::mutex> lock(g_prefill_mutex);
    g_prefill_cv.wait(lock, [this] { return g_prefills == 0 || stop_.load(std::memory_order_relaxed); });
    return !stop_.load(std::memory_order_relaxed);
}

void RepackedWeights::begin_forward(bool prefill) {
    if (prefill) {
        std::lock_guard<std::mutex> lock(g_prefill_mutex);
        ++g_prefills;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    in_forward_ = true;
}

void RepackedWeights::end_forward(bool prefill) {
    if (prefill) {
        std::lock_guard<std::mutex> lock(g_prefill_mutex);
        --g_prefills;
        g_prefill_cv.notify_all();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    in_forward_ = false;
    for (const WeightView* v : pending_release_) release_(*v);
    pending_release_.clear();
}

RepackedWeights::~RepackedWeights() {
    // A new cache file is finished rather than dropped, so that the next run starts from it: a one-time cost, paid
    // where an answer took less time than making the copies (the 1.5B's take about a second). Copies in memory
    // stop after the matrix in progress.
    if (cache_file_ && !from_cache_) wait();
    {
        std::lock_guard<std::mutex> lock(g_prefill_mutex);  // wakes the worker if it is paused
        stop_.store(true, std::memory_order_relaxed);
        g_prefill_cv.notify_all();
    }
    if (worker_.joinable()) worker_.join();
    entries_.clear();
    if (cache_file_)
        cache_file_.reset();  // unmaps it (and removes a new file left incomplete)
    else if (arena_)
        ::munmap(arena_, bytes_);
}

std::optional<GgmlType> RepackedWeights::copy_type(const void* data) const {
    const auto it = by_data_.find(data);
    return it == by_data_.end() ? std::nullopt : std::optional(it->second->copy_type);
}

const RepackedMatrix* RepackedWeights::find(const void* data) const {
    const auto it = by_data_.find(data);
    return it == by_data_.end() ? nullptr : it->second->ready.load(std::memory_order_acquire);
}

}  // namespace tandem::cpu
