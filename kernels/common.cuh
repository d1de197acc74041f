// Device helpers shared by the kernel families (warp / block reductions, unaligned loads, the wait for the previous
// kernel's output) and launch_kernel, the one place that differs between the nvcc build (<<<>>> or
// cudaLaunchKernelEx on a stream) and the emulation (tandem::emu::launch).
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "cuda_compat.h"
#include "device.h"
#include "kernels.h"

namespace tandem::cuda::detail {

constexpr unsigned kFullMask = 0xFFFFFFFFu;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
    return v;
}

// cap * tanh(x * inv_cap) (gemma2's soft-capping; inv_cap = 1 / cap), with tanh(y) = 1 - 2 / (1 + e^2y) through
// __expf and __fdividef: no branch and no slow path (with tanhf in its online softmax, attention_split_kernel<256>
// spilled 12 bytes, sm_80-90, 2026-12-07). Large |y| gives +-cap exactly; the absolute error is a few 1e-7 of the
// cap, below what a softmax or a sampler can tell.
__device__ __forceinline__ float soft_cap(float x, float cap, float inv_cap) {
    const float e = __expf(2.0f * x * inv_cap);
    return cap * (1.0f - __fdividef(2.0f, 1.0f + e));
}

// Sum over a block whose size is a multiple of 32, returned to every thread. `scratch` is 32 floats of shared
// memory; every warp reduces the per-warp partials itself, which saves the broadcast barrier. The caller must
// __syncthreads() before reusing `scratch`.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

// *p, read past L1 (kPastL1) where other blocks wrote it during this launch: L1 is not coherent across SMs (the
// last-block epilogues: SwiGLU's quantize, RoPE in the Q/K/V launch).
template <bool kPastL1, class T>
__device__ __forceinline__ T load_input(const T* p) {
    if constexpr (kPastL1)
        return __ldcg(p);
    else
        return *p;
}

// SwiGLU's product, silu(g) * u, as the CPU backend writes it; one definition for swiglu() and the matvec's SwiGLU
// epilogue, which must agree bit for bit.
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// GGUF blocks are packed at 2-byte alignment (34-byte Q8_0, 18-byte Q4_0, 210-byte Q6_K), so their bytes are read
// 16 bits at a time and assembled.
__device__ __forceinline__ uint32_t load_u32_from_u16(const uint8_t* p) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16);
}

__device__ __forceinline__ float load_half(const uint8_t* p) {
    return tandem_half_to_float(*reinterpret_cast<const uint16_t*>(p));
}

// Sign-extends byte `i` of a packed word.
__device__ __forceinline__ int sbyte(uint32_t w, int i) { return static_cast<int8_t>((w >> (8 * i)) & 0xFF); }

// ---- int8 tensor cores ---------------------------------------------------------------------------------------------
// d = A * B + c for one warp's 16x8 tile over 32 k of int8 codes: mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32
// (sm_80 and later; the emulation computes it from the 32 lanes' fragments). Every lane of the warp calls it at the
// same place. Fragments as the PTX ISA lays them out, with g = lane / 4 and t = lane % 4 (bytes low to high):
//   a[0] = A[g][4t .. 4t+3], a[1] = A[g+8][4t ..], a[2] = A[g][16+4t ..], a[3] = A[g+8][16+4t ..];
//   b[0] = B[4t .. 4t+3][g], b[1] = B[16+4t ..][g]   (B is k x 8: column g is token g's 32 codes);
//   c / d = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1].
__device__ __forceinline__ void mma_s8_m16n8k32(int (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                const int (&c)[4]) {
#if !defined(__CUDACC__)
    tandem_emu_mma_s8_m16n8k32(d, a, b, c);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(c[0]), "r"(c[1]), "r"(c[2]),
          "r"(c[3]));
#else
    __trap();  // no int8 tensor cores before sm_80; gemm_q8 is not launched there
#endif
}

// The same over 16 k: mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32, for blocks with one scale per 16 elements.
// Its fragments are the first halves of m16n8k32's: a[0] = A[g][4t .. 4t+3], a[1] = A[g+8][4t ..], b = B[4t ..][g],
// c / d as above. So a k = 32 tile's fragments a[0], a[1], b[0] feed one of these for k 0..15, a[2], a[3], b[1]
// another for k 16..31.
__device__ __forceinline__ void mma_s8_m16n8k16(int (&d)[4], const uint32_t (&a)[2], uint32_t b, const int (&c)[4]) {
#if !defined(__CUDACC__)
    tandem_emu_mma_s8_m16n8k16(d, a, b, c);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %8, %9, %10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(b), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
#else
    __trap();
#endif
}

// ---- programmatic dependent launch --------------------------------------------------------------------------------
// On a stream made with stream_create(true) (sm_90 and later), launch_kernel lets each kernel start while the one
// before it is still running: its blocks are scheduled onto SMs the earlier kernel's tail leaves idle, so the launch
// latency and the ramp-up hide behind that tail. Every kernel therefore calls wait_for_inputs() before it reads or
// writes memory another kernel may touch: it waits until the kernels before it have finished and their writes are
// visible (griddepcontrol.wait; at once when the launch did not overlap), then lets the next kernel start launching
// (griddepcontrol.launch_dependents), so that no more than two kernels overlap. Before the call a kernel may only
// read memory no kernel writes (weights). Elsewhere (older architectures, the host pass) both are no-ops; the
// emulation checks that every thread of a programmatic launch called it.
__device__ __forceinline__ void wait_for_inputs() {
#if !defined(__CUDACC__) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900)
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
#endif
}

inline void require(bool ok, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("tandem::cuda: ") + what);
}

#if defined(__CUDACC__)
// cudaLaunchKernelEx with one launch attribute; a failure is returned (and cleared from the runtime's last error).
template <class... P, class... A>
cudaError_t launch_with_attribute(void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes, Stream stream,
                                  cudaLaunchAttribute attribute, A&&... args) {
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared_bytes;
    config.stream = static_cast<cudaStream_t>(stream);
    config.attrs = &attribute;
    config.numAttrs = 1;
    const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<A>(args)...);
    if (err != cudaSuccess) (void)cudaGetLastError();
    return err;
}
#endif

template <class... P, class... A>
void launch_kernel(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes, Stream stream,
                   A&&... args) {
#if defined(__CUDACC__)
    cudaError_t err = cudaSuccess;
    if (stream_overlaps_launches(stream)) {
        cudaLaunchAttribute overlap{};
        overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        overlap.val.programmaticStreamSerializationAllowed = 1;
        err = launch_with_attribute(kernel, grid, block, shared_bytes, stream, overlap, std::forward<A>(args)...);
    } else {
        kernel<<<grid, block, shared_bytes, static_cast<cudaStream_t>(stream)>>>(std::forward<A>(args)...);
        err = cudaGetLastError();
    }
    if (err != cudaSuccess)
        throw std::runtime_error(std::string("tandem::cuda: launch of ") + name + " failed: " + cudaGetErrorString(err));
#else
    // The stream decides whether the launch runs now or is recorded into the graph it is capturing.
    ::tandem::emu::launch_on(stream, name, kernel, grid, block, shared_bytes, std::forward<A>(args)...);
#endif
}

// A launch whose blocks are all resident at once (cudaLaunchAttributeCooperative), so its threads may meet in
// tandem_grid_sync(): one launch for work in phases that each need the whole previous phase, with no launch between
// them. The grid must fit the device at once: at most cooperative_max_blocks(kernel, threads, shared_bytes) blocks
// (device.h), else the launch fails (cudaErrorCooperativeLaunchTooLarge). It does not overlap the kernel before it
// (no programmatic launch attribute): wait_for_inputs() returns at once in it.
template <class... P, class... A>
void launch_cooperative_kernel(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared_bytes,
                               Stream stream, A&&... args) {
#if defined(__CUDACC__)
    cudaLaunchAttribute cooperative{};
    cooperative.id = cudaLaunchAttributeCooperative;
    cooperative.val.cooperative = 1;
    const cudaError_t err =
        launch_with_attribute(kernel, grid, block, shared_bytes, stream, cooperative, std::forward<A>(args)...);
    if (err != cudaSuccess)
        throw std::runtime_error(std::string("tandem::cuda: cooperative launch of ") + name +
                                 " failed: " + cudaGetErrorString(err));
#else
    ::tandem::emu::launch_cooperative_on(stream, name, kernel, grid, block, shared_bytes, std::forward<A>(args)...);
#endif
}

}  // namespace tandem::cuda::detail
