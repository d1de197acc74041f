// Tests of the CUDA emulation runtime (kernels/emu/): exact barriers and their misuse reports, warp collectives with
// partial masks, the int8 tensor-core instruction (mma.sync) gathered from a warp's fragments, NaN-poisoned shared
// memory, launch limits, and errors raised inside kernels.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_compat.h"
#include "kernel_test_helpers.h"

using tandem::emu::Error;
using tandem::emu::LaunchOptions;
using tandem::emu::ScopedLaunchOptions;
using tandem::emu::ThreadOrder;

namespace {

const auto& kOrders = tandem::kernel_test::kFourOrders;
using tandem::kernel_test::launch_error;

unsigned linear_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

// Each thread publishes its id, then reads its neighbour's.
__global__ void rotate_kernel(int* out) {
    TANDEM_SHARED(int, ids, 256);
    const int t = threadIdx.x;
    ids[t] = t * 10;
    __syncthreads();
    out[blockIdx.x * blockDim.x + t] = ids[(t + blockDim.x - 1) % blockDim.x];
}

// The same without the barrier: correct only while every thread runs before its successor.
__global__ void rotate_no_barrier_kernel(int* out) {
    TANDEM_SHARED(int, ids, 256);
    const int t = threadIdx.x;
    ids[t] = t * 10;
    out[t] = ids[t == 0 ? 0 : t - 1];
}

__global__ void two_barriers_kernel() {
    if (threadIdx.x % 2)
        __syncthreads();
    else
        __syncthreads();
}

__global__ void early_exit_kernel() {
    if (threadIdx.x == 3) return;
    __syncthreads();
}

// Lanes 0..15 and 16..31 of each warp form two groups with their own masks.
__global__ void partial_mask_kernel(int* xor_out, int* down_out, unsigned* ballot_out, int* any_out, int* all_out,
                                    int* idx_out, int* up_out) {
    const int t = threadIdx.x, lane = t % 32;
    const unsigned mask = lane < 16 ? 0x0000FFFFu : 0xFFFF0000u;
    xor_out[t] = __shfl_xor_sync(mask, t, 1);
    down_out[t] = __shfl_down_sync(mask, t, 4);
    ballot_out[t] = __ballot_sync(mask, lane % 3 == 0);
    any_out[t] = __any_sync(mask, lane == 20);
    all_out[t] = __all_sync(mask, lane < 16 || lane != 31);
    idx_out[t] = __shfl_sync(mask, t, 2, 8);
    up_out[t] = __shfl_up_sync(mask, t, 1);
    __syncwarp(mask);
}

__global__ void exited_lane_kernel(float* out) {
    if (threadIdx.x % 32 == 5) return;
    out[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, 1.0f, 1);
}

__global__ void mask_without_self_kernel(float* out) {
    out[threadIdx.x] = __shfl_xor_sync(threadIdx.x == 0 ? 0x2u : 0xFFFFFFFFu, 1.0f, 1);
}

__global__ void shuffle_vs_barrier_kernel() {
    if (threadIdx.x == 0)
        (void)__shfl_sync(0xFFFFFFFFu, 1, 0);
    else
        __syncthreads();
}

// Reads shared memory before writing it: every read must be the poison. Then writes it, so that a block that saw a
// previous block's values would be caught.
__global__ void poison_kernel(float* out) {
    TANDEM_SHARED(float, s, 64);
    TANDEM_DYNAMIC_SHARED(float, d);
    out[blockIdx.x * 2 * blockDim.x + threadIdx.x] = s[threadIdx.x];
    out[blockIdx.x * 2 * blockDim.x + blockDim.x + threadIdx.x] = d[threadIdx.x];
    __syncthreads();
    s[threadIdx.x] = 1.0f;
    d[threadIdx.x] = 2.0f;
}

__global__ void dynamic_shared_kernel(int* out, int n) {
    TANDEM_DYNAMIC_SHARED(int, d);
    for (int i = threadIdx.x; i < n; i += blockDim.x) d[i] = i;
    __syncthreads();
    int sum = 0;
    for (int i = 0; i < n; ++i) sum += d[i];
    out[threadIdx.x] = sum;
}

__global__ void big_static_shared_kernel(float* out) {
    TANDEM_SHARED(float, big, 13000);  // 52,000 bytes > 48 KiB
    big[threadIdx.x] = 0.0f;
    out[threadIdx.x] = big[threadIdx.x];
}

__global__ void empty_kernel() {}

__global__ void throwing_kernel(int* out) {
    out[threadIdx.x] = 1;
    if (blockIdx.x == 1 && threadIdx.x == 7) throw std::runtime_error("boom from the kernel");
    __syncthreads();
    out[threadIdx.x] = 2;
}

__global__ void coords_kernel(int* out) {
    const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
    out[block * threads + linear_tid()] = static_cast<int>(block * 1000 + linear_tid());
}

__global__ void atomic_kernel(int* count, float* sum, int* max) {
    atomicAdd(count, 1);
    atomicAdd(sum, 0.5f);
    atomicMax(max, static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x));
}

// A block reduction by warp shuffles and shared memory, the pattern the kernels use.
__global__ void block_sum_kernel(const float* in, float* out) {
    TANDEM_SHARED(float, partial, 32);
    float v = in[blockIdx.x * blockDim.x + threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, o);
        if (threadIdx.x == 0) out[blockIdx.x] = v;
    }
}

}  // namespace

// One m16n8k32 int8 product per warp: each lane gathers its fragments element by element with the PTX ISA's
// formulas (written here independently of the runtime's word-wise gather), A 16x32 row-major, B 32x8 as B[k][n],
// C and D 16x8 row-major.
__global__ void mma_s8_kernel(const int8_t* A, const int8_t* B, const int* C, int* D) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    uint32_t a[4] = {}, b[2] = {};
    int c[4], d[4];
    for (int i = 0; i < 16; ++i) {
        const int row = (i < 4 || (i >= 8 && i < 12)) ? g : g + 8;
        const int col = t * 4 + (i & 3) + (i >= 8 ? 16 : 0);
        a[i / 4] |= static_cast<uint32_t>(static_cast<uint8_t>(A[row * 32 + col])) << (8 * (i % 4));
    }
    for (int i = 0; i < 8; ++i) {
        const int k = t * 4 + (i & 3) + (i >= 4 ? 16 : 0);
        b[i / 4] |= static_cast<uint32_t>(static_cast<uint8_t>(B[k * 8 + g])) << (8 * (i % 4));
    }
    for (int i = 0; i < 4; ++i) c[i] = C[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
    tandem_emu_mma_s8_m16n8k32(d, a, b, c);
    for (int i = 0; i < 4; ++i) D[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = d[i];
}

// mma.sync m16n8k16 on the first 16 columns of A (16 x 32) and rows of B (32 x 8), its fragments built from the
// ISA's m16n8k16 .s8 formulas: a row g for elements 0..3 and g + 8 for 4..7, column 4t + (i & 3); b row 4t + i,
// column g.
__global__ void mma_s8_k16_kernel(const int8_t* A, const int8_t* B, const int* C, int* D) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    uint32_t a[2] = {}, b = 0;
    int c[4], d[4];
    for (int i = 0; i < 8; ++i) {
        const int row = i < 4 ? g : g + 8, col = t * 4 + (i & 3);
        a[i / 4] |= static_cast<uint32_t>(static_cast<uint8_t>(A[row * 32 + col])) << (8 * (i % 4));
    }
    for (int i = 0; i < 4; ++i) b |= static_cast<uint32_t>(static_cast<uint8_t>(B[(t * 4 + i) * 8 + g])) << (8 * i);
    for (int i = 0; i < 4; ++i) c[i] = C[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
    tandem_emu_mma_s8_m16n8k16(d, a, b, c);
    for (int i = 0; i < 4; ++i) D[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = d[i];
}

// Lanes of one warp reaching two different mma instructions (mma.sync is .aligned).
__global__ void mma_divergent_kernel(int* D) {
    const uint32_t a[4] = {}, b[2] = {};
    const int c[4] = {};
    int d[4];
    if (threadIdx.x % 2)
        tandem_emu_mma_s8_m16n8k32(d, a, b, c);
    else
        tandem_emu_mma_s8_m16n8k32(d, a, b, c);
    D[threadIdx.x] = d[0];
}

TEST_CASE("cuda emu: __syncthreads orders shared-memory writes before reads in every thread order") {
    for (const LaunchOptions& o : kOrders) {
        ScopedLaunchOptions scope(o);
        std::vector<int> out(3 * 256, -7);
        tandem::emu::launch("rotate_kernel", rotate_kernel, dim3(3), dim3(256), 0, out.data());
        for (int b = 0; b < 3; ++b)
            for (int t = 0; t < 256; ++t) REQUIRE(out[b * 256 + t] == ((t + 255) % 256) * 10);
    }
}

TEST_CASE("cuda emu: a missing barrier passes in Forward order and is caught in Reverse order") {
    std::vector<int> out(256, -7);
    {
        ScopedLaunchOptions scope({ThreadOrder::Forward, 0});
        tandem::emu::launch("rotate_no_barrier_kernel", rotate_no_barrier_kernel, dim3(1), dim3(256), 0, out.data());
        CHECK(out[100] == 990);
    }
    {
        ScopedLaunchOptions scope({ThreadOrder::Reverse, 0});
        tandem::emu::launch("rotate_no_barrier_kernel", rotate_no_barrier_kernel, dim3(1), dim3(256), 0, out.data());
        CHECK(out[100] == -1);  // the poison (0xFFFFFFFF) of a shared int never written
    }
}

TEST_CASE("cuda emu: barriers reached from different call sites are reported") {
    const std::string e = launch_error(
        [] { tandem::emu::launch("two_barriers_kernel", two_barriers_kernel, dim3(1), dim3(64), 0); });
    CHECK(e.find("different __syncthreads") != std::string::npos);
    CHECK(e.find("test_cuda_emu_runtime.cpp") != std::string::npos);
}

TEST_CASE("cuda emu: a barrier not reached by an exited thread is reported") {
    const std::string e =
        launch_error([] { tandem::emu::launch("early_exit_kernel", early_exit_kernel, dim3(2), dim3(64), 0); });
    CHECK(e.find("not reached by all threads") != std::string::npos);
    CHECK(e.find("thread (3,0,0) has exited") != std::string::npos);
}

TEST_CASE("cuda emu: warp collectives honour partial masks") {
    for (const LaunchOptions& o : kOrders) {
        ScopedLaunchOptions scope(o);
        const int n = 64;
        std::vector<int> xr(n), down(n), any(n), all(n), idx(n), up(n);
        std::vector<unsigned> ballot(n);
        tandem::emu::launch("partial_mask_kernel", partial_mask_kernel, dim3(1), dim3(n), 0, xr.data(), down.data(),
                            ballot.data(), any.data(), all.data(), idx.data(), up.data());
        for (int t = 0; t < n; ++t) {
            const int lane = t % 32, base = t - lane;
            CHECK(xr[t] == (t ^ 1));
            // Down by 4 inside a 16-lane group: lanes 12..15 name lanes 16..19, outside their mask: poison.
            if (lane < 12 || (lane >= 16 && lane < 28))
                CHECK(down[t] == t + 4);
            else if (lane >= 28)
                CHECK(down[t] == t);  // beyond the warp: own value
            else
                CHECK(down[t] == -1);
            unsigned expect_ballot = 0;
            for (int l = lane < 16 ? 0 : 16; l < (lane < 16 ? 16 : 32); ++l)
                if (l % 3 == 0) expect_ballot |= 1u << l;
            CHECK(ballot[t] == expect_ballot);
            CHECK(any[t] == (lane >= 16 ? 1 : 0));
            CHECK(all[t] == (lane < 16 ? 1 : 0));
            // Width 8: lane 2 of each 8-lane segment.
            CHECK(idx[t] == base + (lane & ~7) + 2);
            CHECK(up[t] == (lane == 0 ? t : lane == 16 ? -1 : t - 1));
        }
    }
}

TEST_CASE("cuda emu: a mask naming an exited lane is reported") {
    std::vector<float> out(64);
    const std::string e = launch_error([&] {
        tandem::emu::launch("exited_lane_kernel", exited_lane_kernel, dim3(1), dim3(64), 0, out.data());
    });
    CHECK(e.find("__shfl_xor_sync") != std::string::npos);
    CHECK(e.find("names lane 5, which has exited") != std::string::npos);
}

TEST_CASE("cuda emu: a mask without the calling lane, and a shuffle facing a barrier, are reported") {
    std::vector<float> out(32);
    std::string e = launch_error([&] {
        tandem::emu::launch("mask_without_self_kernel", mask_without_self_kernel, dim3(1), dim3(32), 0, out.data());
    });
    CHECK(e.find("does not include the calling lane 0") != std::string::npos);
    e = launch_error(
        [] { tandem::emu::launch("shuffle_vs_barrier_kernel", shuffle_vs_barrier_kernel, dim3(1), dim3(32), 0); });
    CHECK(e.find("can never complete") != std::string::npos);
    CHECK(e.find("__syncthreads") != std::string::npos);
}

TEST_CASE("cuda emu: shared memory is NaN-poisoned at every block start") {
    for (const LaunchOptions& o : kOrders) {
        ScopedLaunchOptions scope(o);
        std::vector<float> out(4 * 2 * 64, 0.0f);
        tandem::emu::launch("poison_kernel", poison_kernel, dim3(4), dim3(64), 64 * sizeof(float), out.data());
        for (float v : out) REQUIRE(std::isnan(v));
    }
}

TEST_CASE("cuda emu: dynamic shared memory size and the opt-in limit") {
    std::vector<int> out(128);
    const int n = 3000;  // 12,000 bytes
    tandem::emu::launch("dynamic_shared_kernel", dynamic_shared_kernel, dim3(1), dim3(128), n * sizeof(int),
                        out.data(), n);
    CHECK(out[0] == n * (n - 1) / 2);
    CHECK(out[127] == n * (n - 1) / 2);

    const int big = 20000;  // 80,000 bytes: more than 48 KiB
    std::string e = launch_error([&] {
        tandem::emu::launch("dynamic_shared_kernel", dynamic_shared_kernel, dim3(1), dim3(128), big * sizeof(int),
                            out.data(), big);
    });
    CHECK(e.find("exceed the limit of 49152") != std::string::npos);
    tandem::emu::set_max_dynamic_shared(reinterpret_cast<const void*>(&dynamic_shared_kernel), 100 * 1024);
    tandem::emu::launch("dynamic_shared_kernel", dynamic_shared_kernel, dim3(1), dim3(128), big * sizeof(int),
                        out.data(), big);
    CHECK(out[5] == static_cast<int>(int64_t{big} * (big - 1) / 2));
    CHECK_THROWS_AS(
        tandem::emu::set_max_dynamic_shared(reinterpret_cast<const void*>(&dynamic_shared_kernel), 300 * 1024), Error);
}

TEST_CASE("cuda emu: launch limits are checked") {
    std::vector<float> out(1024);
    CHECK(launch_error([] { tandem::emu::launch("empty_kernel", empty_kernel, dim3(1), dim3(1025), 0); })
              .find("exceeds 1024 threads") != std::string::npos);
    CHECK(launch_error([] { tandem::emu::launch("empty_kernel", empty_kernel, dim3(1), dim3(1, 1, 65), 0); })
              .find("exceeds 1024 threads") != std::string::npos);
    CHECK(launch_error([] { tandem::emu::launch("empty_kernel", empty_kernel, dim3(0), dim3(32), 0); })
              .find("invalid configuration") != std::string::npos);
    CHECK(launch_error([&] {
              tandem::emu::launch("big_static_shared_kernel", big_static_shared_kernel, dim3(1), dim3(32), 0,
                                  out.data());
          }).find("static shared memory of 52000 bytes exceeds 49152") != std::string::npos);
    tandem::emu::launch("empty_kernel", empty_kernel, dim3(2), dim3(1024), 0);  // the maximum is fine
}

TEST_CASE("cuda emu: an exception thrown by a kernel reaches the launcher and the runtime stays usable") {
    for (const LaunchOptions& o : kOrders) {
        ScopedLaunchOptions scope(o);
        std::vector<int> out(64);
        const std::string e = launch_error(
            [&] { tandem::emu::launch("throwing_kernel", throwing_kernel, dim3(3), dim3(64), 0, out.data()); });
        CHECK(e.find("throwing_kernel") != std::string::npos);
        CHECK(e.find("block (1,0,0) thread (7,0,0)") != std::string::npos);
        CHECK(e.find("boom from the kernel") != std::string::npos);
        std::vector<float> in(4 * 256, 1.0f), sums(4);
        tandem::emu::launch("block_sum_kernel", block_sum_kernel, dim3(4), dim3(256), 0, in.data(), sums.data());
        CHECK(sums[3] == 256.0f);
    }
}

TEST_CASE("cuda emu: built-in coordinates cover a 3-D grid of 3-D blocks, atomics count every thread") {
    for (const LaunchOptions& o : kOrders) {
        ScopedLaunchOptions scope(o);
        const dim3 grid(2, 3, 2), block(4, 3, 2);
        std::vector<int> out(12 * 24, -1);
        tandem::emu::launch("coords_kernel", coords_kernel, grid, block, 0, out.data());
        for (int b = 0; b < 12; ++b)
            for (int t = 0; t < 24; ++t) REQUIRE(out[b * 24 + t] == b * 1000 + t);
        int count = 0, max = -1;
        float sum = 0.0f;
        tandem::emu::launch("atomic_kernel", atomic_kernel, dim3(5), dim3(96), 0, &count, &sum, &max);
        CHECK(count == 480);
        CHECK(sum == 240.0f);
        CHECK(max == 479);
    }
}

// Doubles x after waiting for its input (as every kernel does on a stream whose launches overlap); with
// skip_lane >= 0 that thread returns first without waiting.
__global__ void dependent_kernel(float* x, int skip_lane) {
    if (static_cast<int>(threadIdx.x) == skip_lane) return;
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
    x[blockIdx.x * blockDim.x + threadIdx.x] *= 2.0f;
}

TEST_CASE("cuda emu: on a programmatic stream every thread must wait for its inputs, launched or replayed") {
    void* overlap = tandem::emu::stream_create(true);
    void* plain = tandem::emu::stream_create();
    CHECK(tandem::emu::stream_is_programmatic(overlap));
    CHECK_FALSE(tandem::emu::stream_is_programmatic(plain));
    CHECK_FALSE(tandem::emu::stream_is_programmatic(nullptr));
    std::vector<float> x(128, 1.0f);
    tandem::emu::launch_on(overlap, "dependent_kernel", dependent_kernel, dim3(2), dim3(64), 0, x.data(), -1);
    CHECK(x[127] == 2.0f);
    // A thread that never waits: fine on a plain stream, an error where the launch could overlap its predecessor.
    tandem::emu::launch_on(plain, "dependent_kernel", dependent_kernel, dim3(2), dim3(64), 0, x.data(), 5);
    CHECK(x[5] == 2.0f);
    CHECK(x[6] == 4.0f);
    const std::string e = launch_error([&] {
        tandem::emu::launch_on(overlap, "dependent_kernel", dependent_kernel, dim3(2), dim3(64), 0, x.data(), 5);
    });
    CHECK(e.find("dependent_kernel") != std::string::npos);
    CHECK(e.find("thread (5,0,0)") != std::string::npos);
    CHECK(e.find("without cudaGridDependencySynchronize") != std::string::npos);
    // A captured launch keeps its stream's kind: the replay checks too.
    tandem::emu::begin_capture(overlap);
    tandem::emu::launch_on(overlap, "dependent_kernel", dependent_kernel, dim3(1), dim3(32), 0, x.data(), 9);
    const tandem::emu::Graph g = tandem::emu::end_capture(overlap);
    CHECK(launch_error([&] { tandem::emu::graph_launch(g, plain); }).find("thread (9,0,0)") != std::string::npos);
    tandem::emu::stream_destroy(overlap);
    tandem::emu::stream_destroy(plain);
}

TEST_CASE("cuda emu: mma.sync m16n8k32 and m16n8k16 (s8) compute D = A * B + C from the warp's fragments") {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> code(-128, 127), acc(-100000, 100000);
    std::vector<int8_t> A(16 * 32), B(32 * 8);
    std::vector<int> C(16 * 8);
    for (int8_t& v : A) v = static_cast<int8_t>(code(rng));
    for (int8_t& v : B) v = static_cast<int8_t>(code(rng));
    for (int& v : C) v = acc(rng);
    A[0] = -128, B[0] = -128, A[1] = 127, B[8] = 127;  // the extremes of the codes meet
    std::vector<int> want(16 * 8), want_k16(16 * 8);
    for (int r = 0; r < 16; ++r)
        for (int n = 0; n < 8; ++n) {
            int sum = C[r * 8 + n];
            for (int k = 0; k < 32; ++k) {
                sum += A[r * 32 + k] * B[k * 8 + n];
                if (k == 15) want_k16[r * 8 + n] = sum;
            }
            want[r * 8 + n] = sum;
        }
    for (const LaunchOptions& o : kOrders) {
        ScopedLaunchOptions scope(o);
        // Two warps compute the same product: each completes with its own lanes only.
        std::vector<int> D(16 * 8, -1);
        tandem::emu::launch("mma_s8_kernel", mma_s8_kernel, dim3(1), dim3(64), 0, A.data(), B.data(), C.data(),
                            D.data());
        CHECK(D == want);
        std::vector<int> D16(16 * 8, -1);
        tandem::emu::launch("mma_s8_k16_kernel", mma_s8_k16_kernel, dim3(1), dim3(64), 0, A.data(), B.data(),
                            C.data(), D16.data());
        CHECK(D16 == want_k16);
    }
    std::vector<int> D(64);
    std::string e = launch_error(
        [&] { tandem::emu::launch("mma_divergent_kernel", mma_divergent_kernel, dim3(1), dim3(32), 0, D.data()); });
    CHECK(e.find(".aligned") != std::string::npos);
    // A block of 48 threads: the second warp has 16 lanes, too few for the instruction.
    e = launch_error(
        [&] { tandem::emu::launch("mma_s8_kernel", mma_s8_kernel, dim3(1), dim3(48), 0, A.data(), B.data(), C.data(), D.data()); });
    CHECK(e.find("mma.sync") != std::string::npos);
}
