// For tandem_cuda_device_tests only (the test sources built against the real GPU kernels): the emulation's launch
// options, which a real device has no use for, as no-ops, so that tests written for both compile unchanged.
#pragma once
#include <cstdint>

namespace tandem::emu {

enum class ThreadOrder { Forward, Reverse, Shuffled };
struct LaunchOptions {
    ThreadOrder order = ThreadOrder::Forward;
    uint64_t seed = 0;
};
class ScopedLaunchOptions {
public:
    explicit ScopedLaunchOptions(LaunchOptions) {}
};

}  // namespace tandem::emu
