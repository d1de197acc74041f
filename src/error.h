// The one exception type for errors a user can cause (bad file, bad flag, unsupported model). main() catches it,
// prints its message on stderr and exits non-zero; internal invariants use assert instead.
#pragma once
#include <stdexcept>
#include <string>

namespace tandem {

struct Error : std::runtime_error {
    explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace tandem
