// ThreadPool: worker lifecycle, the spin-then-sleep wait for work, and the dispatch / completion handshake.
//
// Protocol. The caller writes the job, resets `remaining_`, then bumps `generation_`. A worker that sees a new
// generation runs its chunk and decrements `remaining_`; the caller runs chunk 0 and then polls `remaining_` down
// to zero. A worker can never miss a generation: the next one is only published after every worker has finished
// (and decremented for) the current one.
//
// Sleeping without lost wake-ups. A worker that gives up spinning increments `sleepers_` and re-checks the
// generation under the mutex before blocking; the caller bumps the generation and then reads `sleepers_`. Both
// are sequentially consistent, so at least one side sees the other: either the worker sees the new generation and
// does not block, or the caller sees a sleeper and notifies under the mutex, which it can only take once the worker
// is waiting. When nobody sleeps (the common case in decode), dispatch costs no system call. The caller's own
// wait for the last worker blocks the same way (`caller_blocked_` against the decrement of `remaining_`).
//
// Waiting threads pause-spin for a few microseconds, then poll with yields until `spin_` has passed, then block:
// fast when every thread has its own core, and no worse than blocking when threads outnumber free cores (another
// process, or the target and draft pools sharing a machine), where a spinning thread would hold the core that the
// thread everyone waits for needs.
#include "cpu/thread_pool.h"

#include <string>
#include <utility>

#include "error.h"

namespace tandem::cpu {
namespace {

// A hint to the core that this is a spin-wait loop (saves power, frees the sibling hyperthread).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

// Pause iterations before a waiting thread starts yielding: a few microseconds (PAUSE takes tens of cycles).
constexpr int kPauseSpins = 1 << 10;

}  // namespace

ThreadPool::ThreadPool(int n_threads, std::chrono::microseconds spin) : n_threads_(n_threads), spin_(spin) {
    if (n_threads < 1) throw Error("thread count must be at least 1 (got " + std::to_string(n_threads) + ")");
    workers_.reserve(static_cast<size_t>(n_threads - 1));
    for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_.store(true);
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
}

void ThreadPool::run(int64_t n_items, ChunkFn fn, void* ctx) {
    if (n_items <= 0) return;
    if (n_threads_ == 1) {  // nothing to hand out: run inline, exceptions propagate directly
        fn(ctx, 0, n_items, 0);
        return;
    }
    job_fn_ = fn;
    job_ctx_ = ctx;
    job_items_ = n_items;
    remaining_.store(n_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1);  // seq_cst: publishes the job, and orders against the sleepers_ read below
    if (sleepers_.load() > 0) {
        std::lock_guard<std::mutex> lock(mutex_);
        wake_.notify_all();
    }

    run_chunk(0);

    wait_for_workers();

    if (first_error_) {  // every worker is done, so nobody else touches it now
        std::exception_ptr error = std::exchange(first_error_, nullptr);
        std::rethrow_exception(error);
    }
}

void ThreadPool::run_chunk(int thread) noexcept {
    const int64_t begin = chunk_begin(job_items_, n_threads_, thread);
    const int64_t end = chunk_begin(job_items_, n_threads_, thread + 1);
    if (begin == end) return;
    try {
        job_fn_(job_ctx_, begin, end, thread);
    } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!first_error_) first_error_ = std::current_exception();
    }
}

void ThreadPool::worker_main(int thread) {
    uint64_t seen = 0;
    for (;;) {
        const uint64_t generation = wait_for_work(seen);
        if (generation == seen) return;  // stopping
        seen = generation;
        run_chunk(thread);
        // seq_cst: the last worker must either see that the caller blocks or be seen by it (see the header comment).
        if (remaining_.fetch_sub(1) == 1 && caller_blocked_.load()) {
            std::lock_guard<std::mutex> lock(mutex_);
            done_.notify_one();
        }
    }
}

void ThreadPool::wait_for_workers() {
    // Workers started at the same moment on equal chunks, so this wait is normally short. If it is not, a worker
    // has probably lost its core (more threads than free cores): yield ours to it, and in the end block.
    using Clock = std::chrono::steady_clock;
    Clock::time_point deadline{};
    for (int spins = 0; remaining_.load(std::memory_order_acquire) != 0; ++spins) {
        if (spins < kPauseSpins) {
            cpu_relax();
            continue;
        }
        if (spins == kPauseSpins) deadline = Clock::now() + spin_;
        if (Clock::now() >= deadline) {
            std::unique_lock<std::mutex> lock(mutex_);
            caller_blocked_.store(true);  // seq_cst, before the remaining_ re-check in the predicate
            done_.wait(lock, [&] { return remaining_.load() == 0; });
            caller_blocked_.store(false);
            return;
        }
        std::this_thread::yield();
    }
}

uint64_t ThreadPool::wait_for_work(uint64_t seen) {
    // Pause-spin first (in decode the next call is usually microseconds away), then poll with yields so that a
    // thread waiting for a core (the caller, or a sibling still running its chunk) gets ours, then block.
    using Clock = std::chrono::steady_clock;
    Clock::time_point deadline{};
    for (int spins = 0;; ++spins) {
        const uint64_t generation = generation_.load(std::memory_order_acquire);
        if (generation != seen) return generation;
        if (stop_.load(std::memory_order_relaxed)) return seen;
        if (spins < kPauseSpins) {
            cpu_relax();
            continue;
        }
        if (spins == kPauseSpins) deadline = Clock::now() + spin_;
        if (Clock::now() >= deadline) break;
        std::this_thread::yield();
    }

    std::unique_lock<std::mutex> lock(mutex_);
    sleepers_.fetch_add(1);  // seq_cst, before the generation_ re-check in the predicate
    wake_.wait(lock, [&] { return generation_.load() != seen || stop_.load(); });
    sleepers_.fetch_sub(1);
    // Stopping wins over a generation published at the same time: the destructor only runs once no call is active.
    return stop_.load() ? seen : generation_.load();
}

}  // namespace tandem::cpu
