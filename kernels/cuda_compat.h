// The one header kernel sources include for the CUDA device API. Under nvcc it is the real one; under a host
// compiler it is tandem's CPU emulation (emu/cuda_emu.h), so every kernel also builds and runs without a GPU.
//
// Kernels must declare shared memory through the macros below: under a host compiler a plain __shared__ array
// would be one array per thread (the emulation turns it into a compile error), and the emulation needs to know
// which memory is shared to give every thread of a block the same, NaN-poisoned, array.
#pragma once

#if defined(__CUDACC__)
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// The grid-wide barrier of a cooperative launch (launch_cooperative_kernel): every thread of the grid waits here.
__device__ __forceinline__ void tandem_grid_sync() { cooperative_groups::this_grid().sync(); }

// TANDEM_SHARED(float, partial, 32) declares `__shared__ float partial[32]`.
#define TANDEM_SHARED(type, name, count) __shared__ type name[count]
// TANDEM_DYNAMIC_SHARED(float, buf) gives `float* buf` pointing at the launch's dynamic shared memory. One
// unsigned char array name for every kernel: extern __shared__ declarations of one name must agree in type.
#define TANDEM_DYNAMIC_SHARED(type, name)                                                                          \
    extern __shared__ __align__(16) unsigned char tandem_dynamic_shared_[];                                        \
    type* name = reinterpret_cast<type*>(tandem_dynamic_shared_)
#else
#include "emu/cuda_emu.h"
#endif

// fp16 storage is raw uint16_t bits everywhere (host APIs, GGUF blocks, the KV cache); these convert in registers.
__device__ __forceinline__ float tandem_half_to_float(unsigned short bits) {
    return __half2float(__ushort_as_half(bits));
}
__device__ __forceinline__ unsigned short tandem_float_to_half(float f) {
    return __half_as_ushort(__float2half_rn(f));
}
