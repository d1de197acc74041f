// The CUDA emulation runtime's launches: the launch checks (block and grid limits, dynamic shared memory opt-ins),
// the block order, the cooperative launch (its resident blocks run in passes between grid-wide barriers), each
// block's shared-memory arena, the running thread's coordinates, and the way from a device function to the
// scheduler of the running block (BlockRunner, runtime.cpp).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <source_location>
#include <string>
#include <unordered_map>
#include <vector>

#include "emu/cuda_emu.h"
#include "emu/runtime.h"

namespace tandem::emu {

namespace detail {
namespace {
struct Coords {
    uint3 thread_idx;
    uint3 block_idx;
    dim3 block_dim;
    dim3 grid_dim;
};
thread_local Coords g_coords{{0, 0, 0}, {0, 0, 0}, {1, 1, 1}, {1, 1, 1}};
}  // namespace
const uint3& thread_idx() { return g_coords.thread_idx; }
const uint3& block_idx() { return g_coords.block_idx; }
const dim3& block_dim() { return g_coords.block_dim; }
const dim3& grid_dim() { return g_coords.grid_dim; }
}  // namespace detail

namespace runtime_detail {

void set_thread_idx(const uint3& idx) { detail::g_coords.thread_idx = idx; }

std::unordered_map<const void*, size_t>& dynamic_shared_limits() {
    static std::unordered_map<const void*, size_t> m;
    return m;
}

}  // namespace runtime_detail

namespace {

using runtime_detail::BlockRunner;
using runtime_detail::dynamic_shared_limits;
using runtime_detail::format_dim;
using runtime_detail::format_location;
using runtime_detail::same_site;

// The arena holds dynamic shared memory at offset 0 and static arrays after it. It is sized for the opt-in
// maximum so that pointers into it stay valid for the whole launch.
struct Arena {
    Arena() : data(static_cast<unsigned char*>(::operator new(kMaxSharedOptIn + 256, std::align_val_t{256}))) {}
    ~Arena() { ::operator delete(data, std::align_val_t{256}); }
    unsigned char* data;
};

thread_local BlockRunner* g_runner = nullptr;

BlockRunner& runner() {
    if (!g_runner) throw Error("tandem::emu: a device function was called outside a kernel launch");
    return *g_runner;
}

}  // namespace

LaunchOptions& launch_options() {
    thread_local LaunchOptions o;
    return o;
}

void set_max_dynamic_shared(const void* kernel, size_t bytes) {
    if (bytes > kMaxSharedOptIn)
        throw Error("tandem::emu: cudaFuncAttributeMaxDynamicSharedMemorySize of " + std::to_string(bytes) +
                    " bytes exceeds the device maximum of " + std::to_string(kMaxSharedOptIn));
    dynamic_shared_limits()[kernel] = bytes;
}

int max_cooperative_blocks(dim3 block, size_t dynamic_shared_bytes) {
    const uint64_t threads = uint64_t{block.x} * block.y * block.z;
    if (threads == 0 || threads > kMaxThreadsPerBlock) return 0;
    const uint64_t warps_threads = (threads + 31) / 32 * 32;  // a block holds whole warps
    uint64_t blocks = std::min<uint64_t>(kMaxBlocksPerSm, kMaxThreadsPerSm / warps_threads);
    blocks = std::min<uint64_t>(blocks, kSharedPerSm / (dynamic_shared_bytes + kSharedReservedPerBlock));
    return static_cast<int>(blocks);
}

namespace detail {

unsigned warp_collective(WarpOp op, unsigned mask, const void* in, void* out, unsigned size, int param, int width,
                         const std::source_location& where) {
    return runner().warp_collective(op, mask, in, out, size, param, width, where);
}

void syncthreads(const std::source_location& where) { runner().syncthreads(where); }

void* static_shared(const void* key, size_t bytes, size_t align) { return runner().static_shared(key, bytes, align); }

void* dynamic_shared() { return runner().dynamic_shared(); }

void grid_dependency_wait() { runner().grid_dependency_wait(); }

void check_launch(const char* name, const void* kernel, dim3 grid, dim3 block, size_t dyn, bool cooperative) {
    const std::string who = std::string("tandem::emu: launch of ") + name + ": ";
    const uint64_t threads = uint64_t{block.x} * block.y * block.z;
    if (threads == 0 || uint64_t{grid.x} * grid.y * grid.z == 0)
        throw Error(who + "invalid configuration (a grid or block dimension is 0)");
    if (threads > kMaxThreadsPerBlock || block.x > 1024 || block.y > 1024 || block.z > 64)
        throw Error(who + "block (" + std::to_string(block.x) + "," + std::to_string(block.y) + "," +
                    std::to_string(block.z) + ") exceeds 1024 threads or the per-dimension limits (1024,1024,64)");
    if (grid.x > 0x7FFFFFFFu || grid.y > 65535 || grid.z > 65535)
        throw Error(who + "grid exceeds the limits (2^31-1, 65535, 65535)");
    const auto it = dynamic_shared_limits().find(kernel);
    const size_t limit = it != dynamic_shared_limits().end() ? it->second : kDefaultSharedLimit;
    if (dyn > limit)
        throw Error(who + std::to_string(dyn) + " bytes of dynamic shared memory exceed the limit of " +
                    std::to_string(limit) +
                    (it == dynamic_shared_limits().end()
                         ? " (opt in with cudaFuncAttributeMaxDynamicSharedMemorySize)"
                         : ""));
    const uint64_t blocks = uint64_t{grid.x} * grid.y * grid.z;
    if (cooperative && blocks > static_cast<uint64_t>(max_cooperative_blocks(block, dyn)))
        throw Error(who + "cudaErrorCooperativeLaunchTooLarge: a cooperative grid of " + std::to_string(blocks) +
                    " blocks, but the emulated device holds " + std::to_string(max_cooperative_blocks(block, dyn)) +
                    " such blocks at once (max_cooperative_blocks)");
}

namespace {

// The blocks of a launch in the order the launch options give.
std::vector<uint64_t> block_order(dim3 grid) {
    const uint64_t n_blocks = uint64_t{grid.x} * grid.y * grid.z;
    std::vector<uint64_t> order(n_blocks);
    std::iota(order.begin(), order.end(), uint64_t{0});
    const LaunchOptions opts = launch_options();
    if (opts.order == ThreadOrder::Reverse) std::reverse(order.begin(), order.end());
    if (opts.order == ThreadOrder::Shuffled) std::shuffle(order.begin(), order.end(), std::mt19937_64(opts.seed));
    return order;
}

uint3 block_coords(uint64_t b, dim3 grid) {
    return {static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
            static_cast<unsigned>(b / (uint64_t{grid.x} * grid.y))};
}

// A full pass over the blocks of a cooperative launch in which every live thread polled (__nanosleep), this many
// times in a row: nothing can change any more, the kernel waits for a write no block will make.
constexpr int kMaxPollingPasses = 10000;

// A cooperative launch: every block resident at once, each with its own runner and shared memory. Each pass runs
// every unfinished block (in the launch's block order) until it finishes, waits in a grid_sync, or polls; once every
// block waits in the same grid_sync, all go on.
void run_cooperative(const char* name, const void* kernel, dim3 grid, dim3 block, size_t dyn, void (*invoke)(void*),
                     void* ctx, bool programmatic) {
    const std::vector<uint64_t> order = block_order(grid);
    std::vector<std::unique_ptr<Arena>> arenas(order.size());
    std::vector<std::unique_ptr<BlockRunner>> blocks(order.size());
    std::vector<BlockRunner::Stop> stop(order.size(), BlockRunner::Stop::Polling);
    const auto enter = [&](uint64_t b) {
        g_runner = blocks[b].get();
        g_coords.block_idx = blocks[b]->block_index();
    };
    try {
        for (uint64_t b = 0; b < order.size(); ++b) {
            arenas[b] = std::make_unique<Arena>();
            blocks[b] = std::make_unique<BlockRunner>(name, kernel, grid, block, dyn, invoke, ctx, programmatic, true,
                                                      arenas[b]->data);
            enter(b);
            blocks[b]->start_block(block_coords(b, grid));
        }
        for (int polling_passes = 0;;) {
            bool live = false, polled = false;
            for (uint64_t b : order) {
                if (stop[b] == BlockRunner::Stop::Done) continue;
                enter(b);
                stop[b] = blocks[b]->run();
                live |= stop[b] != BlockRunner::Stop::Done;
                polled |= stop[b] == BlockRunner::Stop::Polling;
            }
            if (!live) return;
            if (polled) {
                if (++polling_passes == kMaxPollingPasses)
                    throw Error(std::string("tandem::emu: kernel ") + name + ": every thread still waiting polls "
                                "(__nanosleep) after " + std::to_string(kMaxPollingPasses) +
                                " rounds of every block: it waits for a write no block will make");
                continue;
            }
            polling_passes = 0;
            // Every block that has not finished waits in a grid_sync: all of them must, in the same one.
            const uint64_t first = *std::find_if(order.begin(), order.end(),
                                                 [&](uint64_t b) { return stop[b] == BlockRunner::Stop::GridBarrier; });
            const std::source_location& site = blocks[first]->grid_barrier_site();
            for (uint64_t b : order) {
                if (stop[b] == BlockRunner::Stop::Done)
                    throw Error(std::string("tandem::emu: kernel ") + name + ": grid_sync at " +
                                format_location(site) + " is not reached by block " +
                                format_dim(blocks[b]->block_index()) + ", which has exited");
                if (!same_site(blocks[b]->grid_barrier_site(), site))
                    throw Error(std::string("tandem::emu: kernel ") + name + ": blocks wait at different grid_sync "
                                "calls: block " + format_dim(blocks[first]->block_index()) + " at " +
                                format_location(site) + ", block " + format_dim(blocks[b]->block_index()) + " at " +
                                format_location(blocks[b]->grid_barrier_site()));
            }
            for (uint64_t b : order) blocks[b]->release_grid_barrier();
        }
    } catch (...) {
        // A block that failed has unwound its own threads; the others' wait in a grid_sync or poll.
        for (uint64_t b = 0; b < blocks.size(); ++b)
            if (blocks[b] && stop[b] != BlockRunner::Stop::Done) {
                enter(b);
                blocks[b]->cancel();
            }
        throw;
    }
}

}  // namespace

void launch(const char* name, const void* kernel, dim3 grid, dim3 block, size_t dyn, void (*invoke)(void*),
            void* ctx, bool programmatic, bool cooperative) {
    if (g_runner)
        throw Error(std::string("tandem::emu: launch of ") + name + ": launching from inside a kernel is not supported");
    check_launch(name, kernel, grid, block, dyn, cooperative);
    if (launch_options().launched) launch_options().launched->push_back(name);

    struct Restore {
        ~Restore() {
            g_runner = nullptr;
            detail::g_coords = {{0, 0, 0}, {0, 0, 0}, {1, 1, 1}, {1, 1, 1}};
        }
    } restore;
    g_coords.block_dim = block;
    g_coords.grid_dim = grid;
    if (cooperative) {
        run_cooperative(name, kernel, grid, block, dyn, invoke, ctx, programmatic);
        return;
    }

    static thread_local Arena arena;  // one block at a time: one arena, poisoned at every block's start
    BlockRunner r(name, kernel, grid, block, dyn, invoke, ctx, programmatic, false, arena.data);
    g_runner = &r;
    for (uint64_t b : block_order(grid)) {
        const uint3 idx = block_coords(b, grid);
        g_coords.block_idx = idx;
        r.run_block(idx);
    }
}

void grid_sync(const std::source_location& where) { runner().grid_sync(where); }

void nanosleep() { runner().nanosleep(); }

}  // namespace detail

}  // namespace tandem::emu
