// Tests of ThreadPool: exact coverage of the partition, the thread index contract, many back-to-back calls, the
// spin-then-sleep wake-up path, exception propagation and shutdown.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "cpu/thread_pool.h"
#include "error.h"

using tandem::cpu::ThreadPool;

TEST_CASE("thread_pool covers every item exactly once, in contiguous chunks by thread index") {
    for (int threads : {1, 2, 3, 4, 7}) {
        ThreadPool pool(threads);
        CHECK(pool.size() == threads);
        for (int64_t n : {0, 1, 2, 3, 5, 6, 7, 8, 100, 1000, 100003}) {
            CAPTURE(threads);
            CAPTURE(n);
            std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
            std::vector<std::atomic<int>> calls(static_cast<size_t>(threads));
            std::atomic<int> bad_chunks{0};
            pool.parallel_for(n, [&](int64_t begin, int64_t end, int thread) {
                if (thread < 0 || thread >= threads || begin >= end ||
                    begin != ThreadPool::chunk_begin(n, threads, thread) ||
                    end != ThreadPool::chunk_begin(n, threads, thread + 1))
                    bad_chunks.fetch_add(1);
                else
                    calls[thread].fetch_add(1);
                for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
            });
            CHECK(bad_chunks.load() == 0);
            int wrong = 0;
            for (auto& h : hits) wrong += h.load() != 1;
            CHECK(wrong == 0);
            for (int t = 0; t < threads; ++t) {
                const bool has_items =
                    ThreadPool::chunk_begin(n, threads, t) < ThreadPool::chunk_begin(n, threads, t + 1);
                CHECK(calls[t].load() == (has_items ? 1 : 0));
            }
        }
    }
}

TEST_CASE("thread_pool partition is balanced and static") {
    CHECK(ThreadPool::chunk_begin(10, 3, 0) == 0);
    CHECK(ThreadPool::chunk_begin(10, 3, 1) == 4);
    CHECK(ThreadPool::chunk_begin(10, 3, 2) == 7);
    CHECK(ThreadPool::chunk_begin(10, 3, 3) == 10);
    CHECK(ThreadPool::chunk_begin(2, 4, 4) == 2);
}

TEST_CASE("thread_pool runs 10000 back-to-back calls") {
    ThreadPool pool(2);  // no more threads than a small CI machine has cores: oversubscribed, calls take a time slice
    std::atomic<int64_t> sum{0};
    int64_t expected = 0;
    for (int call = 0; call < 10000; ++call) {
        const int64_t n = call % 17;
        expected += n * (n - 1) / 2;
        pool.parallel_for(n, [&](int64_t begin, int64_t end, int) {
            int64_t local = 0;
            for (int64_t i = begin; i < end; ++i) local += i;
            sum.fetch_add(local, std::memory_order_relaxed);
        });
    }
    CHECK(sum.load() == expected);
}

TEST_CASE("thread_pool wakes sleeping workers") {
    // A tiny spin makes the workers fall asleep between most calls; random gaps around the spin time exercise the
    // race between a worker going to sleep and the next call being published.
    ThreadPool pool(3, std::chrono::microseconds(20));
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> gap_us(0, 60);
    std::atomic<int> items{0};
    for (int call = 0; call < 300; ++call) {
        std::this_thread::sleep_for(std::chrono::microseconds(gap_us(rng)));
        pool.parallel_for(30, [&](int64_t begin, int64_t end, int) { items.fetch_add(static_cast<int>(end - begin)); });
    }
    CHECK(items.load() == 300 * 30);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // certainly asleep now
    pool.parallel_for(3, [&](int64_t begin, int64_t end, int) { items.fetch_add(static_cast<int>(end - begin)); });
    CHECK(items.load() == 300 * 30 + 3);
}

TEST_CASE("thread_pool accepts std::function and mutable lambdas without copying them") {
    ThreadPool pool(2);
    std::atomic<int> count{0};
    const std::function<void(int64_t, int64_t, int)> fn = [&](int64_t b, int64_t e, int) {
        count.fetch_add(static_cast<int>(e - b));
    };
    pool.parallel_for(10, fn);
    CHECK(count.load() == 10);
    struct Counter {
        std::atomic<int>* target;
        explicit Counter(std::atomic<int>* t) : target(t) {}
        Counter(const Counter&) = delete;  // parallel_for must take it by reference
        void operator()(int64_t b, int64_t e, int) { target->fetch_add(static_cast<int>(e - b)); }
    } counter(&count);
    pool.parallel_for(5, counter);
    CHECK(count.load() == 15);
}

TEST_CASE("thread_pool rethrows an exception from a chunk after all chunks finish, and stays usable") {
    for (int threads : {1, 3}) {
        ThreadPool pool(threads);
        std::atomic<int> finished{0};
        CHECK_THROWS_AS(pool.parallel_for(9,
                                          [&](int64_t begin, int64_t, int) {
                                              if (begin == 0) throw std::runtime_error("chunk failed");
                                              finished.fetch_add(1);
                                          }),
                        std::runtime_error);
        CHECK(finished.load() == threads - 1);
        std::atomic<int> items{0};
        pool.parallel_for(9, [&](int64_t b, int64_t e, int) { items.fetch_add(static_cast<int>(e - b)); });
        CHECK(items.load() == 9);
    }
}

TEST_CASE("thread_pool shuts down cleanly whether idle, spinning or asleep") {
    { ThreadPool never_used(4); }
    {
        ThreadPool just_used(4);  // destroyed while its workers still spin
        just_used.parallel_for(8, [](int64_t, int64_t, int) {});
    }
    {
        ThreadPool asleep(4, std::chrono::microseconds(1));
        asleep.parallel_for(8, [](int64_t, int64_t, int) {});
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    CHECK_THROWS_AS(ThreadPool(0), tandem::Error);
}
