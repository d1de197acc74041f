// The one place tandem's programs read the process environment: every variable (docs/environment.md) parsed once
// into the plain options the libraries take. Library code never calls getenv; an executable reads the environment
// at start (environment()) and hands what it found down.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace tandem {

// How a variable is looked up: std::getenv for a program, a table in tests. nullptr = unset.
using EnvLookup = std::function<const char*(const char*)>;

struct Environment {
    std::string home;              // $HOME, else the passwd entry's directory
    std::string cache_root;        // ${XDG_CACHE_HOME:-$HOME/.cache}/tandem
    std::string models_dir;        // TANDEM_MODELS_DIR, else cache_root/models
    std::string repack_cache_dir;  // TANDEM_REPACK_CACHE (empty, 0 or off: "" = no cache), else cache_root/repacked
    std::string prompt_cache_dir;  // TANDEM_PROMPT_CACHE (empty, 0 or off: "" = no cache), else cache_root/prompts
    std::string history_path;      // ${XDG_STATE_HOME:-$HOME/.local/state}/tandem/history (the REPL's)
    bool repack = true;            // TANDEM_NO_REPACK=1: false, the CPU reads every matrix in the file's layout
    bool avx512 = true;            // TANDEM_NO_AVX512=1: false, the AVX2 kernels even where AVX-512 is there
    // Variables that earlier versions read and this one does not, set in this environment, each with what replaced
    // it ("TANDEM_CUDA_MATVEC is no longer read: tandem-bench --cuda-route matvec=VALUE"): a script that still sets
    // one would otherwise measure the default under another route's name. The programs warn; tandem-bench refuses a
    // TANDEM_CUDA_* one.
    std::vector<std::string> retired;

    // Parses the variables `lookup` finds; an empty value counts as unset, as in the shell.
    static Environment read(const EnvLookup& lookup);
};

// The process's environment, read on the first call. The first call also applies the process-wide switches (CPU
// kernel dispatch: TANDEM_NO_AVX512, TANDEM_NO_REPACK) before any kernel runs: call it at the start of main.
const Environment& environment();

}  // namespace tandem
