// The CUDA emulation runtime's scheduler: the per-block fiber scheduler (BlockRunner, declared in runtime.h) with
// exact __syncthreads and warp collectives, the poisoned shared memory of a block, and the pool of fiber stacks. The
// rest of the runtime: launches (limits, block order; a cooperative launch's resident blocks run in passes between
// grid-wide barriers) in runtime_launch.cpp, streams with graph capture (recorded nodes replayed in order) in
// runtime_streams.cpp.
//
// Threads of a block are boost::context fibers on the calling OS thread. The scheduler resumes each runnable thread
// (in the launch's thread order) until it blocks in a barrier / warp collective or returns; when none is runnable it
// completes the collectives whose lanes have all arrived, else releases the barrier, else reports the deadlock. Every
// check that fails becomes an Error; the block's remaining fibers are then resumed once more with `cancel_` set, so
// they unwind by a C++ exception through their own frames and end normally (no fiber is ever destroyed suspended,
// and every stack switch is one we make ourselves, which is what lets ASan follow them, see AsanSwitch).
#include "emu/runtime.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <boost/context/fiber.hpp>
#include <boost/context/preallocated.hpp>
#include <boost/context/stack_context.hpp>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "emu/cuda_emu.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define TANDEM_EMU_ASAN 1
#endif

namespace tandem::emu {

namespace detail {

const char* warp_op_name(WarpOp op) {
    switch (op) {
        case WarpOp::ShflIdx: return "__shfl_sync";
        case WarpOp::ShflUp: return "__shfl_up_sync";
        case WarpOp::ShflDown: return "__shfl_down_sync";
        case WarpOp::ShflXor: return "__shfl_xor_sync";
        case WarpOp::Ballot: return "__ballot_sync";
        case WarpOp::Any: return "__any_sync";
        case WarpOp::All: return "__all_sync";
        case WarpOp::SyncWarp: return "__syncwarp";
        case WarpOp::MmaS8: return "mma.sync (s8)";
    }
    return "?";
}

}  // namespace detail

namespace runtime_detail {

std::string format_location(const std::source_location& w) {
    const char* file = w.file_name();
    if (const char* slash = std::strrchr(file, '/')) file = slash + 1;
    return std::string(file) + ":" + std::to_string(w.line());
}

bool same_site(const std::source_location& a, const std::source_location& b) {
    return a.line() == b.line() && a.column() == b.column() && std::strcmp(a.file_name(), b.file_name()) == 0;
}

std::string format_dim(const uint3& d) {
    return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

namespace {

// 64 KiB is plenty for kernels (their locals are registers on the GPU); ASan's redzones need more.
#ifdef TANDEM_EMU_ASAN
constexpr size_t kStackBytes = 512 * 1024;
// The redzones ASan poisons in a frame are unpoisoned when the function returns. The frames at the top of a fiber's
// stack never return (fiber_entry switches away when the thread exits), so their poison stays, within this many
// bytes of the top: those are unpoisoned when a stack is handed out again. Frames an exception unwound may keep
// theirs anywhere, so a fiber that ended in one unpoisons its whole stack (BlockRunner::entry). Unpoisoning every
// whole stack at every block start cost a fifth of an ASan test's time (64 KiB of shadow memset per thread).
constexpr size_t kAsanEntryBytes = 32 * 1024;
#else
constexpr size_t kStackBytes = 64 * 1024;
#endif

std::string hex(unsigned v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", v);
    return buf;
}

// Stacks are mmap'ed with a PROT_NONE guard page below them (a kernel that overflows its stack faults instead of
// corrupting a neighbour) and kept for reuse: a launch of 1024-thread blocks would otherwise map 1024 stacks per
// block.
class StackPool {
public:
    ~StackPool() {
        for (void* base : free_) munmap(base, kStackBytes + page());
    }
    ctx::stack_context allocate() {
        void* base;
        if (!free_.empty()) {
            base = free_.back();
            free_.pop_back();
        } else {
            base = mmap(nullptr, kStackBytes + page(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (base == MAP_FAILED) throw Error("tandem::emu: cannot map a fiber stack");
            mprotect(base, page(), PROT_NONE);
        }
#ifdef TANDEM_EMU_ASAN
        // The previous fiber's entry frames left their redzones poisoned here (kAsanEntryBytes).
        ASAN_UNPOISON_MEMORY_REGION(static_cast<char*>(base) + page() + kStackBytes - kAsanEntryBytes, kAsanEntryBytes);
#endif
        ctx::stack_context sc;
        sc.size = kStackBytes;
        sc.sp = static_cast<char*>(base) + page() + kStackBytes;
        return sc;
    }
    void deallocate(ctx::stack_context& sc) {
        free_.push_back(static_cast<char*>(sc.sp) - kStackBytes - page());
    }

private:
    static size_t page() {
        static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
        return p;
    }
    std::vector<void*> free_;
};

StackPool& stack_pool() {
    thread_local StackPool pool;
    return pool;
}

// The StackAllocator boost calls to give a finished fiber's stack back.
struct PoolAllocator {
    ctx::stack_context allocate() { return stack_pool().allocate(); }
    void deallocate(ctx::stack_context& sc) { stack_pool().deallocate(sc); }
};

// ASan keeps its own idea of the current stack; each switch is announced before it happens (start) and confirmed
// on arrival (finish). Without this it reports false stack-buffer-overflows and breaks on exceptions in fibers.
struct AsanSwitch {
#ifdef TANDEM_EMU_ASAN
    static void start(void** fake_stack_save, const void* bottom, size_t size) {
        __sanitizer_start_switch_fiber(fake_stack_save, bottom, size);
    }
    static void finish(void* fake_stack_save, const void** bottom_old, size_t* size_old) {
        __sanitizer_finish_switch_fiber(fake_stack_save, bottom_old, size_old);
    }
#else
    static void start(void**, const void*, size_t) {}
    static void finish(void*, const void**, size_t*) {}
#endif
};

// Thrown into the suspended threads of a failed block to unwind them. Not a std::exception, so that kernel code
// catching std::exception cannot swallow it.
struct Cancelled {};

}  // namespace

BlockRunner::BlockRunner(const char* name, const void* kernel, dim3 grid, dim3 block, size_t dyn, void (*invoke)(void*),
                         void* ctx, bool programmatic, bool cooperative, unsigned char* arena)
    : name_(name), grid_(grid), block_(block), dyn_(dyn), invoke_(invoke), ctx_(ctx), programmatic_(programmatic),
      cooperative_(cooperative), arena_(arena) {
    n_ = block.x * block.y * block.z;
    const auto it = dynamic_shared_limits().find(kernel);
    opt_in_ = it != dynamic_shared_limits().end() ? it->second : 0;
    shared_limit_ = std::max(kDefaultSharedLimit, opt_in_);
    threads_.resize(n_);
    for (unsigned i = 0; i < n_; ++i)
        threads_[i].idx = {i % block.x, (i / block.x) % block.y, i / (block.x * block.y)};
    std::memset(arena_, 0xFF, kMaxSharedOptIn);
    used_ = dyn_;
}

void BlockRunner::run_block(uint3 block_idx) {
    start_block(block_idx);
    run();
}

void BlockRunner::start_block(uint3 block_idx) {
    block_idx_ = block_idx;
    rng_.seed(launch_options().seed ^ (uint64_t{block_idx.x} << 32) ^ (uint64_t{block_idx.y} << 16) ^ block_idx.z);
    std::memset(arena_, 0xFF, used_);  // NaN for every float a block reads before writing
    for (unsigned i = 0; i < n_; ++i) {
        Thread& t = threads_[i];
        t.wait = Wait::Runnable;
        t.waited = false;
        t.stack = stack_pool().allocate();
        const ctx::preallocated pre(t.stack.sp, t.stack.size, t.stack);
        t.fiber = ctx::fiber(std::allocator_arg, pre, PoolAllocator{},
                             [this, i](ctx::fiber&& sched) { return entry(i, std::move(sched)); });
    }
}

BlockRunner::Stop BlockRunner::run() {
    try {
        return schedule();
    } catch (...) {
        cancel_all();
        throw;
    }
}

void BlockRunner::release_grid_barrier() {
    for (Thread& t : threads_) t.wait = Wait::Runnable;
}

// ---- called on a fiber ---------------------------------------------------------------------------------------------
void BlockRunner::syncthreads(const std::source_location& where) {
    Thread& t = threads_[current_];
    t.wait = Wait::Barrier;
    t.where = where;
    suspend(t);
}

void BlockRunner::grid_sync(const std::source_location& where) {
    if (!cooperative_)
        fail_here("grid_sync at " + format_location(where) +
                  " in a launch that is not cooperative (launch_cooperative_kernel): its blocks need not be "
                  "resident together, so a grid-wide barrier could wait forever");
    Thread& t = threads_[current_];
    t.wait = Wait::GridBarrier;
    t.where = where;
    suspend(t);
}

void BlockRunner::nanosleep() {
    if (!cooperative_) return;
    Thread& t = threads_[current_];
    t.wait = Wait::Yield;
    suspend(t);
}

unsigned BlockRunner::warp_collective(detail::WarpOp op, unsigned mask, const void* in, void* out, unsigned size,
                                      int param, int width, const std::source_location& where) {
    const unsigned lane = current_ % 32, warp_base = current_ - lane;
    if (!(mask >> lane & 1u))
        fail_here(std::string(detail::warp_op_name(op)) + " at " + format_location(where) + ": mask " + hex(mask) +
                  " does not include the calling lane " + std::to_string(lane));
    const unsigned lanes_in_warp = std::min(32u, n_ - warp_base);
    if (lanes_in_warp < 32 && (mask >> lanes_in_warp) != 0)
        fail_here(std::string(detail::warp_op_name(op)) + " at " + format_location(where) + ": mask " + hex(mask) +
                  " names lanes beyond the block's last thread");
    if (width <= 0 || width > 32 || (width & (width - 1)) != 0)
        fail_here(std::string(detail::warp_op_name(op)) + " at " + format_location(where) + ": width " +
                  std::to_string(width) + " is not a power of two <= 32");
    Thread& t = threads_[current_];
    t.op = op;
    t.mask = mask;
    t.size = size;
    t.param = param;
    t.width = width;
    if (size) std::memcpy(t.in, in, size);
    t.wait = Wait::Warp;
    t.where = where;
    suspend(t);
    if (op == detail::WarpOp::MmaS8)
        std::memcpy(out, t.out, detail::kMmaS8OutBytes);
    else if (size)
        std::memcpy(out, t.out, size);
    return t.result;
}

void* BlockRunner::static_shared(const void* key, size_t bytes, size_t align) {
    for (const StaticAlloc& s : statics_)
        if (s.key == key) return arena_ + s.offset;
    const size_t offset = (std::max(used_, dyn_) + std::max<size_t>(align, 16) - 1) & ~(std::max<size_t>(align, 16) - 1);
    static_bytes_ += bytes;
    if (static_bytes_ > kDefaultSharedLimit)
        fail_here("static shared memory of " + std::to_string(static_bytes_) + " bytes exceeds " +
                  std::to_string(kDefaultSharedLimit));
    if (static_bytes_ + dyn_ > shared_limit_)
        fail_here("static (" + std::to_string(static_bytes_) + ") + dynamic (" + std::to_string(dyn_) +
                  ") shared memory exceeds the limit of " + std::to_string(shared_limit_) + " bytes" +
                  (opt_in_ ? "" : " (no cudaFuncAttributeMaxDynamicSharedMemorySize opt-in)"));
    statics_.push_back({key, offset, bytes});
    used_ = offset + bytes;
    return arena_ + offset;
}

// ---- fiber side ----------------------------------------------------------------------------------------------------
ctx::fiber BlockRunner::entry(unsigned i, ctx::fiber&& sched) {
    sched_ = std::move(sched);
    Thread& t = threads_[i];
    AsanSwitch::finish(nullptr, &sched_bottom_, &sched_size_);
    bool unwound = false;  // an exception went through the thread's frames
    if (!cancel_) {
        try {
            invoke_(ctx_);
            // On a GPU such a thread may have read its inputs before the kernel it overlaps wrote them.
            if (programmatic_ && !t.waited)
                fail_here("launched to overlap the kernel before it (programmatic dependent launch), but the "
                          "thread exited without cudaGridDependencySynchronize (detail::wait_for_inputs)");
        } catch (const Cancelled&) {
            unwound = true;
        } catch (...) {
            unwound = true;
            if (!error_) {
                error_ = std::current_exception();
                error_thread_ = i;
            }
        }
    }
#ifdef TANDEM_EMU_ASAN
    if (unwound) ASAN_UNPOISON_MEMORY_REGION(static_cast<char*>(t.stack.sp) - t.stack.size, t.stack.size);
#else
    (void)unwound;
#endif
    t.wait = Wait::Exited;
    AsanSwitch::start(nullptr, sched_bottom_, sched_size_);  // this fiber is done: no fake stack to keep
    return std::move(sched_);
}

void BlockRunner::suspend(Thread& t) {
    if (cancel_) throw Cancelled{};  // a destructor running during cancellation must not suspend again
    AsanSwitch::start(&t.fake_stack, sched_bottom_, sched_size_);
    sched_ = std::move(sched_).resume();
    AsanSwitch::finish(t.fake_stack, &sched_bottom_, &sched_size_);
    if (cancel_) throw Cancelled{};
}

// ---- scheduler side ------------------------------------------------------------------------------------------------
void BlockRunner::resume(unsigned i) {
    Thread& t = threads_[i];
    current_ = i;
    set_thread_idx(t.idx);
    void* fake = nullptr;
    AsanSwitch::start(&fake, static_cast<char*>(t.stack.sp) - t.stack.size, t.stack.size);
    t.fiber = std::move(t.fiber).resume();
    AsanSwitch::finish(fake, nullptr, nullptr);
}

std::string BlockRunner::where_thread(unsigned i) const {
    return "block " + format_dim(block_idx_) + " thread " + format_dim(threads_[i].idx);
}

void BlockRunner::fail(const std::string& what) {
    throw Error(std::string("tandem::emu: kernel ") + name_ + ": " + what);
}

BlockRunner::Stop BlockRunner::schedule() {
    std::vector<unsigned> order(n_);
    std::iota(order.begin(), order.end(), 0u);
    const LaunchOptions opts = launch_options();
    if (opts.order == ThreadOrder::Reverse) std::reverse(order.begin(), order.end());
    // Threads polling since the last return: resumed once each per run(), after the others have run.
    for (Thread& t : threads_)
        if (t.wait == Wait::Yield) t.wait = Wait::Runnable;
    for (;;) {
        if (opts.order == ThreadOrder::Shuffled) std::shuffle(order.begin(), order.end(), rng_);
        for (unsigned i : order) {
            if (threads_[i].wait != Wait::Runnable) continue;
            resume(i);
            if (error_) report_thread_error();
        }
        bool all_exited = true, polling = false;
        for (const Thread& t : threads_) {
            all_exited &= t.wait == Wait::Exited;
            polling |= t.wait == Wait::Yield;
        }
        if (all_exited) return Stop::Done;
        if (complete_warp_collectives()) continue;
        if (polling) return Stop::Polling;
        if (release_barrier()) return Stop::GridBarrier;
    }
}

void BlockRunner::report_thread_error() {
    const unsigned i = error_thread_;
    std::exception_ptr e = error_;
    error_ = nullptr;
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& ex) {
        fail(where_thread(i) + ": " + ex.what());
    } catch (...) {
        fail(where_thread(i) + ": a non-standard exception");
    }
}

// Completes every collective whose lanes have all arrived; reports lanes that can never arrive.
bool BlockRunner::complete_warp_collectives() {
    bool progress = false;
    for (unsigned base = 0; base < n_; base += 32) {
        const unsigned lanes = std::min(32u, n_ - base);
        for (unsigned l = 0; l < lanes; ++l) {
            Thread& t = threads_[base + l];
            if (t.wait != Wait::Warp) continue;
            bool ready = true;
            for (unsigned m = 0; m < lanes; ++m) {
                if (!(t.mask >> m & 1u)) continue;
                const Thread& o = threads_[base + m];
                // Built only on failure: this loop runs lanes x lanes times for every collective.
                const auto what = [&] {
                    return std::string(detail::warp_op_name(t.op)) + " at " + format_location(t.where) + " (" +
                           where_thread(base + l) + ", mask " + hex(t.mask) + ")";
                };
                if (o.wait == Wait::Exited)
                    fail(what() + " names lane " + std::to_string(m) + ", which has exited");
                if (o.wait == Wait::Barrier || o.wait == Wait::GridBarrier || o.wait == Wait::Yield) {
                    ready = false;  // a deadlock unless something else progresses; release_barrier reports it
                    continue;
                }
                if (o.op != t.op || o.mask != t.mask || o.size != t.size)
                    fail(what() + " meets lane " + std::to_string(m) + " in " + detail::warp_op_name(o.op) + " at " +
                         format_location(o.where) + " with mask " + hex(o.mask));
                if (t.op == detail::WarpOp::MmaS8 &&
                    (o.where.line() != t.where.line() || o.param != t.param ||
                     std::strcmp(o.where.file_name(), t.where.file_name()) != 0))
                    fail(what() + " meets lane " + std::to_string(m) + " at " + format_location(o.where) +
                         ": mma.sync is .aligned, every lane must execute the same instruction");
            }
            if (!ready) continue;
            complete(base, lanes, t.mask);
            progress = true;
        }
    }
    return progress;
}

// D = A * B + C of mma.sync.m16n8k32 (or m16n8k16: `param` is k).row.col.s32.s8.s8.s32 from the 32 lanes'
// fragments, in the PTX ISA's layout (g = lane / 4, t = lane % 4): a[0], a[1], a[2], a[3] hold A[g][4t..4t+3],
// A[g+8][4t..], A[g][16+4t..], A[g+8][16+4t..] (low byte first); b[0], b[1] hold B[4t..4t+3][g], B[16+4t..][g];
// c / d[0..3] are C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]. For k = 16 only a[0], a[1] and b[0] exist.
void BlockRunner::complete_mma_s8(unsigned base) {
    const int k = threads_[base].param;
    int8_t A[16][32], B[32][8];
    int32_t C[16][8];
    const auto byte = [](uint32_t word, int i) { return static_cast<int8_t>(static_cast<uint8_t>(word >> (8 * i))); };
    for (unsigned lane = 0; lane < 32; ++lane) {
        detail::MmaS8Fragments f;
        std::memcpy(&f, threads_[base + lane].in, sizeof f);
        const int g = static_cast<int>(lane / 4), t = static_cast<int>(lane % 4);
        for (int i = 0; i < 4; ++i) {
            A[g][4 * t + i] = byte(f.a[0], i);
            A[g + 8][4 * t + i] = byte(f.a[1], i);
            B[4 * t + i][g] = byte(f.b[0], i);
            if (k == 32) {
                A[g][16 + 4 * t + i] = byte(f.a[2], i);
                A[g + 8][16 + 4 * t + i] = byte(f.a[3], i);
                B[16 + 4 * t + i][g] = byte(f.b[1], i);
            }
        }
        C[g][2 * t] = f.c[0], C[g][2 * t + 1] = f.c[1], C[g + 8][2 * t] = f.c[2], C[g + 8][2 * t + 1] = f.c[3];
    }
    for (unsigned lane = 0; lane < 32; ++lane) {
        const int g = static_cast<int>(lane / 4), t = static_cast<int>(lane % 4);
        const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
        int32_t d[4];
        for (int i = 0; i < 4; ++i) {
            // Exact while it fits: k products of at most 128 * 128 plus C, which gemm_q8 keeps far from 2^31
            // (C = 0). Beyond that, two's-complement wrap-around (the kernels use no .satfinite).
            uint32_t sum = static_cast<uint32_t>(C[rows[i]][cols[i]]);
            for (int j = 0; j < k; ++j)
                sum += static_cast<uint32_t>(int32_t{A[rows[i]][j]} * int32_t{B[j][cols[i]]});
            d[i] = static_cast<int32_t>(sum);
        }
        std::memcpy(threads_[base + lane].out, d, sizeof d);
    }
}

void BlockRunner::complete(unsigned base, unsigned lanes, unsigned mask) {
    if (threads_[base].op == detail::WarpOp::MmaS8) {
        // A whole warp: the mask is always full (cuda_emu.h), and warp_collective refuses a full mask in a
        // warp cut short by the block's end.
        complete_mma_s8(base);
        for (unsigned m = 0; m < 32; ++m) threads_[base + m].wait = Wait::Runnable;
        return;
    }
    unsigned ballot = 0;
    for (unsigned m = 0; m < lanes; ++m)
        if ((mask >> m & 1u) && threads_[base + m].param) ballot |= 1u << m;
    for (unsigned m = 0; m < lanes; ++m) {
        if (!(mask >> m & 1u)) continue;
        Thread& t = threads_[base + m];
        const int w = t.width, seg = static_cast<int>(m) & ~(w - 1);
        int src = static_cast<int>(m);
        switch (t.op) {
            case detail::WarpOp::ShflIdx: src = seg + (t.param & (w - 1)); break;
            case detail::WarpOp::ShflUp:
                src = static_cast<int>(m) - t.param;
                if (src < seg) src = static_cast<int>(m);
                break;
            case detail::WarpOp::ShflDown:
                src = static_cast<int>(m) + t.param;
                if (src >= seg + w) src = static_cast<int>(m);
                break;
            case detail::WarpOp::ShflXor:
                src = static_cast<int>(m) ^ t.param;
                if (src < seg || src >= seg + w) src = static_cast<int>(m);
                break;
            case detail::WarpOp::Ballot: t.result = ballot; break;
            case detail::WarpOp::Any: t.result = ballot != 0; break;
            case detail::WarpOp::All: t.result = ballot == mask; break;
            case detail::WarpOp::SyncWarp: break;
            case detail::WarpOp::MmaS8: break;  // completed by complete_mma_s8
        }
        if (t.size) {
            // Reading a lane outside the mask is undefined on the GPU: hand back poison (NaN for floats).
            if (src < 0 || src >= 32 || !(mask >> src & 1u))
                std::memset(t.out, 0xFF, t.size);
            else
                std::memcpy(t.out, threads_[base + static_cast<unsigned>(src)].in, t.size);
        }
    }
    for (unsigned m = 0; m < lanes; ++m)
        if (mask >> m & 1u) threads_[base + m].wait = Wait::Runnable;
}

// Every thread is blocked and no collective can complete: the barrier must hold all threads, at one call site.
// Returns true when that barrier is a grid_sync (the launch releases it once every block is there), false after
// releasing a __syncthreads.
bool BlockRunner::release_barrier() {
    int first_barrier = -1, first_exited = -1, first_warp = -1, first_grid = -1;
    unsigned n_barrier = 0, n_grid = 0;
    for (unsigned i = 0; i < n_; ++i) {
        const Wait w = threads_[i].wait;
        if (w == Wait::Barrier) {
            if (first_barrier < 0) first_barrier = static_cast<int>(i);
            ++n_barrier;
        } else if (w == Wait::GridBarrier) {
            if (first_grid < 0) first_grid = static_cast<int>(i);
            ++n_grid;
        } else if (w == Wait::Exited && first_exited < 0) {
            first_exited = static_cast<int>(i);
        } else if (w == Wait::Warp && first_warp < 0) {
            first_warp = static_cast<int>(i);
        }
    }
    if (first_warp >= 0) {
        const Thread& t = threads_[first_warp];
        std::string msg = std::string(detail::warp_op_name(t.op)) + " at " + format_location(t.where) + " (" +
                          where_thread(first_warp) + ", mask " + hex(t.mask) + ") can never complete";
        if (first_barrier >= 0)
            msg += ": thread " + format_dim(threads_[first_barrier].idx) + " waits in __syncthreads at " +
                   format_location(threads_[first_barrier].where);
        else if (first_grid >= 0)
            msg += ": thread " + format_dim(threads_[first_grid].idx) + " waits in grid_sync at " +
                   format_location(threads_[first_grid].where);
        fail(msg);
    }
    if (first_grid >= 0) {
        const Thread& g = threads_[first_grid];
        if (first_barrier >= 0)
            fail("threads wait at different barriers: " + where_thread(first_grid) + " in grid_sync at " +
                 format_location(g.where) + ", " + where_thread(first_barrier) + " in __syncthreads at " +
                 format_location(threads_[first_barrier].where));
        for (unsigned i = 0; i < n_; ++i)
            if (threads_[i].wait == Wait::GridBarrier && !same_site(threads_[i].where, g.where))
                fail("threads wait at different grid_sync calls: " + where_thread(first_grid) + " at " +
                     format_location(g.where) + ", " + where_thread(i) + " at " +
                     format_location(threads_[i].where));
        if (first_exited >= 0)
            fail("grid_sync at " + format_location(g.where) + " is not reached by all threads of block " +
                 format_dim(block_idx_) + ": " + std::to_string(n_grid) + " of " + std::to_string(n_) +
                 " wait, thread " + format_dim(threads_[first_exited].idx) + " has exited");
        return true;
    }
    const Thread& b = threads_[first_barrier];
    for (unsigned i = 0; i < n_; ++i)
        if (threads_[i].wait == Wait::Barrier && !same_site(threads_[i].where, b.where))
            fail("threads wait at different __syncthreads: " + where_thread(first_barrier) + " at " +
                 format_location(b.where) + ", " + where_thread(i) + " at " + format_location(threads_[i].where));
    if (first_exited >= 0)
        fail("__syncthreads at " + format_location(b.where) + " in block " + format_dim(block_idx_) +
             " is not reached by all threads: " + std::to_string(n_barrier) + " of " + std::to_string(n_) +
             " wait, thread " + format_dim(threads_[first_exited].idx) + " has exited");
    for (Thread& t : threads_) t.wait = Wait::Runnable;
    return false;
}

// Unwinds every thread that has not finished (see the file comment), leaving no fiber suspended.
void BlockRunner::cancel_all() {
    cancel_ = true;
    for (unsigned i = 0; i < n_; ++i)
        if (threads_[i].fiber) resume(i);
    cancel_ = false;
    error_ = nullptr;
}

}  // namespace runtime_detail
}  // namespace tandem::emu
