// Device memory, pinned host memory, copies, streams and CUDA graphs (kernels/device.h): the CUDA runtime under
// nvcc, host memory and the emulation's streams under the emulation. Not a kernel family, but a .cu so that it joins
// both libraries the same way the kernels do.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "common.cuh"
#include "device.h"

namespace tandem::cuda {

#if defined(__CUDACC__)

namespace {

// "cudaErrorInsufficientDriver (CUDA driver version is insufficient for CUDA runtime version)".
std::string describe(cudaError_t err) {
    return std::string(cudaGetErrorName(err)) + " (" + cudaGetErrorString(err) + ")";
}

void check(cudaError_t err, const char* what) {
    if (err != cudaSuccess) {
        (void)cudaGetLastError();  // clear a non-sticky error so the next call does not report it again
        throw DeviceError(std::string("CUDA: ") + what + " failed: " + describe(err));
    }
}

}  // namespace

bool device_is_emulated() { return false; }

int device_count(std::string* why) {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        if (why) *why = describe(err);
        return 0;
    }
    if (n == 0 && why) *why = "cudaGetDeviceCount found no CUDA device";
    return n;
}

std::string device_name() {
    cudaDeviceProp p{};
    check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
    return std::string(p.name) + ", sm_" + std::to_string(p.major) + std::to_string(p.minor);
}

DeviceMemory device_memory() {
    DeviceMemory m;
    check(cudaMemGetInfo(&m.free_bytes, &m.total_bytes), "cudaMemGetInfo");
    return m;
}

void set_emulated_device_memory(size_t) {}

void* device_alloc(size_t bytes) {
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
    return p;
}

void device_free(void* p) noexcept {
    if (p) cudaFree(p);
}

void copy_to_device(void* dst, const void* src, size_t bytes, Stream stream) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)),
          "cudaMemcpyAsync (host to device)");
}

void copy_to_host(void* dst, const void* src, size_t bytes, Stream stream) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream)),
          "cudaMemcpyAsync (device to host)");
}

void copy_on_device(void* dst, const void* src, size_t bytes, Stream stream) {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)),
          "cudaMemcpyAsync (device to device)");
}

void device_memset(void* dst, int value, size_t bytes, Stream stream) {
    check(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
}

namespace {

// The streams made with overlap_launches on a device that has programmatic dependent launch. Looked up at every
// launch (a few per microsecond at most: graphs replay without launching).
struct OverlapStreams {
    std::mutex mu;
    std::set<Stream> streams;
};

OverlapStreams& overlap_streams() {
    static OverlapStreams s;
    return s;
}

int compute_capability_major() {
    int device = 0, major = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
    return major;
}

// A kernel of this build, to ask what code the device runs of it.
__global__ void probe_kernel() {}

// The virtual architecture of the code the device runs (80 for sm_80 code, or for sm_80 PTX compiled just in time
// for a newer device): what __CUDA_ARCH__ was when this build's kernels were compiled for it.
int code_architecture() {
    cudaFuncAttributes attributes{};
    check(cudaFuncGetAttributes(&attributes, probe_kernel), "cudaFuncGetAttributes");
    return attributes.ptxVersion;
}

// common.cuh compiles griddepcontrol (and the int8 mma.sync) only into code for sm_90 (sm_80) and later: a build
// whose code for this device comes from older PTX (e.g. CMAKE_CUDA_ARCHITECTURES=80 on an H100) must not overlap
// launches, whose kernels would then never wait for their inputs (nor run the int8 GEMM, which would trap).
bool device_has_programmatic_launch() { return compute_capability_major() >= 9 && code_architecture() >= 90; }

}  // namespace

bool device_has_int8_mma() { return compute_capability_major() >= 8 && code_architecture() >= 80; }

int multiprocessor_count() {
    int device = 0, count = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
    return count;
}

int cooperative_max_blocks(const void* kernel, int block_threads, size_t dynamic_shared_bytes) {
    int per_sm = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block_threads, dynamic_shared_bytes),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    return per_sm * multiprocessor_count();
}

Stream stream_create(bool overlap_launches, bool high_priority) {
    int least = 0, greatest = 0;
    check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, high_priority ? greatest : least),
          "cudaStreamCreateWithPriority");
    if (overlap_launches && device_has_programmatic_launch()) {
        std::lock_guard<std::mutex> lock(overlap_streams().mu);
        overlap_streams().streams.insert(s);
    }
    return s;
}

void stream_destroy(Stream stream) noexcept {
    if (!stream) return;
    {
        std::lock_guard<std::mutex> lock(overlap_streams().mu);
        overlap_streams().streams.erase(stream);
    }
    cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

bool stream_overlaps_launches(Stream stream) {
    if (!stream) return false;
    std::lock_guard<std::mutex> lock(overlap_streams().mu);
    return overlap_streams().streams.count(stream) != 0;
}

bool stream_high_priority(Stream stream) {
    if (!stream) return false;
    int least = 0, greatest = 0, priority = 0;
    check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    check(cudaStreamGetPriority(static_cast<cudaStream_t>(stream), &priority), "cudaStreamGetPriority");
    return greatest != least && priority == greatest;
}

void stream_synchronize(Stream stream) {
    check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

bool stream_done(Stream stream) {
    const cudaError_t status = cudaStreamQuery(static_cast<cudaStream_t>(stream));
    if (status == cudaErrorNotReady) return false;
    check(status, "cudaStreamQuery");
    return true;
}

void* pinned_alloc(size_t bytes) {
    void* p = nullptr;
    check(cudaMallocHost(&p, bytes), ("cudaMallocHost of " + std::to_string(bytes) + " bytes").c_str());
    return p;
}

void pinned_free(void* p) noexcept {
    if (p) cudaFreeHost(p);
}

void begin_capture(Stream stream) {
    check(cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture");
}

bool is_capturing(Stream stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status), "cudaStreamIsCapturing");
    return status != cudaStreamCaptureStatusNone;
}

namespace {

// The captured graph (cudaGraph_t) is only needed until it is instantiated or used to update an instance.
struct CapturedGraph {
    cudaGraph_t graph = nullptr;
    size_t nodes = 0;
    explicit CapturedGraph(Stream stream) {
        check(cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph), "cudaStreamEndCapture");
        check(cudaGraphGetNodes(graph, nullptr, &nodes), "cudaGraphGetNodes");
    }
    ~CapturedGraph() {
        if (graph) cudaGraphDestroy(graph);
    }
    CapturedGraph(const CapturedGraph&) = delete;
    CapturedGraph& operator=(const CapturedGraph&) = delete;
    cudaGraphExec_t instantiate() const {
        cudaGraphExec_t exec = nullptr;
        check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
        return exec;
    }
};

}  // namespace

Graph::~Graph() {
    if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
}

Graph& Graph::operator=(Graph&& o) noexcept {
    if (this != &o) {
        if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
        exec_ = std::exchange(o.exec_, nullptr);
        nodes_ = std::exchange(o.nodes_, 0);
    }
    return *this;
}

void Graph::launch(Stream stream) const {
    if (!exec_) throw DeviceError("CUDA: launch of an empty tandem::cuda::Graph");
    check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), static_cast<cudaStream_t>(stream)), "cudaGraphLaunch");
}

Graph end_capture(Stream stream) {
    const CapturedGraph captured(stream);
    Graph g;
    g.exec_ = captured.instantiate();
    g.nodes_ = captured.nodes;
    return g;
}

bool end_capture(Stream stream, Graph& graph) {
    const CapturedGraph captured(stream);
    if (graph.exec_) {
        cudaGraphExecUpdateResultInfo info{};
        if (cudaGraphExecUpdate(static_cast<cudaGraphExec_t>(graph.exec_), captured.graph, &info) == cudaSuccess) {
            graph.nodes_ = captured.nodes;
            return true;
        }
        (void)cudaGetLastError();  // a topology change: not an error, re-instantiate below
    }
    Graph fresh;
    fresh.exec_ = captured.instantiate();
    fresh.nodes_ = captured.nodes;
    graph = std::move(fresh);
    return false;
}

#else  // the emulation: host memory, synchronous

namespace {

size_t& emulated_limit() {
    static size_t limit = 0;  // 0: unlimited
    return limit;
}

// Live pinned allocations (begin -> bytes), so that a captured copy can tell pinned from pageable host memory.
struct PinnedRegistry {
    std::mutex mu;
    std::map<uintptr_t, size_t> blocks;
    bool contains(const void* p, size_t bytes) {
        const uintptr_t a = reinterpret_cast<uintptr_t>(p);
        std::lock_guard<std::mutex> lock(mu);
        auto it = blocks.upper_bound(a);
        if (it == blocks.begin()) return false;
        --it;
        return a - it->first + bytes <= it->second;
    }
};

PinnedRegistry& pinned_registry() {
    static PinnedRegistry r;
    return r;
}

[[noreturn]] void capture_error(const std::string& what, const std::string& detail) {
    throw DeviceError("CUDA: " + what + " failed: cudaErrorStreamCaptureUnsupported (operation not permitted when "
                      "stream is capturing: " + detail + ") (emulated)");
}

// ThreadLocal capture mode: a call that may synchronize the device, made by a thread that is capturing, fails and
// invalidates that thread's captures.
void forbid_while_capturing(const std::string& what) {
    if (!emu::thread_is_capturing()) return;
    const std::string detail = what + " may synchronize the device; this thread is capturing a graph";
    emu::invalidate_thread_captures(what);
    capture_error(what, detail);
}

// Runs an emulation call, reporting its errors as DeviceError like the CUDA runtime's.
template <class F>
auto device_call(const char* what, F&& f) -> decltype(f()) {
    try {
        return f();
    } catch (const emu::Error& e) {
        throw DeviceError(std::string("CUDA: ") + what + " failed: " + e.what());
    }
}

bool capturing(Stream stream, const char* what) {
    return stream && device_call(what, [&] { return emu::is_capturing(stream); });
}

// A copy on a capturing stream becomes a node that copies when the graph runs; its host side must be pinned.
void record_copy(Stream stream, const char* what, void* dst, const void* src, size_t bytes, const void* host) {
    if (!pinned_registry().contains(host, bytes)) {
        emu::invalidate_capture(stream, std::string(what) + " of pageable host memory");
        capture_error(what, "a captured copy must use pinned host memory (pinned_alloc), which the graph reads or "
                            "writes when it runs");
    }
    emu::record(stream, emu::GraphNode{emu::NodeKind::Memcpy, what, nullptr, [dst, src, bytes] {
                                           if (bytes) std::memcpy(dst, src, bytes);
                                       }});
}

}  // namespace

bool device_is_emulated() { return true; }

int device_count(std::string*) { return 1; }

std::string device_name() { return "CUDA emulation"; }

bool device_has_int8_mma() { return true; }

int multiprocessor_count() { return 1; }

int cooperative_max_blocks(const void*, int block_threads, size_t dynamic_shared_bytes) {
    return emu::max_cooperative_blocks(dim3(static_cast<unsigned>(block_threads)), dynamic_shared_bytes);
}

DeviceMemory device_memory() {
    const size_t limit = emulated_limit() ? emulated_limit() : std::numeric_limits<size_t>::max();
    return {limit, limit};
}

void set_emulated_device_memory(size_t bytes) { emulated_limit() = bytes; }

void* device_alloc(size_t bytes) {
    forbid_while_capturing("cudaMalloc");
    // Rounded up: aligned_alloc wants a multiple of the alignment.
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!p) throw DeviceError("CUDA: cudaMalloc of " + std::to_string(bytes) + " bytes failed: cudaErrorMemoryAllocation (emulated)");
    return p;
}

void device_free(void* p) noexcept {
    // cudaFree during a capture fails and invalidates it; the emulation cannot throw here, so it invalidates the
    // capture (end_capture reports it) and still frees, which keeps leak checkers quiet.
    if (p && emu::thread_is_capturing()) emu::invalidate_thread_captures("cudaFree");
    std::free(p);
}

void* pinned_alloc(size_t bytes) {
    forbid_while_capturing("cudaMallocHost");
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!p)
        throw DeviceError("CUDA: cudaMallocHost of " + std::to_string(bytes) +
                          " bytes failed: cudaErrorMemoryAllocation (emulated)");
    std::lock_guard<std::mutex> lock(pinned_registry().mu);
    pinned_registry().blocks[reinterpret_cast<uintptr_t>(p)] = bytes;
    return p;
}

void pinned_free(void* p) noexcept {
    if (!p) return;
    if (emu::thread_is_capturing()) emu::invalidate_thread_captures("cudaFreeHost");
    {
        std::lock_guard<std::mutex> lock(pinned_registry().mu);
        pinned_registry().blocks.erase(reinterpret_cast<uintptr_t>(p));
    }
    std::free(p);
}

void copy_to_device(void* dst, const void* src, size_t bytes, Stream stream) {
    if (capturing(stream, "cudaMemcpyAsync (host to device)"))
        return record_copy(stream, "cudaMemcpyAsync (host to device)", dst, src, bytes, src);
    if (bytes) std::memcpy(dst, src, bytes);
}
void copy_to_host(void* dst, const void* src, size_t bytes, Stream stream) {
    if (capturing(stream, "cudaMemcpyAsync (device to host)"))
        return record_copy(stream, "cudaMemcpyAsync (device to host)", dst, src, bytes, dst);
    if (bytes) std::memcpy(dst, src, bytes);
}
void copy_on_device(void* dst, const void* src, size_t bytes, Stream stream) {
    if (capturing(stream, "cudaMemcpyAsync (device to device)")) {
        emu::record(stream, emu::GraphNode{emu::NodeKind::Memcpy, "cudaMemcpyAsync (device to device)", nullptr,
                                           [dst, src, bytes] {
                                               if (bytes) std::memcpy(dst, src, bytes);
                                           }});
        return;
    }
    if (bytes) std::memcpy(dst, src, bytes);
}
void device_memset(void* dst, int value, size_t bytes, Stream stream) {
    if (capturing(stream, "cudaMemsetAsync")) {
        emu::record(stream, emu::GraphNode{emu::NodeKind::Memset, "cudaMemsetAsync", nullptr, [dst, value, bytes] {
                                               if (bytes) std::memset(dst, value, bytes);
                                           }});
        return;
    }
    if (bytes) std::memset(dst, value, bytes);
}

Stream stream_create(bool overlap_launches, bool high_priority) {
    return emu::stream_create(overlap_launches, high_priority);
}
void stream_destroy(Stream stream) noexcept { emu::stream_destroy(stream); }
bool stream_overlaps_launches(Stream stream) {
    return device_call("cudaStreamGetAttribute", [&] { return emu::stream_is_programmatic(stream); });
}
bool stream_high_priority(Stream stream) {
    return device_call("cudaStreamGetPriority", [&] { return emu::stream_is_high_priority(stream); });
}
void stream_synchronize(Stream stream) {
    if (capturing(stream, "cudaStreamSynchronize")) {
        emu::invalidate_capture(stream, "cudaStreamSynchronize");
        capture_error("cudaStreamSynchronize", "synchronizing the capturing stream");
    }
}
bool stream_done(Stream stream) {
    if (capturing(stream, "cudaStreamQuery")) {
        emu::invalidate_capture(stream, "cudaStreamQuery");
        capture_error("cudaStreamQuery", "querying the capturing stream");
    }
    return true;
}

void begin_capture(Stream stream) {
    device_call("cudaStreamBeginCapture", [&] { emu::begin_capture(stream); });
}

bool is_capturing(Stream stream) { return capturing(stream, "cudaStreamIsCapturing"); }

Graph::~Graph() { delete static_cast<emu::Graph*>(exec_); }

Graph& Graph::operator=(Graph&& o) noexcept {
    if (this != &o) {
        delete static_cast<emu::Graph*>(exec_);
        exec_ = std::exchange(o.exec_, nullptr);
        nodes_ = std::exchange(o.nodes_, 0);
    }
    return *this;
}

void Graph::launch(Stream stream) const {
    if (!exec_) throw DeviceError("CUDA: launch of an empty tandem::cuda::Graph");
    // Kernel errors inside the replay stay emu::Error, as from a direct launch.
    if (stream) (void)capturing(stream, "cudaGraphLaunch");  // an unknown stream handle is a DeviceError
    emu::graph_launch(*static_cast<const emu::Graph*>(exec_), stream);
}

Graph end_capture(Stream stream) {
    auto g = std::make_unique<emu::Graph>(device_call("cudaStreamEndCapture", [&] { return emu::end_capture(stream); }));
    Graph out;
    out.nodes_ = g->nodes.size();
    out.exec_ = g.release();
    return out;
}

bool end_capture(Stream stream, Graph& graph) {
    Graph fresh = end_capture(stream);
    const bool updated = graph && static_cast<const emu::Graph*>(graph.exec_)->same_topology(
                                      *static_cast<const emu::Graph*>(fresh.exec_));
    graph = std::move(fresh);  // an update in place and a new instance replay the same nodes
    return updated;
}

#endif

}  // namespace tandem::cuda
