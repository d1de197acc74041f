// Tests of the CUDA emulation's cooperative launches (kernels/emu/, launch_cooperative_kernel in common.cuh): every
// block resident at once, grid_sync ordering every block's writes before any block's reads in every block and thread
// order, each block's own poisoned shared memory across the barrier, polling another block's write with __nanosleep,
// graphs replaying the launch as cooperative, and the misuse reports (a grid_sync outside a cooperative launch, at
// different call sites, not reached by a thread or a block, beside a __syncthreads, a grid too large to be resident,
// polling for a write that never comes).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common.cuh"
#include "cuda_compat.h"
#include "device.h"
#include "kernel_test_helpers.h"

using tandem::emu::Error;
using tandem::emu::LaunchOptions;
using tandem::emu::ScopedLaunchOptions;
using tandem::emu::ThreadOrder;

namespace {

const auto& kOrders = tandem::kernel_test::kFourOrders;
using tandem::kernel_test::launch_error;

void launch_coop(const char* name, auto kernel, unsigned blocks, unsigned threads, auto... args) {
    tandem::cuda::detail::launch_cooperative_kernel(name, kernel, dim3(blocks), dim3(threads), 0, nullptr, args...);
}

// Rounds of a grid-wide stencil: every round each block sums its threads' values into partials[block], then every
// thread adds the sum of its neighbour block's partial, which another block wrote in this round. With kGridSync two
// grid_syncs a round, called in a loop (the same two call sites every round); without them a block reads partials
// other blocks have not written yet.
template <bool kGridSync>
__global__ void rounds_kernel(float* values, float* partials, int rounds) {
    TANDEM_SHARED(float, sums, 32);
    const unsigned t = threadIdx.x, b = blockIdx.x, i = b * blockDim.x + t;
    for (int r = 0; r < rounds; ++r) {
        float v = values[i];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
        if (t % 32 == 0) sums[t / 32] = v;
        __syncthreads();
        if (t == 0) {
            float s = 0;
            for (unsigned w = 0; w < blockDim.x / 32; ++w) s += sums[w];
            partials[b] = s;
        }
        if constexpr (kGridSync)
            tandem_grid_sync();  // every block's partial is written
        else
            __syncthreads();
        values[i] += 0.001f * partials[(b + 1) % gridDim.x];
        __syncthreads();
        if constexpr (kGridSync) tandem_grid_sync();  // every value is updated before the next round reads them
    }
}

std::vector<float> rounds_reference(std::vector<float> v, unsigned blocks, unsigned threads, int rounds) {
    for (int r = 0; r < rounds; ++r) {
        std::vector<float> partials(blocks);
        for (unsigned b = 0; b < blocks; ++b) {
            // The kernel's order: a warp's butterfly sum, then the warps' sums in order.
            float s = 0;
            for (unsigned w = 0; w < threads / 32; ++w) {
                float lanes[32];
                for (unsigned l = 0; l < 32; ++l) lanes[l] = v[b * threads + w * 32 + l];
                for (int o = 16; o > 0; o >>= 1) {
                    float next[32];
                    for (unsigned l = 0; l < 32; ++l) next[l] = lanes[l] + lanes[l ^ static_cast<unsigned>(o)];
                    for (unsigned l = 0; l < 32; ++l) lanes[l] = next[l];
                }
                s += lanes[0];
            }
            partials[b] = s;
        }
        for (unsigned b = 0; b < blocks; ++b)
            for (unsigned t = 0; t < threads; ++t) v[b * threads + t] += 0.001f * partials[(b + 1) % blocks];
    }
    return v;
}

// Each block keeps a value of its own in shared memory across a grid_sync, while the other blocks run.
__global__ void shared_across_grid_sync_kernel(int* out) {
    TANDEM_SHARED(int, mine, 64);
    const unsigned t = threadIdx.x;
    mine[t] = static_cast<int>(blockIdx.x * 1000 + t);
    tandem_grid_sync();
    out[blockIdx.x * blockDim.x + t] = mine[(t + 1) % blockDim.x];
}

// A block reads shared memory it never wrote: the poison, in every block of the launch.
__global__ void read_unwritten_shared_kernel(float* out) {
    TANDEM_SHARED(float, never_written, 32);
    tandem_grid_sync();
    out[blockIdx.x * blockDim.x + threadIdx.x] = never_written[threadIdx.x];
}

// Block 0 publishes a value late (after a loop of barriers); the other blocks poll for it with __nanosleep.
__global__ void poll_flag_kernel(volatile int* flag, int* out) {
    if (blockIdx.x == 0) {
        for (int k = 0; k < 3; ++k) __syncthreads();
        if (threadIdx.x == 0) *flag = 42;
        return;
    }
    while (*flag == 0) __nanosleep(100);
    out[blockIdx.x * blockDim.x + threadIdx.x] = *flag;
}

__global__ void poll_forever_kernel(volatile int* flag) {
    while (*flag == 0) __nanosleep(100);
}

__global__ void nanosleep_kernel(int* out) {
    __nanosleep(100);
    out[blockIdx.x * blockDim.x + threadIdx.x] = 7;
}

__global__ void grid_sync_kernel(int* out) {
    tandem_grid_sync();
    out[blockIdx.x] = 1;
}

__global__ void grid_sync_two_sites_kernel() {
    if (blockIdx.x == 0)
        tandem_grid_sync();
    else
        tandem_grid_sync();
}

__global__ void grid_sync_two_sites_in_block_kernel() {
    if (threadIdx.x == 0)
        tandem_grid_sync();
    else
        tandem_grid_sync();
}

__global__ void block_exits_before_grid_sync_kernel() {
    if (blockIdx.x == 1) return;
    tandem_grid_sync();
}

__global__ void thread_exits_before_grid_sync_kernel() {
    if (threadIdx.x == 5) return;
    tandem_grid_sync();
}

__global__ void grid_sync_beside_syncthreads_kernel() {
    if (threadIdx.x < 32)
        tandem_grid_sync();
    else
        __syncthreads();
}

}  // namespace

TEST_CASE("cuda emu cooperative: grid_sync orders every block's writes before any block's reads, in every order") {
    const unsigned blocks = 6, threads = 128;
    const int rounds = 4;
    std::vector<float> init(blocks * threads);
    for (size_t i = 0; i < init.size(); ++i) init[i] = std::sin(0.37f * static_cast<float>(i));
    const std::vector<float> want = rounds_reference(init, blocks, threads, rounds);
    for (const LaunchOptions& o : kOrders) {
        ScopedLaunchOptions scope(o);
        CAPTURE(static_cast<int>(o.order));
        CAPTURE(o.seed);
        std::vector<float> values = init, partials(blocks, NAN);
        launch_coop("rounds", rounds_kernel<true>, blocks, threads, values.data(), partials.data(), rounds);
        CHECK(values == want);
    }
}

TEST_CASE("cuda emu cooperative: without grid_sync a block reads partials not yet written, which the emulation shows") {
    // Blocks of a cooperative launch run interleaved only at grid-wide barriers, so without them a block runs to
    // its end before the next begins and reads the unwritten (NaN) partials of the blocks after it.
    const unsigned blocks = 4, threads = 64;
    std::vector<float> init(blocks * threads, 1.0f);
    const std::vector<float> want = rounds_reference(init, blocks, threads, 2);
    for (const LaunchOptions& o : {LaunchOptions{ThreadOrder::Forward, 0}, LaunchOptions{ThreadOrder::Reverse, 0}}) {
        ScopedLaunchOptions scope(o);
        std::vector<float> values = init, partials(blocks, NAN);
        launch_coop("rounds_no_grid_sync", rounds_kernel<false>, blocks, threads, values.data(),
                    partials.data(), 2);
        CHECK(values != want);
        bool any_nan = false;
        for (float v : values) any_nan |= std::isnan(v);
        CHECK(any_nan);
    }
}

TEST_CASE("cuda emu cooperative: each block keeps its own shared memory across grid_sync, poisoned at its start") {
    const unsigned blocks = 5, threads = 64;
    for (const LaunchOptions& o : kOrders) {
        ScopedLaunchOptions scope(o);
        std::vector<int> out(blocks * threads, -1);
        launch_coop("shared_across_grid_sync", shared_across_grid_sync_kernel, blocks, threads, out.data());
        for (unsigned b = 0; b < blocks; ++b)
            for (unsigned t = 0; t < threads; ++t)
                CHECK(out[b * threads + t] == static_cast<int>(b * 1000 + (t + 1) % threads));
    }
    std::vector<float> poison(3 * 32, 0.0f);
    launch_coop("read_unwritten_shared", read_unwritten_shared_kernel, 3, 32, poison.data());
    for (float v : poison) CHECK(std::isnan(v));
}

TEST_CASE("cuda emu cooperative: a block polling another's write with __nanosleep gets it in every order") {
    for (const LaunchOptions& o : kOrders) {
        ScopedLaunchOptions scope(o);
        int flag = 0;
        std::vector<int> out(4 * 32, -1);
        launch_coop("poll_flag", poll_flag_kernel, 4, 32, &flag, out.data());
        CHECK(flag == 42);
        for (size_t i = 32; i < out.size(); ++i) CHECK(out[i] == 42);
    }
    // Outside a cooperative launch __nanosleep waits for nothing (blocks run one after another).
    std::vector<int> slept(2 * 32, 0);
    tandem::emu::launch("nanosleep", nanosleep_kernel, dim3(2), dim3(32), 0, slept.data());
    CHECK(slept == std::vector<int>(2 * 32, 7));
    // Polling for a write no block will make is reported, not an endless loop.
    int flag = 0;
    const std::string e = launch_error([&] { launch_coop("poll_forever", poll_forever_kernel, 2, 32, &flag); });
    CHECK(e.find("poll_forever") != std::string::npos);
    CHECK(e.find("waits for a write no block will make") != std::string::npos);
}

TEST_CASE("cuda emu cooperative: a captured cooperative launch replays as one, and never overlaps the one before") {
    void* stream = tandem::emu::stream_create();
    std::vector<int> out(4, 0);
    tandem::emu::begin_capture(stream);
    tandem::cuda::detail::launch_cooperative_kernel("grid_sync", grid_sync_kernel, dim3(4), dim3(64), 0, stream,
                                                    out.data());
    const tandem::emu::Graph graph = tandem::emu::end_capture(stream);
    CHECK(out == std::vector<int>(4, 0));  // recorded, not run
    REQUIRE(graph.nodes.size() == 1u);
    tandem::emu::graph_launch(graph, stream);
    CHECK(out == std::vector<int>(4, 1));
    // A grid too large to be resident fails at the capturing launch, as CUDA's does.
    tandem::emu::begin_capture(stream);
    CHECK_THROWS_AS(tandem::cuda::detail::launch_cooperative_kernel("grid_sync", grid_sync_kernel, dim3(100),
                                                                    dim3(64), 0, stream, out.data()),
                    Error);
    CHECK_THROWS_AS(tandem::emu::end_capture(stream), Error);
    tandem::emu::stream_destroy(stream);
    // A cooperative launch does not overlap the kernel before it, even on a programmatic stream: its threads need not
    // wait for their inputs (grid_sync_kernel does not).
    void* overlapping = tandem::emu::stream_create(true);
    out.assign(4, 0);
    tandem::cuda::detail::launch_cooperative_kernel("grid_sync", grid_sync_kernel, dim3(4), dim3(64), 0, overlapping,
                                                    out.data());
    CHECK(out == std::vector<int>(4, 1));
    tandem::emu::stream_destroy(overlapping);
}

TEST_CASE("cuda emu cooperative: the grid must be resident at once, as cooperative_max_blocks says") {
    // One emulated SM: 2048 threads, 32 blocks, 228 KiB of shared memory with 1 KiB reserved per block.
    CHECK(tandem::cuda::cooperative_max_blocks(nullptr, 256, 0) == 8);
    CHECK(tandem::cuda::cooperative_max_blocks(nullptr, 1024, 0) == 2);
    CHECK(tandem::cuda::cooperative_max_blocks(nullptr, 32, 0) == 32);
    CHECK(tandem::cuda::cooperative_max_blocks(nullptr, 100, 0) == 16);  // 4 warps' worth of threads
    CHECK(tandem::cuda::cooperative_max_blocks(nullptr, 128, 100 * 1024) == 2);
    std::vector<int> out(9, 0);
    launch_coop("grid_sync", grid_sync_kernel, 8, 256, out.data());
    CHECK(out[7] == 1);
    const std::string e = launch_error([&] { launch_coop("grid_sync", grid_sync_kernel, 9, 256, out.data()); });
    CHECK(e.find("cudaErrorCooperativeLaunchTooLarge") != std::string::npos);
    CHECK(e.find("9 blocks") != std::string::npos);
}

TEST_CASE("cuda emu cooperative: grid_sync misuse is reported") {
    std::vector<int> out(4, 0);
    std::string e =
        launch_error([&] { tandem::emu::launch("plain", grid_sync_kernel, dim3(2), dim3(32), 0, out.data()); });
    CHECK(e.find("not cooperative") != std::string::npos);

    e = launch_error([&] { launch_coop("two_sites", grid_sync_two_sites_kernel, 3, 32); });
    CHECK(e.find("blocks wait at different grid_sync calls") != std::string::npos);
    CHECK(e.find("test_cuda_emu_cooperative.cpp") != std::string::npos);

    e = launch_error([&] { launch_coop("two_sites_in_block", grid_sync_two_sites_in_block_kernel, 2, 64); });
    CHECK(e.find("threads wait at different grid_sync calls") != std::string::npos);

    for (const LaunchOptions& o : {LaunchOptions{ThreadOrder::Forward, 0}, LaunchOptions{ThreadOrder::Reverse, 0}}) {
        ScopedLaunchOptions scope(o);
        e = launch_error([&] { launch_coop("block_exits", block_exits_before_grid_sync_kernel, 3, 32); });
        CHECK(e.find("is not reached by block (1,0,0), which has exited") != std::string::npos);
    }

    e = launch_error([&] { launch_coop("thread_exits", thread_exits_before_grid_sync_kernel, 2, 64); });
    CHECK(e.find("is not reached by all threads of block") != std::string::npos);
    CHECK(e.find("63 of 64 wait") != std::string::npos);

    e = launch_error([&] { launch_coop("beside_syncthreads", grid_sync_beside_syncthreads_kernel, 2, 64); });
    CHECK(e.find("threads wait at different barriers") != std::string::npos);

    // The runtime stays usable after each failure (every fiber of every block unwound).
    launch_coop("grid_sync", grid_sync_kernel, 4, 64, out.data());
    CHECK(out == std::vector<int>(4, 1));
}
