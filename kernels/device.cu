// Device memory, copies and streams (kernels/device.h): the CUDA runtime under nvcc, host memory under the
// emulation. Not a kernel family, but a .cu so that it joins both libraries the same way the kernels do.
#include <cstdlib>
#include <cstring>
#include <limits>

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

void device_memset(void* dst, int value, size_t bytes, Stream stream) {
    check(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
}

Stream stream_create() {
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    return s;
}

void stream_destroy(Stream stream) noexcept {
    if (stream) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

void stream_synchronize(Stream stream) {
    check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

#else  // the emulation: host memory, synchronous

namespace {
size_t& emulated_limit() {
    static size_t limit = 0;  // 0: unlimited
    return limit;
}
}  // namespace

bool device_is_emulated() { return true; }

int device_count(std::string*) { return 1; }

std::string device_name() { return "CUDA emulation"; }

DeviceMemory device_memory() {
    const size_t limit = emulated_limit() ? emulated_limit() : std::numeric_limits<size_t>::max();
    return {limit, limit};
}

void set_emulated_device_memory(size_t bytes) { emulated_limit() = bytes; }

void* device_alloc(size_t bytes) {
    // Rounded up: aligned_alloc wants a multiple of the alignment.
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!p) throw DeviceError("CUDA: cudaMalloc of " + std::to_string(bytes) + " bytes failed: cudaErrorMemoryAllocation (emulated)");
    return p;
}

void device_free(void* p) noexcept { std::free(p); }

void copy_to_device(void* dst, const void* src, size_t bytes, Stream) {
    if (bytes) std::memcpy(dst, src, bytes);
}
void copy_to_host(void* dst, const void* src, size_t bytes, Stream) {
    if (bytes) std::memcpy(dst, src, bytes);
}
void device_memset(void* dst, int value, size_t bytes, Stream) {
    if (bytes) std::memset(dst, value, bytes);
}

Stream stream_create() { return nullptr; }
void stream_destroy(Stream) noexcept {}
void stream_synchronize(Stream) {}

#endif

}  // namespace tandem::cuda
