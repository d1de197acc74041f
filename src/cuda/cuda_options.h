// What a CudaBackend may be told to do (CudaOptions) and the route each weight type's matvecs take (the measured
// defaults and their overrides). A benchmark forces another route with tandem-bench --cuda-route
// (app/cuda_routes.h); tandem runs the defaults.
#pragma once
#include <optional>
#include <string>

#include "device.h"
#include "gguf/ggml_types.h"

namespace tandem {

// How the decode and verification matvecs of one weight type run. One route per type for every token count, so
// that verification stays bitwise one-token decoding.
struct MatvecRoute {
    bool int8 = false;                                     // 8-bit activations (kernels.h matvec_q8), else fp32
    cuda::MatvecLoads loads = cuda::MatvecLoads::Direct;   // ignored by the float types (always direct)
    bool operator==(const MatvecRoute&) const = default;
};
// The route measured fastest for `type` on a GPU (an H200, 2026-11-27; docs/cuda-backend.md "Routes chosen"): Q4_0
// takes 8-bit activations with staged loads (decode +5.5-9.4% on a 1.1B model, +10.8-12.1% on a 6.7B one over two
// calls, and 1.7x faster 5- and 16-token verification matvecs); every other type fp32 activations with direct loads,
// which no other route beat for one token on both model sizes.
MatvecRoute measured_matvec_route(GgmlType type);
// The rest of the backend's choices.
struct CudaOptions {
    cuda::KvType kv_type = cuda::KvType::F16;  // storage of the KV cache (--kv-type; Q8_0 needs kv_dim % 32 == 0)
    bool graphs = true;  // CUDA graphs for short calls (see the file comment)
    int attention_split = 64;              // key positions per split-K split (tests make it small to move the grid)
    // Overrides of the measured per-type routes (measured_matvec_route) for every block type; nullopt keeps them.
    // Direct, staged and persistent give the same sums; split another fixed order (kernels.h).
    std::optional<cuda::MatvecLoads> matvec_loads = std::nullopt;
    // Q/K/V (with their biases) in one launch and gate/up with SwiGLU in another where their types match (4 kernels
    // fewer per layer, 7 for qwen2), and with int8_activations the norms quantize their output for the matvecs that
    // read it (3 quantize launches fewer); false launches them one by one (the same bits; tests compare the two).
    bool fused_matvecs = true;
    // With fused_matvecs and ffn_down on the 8-bit route (Q8_1), the gate/up launch's last blocks quantize its
    // output (staged and persistent loads; kernels.h SwigluQuant); false: a quantize launch after it. The same
    // bytes; on by default, one launch a layer fewer (not yet measured on a GPU).
    bool gate_up_quantizes = true;
    // With fused_matvecs, the Q/K/V launch applies RoPE and writes the KV cache in its last blocks (kernels.h
    // matvec_qkv_rope: direct, staged and split loads, the angles tabled once a step); false: a rope_kv_write launch
    // after it. The same bits; on by default, one launch a layer fewer (not yet measured on a GPU).
    bool qkv_rope = true;
    // With fused_matvecs, Q/K/V of two types in one launch where kernels.h matvec_types_fuse takes the pair and the
    // two types share a route (llama.cpp's Q4_K_M gives attn_v Q6_K beside Q4_K, or Q8_0 beside Q5_0, in half the
    // layers; the default models' too), with RoPE in it as for one type; false: a launch per type (Q and K, then V)
    // and RoPE's own launch in those layers. The same bits; on by default, three launches fewer in each such layer
    // (not yet measured on a GPU).
    bool qkv_type_pairs = true;
    // With fused_matvecs, a one-token step's attn_output and ffn_down launches add their output into the residual
    // stream and apply the RMSNorm that follows in their last block (kernels.h matvec_add_rms_norm); false, and for
    // steps of more tokens: an add_rms_norm launch after each. The same bits; on by default, two launches a layer
    // fewer in decode (not yet measured on a GPU).
    bool matvec_norm = true;
    // The greedy picks of a short step (argmax; with the draft's confidence) in one launch whose last block per row
    // combines the splits (kernels.h argmax with counters), instead of two (three). The same ids; the confidence to
    // float rounding. On by default, one or two launches a step fewer (not yet measured on a GPU).
    bool one_launch_picks = true;
    // One-token decode steps run every layer in one cooperative launch (kernels.h decode_step: the embedding, that
    // launch, the output head), where the model's shapes and types allow it, instead of ~5 launches a layer. Within
    // float rounding of the launches it replaces, not bitwise, so a target's decode steps would no longer be bitwise
    // its verification steps: tandem-bench sets it for a draft under --cuda-route persistent-step=draft
    // (or all), never by default: not yet run on a GPU. Its block types' rows are staged through
    // shared memory (kernels.h DecodeStepRows) unless matvec_loads is Direct (--cuda-route matvec=direct, to
    // measure the staging) or neither staged kernel takes every matrix's type (Q2_K, Q3_K rows); the same sums.
    bool persistent_step = false;
    // Its grid: 0 lets kernels.h decode_step_plan choose (two blocks per SM); tests vary it.
    int persistent_step_blocks = 0;
    // true: decode and verification matvecs of every block type through the 8-bit route (kernels.h matvec_q8):
    // each input quantized once per matvec launch, as the CPU backend does; false: fp32 activations; nullopt: each
    // type's measured route. Not bitwise the same, but within float rounding of the CPU backend's integer products.
    std::optional<bool> int8_activations = std::nullopt;
    // Programmatic dependent launch on sm_90 and later (kernels/device.h stream_create): each kernel of a step is
    // scheduled while the one before it finishes and waits on the device for its inputs, which hides launch latency
    // and ramp-up, and lets the staged matvec request its first weights early. The same bits either way; ignored
    // on older devices. On by default: on an H200 (2026-11-27, tg128, two alternating runs each) decode gained 1-3%
    // on Q4_K / Q8_0 models and 8-11% on Q4_0 ones, whose staged matvecs load before they wait.
    bool overlap_launches = true;
    // Prefill chunks multiply the types of kernels.h gemm_q8 (every quantized type: Q8_0, Q4_0/1, Q5_0/1,
    // Q2_K..Q6_K) on int8 tensor cores, x quantized once per input to Q8_1 (llama.cpp's MMQ idea), instead of
    // dequantizing W to fp16 for cuBLAS (or the SIMT GEMM); F32 / F16 / BF16 keep that route. Within float
    // rounding of the CPU backend's integer products, not bitwise the fp16 route. Ignored before sm_80 (no int8
    // mma.sync).
    bool int8_gemm = false;
    // The backend's stream at the device's greatest priority (kernels/device.h stream_create): where another
    // stream's blocks also wait for SMs, this one's are scheduled first. For a target beside a draft on the same
    // device, which drafts ahead while the target verifies (SpeculativeParams::draft_ahead): the verification is
    // what the round waits for, the draft's steps a guess that only uses what the target leaves idle. The same bits
    // either way; tandem and tandem-bench set it for the target (not yet measured on a GPU).
    bool high_priority = false;
    // The SIMT GEMM for prefill instead of cuBLAS (--cuda-route gemm=simt, to measure it; CudaBackend::use_blas).
    bool simt_gemm = false;

    // The route of `type`'s matvecs: the measured one with the overrides above applied.
    MatvecRoute matvec_route(GgmlType type) const;
};

// The block types' matvec routes in words, for -v: the route most of them take, then the others', e.g. "fp32
// activations, direct loads (q4_0: 8-bit activations, staged loads)".
std::string describe_matvec_routes(const CudaOptions& options);

}  // namespace tandem
