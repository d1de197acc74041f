// ThreadPool: a fixed set of worker threads that run one parallel_for at a time, each call splitting [0, n) into
// size() contiguous chunks. Built for the decode loop, which makes thousands of short calls per second: workers
// spin on a generation counter for a moment before sleeping, and a call allocates nothing.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace tandem::cpu {

class ThreadPool {
public:
    // How long a waiting thread polls before it blocks: an idle worker for the next call, the caller for the last
    // worker. Long enough to bridge the gap between two matmuls of a decode step (norms, RoPE, attention on the
    // caller's thread), short enough that an idle pool (the draft model's while the target verifies, a REPL
    // waiting for input) soon stops taking CPU from anyone.
    static constexpr std::chrono::microseconds kDefaultSpin{200};

    // n_threads >= 1 threads in all, the calling thread included (so n_threads - 1 workers are started).
    explicit ThreadPool(int n_threads, std::chrono::microseconds spin = kDefaultSpin);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return n_threads_; }

    // Calls fn(begin, end, thread_index) for the chunks of a static partition of [0, n_items) into size()
    // contiguous chunks, chunk i going to thread i (the caller runs chunk 0), and returns when all are done. Chunks
    // that would be empty are skipped. The partition depends only on n_items and size(). fn is called by
    // reference, never copied: any callable works (a lambda, std::function). An exception thrown by fn is
    // rethrown here once every chunk has finished. Not reentrant: fn must not call parallel_for on this pool, and
    // one pool serves one calling thread at a time.
    template <class Fn>
    void parallel_for(int64_t n_items, Fn&& fn) {
        using F = std::remove_reference_t<Fn>;
        static_assert(std::is_invocable_v<F&, int64_t, int64_t, int>,
                      "parallel_for needs a callable taking (int64_t begin, int64_t end, int thread_index)");
        run(n_items,
            [](void* ctx, int64_t begin, int64_t end, int thread) { (*static_cast<F*>(ctx))(begin, end, thread); },
            const_cast<void*>(static_cast<const void*>(std::addressof(fn))));
    }

    // Chunk i of the partition of n_items into n_chunks: sizes differ by at most one, larger chunks first.
    static int64_t chunk_begin(int64_t n_items, int n_chunks, int i) {
        const int64_t base = n_items / n_chunks, extra = n_items % n_chunks;
        return i * base + std::min<int64_t>(i, extra);
    }

private:
    using ChunkFn = void (*)(void* ctx, int64_t begin, int64_t end, int thread);

    void run(int64_t n_items, ChunkFn fn, void* ctx);
    void run_chunk(int thread) noexcept;
    void worker_main(int thread);
    // Waits until the generation differs from `seen` (returns it) or the pool stops (returns `seen`).
    uint64_t wait_for_work(uint64_t seen);
    // The caller's wait for remaining_ to reach zero.
    void wait_for_workers();

    const int n_threads_;
    const std::chrono::microseconds spin_;
    std::vector<std::thread> workers_;

    // The current job. Written by the caller before it publishes a new generation, read by workers after they see
    // it; the generation's release/acquire orders the two.
    ChunkFn job_fn_ = nullptr;
    void* job_ctx_ = nullptr;
    int64_t job_items_ = 0;

    // Kept on separate cache lines: workers poll generation_ while finishing workers write remaining_.
    alignas(64) std::atomic<uint64_t> generation_{0};
    alignas(64) std::atomic<int> remaining_{0};  // workers still running the current generation
    alignas(64) std::atomic<int> sleepers_{0};   // workers blocked (or about to block) on wake_
    std::atomic<bool> caller_blocked_{false};    // the caller is blocked (or about to block) on done_
    std::atomic<bool> stop_{false};

    std::mutex mutex_;  // guards the sleep / wake handshakes and first_error_
    std::condition_variable wake_;  // workers wait here for a new generation
    std::condition_variable done_;  // the caller waits here for the last worker
    std::exception_ptr first_error_;
};

}  // namespace tandem::cpu
