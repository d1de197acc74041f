// The CUDA routes a benchmark may force (tandem-bench --cuda-route NAME=VALUE): each overrides one route a GPU
// measurement chose as the default (docs/cuda-backend.md, "Routes chosen"), so that the next measurement can compare
// them. tandem itself always runs the defaults.
#pragma once
#include <string>
#include <vector>

#include "cuda/cuda_options.h"

namespace tandem {

struct CudaSwitches {
    // CudaOptions' defaults with the routes that apply to every backend: graphs, matvec, int8, fused-matvecs,
    // gate-up-q8, qkv-rope, qkv-pairs, matvec-norm, one-launch-picks, gemm, pdl.
    CudaOptions common;
    bool stream_priority = true;          // stream-priority=1|0: the target's stream first
    bool persistent_step_draft = false;   // persistent-step=off|draft|all: draft or all
    bool persistent_step_target = false;  //   ... all

    // CudaOptions for a target's backend or a draft's (`draft`): the stream priority goes to the target, the
    // persistent step where the switch names the role.
    CudaOptions options(bool draft) const;
};

// The names and values --cuda-route takes, one "NAME=VALUE" line each, for --help and errors.
std::string cuda_route_help();

// Parses "NAME=VALUE" items (later ones win). Throws Error naming the item for an unknown name or a value the
// route does not take: a typo (matvec=splt) must never measure the default under another route's label.
CudaSwitches parse_cuda_routes(const std::vector<std::string>& routes);

}  // namespace tandem
