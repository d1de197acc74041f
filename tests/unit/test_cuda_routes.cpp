// tandem-bench's --cuda-route switches (app/cuda_routes.h): the defaults, what each route sets, and the errors for
// an unknown name or value.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "app/cuda_routes.h"
#include "error.h"

using namespace tandem;

namespace {

CudaOptions routed(const std::string& item, bool draft = false) { return parse_cuda_routes({item}).options(draft); }

// The error message of parsing `items`, "" when they parse.
std::string route_error(const std::vector<std::string>& items) {
    try {
        parse_cuda_routes(items);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("cuda routes: none given are CudaOptions' defaults, for a target and a draft") {
    const CudaSwitches s = parse_cuda_routes({});
    for (const bool draft : {false, true}) {
        CAPTURE(draft);
        const CudaOptions o = s.options(draft), d;
        CHECK(o.graphs == d.graphs);
        CHECK(o.matvec_loads == d.matvec_loads);
        CHECK(o.fused_matvecs == d.fused_matvecs);
        CHECK(o.gate_up_quantizes == d.gate_up_quantizes);
        CHECK(o.qkv_rope == d.qkv_rope);
        CHECK(o.qkv_type_pairs == d.qkv_type_pairs);
        CHECK(o.matvec_norm == d.matvec_norm);
        CHECK(o.one_launch_picks == d.one_launch_picks);
        CHECK(o.int8_activations == d.int8_activations);
        CHECK(o.int8_gemm == d.int8_gemm);
        CHECK(o.simt_gemm == d.simt_gemm);
        CHECK(o.overlap_launches == d.overlap_launches);
        CHECK_FALSE(o.persistent_step);
        // The target's stream goes first (a draft on the same device drafts ahead while it verifies).
        CHECK(o.high_priority == !draft);
    }
}

TEST_CASE("cuda routes: each route sets its option") {
    CHECK_FALSE(routed("graphs=0").graphs);
    CHECK(routed("graphs=1").graphs);
    CHECK_FALSE(routed("matvec=auto").matvec_loads.has_value());
    CHECK(routed("matvec=direct").matvec_loads == cuda::MatvecLoads::Direct);
    CHECK(routed("matvec=staged").matvec_loads == cuda::MatvecLoads::Staged);
    CHECK(routed("matvec=split").matvec_loads == cuda::MatvecLoads::Split);
    CHECK(routed("matvec=persistent").matvec_loads == cuda::MatvecLoads::Persistent);
    CHECK_FALSE(routed("fused-matvecs=0").fused_matvecs);
    CHECK_FALSE(routed("gate-up-q8=0").gate_up_quantizes);
    CHECK_FALSE(routed("qkv-rope=0").qkv_rope);
    CHECK_FALSE(routed("qkv-pairs=0").qkv_type_pairs);
    CHECK_FALSE(routed("matvec-norm=0").matvec_norm);
    CHECK_FALSE(routed("one-launch-picks=0").one_launch_picks);
    CHECK(routed("int8=1").int8_activations == true);
    CHECK(routed("int8=0").int8_activations == false);
    CHECK_FALSE(routed("int8=auto").int8_activations.has_value());
    CHECK(routed("gemm=int8").int8_gemm);
    CHECK_FALSE(routed("gemm=int8").simt_gemm);
    CHECK_FALSE(routed("gemm=simt").int8_gemm);
    CHECK(routed("gemm=simt").simt_gemm);
    CHECK_FALSE(routed("gemm=cublas").simt_gemm);
    CHECK_FALSE(routed("pdl=0").overlap_launches);
    CHECK_FALSE(routed("stream-priority=0").high_priority);
    // Several routes at once; a later item wins.
    const CudaOptions both = parse_cuda_routes({"int8=1", "matvec=split", "matvec=staged"}).options(false);
    CHECK(both.int8_activations == true);
    CHECK(both.matvec_loads == cuda::MatvecLoads::Staged);
}

TEST_CASE("cuda routes: persistent-step turns the persistent step on for a draft or for every backend") {
    CHECK_FALSE(routed("persistent-step=off", true).persistent_step);
    CHECK(routed("persistent-step=draft", true).persistent_step);
    CHECK_FALSE(routed("persistent-step=draft", false).persistent_step);
    CHECK(routed("persistent-step=all", true).persistent_step);
    CHECK(routed("persistent-step=all", false).persistent_step);
}

TEST_CASE("cuda routes: an unknown name or value is an error naming the item and what it takes") {
    CHECK(route_error({"matvec=splt"}) == "--cuda-route matvec=splt: expected matvec=auto, direct, staged, split or persistent");
    CHECK(route_error({"gemm=cuBLAS"}) == "--cuda-route gemm=cuBLAS: expected gemm=cublas, int8 or simt");
    CHECK(route_error({"graphs=off"}) == "--cuda-route graphs=off: expected graphs=1 or 0");
    CHECK(route_error({"graphs="}) == "--cuda-route graphs=: expected graphs=1 or 0");
    CHECK(route_error({"graphs"}) == "--cuda-route graphs: expected graphs=1 or 0");
    CHECK(route_error({"persistent-step=on"}) == "--cuda-route persistent-step=on: expected persistent-step=off, draft or all");
    const std::string unknown = route_error({"int8=1", "graph=0"});
    CHECK(unknown.rfind("--cuda-route graph=0: no route 'graph' (routes: graphs, matvec, ", 0) == 0);
}

TEST_CASE("cuda routes: every route the help lists parses with each value it names") {
    const std::string help = cuda_route_help();
    CHECK(help.find("persistent-step=off, draft or all (default off)\n") != std::string::npos);
    CHECK(help.find("matvec=auto, direct, staged, split or persistent (default auto)\n") != std::string::npos);
    int routes = 0, values = 0;
    for (size_t begin = 0, end; (end = help.find('\n', begin)) != std::string::npos; begin = end + 1) {
        const std::string line = help.substr(begin, end - begin);
        const size_t eq = line.find('='), paren = line.find(" (default ");
        REQUIRE(eq != std::string::npos);
        REQUIRE(paren != std::string::npos);
        const std::string name = line.substr(0, eq);
        std::string list = line.substr(eq + 1, paren - eq - 1) + ", ";
        if (const size_t at = list.rfind(" or "); at != std::string::npos) list.replace(at, 4, ", ");
        for (size_t b = 0, e; (e = list.find(", ", b)) != std::string::npos; b = e + 2) {
            CAPTURE(line);
            CHECK(route_error({name + "=" + list.substr(b, e - b)}).empty());
            ++values;
        }
        ++routes;
    }
    CHECK(routes == 13);
    CHECK(values == 2 * 9 + 5 + 3 + 3 + 3);  // nine on/off routes; matvec, int8, gemm, persistent-step
}
