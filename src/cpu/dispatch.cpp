// The process-wide CPU kernel choices (dispatch.h).
#include "cpu/dispatch.h"

#include <mutex>

#include "error.h"

namespace tandem::cpu {

namespace {

// The one process-wide state of the CPU backend: what the CPU offers is process-wide too.
std::mutex g_mutex;
CpuDispatch g_choices;
bool g_fixed = false;

}  // namespace

void configure_dispatch(const CpuDispatch& choices) {
    std::lock_guard lock(g_mutex);
    if (g_fixed && (choices.avx512 != g_choices.avx512 || choices.repack != g_choices.repack))
        throw Error("the CPU kernel choices (AVX-512, repacking) are fixed once a kernel has run");
    g_choices = choices;
}

const CpuDispatch& dispatch() {
    std::lock_guard lock(g_mutex);
    g_fixed = true;
    return g_choices;
}

}  // namespace tandem::cpu
