// CudaOptions' matvec routes (cuda_options.h).
#include "cuda/cuda_options.h"

#include <algorithm>
#include <iterator>

#include "error.h"

namespace tandem {

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

}  // namespace tandem
