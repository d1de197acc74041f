// Where the tests find their fixtures and put scratch files: the source tree's tests/data and the CMake build
// directory. Only test_paths.cpp is compiled with the two absolute paths, so no other test object depends on where
// the clone lies and the compiler cache (CMakeLists.txt) serves them to another clone of the same sources.
#pragma once

namespace tandem::test {

const char* test_data_dir();  // <source>/tests/data
const char* build_dir();      // the build directory

}  // namespace tandem::test

#define TANDEM_TEST_DATA (::tandem::test::test_data_dir())
#define TANDEM_BUILD_DIR (::tandem::test::build_dir())
