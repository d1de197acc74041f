// What every fuzz target in tests/fuzz/ provides besides libFuzzer's entry point: seed inputs, written by
// `replay --write-seeds DIR` into a fresh corpus (scripts/fuzz) and run by the replay build as a test.
//
// A target is one .cpp file defining LLVMFuzzerTestOneInput (which must return 0 and may only let tandem::Error
// escape as an expected outcome, caught inside) and fuzz_seeds(). Built two ways from the same file: with clang's
// -fsanitize=fuzzer for a campaign (scripts/fuzz, CMake option TANDEM_FUZZ), and always, with replay_main.cpp,
// into `fuzz-replay-NAME`, which ctest runs over the seeds and the committed inputs in tests/fuzz/corpus/NAME/
// (each a case a campaign found, kept so it stays fixed), under the sanitizer build in CI too.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "test_paths.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace tandem::fuzz {

// (file name, bytes) of inputs that reach deep into the target, for a campaign's starting corpus.
std::vector<std::pair<std::string, std::string>> fuzz_seeds();

// Where the test data lives (tests/data; the path comes from test_paths.cpp).
inline std::string data_dir() { return TANDEM_TEST_DATA; }

// A property the target checks failed: prints `what` on stderr and aborts, which libFuzzer reports as a crash
// with the input that caused it.
[[noreturn]] inline void fail(const std::string& what) {
    std::fprintf(stderr, "fuzz: property failed: %s\n", what.c_str());
    std::fflush(stderr);
    std::abort();
}

// A whole file's bytes; a file that cannot be read fails the run (a seed's data file, a replayed input).
inline std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot read " + path);
    return std::string(std::istreambuf_iterator<char>(in), {});
}

// The input as a file without touching the disk, for the readers that take a path: an anonymous memory file,
// named through /proc.
class MemoryFile {
public:
    MemoryFile(const uint8_t* data, size_t size) : fd_(memfd_create("fuzz-input", 0)) {
        if (fd_ < 0) fail("memfd_create failed");
        for (size_t done = 0; done < size;) {
            const ssize_t n = write(fd_, data + done, size - done);
            if (n <= 0) fail("write to the memory file failed");
            done += static_cast<size_t>(n);
        }
    }
    ~MemoryFile() { close(fd_); }
    MemoryFile(const MemoryFile&) = delete;
    MemoryFile& operator=(const MemoryFile&) = delete;
    std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

private:
    int fd_;
};

}  // namespace tandem::fuzz
