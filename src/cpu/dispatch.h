// Process-wide choices of the CPU kernels (which instruction set, whether matrices are repacked), fixed before the
// first kernel runs: the kernel tables are built once per process from them. A program sets them from its
// environment at start (app/environment.cpp: TANDEM_NO_AVX512, TANDEM_NO_REPACK); left alone, every path the CPU
// has is used.
#pragma once

namespace tandem::cpu {

struct CpuDispatch {
    bool avx512 = true;  // the AVX-512 kernels where the CPU has them (false: the AVX2 ones, to compare the two)
    bool repack = true;  // repacked copies of the matrices that have a repacked kernel (false: the file's layout)
};

// Sets the choices. Throws Error when a kernel table was already built with other ones (a call after the first
// kernel ran could not take effect).
void configure_dispatch(const CpuDispatch& choices);
// The choices in force; the first call fixes them for the process.
const CpuDispatch& dispatch();

}  // namespace tandem::cpu
