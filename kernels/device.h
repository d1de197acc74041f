// Device memory and streams for the host side of the CUDA backend, in plain C++ (no CUDA header): allocate, free,
// copy host <-> device, memset, streams, synchronize, device count and free memory. kernels/device.cu defines it
// twice, like the kernels: under nvcc on the CUDA runtime (cudaMalloc, cudaMemcpyAsync on a stream, ...), under
// the emulation on plain host memory (copies are memcpy, streams are null, everything is synchronous).
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
void device_memset(void* dst, int value, size_t bytes, Stream stream);

Stream stream_create();
void stream_destroy(Stream stream) noexcept;
// Waits for everything queued on `stream`, and reports an asynchronous kernel fault as a DeviceError.
void stream_synchronize(Stream stream);

// One device allocation, freed on destruction.
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t bytes) : ptr_(bytes ? device_alloc(bytes) : nullptr), bytes_(bytes) {}
    ~DeviceBuffer() { device_free(ptr_); }
    DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) {
            device_free(ptr_);
            ptr_ = std::exchange(o.ptr_, nullptr);
            bytes_ = std::exchange(o.bytes_, 0);
        }
        return *this;
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    void* get() const { return ptr_; }
    template <class T>
    T* as() const { return static_cast<T*>(ptr_); }
    size_t size() const { return bytes_; }

private:
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
};

}  // namespace tandem::cuda
