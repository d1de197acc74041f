// Internal to the CUDA emulation runtime (emu/runtime.cpp, emu/runtime_launch.cpp): the per-block fiber scheduler
// that a launch drives (BlockRunner, defined in runtime.cpp), its view of a block's threads, and the few helpers both
// sides use. Kernels never see this: they reach the scheduler through cuda_emu.h's detail functions.
#pragma once
#include <boost/context/fiber.hpp>
#include <boost/context/stack_context.hpp>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <random>
#include <source_location>
#include <string>
#include <unordered_map>
#include <vector>

#include "emu/cuda_emu.h"

namespace tandem::emu::runtime_detail {

namespace ctx = boost::context;

// A call site as "file:line", whether two call sites are the same one, and "(x,y,z)": for the error messages and the
// barrier checks.
std::string format_location(const std::source_location& w);
bool same_site(const std::source_location& a, const std::source_location& b);
std::string format_dim(const uint3& d);

// The dynamic shared memory each kernel has opted in to (cudaFuncAttributeMaxDynamicSharedMemorySize), by kernel.
// Defined in runtime_launch.cpp, next to set_max_dynamic_shared and the launch checks.
std::unordered_map<const void*, size_t>& dynamic_shared_limits();

// Sets threadIdx for the thread the scheduler is about to resume. The running thread's coordinates live in
// runtime_launch.cpp, which sets the block's and the grid's around every block it runs; a function rather than an
// extern thread_local for the reason cuda_emu.h gives at detail::thread_idx.
void set_thread_idx(const uint3& idx);

// Barrier: in __syncthreads. GridBarrier: in grid_sync (cooperative launches). Yield: in __nanosleep, runnable again
// after the other blocks of a cooperative launch have run (a block polling another's write).
enum class Wait : uint8_t { Runnable, Barrier, GridBarrier, Yield, Warp, Exited };

struct Thread {
    ctx::fiber fiber;
    ctx::stack_context stack;
    uint3 idx{};
    Wait wait = Wait::Runnable;
    std::source_location where;
    // the pending warp collective
    detail::WarpOp op{};
    unsigned mask = 0;
    unsigned size = 0;
    int param = 0;
    int width = 32;
    // the largest operands: an mma's fragments in and its accumulators out (a shuffle moves at most 8 bytes)
    unsigned char in[sizeof(detail::MmaS8Fragments)]{}, out[detail::kMmaS8OutBytes]{};
    unsigned result = 0;
    bool waited = false;  // called cudaGridDependencySynchronize
    void* fake_stack = nullptr;  // ASan's fake stack of this fiber while it is switched out
};

struct StaticAlloc {
    const void* key;
    size_t offset, bytes;
};

// The threads of one block as fibers on the calling OS thread, and the scheduler that runs them to their end or to
// the next grid-wide stop (runtime.cpp's file comment says how).
class BlockRunner {
public:
    // `arena`: the block's shared memory (kMaxSharedOptIn bytes). `cooperative`: the blocks of the launch are
    // co-resident (grid_sync, __nanosleep polling); each then has its own runner and arena.
    BlockRunner(const char* name, const void* kernel, dim3 grid, dim3 block, size_t dyn, void (*invoke)(void*),
                void* ctx, bool programmatic, bool cooperative, unsigned char* arena);

    // Runs a block to its end (launches that are not cooperative).
    void run_block(uint3 block_idx);

    // Creates the block's threads (suspended before their first instruction).
    void start_block(uint3 block_idx);

    // What stopped a cooperative block's run: its end, every thread in one grid_sync, or threads polling
    // (__nanosleep) for what another block has to write.
    enum class Stop { Done, GridBarrier, Polling };

    // Runs the block's threads until one of the stops above; an error unwinds every thread of the block first.
    Stop run();

    // After every block of the grid has reached the same grid_sync: its threads go on.
    void release_grid_barrier();
    // The grid_sync every thread of the block waits in (after run() returned Stop::GridBarrier).
    const std::source_location& grid_barrier_site() const { return threads_[0].where; }
    uint3 block_index() const { return block_idx_; }
    // Unwinds the threads of a block that has not finished (another block of the launch failed).
    void cancel() { cancel_all(); }

    // ---- called on a fiber -------------------------------------------------------------------------------------
    void syncthreads(const std::source_location& where);
    void grid_sync(const std::source_location& where);

    // __nanosleep: in a cooperative launch the thread lets the other blocks run before it goes on, so that a loop
    // polling another block's write makes progress; elsewhere there is nothing to wait for.
    void nanosleep();

    unsigned warp_collective(detail::WarpOp op, unsigned mask, const void* in, void* out, unsigned size, int param,
                             int width, const std::source_location& where);
    void* static_shared(const void* key, size_t bytes, size_t align);
    void* dynamic_shared() const { return arena_; }
    void grid_dependency_wait() { threads_[current_].waited = true; }

    const char* name() const { return name_; }

private:
    // ---- fiber side ------------------------------------------------------------------------------------------------
    ctx::fiber entry(unsigned i, ctx::fiber&& sched);
    void suspend(Thread& t);

    // An error found on a fiber: thrown there, so it unwinds that thread, and reported by the scheduler.
    [[noreturn]] void fail_here(const std::string& what) { throw Error(what); }

    // ---- scheduler side --------------------------------------------------------------------------------------------
    void resume(unsigned i);
    std::string where_thread(unsigned i) const;
    [[noreturn]] void fail(const std::string& what);
    Stop schedule();
    [[noreturn]] void report_thread_error();
    bool complete_warp_collectives();
    void complete_mma_s8(unsigned base);
    void complete(unsigned base, unsigned lanes, unsigned mask);
    bool release_barrier();
    void cancel_all();

    const char* name_;
    dim3 grid_, block_;
    size_t dyn_;
    void (*invoke_)(void*);
    void* ctx_;
    bool programmatic_;
    bool cooperative_;
    unsigned n_ = 0;
    size_t opt_in_ = 0, shared_limit_ = 0;
    std::vector<Thread> threads_;
    unsigned char* arena_ = nullptr;
    size_t used_ = 0, static_bytes_ = 0;
    std::vector<StaticAlloc> statics_;
    uint3 block_idx_{};
    std::mt19937_64 rng_;  // the Shuffled thread order's
    unsigned current_ = 0;
    ctx::fiber sched_;
    const void* sched_bottom_ = nullptr;
    size_t sched_size_ = 0;
    bool cancel_ = false;
    std::exception_ptr error_;
    unsigned error_thread_ = 0;
};

}  // namespace tandem::emu::runtime_detail
