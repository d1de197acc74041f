// The CUDA execution model emulated on the CPU: the part of the CUDA device API that tandem's kernels use, so the
// same kernel source compiles with g++ and runs under tests without a GPU. Included through cuda_compat.h only.
//
// How it runs (see emu/runtime.cpp): blocks run one after another (a cooperative launch's are all resident and
// interleaved, for grid_sync); every thread of a block is a fiber on one OS thread. A thread runs until it blocks
// in __syncthreads or a warp collective (__shfl*_sync, votes, __syncwarp); when every thread is blocked the
// scheduler completes the collectives whose lanes have all arrived, or releases the barrier, and checks the rules
// the hardware does not check for us (same barrier for all threads, no exited lanes named in a mask, ...).
// Violations throw tandem::emu::Error from the launch.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <source_location>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/fp16.h"

// ---- qualifiers: nothing to do on the CPU -------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// A plain `__shared__ float x[32];` would silently become one array per thread (the fiber's stack); make it a
// compile error that names the macro to use instead.
#define __shared__ use_TANDEM_SHARED_or_TANDEM_DYNAMIC_SHARED_from_cuda_compat_h

// ---- vector types -------------------------------------------------------------------------------------------------
struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

constexpr int warpSize = 32;

// ---- half precision ---------------------------------------------------------------------------------------------
// Storage only, with the conversions kernels use. Round to nearest even, like __float2half_rn on the GPU; the
// portable tandem conversions are used so the result does not depend on the F16C flags of this translation unit.
struct __half {
    unsigned short x;
};
inline float __half2float(__half h) { return tandem::cpu::fp16_to_fp32_portable(h.x); }
inline __half __float2half(float f) { return {tandem::cpu::fp32_to_fp16_portable(f)}; }
inline __half __float2half_rn(float f) { return __float2half(f); }
inline __half __ushort_as_half(unsigned short u) { return {u}; }
inline unsigned short __half_as_ushort(__half h) { return h.x; }

// ---- math intrinsics ------------------------------------------------------------------------------------------------
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __int_as_float(int i) { return std::bit_cast<float>(i); }
inline int __float_as_int(float f) { return std::bit_cast<int>(f); }
inline float __uint_as_float(unsigned u) { return std::bit_cast<float>(u); }
inline unsigned __float_as_uint(float f) { return std::bit_cast<unsigned>(f); }
// Round to nearest, ties to even (the default rounding mode nearbyint uses); out-of-range values are undefined
// on the GPU too.
inline int __float2int_rn(float f) { return static_cast<int>(std::nearbyint(f)); }
// c + the four products of a's and b's signed bytes (the sm_61+ dp4a instruction; wraps like it on overflow).
inline int __dp4a(int a, int b, int c) {
    uint32_t sum = static_cast<uint32_t>(c);
    for (int i = 0; i < 4; ++i)
        sum += static_cast<uint32_t>(static_cast<int8_t>(a >> (8 * i)) * static_cast<int8_t>(b >> (8 * i)));
    return static_cast<int>(sum);
}
template <class T>
inline T __ldg(const T* p) {
    return *p;
}

namespace tandem::emu {

// Every misuse the emulation detects, and every exception thrown by a kernel, reaches the launcher as this.
class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// The order in which the threads of a block (and the blocks of a grid) are run between synchronisation points.
// Forward is what naive code silently relies on; Reverse and Shuffled expose missing barriers.
enum class ThreadOrder { Forward, Reverse, Shuffled };

struct LaunchOptions {
    ThreadOrder order = ThreadOrder::Forward;
    uint64_t seed = 0;  // for Shuffled
    // When set, the name of every kernel launch that runs (directly, or as a node of a replayed graph; not one
    // recorded into a capture) is appended: what tests count to see what a call launched, e.g. how many matvec
    // launches read a model's weights in one step.
    std::vector<std::string>* launched = nullptr;
};

// The options every launch on this OS thread uses (kernels are launched through plain C++ functions that know
// nothing of the emulation, so tests choose the order here).
LaunchOptions& launch_options();

// Sets the launch options for a scope and restores the previous ones.
class ScopedLaunchOptions {
public:
    explicit ScopedLaunchOptions(LaunchOptions o) : saved_(launch_options()) { launch_options() = o; }
    ~ScopedLaunchOptions() { launch_options() = saved_; }
    ScopedLaunchOptions(const ScopedLaunchOptions&) = delete;
    ScopedLaunchOptions& operator=(const ScopedLaunchOptions&) = delete;

private:
    LaunchOptions saved_;
};

// The limits the launch checks, as on sm_80..sm_90.
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr size_t kDefaultSharedLimit = 48 * 1024;      // static + dynamic without an opt-in
constexpr size_t kMaxSharedOptIn = 227 * 1024;         // cudaDevAttrMaxSharedMemoryPerBlockOptin on sm_90

// A cooperative launch's blocks must all be resident at once. The emulated device is one SM with sm_80..90's
// per-SM limits (2048 threads, 32 blocks, 228 KiB of shared memory with 1 KiB reserved per block). Registers, which
// also limit it on a GPU, are not modelled, nor is static shared memory (known only once the kernel runs).
constexpr unsigned kMaxThreadsPerSm = 2048;
constexpr unsigned kMaxBlocksPerSm = 32;
constexpr size_t kSharedPerSm = 228 * 1024;
constexpr size_t kSharedReservedPerBlock = 1024;
// The most blocks of `block` threads with `dynamic_shared_bytes` a cooperative launch may have here (0 for an invalid
// block): the emulation's cudaOccupancyMaxActiveBlocksPerMultiprocessor times its one SM.
int max_cooperative_blocks(dim3 block, size_t dynamic_shared_bytes);

// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes): lets launches of `kernel` use
// up to `bytes` of dynamic shared memory (at most kMaxSharedOptIn).
void set_max_dynamic_shared(const void* kernel, size_t bytes);

namespace detail {

// The running thread's coordinates, set by the scheduler before it resumes a thread. Out of line on purpose: an
// inline read of an extern thread_local goes through GCC's TLS wrapper, which UBSan's null check misreports.
const uint3& thread_idx();
const uint3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();

enum class WarpOp : uint8_t { ShflIdx, ShflUp, ShflDown, ShflXor, Ballot, Any, All, SyncWarp, MmaS8 };
const char* warp_op_name(WarpOp op);

// One lane's fragments of mma.sync.m16n8k32 / m16n8k16 .row.col.s32.s8.s8.s32 (WarpOp::MmaS8: `in` is an
// MmaS8Fragments, `param` the k (32 or 16; for 16 only a[0], a[1] and b[0] are read), `out` the lane's 4
// accumulators D), laid out as the PTX ISA gives them; mma_s8_m16n8k32 / k16 in common.cuh say which.
struct MmaS8Fragments {
    uint32_t a[4];
    uint32_t b[2];
    int32_t c[4];
};
constexpr unsigned kMmaS8OutBytes = 4 * sizeof(int32_t);

// One lane's part in a warp collective: blocks until every lane of `mask` has arrived at the same operation.
// For shuffles `in`/`out` are `size` bytes and `param` is the source lane / delta / lane mask; for votes `param`
// is the predicate and the result is returned; for MmaS8 every lane of the warp takes part (.aligned: one call
// site, a full mask) and `out` receives kMmaS8OutBytes.
unsigned warp_collective(WarpOp op, unsigned mask, const void* in, void* out, unsigned size, int param, int width,
                         const std::source_location& where);
void syncthreads(const std::source_location& where);

// Shared memory of the running block. `key` identifies a static declaration (the address of a static local the
// TANDEM_SHARED macro emits), so every thread of the block gets the same array.
void* static_shared(const void* key, size_t bytes, size_t align);
void* dynamic_shared();

// Runs `invoke(ctx)` as every thread of every block. `programmatic`: launched to overlap the kernel before it
// (programmatic dependent launch), so every thread must call cudaGridDependencySynchronize before it exits.
// `cooperative` (cudaLaunchAttributeCooperative): every block is resident at once, so the threads may meet in
// grid_sync and poll other blocks' writes; the blocks then run interleaved (each until it finishes, waits in a
// grid_sync or polls), not one after another.
void launch(const char* name, const void* kernel, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
            void (*invoke)(void*), void* ctx, bool programmatic = false, bool cooperative = false);

// cudaGridDependencySynchronize on the running thread: recorded, for the check above.
void grid_dependency_wait();

// The running thread waits until every thread of the grid has reached the same grid_sync (cooperative_groups'
// grid.sync()). Errors: a launch that is not cooperative, threads or blocks at different calls, one that exited.
void grid_sync(const std::source_location& where);
// __nanosleep: in a cooperative launch, the thread waits until the other blocks have run.
void nanosleep();

template <class T>
T shuffle(WarpOp op, unsigned mask, T var, int param, int width, const std::source_location& where) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffles move 1..8 byte values");
    T out;
    warp_collective(op, mask, &var, &out, sizeof(T), param, width, where);
    return out;
}

}  // namespace detail

// ---- streams and graph capture ------------------------------------------------------------------------------------
// Work runs synchronously in the emulation, so a stream's only state is a capture in progress. While a stream
// captures, kernel launches on it (and the copies / memsets kernels/device.cu records) are appended to its graph
// instead of running; a kernel node keeps its arguments converted to the parameter types and stored by value, as
// CUDA bakes kernel parameters into a kernel node at capture, so a replay sees the values of capture time and only
// what they point to may change. nullptr is the legacy default stream, which cannot capture. Stream handles are
// checked against the live ones: a destroyed or invented handle is an Error, not a wild pointer.

enum class NodeKind : uint8_t { Kernel, Memcpy, Memset, Graph };

struct GraphNode {
    NodeKind kind;
    std::string name;               // the kernel's name, or what the copy / memset was
    const void* function = nullptr;  // the kernel of a Kernel node (cudaGraphExecUpdate compares them)
    std::function<void()> run;       // replays the node
};

// A captured (and, the emulation needs no more, instantiated) graph: its nodes in stream order.
struct Graph {
    std::vector<GraphNode> nodes;
    // Same node kinds and kernels in the same order: what lets cudaGraphExecUpdate patch an executable graph
    // in place (parameters, launch shapes and copy addresses may differ). Stricter than CUDA, which would also
    // accept a changed kernel function: an emulated "update" then re-instantiates, with the same result.
    bool same_topology(const Graph& o) const;
};

// `programmatic`: kernels launched on the stream may overlap the kernel before them (the launch attribute
// cudaLaunchAttributeProgrammaticStreamSerialization, sm_90+). The emulation still runs them one after another, and
// checks what it can: that every thread of such a kernel waits (cudaGridDependencySynchronize) before it exits.
// `high_priority`: created with the device's greatest priority (cudaStreamCreateWithPriority); the emulation runs
// work when it is queued, so it only remembers it (stream_is_high_priority).
void* stream_create(bool programmatic = false, bool high_priority = false);
void stream_destroy(void* stream) noexcept;  // discards a capture in progress
// Launches on `stream` overlap their predecessor (created so). False for nullptr.
bool stream_is_programmatic(void* stream);
// Created with high_priority. False for nullptr.
bool stream_is_high_priority(void* stream);
// cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal). Errors: the legacy stream, a stream already
// capturing.
void begin_capture(void* stream);
// cudaStreamIsCapturing: begun and not ended, invalidated or not. False for nullptr.
bool is_capturing(void* stream);
// A capture begun by this OS thread is in progress: ThreadLocal mode forbids this thread "potentially unsafe"
// calls (cudaMalloc, cudaFree, cudaMallocHost, synchronizing the capturing stream).
bool thread_is_capturing();
// Makes the capture on `stream` (or every capture begun by this thread) fail at end_capture with `why`, as
// CUDA invalidates a capture sequence after an illegal call.
void invalidate_capture(void* stream, const std::string& why);
void invalidate_thread_captures(const std::string& why);
// Appends a node to the graph `stream` captures (it must be capturing).
void record(void* stream, GraphNode node);
// cudaStreamEndCapture: the graph, or an Error naming the call that invalidated the capture. Either way the
// stream stops capturing.
Graph end_capture(void* stream);
// cudaGraphLaunch: replays the nodes in order now, or, on a capturing stream, records the graph as one node (a
// child graph, copied as CUDA copies it).
void graph_launch(const Graph& graph, void* stream);

namespace detail {
// The launch checks (block and grid limits, dynamic shared memory): made when a launch is recorded as well as
// when it runs, since CUDA rejects a bad configuration at the capturing launch.
void check_launch(const char* name, const void* kernel, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                  bool cooperative = false);
}  // namespace detail

// What launch_on and launch_cooperative_on (below) both do: launches `kernel` on `stream` with CUDA's by-value
// parameter passing: the arguments are converted to the parameter types once, and every thread calls the kernel
// with (copies of) them. On a capturing stream the converted arguments are stored in the graph node instead, and
// every replay launches with (copies of) those. `cooperative`: as a cooperative launch (detail::launch).
template <class... P, class... A>
void launch_on_as(bool cooperative, void* stream, const char* name, void (*kernel)(P...), dim3 grid, dim3 block,
                  size_t dynamic_shared_bytes, A&&... args) {
    static_assert(sizeof...(P) == sizeof...(A), "wrong number of kernel arguments");
    struct Call {
        void (*kernel)(P...);
        std::tuple<std::decay_t<P>...> args;
        static void invoke(void* p) {
            Call& c = *static_cast<Call*>(p);
            std::apply(c.kernel, c.args);  // std::apply copies nothing: the kernel's by-value params are the copies
        }
    } call{kernel, std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)};
    const void* key = reinterpret_cast<const void*>(kernel);
    // A cooperative launch does not overlap the kernel before it (launch_cooperative_kernel sets no programmatic
    // attribute): its threads' wait has nothing to wait for, as on the GPU.
    const bool programmatic = !cooperative && stream_is_programmatic(stream);
    if (stream && is_capturing(stream)) {
        try {
            detail::check_launch(name, key, grid, block, dynamic_shared_bytes, cooperative);
        } catch (const Error& e) {
            invalidate_capture(stream, e.what());
            throw;
        }
        record(stream,
               GraphNode{NodeKind::Kernel, name, key,
                         [name, key, grid, block, dynamic_shared_bytes, call, programmatic, cooperative]() mutable {
                             detail::launch(name, key, grid, block, dynamic_shared_bytes, &Call::invoke, &call,
                                            programmatic, cooperative);
                         }});
        return;
    }
    detail::launch(name, key, grid, block, dynamic_shared_bytes, &Call::invoke, &call, programmatic, cooperative);
}

template <class... P, class... A>
void launch_on(void* stream, const char* name, void (*kernel)(P...), dim3 grid, dim3 block,
               size_t dynamic_shared_bytes, A&&... args) {
    launch_on_as(false, stream, name, kernel, grid, block, dynamic_shared_bytes, std::forward<A>(args)...);
}

// cudaLaunchKernelEx with cudaLaunchAttributeCooperative: the grid must fit the device at once
// (max_cooperative_blocks), and its threads may call grid_sync.
template <class... P, class... A>
void launch_cooperative_on(void* stream, const char* name, void (*kernel)(P...), dim3 grid, dim3 block,
                           size_t dynamic_shared_bytes, A&&... args) {
    launch_on_as(true, stream, name, kernel, grid, block, dynamic_shared_bytes, std::forward<A>(args)...);
}

// A launch on the legacy default stream: runs now.
template <class... P, class... A>
void launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t dynamic_shared_bytes, A&&... args) {
    launch_on(nullptr, name, kernel, grid, block, dynamic_shared_bytes, std::forward<A>(args)...);
}

}  // namespace tandem::emu

// ---- built-in variables ---------------------------------------------------------------------------------------------
#define threadIdx (::tandem::emu::detail::thread_idx())
#define blockIdx (::tandem::emu::detail::block_idx())
#define blockDim (::tandem::emu::detail::block_dim())
#define gridDim (::tandem::emu::detail::grid_dim())

// ---- synchronisation and warp functions -------------------------------------------------------------------------------
// The source_location default arguments name the call site, which the barrier checks compare and errors report.
inline void __syncthreads(std::source_location where = std::source_location::current()) {
    ::tandem::emu::detail::syncthreads(where);
}
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu, std::source_location where = std::source_location::current()) {
    ::tandem::emu::detail::warp_collective(::tandem::emu::detail::WarpOp::SyncWarp, mask, nullptr, nullptr, 0, 0, 32,
                                           where);
}
template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32,
              std::source_location where = std::source_location::current()) {
    return ::tandem::emu::detail::shuffle(::tandem::emu::detail::WarpOp::ShflIdx, mask, var, src_lane, width, where);
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32,
                 std::source_location where = std::source_location::current()) {
    return ::tandem::emu::detail::shuffle(::tandem::emu::detail::WarpOp::ShflUp, mask, var, static_cast<int>(delta),
                                          width, where);
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32,
                   std::source_location where = std::source_location::current()) {
    return ::tandem::emu::detail::shuffle(::tandem::emu::detail::WarpOp::ShflDown, mask, var, static_cast<int>(delta),
                                          width, where);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32,
                  std::source_location where = std::source_location::current()) {
    return ::tandem::emu::detail::shuffle(::tandem::emu::detail::WarpOp::ShflXor, mask, var, lane_mask, width, where);
}
inline unsigned __ballot_sync(unsigned mask, int pred, std::source_location where = std::source_location::current()) {
    return ::tandem::emu::detail::warp_collective(::tandem::emu::detail::WarpOp::Ballot, mask, nullptr, nullptr, 0,
                                                  pred != 0, 32, where);
}
inline int __any_sync(unsigned mask, int pred, std::source_location where = std::source_location::current()) {
    return static_cast<int>(::tandem::emu::detail::warp_collective(::tandem::emu::detail::WarpOp::Any, mask, nullptr,
                                                                   nullptr, 0, pred != 0, 32, where));
}
inline int __all_sync(unsigned mask, int pred, std::source_location where = std::source_location::current()) {
    return static_cast<int>(::tandem::emu::detail::warp_collective(::tandem::emu::detail::WarpOp::All, mask, nullptr,
                                                                   nullptr, 0, pred != 0, 32, where));
}

// ---- warp-level matrix multiply-accumulate: the int8 tensor-core instructions of gemm_q8, as warp collectives
// (runtime.cpp gathers the 32 lanes' fragments into the 16x32, 32x8 and 16x8 matrices and hands each lane its D).
inline void tandem_emu_mma_s8_m16n8k32(int (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const int (&c)[4],
                                       std::source_location where = std::source_location::current()) {
    ::tandem::emu::detail::MmaS8Fragments in{};
    for (int i = 0; i < 4; ++i) in.a[i] = a[i], in.c[i] = c[i];
    in.b[0] = b[0], in.b[1] = b[1];
    int32_t out[4];
    ::tandem::emu::detail::warp_collective(::tandem::emu::detail::WarpOp::MmaS8, 0xFFFFFFFFu, &in, out, sizeof in, 32,
                                           32, where);
    for (int i = 0; i < 4; ++i) d[i] = out[i];
}
inline void tandem_emu_mma_s8_m16n8k16(int (&d)[4], const uint32_t (&a)[2], uint32_t b, const int (&c)[4],
                                       std::source_location where = std::source_location::current()) {
    ::tandem::emu::detail::MmaS8Fragments in{};
    in.a[0] = a[0], in.a[1] = a[1], in.b[0] = b;
    for (int i = 0; i < 4; ++i) in.c[i] = c[i];
    int32_t out[4];
    ::tandem::emu::detail::warp_collective(::tandem::emu::detail::WarpOp::MmaS8, 0xFFFFFFFFu, &in, out, sizeof in, 16,
                                           32, where);
    for (int i = 0; i < 4; ++i) d[i] = out[i];
}

// ---- memory ordering between blocks: the blocks of a launch run one after another (a cooperative launch's
// interleaved) on one OS thread, so every write is visible to every later read; the fence has nothing to order
// and an L1-bypassing load is a plain load.
// (What this cannot show: a missing fence on a real GPU. docs/cuda-backend.md, "What the emulation cannot show".)
inline void __threadfence() {}
template <class T>
inline T __ldcg(const T* p) {
    return *p;
}

// ---- cooperative launches: the grid-wide barrier (cuda_compat.h: cooperative_groups' grid.sync() under nvcc) and
// the back-off of a loop polling another block's write.
inline void tandem_grid_sync(std::source_location where = std::source_location::current()) {
    ::tandem::emu::detail::grid_sync(where);
}
inline void __nanosleep(unsigned) { ::tandem::emu::detail::nanosleep(); }

// ---- programmatic dependent launch (sm_90+): kernels of a launch run after the previous launch has finished, so
// the wait has nothing to wait for and the trigger nothing to start early; the wait is recorded, so that a launch
// on a programmatic stream can report a thread that never waited.
inline void cudaGridDependencySynchronize() { ::tandem::emu::detail::grid_dependency_wait(); }
inline void cudaTriggerProgrammaticLaunchCompletion() {}

// ---- atomics: one OS thread runs every fiber and a fiber is never preempted, so plain read-modify-write is atomic --
inline float atomicAdd(float* p, float v) {
    const float old = *p;
    *p = old + v;
    return old;
}
inline int atomicAdd(int* p, int v) {
    const int old = *p;
    *p = old + v;
    return old;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
    const unsigned old = *p;
    *p = old + v;
    return old;
}
inline int atomicMax(int* p, int v) {
    const int old = *p;
    *p = old > v ? old : v;
    return old;
}
inline int atomicExch(int* p, int v) {
    const int old = *p;
    *p = v;
    return old;
}
inline int atomicCAS(int* p, int compare, int v) {
    const int old = *p;
    if (old == compare) *p = v;
    return old;
}

// ---- shared memory -----------------------------------------------------------------------------------------------------
// `static char` gives each declaration (and each template instantiation of the enclosing kernel) its own key.
#define TANDEM_SHARED(type, name, count)                                                                           \
    static char tandem_shared_key_##name;                                                                          \
    type(&name)[count] = *reinterpret_cast<type(*)[count]>(                                                        \
        ::tandem::emu::detail::static_shared(&tandem_shared_key_##name, sizeof(type) * (count), alignof(type)))
#define TANDEM_DYNAMIC_SHARED(type, name) type* name = static_cast<type*>(::tandem::emu::detail::dynamic_shared())
