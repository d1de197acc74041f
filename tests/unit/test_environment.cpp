// The environment of tandem's programs (app/environment.h): every variable read through a table, the path rules and
// the CPU dispatch choices they set.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "app/environment.h"
#include "cpu/dispatch.h"
#include "error.h"

using namespace tandem;

namespace {

// Environment::read over a table: the variables given, no others.
Environment read(const std::map<std::string, std::string>& vars) {
    return Environment::read([&](const char* name) -> const char* {
        const auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
    });
}

}  // namespace

TEST_CASE("environment: models_dir follows TANDEM_MODELS_DIR, then XDG_CACHE_HOME, then HOME") {
    CHECK(read({{"TANDEM_MODELS_DIR", "/x/models"}, {"XDG_CACHE_HOME", "/y"}}).models_dir == "/x/models");
    // An empty variable counts as unset, as in the shell.
    CHECK(read({{"TANDEM_MODELS_DIR", ""}, {"XDG_CACHE_HOME", "/y"}}).models_dir == "/y/tandem/models");
    const Environment home = read({{"HOME", "/home/u"}});
    CHECK(home.models_dir == "/home/u/.cache/tandem/models");
    CHECK(home.cache_root == "/home/u/.cache/tandem");
    CHECK(home.home == "/home/u");
    CHECK_FALSE(read({}).home.empty());  // no HOME: the passwd entry's directory
}

TEST_CASE("environment: the repacked-weights cache is under the cache root unless TANDEM_REPACK_CACHE moves it or turns it off") {
    CHECK(read({{"XDG_CACHE_HOME", "/c"}}).repack_cache_dir == "/c/tandem/repacked");
    CHECK(read({{"XDG_CACHE_HOME", "/c"}, {"TANDEM_REPACK_CACHE", "/r"}}).repack_cache_dir == "/r");
    for (const char* off : {"", "0", "off"}) {
        CAPTURE(std::string(off));
        CHECK(read({{"XDG_CACHE_HOME", "/c"}, {"TANDEM_REPACK_CACHE", off}}).repack_cache_dir.empty());
    }
}

TEST_CASE("environment: the prompt cache is under the cache root unless TANDEM_PROMPT_CACHE moves it or turns it off") {
    CHECK(read({{"XDG_CACHE_HOME", "/c"}}).prompt_cache_dir == "/c/tandem/prompts");
    CHECK(read({{"HOME", "/h"}}).prompt_cache_dir == "/h/.cache/tandem/prompts");
    CHECK(read({{"XDG_CACHE_HOME", "/c"}, {"TANDEM_PROMPT_CACHE", "/p"}}).prompt_cache_dir == "/p");
    for (const char* off : {"", "0", "off"}) {
        CAPTURE(std::string(off));
        CHECK(read({{"XDG_CACHE_HOME", "/c"}, {"TANDEM_PROMPT_CACHE", off}}).prompt_cache_dir.empty());
    }
}

TEST_CASE("environment: the REPL's history follows XDG_STATE_HOME, then HOME") {
    CHECK(read({{"XDG_STATE_HOME", "/s"}, {"HOME", "/h"}}).history_path == "/s/tandem/history");
    CHECK(read({{"HOME", "/h"}}).history_path == "/h/.local/state/tandem/history");
}

TEST_CASE("environment: TANDEM_NO_REPACK=1 and TANDEM_NO_AVX512=1 turn the CPU paths off, any other value leaves them") {
    CHECK(read({}).repack);
    CHECK(read({}).avx512);
    CHECK_FALSE(read({{"TANDEM_NO_REPACK", "1"}}).repack);
    CHECK_FALSE(read({{"TANDEM_NO_AVX512", "1"}}).avx512);
    CHECK(read({{"TANDEM_NO_REPACK", "0"}}).repack);
    CHECK(read({{"TANDEM_NO_AVX512", ""}}).avx512);
}

TEST_CASE("environment: a variable earlier versions read is named with what replaced it") {
    CHECK(read({}).retired.empty());
    CHECK(read({{"TANDEM_CUDA_MATVEC", ""}}).retired.empty());  // empty is unset
    const Environment e = read({{"TANDEM_CUDA_MATVEC", "split"}, {"TANDEM_CUDA_ONE_LAUNCH_PICKS", "0"},
                                {"TANDEM_SPEC_TRACE", "1"}, {"TANDEM_NO_AVX512", "1"}});
    REQUIRE(e.retired.size() == 3);
    CHECK(e.retired[0] == "TANDEM_CUDA_MATVEC is no longer read: tandem-bench --cuda-route matvec=VALUE forces that "
                          "route");
    CHECK(e.retired[1].find("--cuda-route one-launch-picks=VALUE") != std::string::npos);
    CHECK(e.retired[2].find("--spec-trace") != std::string::npos);
}

TEST_CASE("environment: the CPU dispatch choices are fixed once a kernel table is built") {
    // The test process's kernels have run (or will) with the defaults: setting them again is fine, changing not.
    const cpu::CpuDispatch now = cpu::dispatch();
    CHECK_NOTHROW(cpu::configure_dispatch(now));
    CHECK_THROWS_AS(cpu::configure_dispatch({.avx512 = !now.avx512, .repack = now.repack}), Error);
    CHECK_THROWS_AS(cpu::configure_dispatch({.avx512 = now.avx512, .repack = !now.repack}), Error);
}
