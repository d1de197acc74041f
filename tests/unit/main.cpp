// The doctest entry point for tandem_tests: the one translation unit that defines main(); every other file in
// tests/unit/ only registers TEST_CASEs.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
