// tandem-bench's --cuda-route switches (cuda_routes.h): one table of names, values and what each sets.
#include "app/cuda_routes.h"

#include <string_view>

#include "error.h"

namespace tandem {

namespace {

struct Route {
    const char* name;
    std::vector<std::string> values;  // values[0] is the default
    void (*apply)(CudaSwitches& s, size_t value);
};

// "1|0" routes: on by default.
Route on_off(const char* name, void (*apply)(CudaSwitches&, size_t)) { return {name, {"1", "0"}, apply}; }

const std::vector<Route>& routes() {
    static const std::vector<Route> table = [] {
        std::vector<std::string> loads = {"auto"};
        for (cuda::MatvecLoads l : cuda::kAllMatvecLoads) loads.emplace_back(cuda::matvec_loads_name(l));
        return std::vector<Route>{
            on_off("graphs", [](CudaSwitches& s, size_t v) { s.common.graphs = v == 0; }),
            {"matvec", loads,
             [](CudaSwitches& s, size_t v) {
                 s.common.matvec_loads = v == 0 ? std::nullopt : std::optional(cuda::kAllMatvecLoads[v - 1]);
             }},
            {"int8",
             {"auto", "0", "1"},
             [](CudaSwitches& s, size_t v) {
                 s.common.int8_activations = v == 0 ? std::nullopt : std::optional(v == 2);
             }},
            on_off("fused-matvecs", [](CudaSwitches& s, size_t v) { s.common.fused_matvecs = v == 0; }),
            on_off("gate-up-q8", [](CudaSwitches& s, size_t v) { s.common.gate_up_quantizes = v == 0; }),
            on_off("qkv-rope", [](CudaSwitches& s, size_t v) { s.common.qkv_rope = v == 0; }),
            on_off("qkv-pairs", [](CudaSwitches& s, size_t v) { s.common.qkv_type_pairs = v == 0; }),
            on_off("matvec-norm", [](CudaSwitches& s, size_t v) { s.common.matvec_norm = v == 0; }),
            on_off("one-launch-picks", [](CudaSwitches& s, size_t v) { s.common.one_launch_picks = v == 0; }),
            {"gemm",
             {"cublas", "int8", "simt"},
             [](CudaSwitches& s, size_t v) {
                 s.common.int8_gemm = v == 1;
                 s.common.simt_gemm = v == 2;
             }},
            on_off("pdl", [](CudaSwitches& s, size_t v) { s.common.overlap_launches = v == 0; }),
            on_off("stream-priority", [](CudaSwitches& s, size_t v) { s.stream_priority = v == 0; }),
            {"persistent-step",
             {"off", "draft", "all"},
             [](CudaSwitches& s, size_t v) {
                 s.persistent_step_draft = v >= 1;
                 s.persistent_step_target = v == 2;
             }},
        };
    }();
    return table;
}

// "a, b or c".
std::string one_of(const std::vector<std::string>& values) {
    std::string s;
    for (size_t i = 0; i < values.size(); ++i) s += (i == 0 ? "" : i + 1 == values.size() ? " or " : ", ") + values[i];
    return s;
}

}  // namespace

CudaOptions CudaSwitches::options(bool draft) const {
    CudaOptions o = common;
    // The target's stream goes first where a draft on the same device drafts ahead while it verifies.
    o.high_priority = !draft && stream_priority;
    o.persistent_step = draft ? persistent_step_draft : persistent_step_target;
    return o;
}

std::string cuda_route_help() {
    std::string s;
    for (const Route& r : routes())
        s += std::string(r.name) + "=" + one_of(r.values) + " (default " + r.values[0] + ")\n";
    return s;
}

CudaSwitches parse_cuda_routes(const std::vector<std::string>& items) {
    CudaSwitches s;
    for (const std::string& item : items) {
        const size_t eq = item.find('=');
        const std::string name = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
        const Route* route = nullptr;
        for (const Route& r : routes())
            if (name == r.name) route = &r;
        if (!route) {
            std::vector<std::string> names;
            for (const Route& r : routes()) names.emplace_back(r.name);
            throw Error("--cuda-route " + item + ": no route '" + name + "' (routes: " + one_of(names) + ")");
        }
        size_t index = 0;
        while (index < route->values.size() && route->values[index] != value) ++index;
        if (index == route->values.size())
            throw Error("--cuda-route " + item + ": expected " + name + "=" + one_of(route->values));
        route->apply(s, index);
    }
    return s;
}

}  // namespace tandem
