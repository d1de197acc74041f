// Device memory and streams for the host side of the CUDA backend, in plain C++ (no CUDA header): allocate, free,
// pinned host memory, copy host <-> device and device -> device, memset, streams, synchronize, CUDA graphs (stream
// capture and replay), device count and free memory. kernels/device.cu defines it twice, like the kernels: under
// nvcc on the CUDA runtime (cudaMalloc, cudaMemcpyAsync on a stream, cudaStreamBeginCapture, ...), under the
// emulation on plain host memory (copies are memcpy, everything not captured runs synchronously, graphs are
// recorded lists of launches).
//
// Every failure throws DeviceError (a tandem::Error, so the CLI reports it like any user-facing error) whose
// message names the CUDA error (e.g. "cudaErrorInsufficientDriver").
#pragma once
#include <cstddef>
#include <string>
#include <utility>

#include "error.h"
#include "kernels.h"

namespace tandem::cuda {

struct DeviceError : tandem::Error {
    using tandem::Error::Error;
};

// True in tandem_cuda_emu: "device" memory is host memory and kernels run on the CPU emulation.
bool device_is_emulated();

// Number of usable devices; 0 with *why set to the CUDA error name and text when the runtime cannot tell
// (no driver, driver too old, no device). Never throws: the CLI's --backend auto asks it.
int device_count(std::string* why = nullptr);
// Short description of device 0 ("NVIDIA H100 80GB HBM3, sm_90"; "CUDA emulation" when emulated).
std::string device_name();
// The current device has the int8 tensor-core instructions gemm_q8 uses (mma.sync m16n8k32 / m16n8k16 .s8:
// sm_80 and later), and this build's code for it was compiled for them (not older PTX compiled just in time). The
// emulation computes them, so it has them.
bool device_has_int8_mma();
// Streaming multiprocessors of the current device (cudaDevAttrMultiProcessorCount): what a persistent kernel's grid
// is sized by. The emulation runs one block at a time, so it reports one.
int multiprocessor_count();
// The most blocks of `block_threads` threads with `dynamic_shared_bytes` of dynamic shared memory that a cooperative
// launch of `kernel` may have (cudaOccupancyMaxActiveBlocksPerMultiprocessor times the SMs: every block resident at
// once). The emulation's device is one SM without a register limit (emu::max_cooperative_blocks).
int cooperative_max_blocks(const void* kernel, int block_threads, size_t dynamic_shared_bytes);

struct DeviceMemory {
    size_t free_bytes = 0, total_bytes = 0;
};
// cudaMemGetInfo on the current device. Emulated: the limit set below (unlimited by default, i.e. SIZE_MAX).
DeviceMemory device_memory();
// Emulation only (ignored on a real device): pretend the device has `bytes` free, so tests can exercise the
// memory plan's refusal. 0 restores "unlimited".
void set_emulated_device_memory(size_t bytes);

void* device_alloc(size_t bytes);  // 256-byte aligned; throws DeviceError naming the size on failure
void device_free(void* p) noexcept;
void copy_to_device(void* dst, const void* src, size_t bytes, Stream stream);
void copy_to_host(void* dst, const void* src, size_t bytes, Stream stream);
void copy_on_device(void* dst, const void* src, size_t bytes, Stream stream);  // device to device
void device_memset(void* dst, int value, size_t bytes, Stream stream);

// A non-blocking stream. The emulation's streams are real handles too (capture state lives in them); nullptr, the
// legacy default stream, still works everywhere except begin_capture.
// `overlap_launches`: each kernel launched on it may start before the previous one ends (programmatic dependent
// launch, common.cuh wait_for_inputs), where the device supports it and this build's code for it has the waits
// (sm_90 and later; elsewhere a plain stream).
// The emulation honours it on every "device", so the tests check that every kernel waits for its inputs.
// `high_priority`: the device's greatest stream priority (cudaDeviceGetStreamPriorityRange), else its least (the
// default streams' priority): where another stream's blocks also wait for an SM, this one's are scheduled first. A
// graph launched on it runs at its priority. The emulation runs work when it is queued: it only remembers it.
Stream stream_create(bool overlap_launches = false, bool high_priority = false);
// The stream's launches overlap (requested, and supported by the device).
bool stream_overlaps_launches(Stream stream);
// The stream has the device's greatest priority, which is above the least (created with high_priority on a device
// that has priorities).
bool stream_high_priority(Stream stream);
void stream_destroy(Stream stream) noexcept;
// Waits for everything queued on `stream`, and reports an asynchronous kernel fault as a DeviceError. An error on
// a capturing stream (see below).
void stream_synchronize(Stream stream);
// cudaStreamQuery: true when everything queued on `stream` has finished (never blocks); a fault is reported as
// stream_synchronize reports it. Emulated: always true (work runs when it is queued). Not on a capturing stream.
bool stream_done(Stream stream);

// ---- pinned host memory ---------------------------------------------------------------------------------------------
// cudaMallocHost / cudaFreeHost. A copy captured into a graph reads (or writes) its host buffer when the graph
// runs, so it must be pinned memory that stays put: the emulation rejects a captured copy of any other host memory
// (as CUDA rejects pageable memory in a capture, whose copies it stages synchronously).
void* pinned_alloc(size_t bytes);  // throws DeviceError naming the size on failure
void pinned_free(void* p) noexcept;

// One allocation of `Alloc`, freed by `Free` on destruction; movable, not copyable.
template <void* (*Alloc)(size_t), void (*Free)(void*) noexcept>
class OwnedBuffer {
public:
    OwnedBuffer() = default;
    explicit OwnedBuffer(size_t bytes) : ptr_(bytes ? Alloc(bytes) : nullptr), bytes_(bytes) {}
    ~OwnedBuffer() { Free(ptr_); }
    OwnedBuffer(OwnedBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
    OwnedBuffer& operator=(OwnedBuffer&& o) noexcept {
        if (this != &o) {
            Free(ptr_);
            ptr_ = std::exchange(o.ptr_, nullptr);
            bytes_ = std::exchange(o.bytes_, 0);
        }
        return *this;
    }
    OwnedBuffer(const OwnedBuffer&) = delete;
    OwnedBuffer& operator=(const OwnedBuffer&) = delete;
    void* get() const { return ptr_; }
    template <class T>
    T* as() const { return static_cast<T*>(ptr_); }
    size_t size() const { return bytes_; }

private:
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
};
using DeviceBuffer = OwnedBuffer<device_alloc, device_free>;  // device memory
using PinnedBuffer = OwnedBuffer<pinned_alloc, pinned_free>;  // pinned host memory

// ---- CUDA graphs -----------------------------------------------------------------------------------------------------
// Capture: between begin_capture(s) and end_capture(s), the work queued on stream s (kernel launches, copies,
// memsets) is recorded, not run. A kernel node keeps its arguments as they were at capture: a value passed to a
// kernel by value (a position, a token count) is frozen into the graph, and a replay sees the old value. Whatever
// changes between replays must live in device memory that the kernels read through a pointer. Copies keep their
// addresses: a captured copy_to_device re-reads its (pinned) host buffer at every replay.
//
// The capture mode is cudaStreamCaptureModeThreadLocal: while this thread captures, calls that may synchronize
// the device are errors (device_alloc, device_free, pinned_alloc, pinned_free, stream_synchronize of the
// capturing stream) and invalidate the capture, so that end_capture throws. The legacy default stream (nullptr)
// cannot be captured. All errors are DeviceError.

// cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal).
void begin_capture(Stream stream);
// cudaStreamIsCapturing: a capture was begun on `stream` and has not ended (an invalidated capture counts).
bool is_capturing(Stream stream);

// An instantiated graph (cudaGraphExec_t), destroyed with the object.
class Graph {
public:
    Graph() = default;
    ~Graph();
    Graph(Graph&& o) noexcept : exec_(std::exchange(o.exec_, nullptr)), nodes_(std::exchange(o.nodes_, 0)) {}
    Graph& operator=(Graph&& o) noexcept;
    Graph(const Graph&) = delete;
    Graph& operator=(const Graph&) = delete;

    // cudaGraphLaunch: queues every recorded node on `stream`, in capture order (synchronous when emulated).
    // Launching into a capturing stream records the graph as one child node. Throws DeviceError when empty.
    void launch(Stream stream) const;
    explicit operator bool() const { return exec_ != nullptr; }
    size_t node_count() const { return nodes_; }  // kernels + copies + memsets (+ child graphs) captured

private:
    friend Graph end_capture(Stream stream);
    friend bool end_capture(Stream stream, Graph& graph);
    void* exec_ = nullptr;  // cudaGraphExec_t, or the emulation's recorded graph
    size_t nodes_ = 0;
};

// cudaStreamEndCapture + cudaGraphInstantiate. The stream stops capturing even when this throws (an invalidated
// capture: DeviceError naming cudaErrorStreamCaptureInvalidated and, emulated, the call that invalidated it).
Graph end_capture(Stream stream);
// Ends the capture into an existing graph: when `graph` is non-empty and the new capture has its topology (same
// nodes in the same order; parameters, launch shapes and addresses may differ), cudaGraphExecUpdate patches it in
// place and this returns true (cheap: no re-instantiation); otherwise `graph` is replaced by a fresh instantiation
// and this returns false.
bool end_capture(Stream stream, Graph& graph);

}  // namespace tandem::cuda
