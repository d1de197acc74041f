// The two paths of test_paths.h, from the compile definitions CMakeLists.txt gives this file alone.
#include "test_paths.h"

namespace tandem::test {

const char* test_data_dir() { return TANDEM_TEST_DATA_PATH; }
const char* build_dir() { return TANDEM_BUILD_DIR_PATH; }

}  // namespace tandem::test
