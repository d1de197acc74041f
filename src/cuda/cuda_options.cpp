// CudaOptions' matvec routes and the TANDEM_CUDA_* switches (cuda_options.h).
#include "cuda/cuda_options.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <string_view>
#include <vector>

#include "error.h"

namespace tandem {

namespace {

// The value of a TANDEM_CUDA_* switch as its index in `values`; unset or empty is values[0], the default. Any other
// value is an error naming the variable and what it takes: a typo (TANDEM_CUDA_MATVEC=splt) must not quietly run
// the default route under a benchmark row that names another.
size_t env_switch(const char* name, const std::vector<std::string_view>& values) {
    const char* env = std::getenv(name);
    const std::string_view value = env ? env : "";
    if (value.empty()) return 0;
    std::string accepted;
    size_t index = 0;
    for (std::string_view v : values) {
        if (v == value) return index;
        accepted += std::string(index == 0 ? "" : index + 1 == values.size() ? " or " : ", ") + std::string(v);
        ++index;
    }
    throw Error(std::string(name) + "=" + std::string(value) + ": expected " + accepted);
}

}  // namespace

bool cuda_graphs_from_env() { return env_switch("TANDEM_CUDA_GRAPHS", {"1", "0"}) == 0; }

std::optional<cuda::MatvecLoads> cuda_matvec_loads_from_env() {
    std::vector<std::string_view> values = {"auto"};
    for (cuda::MatvecLoads loads : cuda::kAllMatvecLoads) values.push_back(cuda::matvec_loads_name(loads));
    const size_t i = env_switch("TANDEM_CUDA_MATVEC", values);
    if (i == 0) return std::nullopt;
    return cuda::kAllMatvecLoads[i - 1];
}

bool cuda_fused_matvecs_from_env() { return env_switch("TANDEM_CUDA_FUSED_MATVECS", {"1", "0"}) == 0; }

bool cuda_gate_up_q8_from_env() { return env_switch("TANDEM_CUDA_GATE_UP_Q8", {"1", "0"}) == 0; }

std::optional<bool> cuda_int8_activations_from_env() {
    const size_t i = env_switch("TANDEM_CUDA_INT8", {"auto", "0", "1"});
    if (i == 0) return std::nullopt;
    return i == 2;
}

MatvecRoute measured_matvec_route(GgmlType type) {
    if (type == GgmlType::Q4_0) return {true, cuda::MatvecLoads::Staged};
    return {};
}

MatvecRoute CudaOptions::matvec_route(GgmlType type) const {
    MatvecRoute route = measured_matvec_route(type);
    if (int8_activations) route.int8 = *int8_activations;
    if (matvec_loads) route.loads = *matvec_loads;
    return route;
}

std::string describe_matvec_routes(const CudaOptions& options) {
    constexpr GgmlType kBlockTypes[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                        GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,
                                        GgmlType::Q5_K, GgmlType::Q6_K};
    constexpr size_t kN = std::size(kBlockTypes);
    MatvecRoute routes[kN];
    for (size_t i = 0; i < kN; ++i) routes[i] = options.matvec_route(kBlockTypes[i]);
    // The route most block types take, then the types that take another.
    const MatvecRoute common = *std::max_element(routes, routes + kN, [&](MatvecRoute a, MatvecRoute b) {
        return std::count(routes, routes + kN, a) < std::count(routes, routes + kN, b);
    });
    const auto words = [](MatvecRoute r) {
        return std::string(r.int8 ? "8-bit" : "fp32") + " activations, " + cuda::matvec_loads_name(r.loads) +
               " loads";
    };
    std::string exceptions;
    for (size_t i = 0; i < kN; ++i)
        if (!(routes[i] == common))
            exceptions += std::string(exceptions.empty() ? "" : "; ") + ggml_type_name(kBlockTypes[i]) + ": " +
                          words(routes[i]);
    return words(common) + (exceptions.empty() ? "" : " (" + exceptions + ")");
}

// TANDEM_CUDA_GEMM picks one of three prefill routes; the two functions below each ask about one of them.
const std::vector<std::string_view> kGemmRoutes = {"cublas", "int8", "simt"};

bool cuda_int8_gemm_from_env() { return env_switch("TANDEM_CUDA_GEMM", kGemmRoutes) == 1; }

bool cuda_simt_gemm_from_env() { return env_switch("TANDEM_CUDA_GEMM", kGemmRoutes) == 2; }

bool cuda_qkv_type_pairs_from_env() { return env_switch("TANDEM_CUDA_QKV_PAIRS", {"1", "0"}) == 0; }

bool cuda_qkv_rope_from_env() { return env_switch("TANDEM_CUDA_QKV_ROPE", {"1", "0"}) == 0; }

bool cuda_matvec_norm_from_env() { return env_switch("TANDEM_CUDA_MATVEC_NORM", {"1", "0"}) == 0; }

bool cuda_persistent_step_from_env(bool draft) {
    const size_t choice = env_switch("TANDEM_CUDA_PERSISTENT_STEP", {"off", "draft", "all"});
    return choice == 2 || (choice == 1 && draft);
}

bool cuda_one_launch_picks_from_env() { return env_switch("TANDEM_CUDA_ONE_LAUNCH_PICKS", {"1", "0"}) == 0; }

bool cuda_overlap_launches_from_env() { return env_switch("TANDEM_CUDA_PDL", {"1", "0"}) == 0; }

bool cuda_stream_priority_from_env() { return env_switch("TANDEM_CUDA_STREAM_PRIORITY", {"1", "0"}) == 0; }

}  // namespace tandem
