// Reads and parses every environment variable of tandem's programs (environment.h); the only getenv calls there are.
#include "app/environment.h"

#include <pwd.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <string_view>

#include "cpu/dispatch.h"

namespace tandem {

namespace {

// A variable's value; unset and empty are both "".
std::string value_of(const EnvLookup& lookup, const char* name) {
    const char* v = lookup(name);
    return v ? std::string(v) : std::string();
}

std::string home_dir(const EnvLookup& lookup) {
    std::string home = value_of(lookup, "HOME");
    if (!home.empty()) return home;
    // No $HOME (a service, a stripped environment): the passwd entry is what the shell would have used.
    if (const passwd* pw = getpwuid(getuid()); pw && pw->pw_dir) return pw->pw_dir;
    return ".";
}

}  // namespace

Environment Environment::read(const EnvLookup& lookup) {
    Environment e;
    e.home = home_dir(lookup);
    std::string cache_home = value_of(lookup, "XDG_CACHE_HOME");
    if (cache_home.empty()) cache_home = e.home + "/.cache";
    e.cache_root = cache_home + "/tandem";
    e.models_dir = value_of(lookup, "TANDEM_MODELS_DIR");
    if (e.models_dir.empty()) e.models_dir = e.cache_root + "/models";
    // TANDEM_REPACK_CACHE: set but empty, "0" or "off" turns the cache off; unset keeps the default directory.
    if (const char* v = lookup("TANDEM_REPACK_CACHE")) {
        const std::string_view s(v);
        e.repack_cache_dir = s.empty() || s == "0" || s == "off" ? std::string() : std::string(s);
    } else {
        e.repack_cache_dir = e.cache_root + "/repacked";
    }
    // TANDEM_PROMPT_CACHE: the same rule, for the on-disk prompt cache (--prompt-cache overrides it).
    if (const char* v = lookup("TANDEM_PROMPT_CACHE")) {
        const std::string_view s(v);
        e.prompt_cache_dir = s.empty() || s == "0" || s == "off" ? std::string() : std::string(s);
    } else {
        e.prompt_cache_dir = e.cache_root + "/prompts";
    }
    const std::string state = value_of(lookup, "XDG_STATE_HOME");
    e.history_path = (state.empty() ? e.home + "/.local/state" : state) + "/tandem/history";
    e.repack = value_of(lookup, "TANDEM_NO_REPACK") != "1";
    e.avx512 = value_of(lookup, "TANDEM_NO_AVX512") != "1";
    for (const char* name :
         {"TANDEM_CUDA_GRAPHS", "TANDEM_CUDA_MATVEC", "TANDEM_CUDA_INT8", "TANDEM_CUDA_FUSED_MATVECS",
          "TANDEM_CUDA_GATE_UP_Q8", "TANDEM_CUDA_QKV_ROPE", "TANDEM_CUDA_QKV_PAIRS", "TANDEM_CUDA_MATVEC_NORM",
          "TANDEM_CUDA_ONE_LAUNCH_PICKS", "TANDEM_CUDA_GEMM", "TANDEM_CUDA_PDL", "TANDEM_CUDA_STREAM_PRIORITY",
          "TANDEM_CUDA_PERSISTENT_STEP"})
        if (!value_of(lookup, name).empty()) {
            std::string route = std::string(name).substr(std::string_view("TANDEM_CUDA_").size());
            for (char& c : route) c = c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
            e.retired.push_back(std::string(name) + " is no longer read: tandem-bench --cuda-route " + route +
                                "=VALUE forces that route");
        }
    if (!value_of(lookup, "TANDEM_SPEC_TRACE").empty())
        e.retired.push_back("TANDEM_SPEC_TRACE is no longer read: --spec-trace traces the speculative rounds");
    return e;
}

const Environment& environment() {
    static const Environment env = [] {
        Environment e = Environment::read([](const char* name) { return std::getenv(name); });
        cpu::configure_dispatch({.avx512 = e.avx512, .repack = e.repack});
        return e;
    }();
    return env;
}

}  // namespace tandem
