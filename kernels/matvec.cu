// Matrix-vector products y = W x for 1..16 tokens of fp32 activations: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K weights (every type the CPU backend computes with) with the dequantization
// fused into the dot product: each type's walk over a row (a Dot, matvec_dots.cuh), run by the kernels of matvec_kernels.cuh. The
// public matvec functions also route to the 8-bit-activation Dots of matvec_q8.cu when given quantized x.
#include "matvec_dots.cuh"
#include "matvec_kernels.cuh"
#include "quantize_q8.cuh"

namespace tandem::cuda {
namespace {

using namespace matvec_detail;

// Whether segments [first, end) of the job have rows of whole 4-byte words (the Q4_K / Q5_K walks read them so).
bool rows_4_aligned(const MatvecJob& job, int first, int end) {
    bool aligned = true;
    for (const MatvecSegment* seg : {&job.seg0, &job.seg1, &job.seg2})
        if (seg - &job.seg0 >= first && seg - &job.seg0 < end) aligned = aligned && seg->row_bytes % 4 == 0;
    return aligned;
}

// Checks the shapes for `type` and launches its kernel over the job's rows.
void dispatch(GgmlType type, const MatvecJob& job, int cols, const float* x, int n_tokens, MatvecLoads loads,
              Stream stream) {
    check_job(job, cols, n_tokens);
    detail::require(reinterpret_cast<uintptr_t>(x) % 16 == 0, "matvec: W and x must be 16-byte aligned");
    check_shape(type, cols, rows_4_aligned(job, 0, job.n_seg));
    const auto blocks = [&](auto launch, const KernelNames& names) {
        launch(names, loads, job, cols, x, n_tokens, stream);
    };
    constexpr MatvecLoads kDirect = MatvecLoads::Direct;
    switch (type) {
        case GgmlType::F32:
            return launch_type<DotF32, kDirect>(direct_only("matvec_kernel<F32>"), job, cols, x, n_tokens, stream);
        case GgmlType::F16:
            return launch_type<DotF16, kDirect>(direct_only("matvec_kernel<F16>"), job, cols, x, n_tokens, stream);
        case GgmlType::BF16:
            return launch_type<DotBF16, kDirect>(direct_only("matvec_kernel<BF16>"), job, cols, x, n_tokens, stream);
        case GgmlType::Q8_0: return blocks(launch_blocks<DotQ8_0>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q8_0));
        case GgmlType::Q4_0: return blocks(launch_blocks<DotQ4_0>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q4_0));
        case GgmlType::Q4_1: return blocks(launch_blocks<DotQ4_1>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q4_1));
        case GgmlType::Q5_0: return blocks(launch_blocks<DotQ5_0>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q5_0));
        case GgmlType::Q5_1: return blocks(launch_blocks<DotQ5_1>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q5_1));
        case GgmlType::Q2_K: return blocks(launch_blocks<DotQ2_K>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q2_K));
        case GgmlType::Q3_K: return blocks(launch_blocks<DotQ3_K>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q3_K));
        case GgmlType::Q4_K: return blocks(launch_blocks<DotQ4_K>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q4_K));
        case GgmlType::Q5_K: return blocks(launch_blocks<DotQ5_K>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q5_K));
        case GgmlType::Q6_K: return blocks(launch_blocks<DotQ6_K>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q6_K));
        default: detail::require(false, "matvec: unsupported weight type");
    }
}

// A job of two types (job.b_seg: the first segment of types.last): checks both types' shapes and launches the
// pair's kernel (matvec_types_fuse lists the pairs).
void dispatch_pair(MatvecTypes types, const MatvecJob& job, int cols, const float* x, int n_tokens,
                   MatvecLoads loads, Stream stream) {
    check_job(job, cols, n_tokens);
    detail::require(reinterpret_cast<uintptr_t>(x) % 16 == 0, "matvec: W and x must be 16-byte aligned");
    check_shape(types.type, cols, rows_4_aligned(job, 0, job.b_seg));
    check_shape(types.last, cols, rows_4_aligned(job, job.b_seg, job.n_seg));
    const auto blocks = [&](auto launch, const KernelNames& names) {
        launch(names, loads, job, cols, x, n_tokens, stream);
    };
    if (types.type == GgmlType::Q4_K && types.last == GgmlType::Q6_K)
        return blocks(launch_blocks<DotPair<DotQ4_K, DotQ6_K>>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q4_K+Q6_K));
    if (types.type == GgmlType::Q5_0 && types.last == GgmlType::Q8_0)
        return blocks(launch_blocks<DotPair<DotQ5_0, DotQ8_0>>, TANDEM_KERNEL_NAMES("matvec", "_kernel", Q5_0+Q8_0));
    detail::require(false, "matvec: no kernel computes this pair of types in one launch");
}

// x quantized (xq) for a type with an 8-bit route: matvec_q8.cu computes it; else the fp32 kernels here. A job of
// two types (types.last other than types.type) walks its last segment with the other.
void route(MatvecTypes types, MatvecJob job, int cols, const float* x, const void* xq, int n_tokens,
           MatvecLoads loads, Stream stream) {
    const bool int8 = xq && matvec_q8_supports(types.type);
    if (types.last == types.type) {
        if (int8)
            dispatch_q8(types.type, job, cols, static_cast<const uint8_t*>(xq), n_tokens, loads, stream);
        else
            dispatch(types.type, job, cols, x, n_tokens, loads, stream);
        return;
    }
    detail::require(matvec_types_fuse(types.type, types.last) && job.n_seg >= 2,
                    "matvec: no kernel computes this pair of types in one launch");
    job.b_seg = job.n_seg - 1;
    if (int8)
        dispatch_q8_pair(types, job, cols, static_cast<const uint8_t*>(xq), n_tokens, loads, stream);
    else
        dispatch_pair(types, job, cols, x, n_tokens, loads, stream);
}

}  // namespace

bool matvec_types_fuse(GgmlType type, GgmlType last) {
    // The pairs of llama.cpp's Q4_K_M mixture (attn_v in Q6_K beside Q4_K; in rows that are not whole super-blocks,
    // Q8_0 beside Q5_0): the default models'. Both have one activation format per pair, so both routes take them.
    return type == last || (type == GgmlType::Q4_K && last == GgmlType::Q6_K) ||
           (type == GgmlType::Q5_0 && last == GgmlType::Q8_0);
}

bool matvec_supports(GgmlType type) {
    switch (type) {
        case GgmlType::F32:
        case GgmlType::F16:
        case GgmlType::BF16:
        case GgmlType::Q8_0:
        case GgmlType::Q4_0:
        case GgmlType::Q4_1:
        case GgmlType::Q5_0:
        case GgmlType::Q5_1:
        case GgmlType::Q2_K:
        case GgmlType::Q3_K:
        case GgmlType::Q4_K:
        case GgmlType::Q5_K:
        case GgmlType::Q6_K: return true;
        default: return false;
    }
}

void matvec(GgmlType type, const void* W, size_t row_bytes, int rows, int cols, const float* x, int n_tokens, float* y,
            Stream stream, size_t y_stride, MatvecLoads loads, const void* xq) {
    detail::require(y_stride == 0 || y_stride >= static_cast<size_t>(rows), "matvec: y_stride is less than rows");
    MatvecJob job{};
    job.seg0 = {static_cast<const uint8_t*>(W), row_bytes, y, y_stride ? y_stride : static_cast<size_t>(rows), nullptr,
                rows};
    job.n_seg = 1;
    job.total_rows = rows;
    route(type, job, cols, x, xq, n_tokens, loads, stream);
}

void matvec_rows(GgmlType type, const void* W, size_t row_bytes, int cols, const int* row_ids, int n_ids,
                 const float* x, int n_tokens, float* y, size_t y_stride, Stream stream, MatvecLoads loads,
                 const void* xq) {
    detail::require(row_ids != nullptr && y_stride > 0, "matvec_rows: row_ids and y_stride are required");
    MatvecJob job{};
    job.seg0 = {static_cast<const uint8_t*>(W), row_bytes, y, y_stride, nullptr, n_ids};
    job.n_seg = 1;
    job.total_rows = n_ids;
    job.row_ids = row_ids;
    route(type, job, cols, x, xq, n_tokens, loads, stream);
}

namespace {

MatvecJob multi_job(const MatvecTarget* targets, int n_targets) {
    detail::require(targets != nullptr && n_targets >= 1 && n_targets <= kMatvecMaxTargets,
                    "matvec_multi: 1..3 targets");
    MatvecJob job{};
    MatvecSegment* segs[] = {&job.seg0, &job.seg1, &job.seg2};
    for (int i = 0; i < n_targets; ++i) {
        const MatvecTarget& t = targets[i];
        *segs[i] = {static_cast<const uint8_t*>(t.W), t.row_bytes, t.y, static_cast<size_t>(t.rows), t.bias, t.rows};
        detail::require(t.rows > 0, "matvec: empty shape");
        job.total_rows += t.rows;
    }
    job.n_seg = n_targets;
    return job;
}

}  // namespace

void matvec_multi(MatvecTypes types, const MatvecTarget* targets, int n_targets, int cols, const float* x,
                  int n_tokens, Stream stream, MatvecLoads loads, const void* xq) {
    route(types, multi_job(targets, n_targets), cols, x, xq, n_tokens, loads, stream);
}

size_t matvec_rope_counters(const RopeKvArgs& rope) {
    return static_cast<size_t>(rope.n_heads) + 2 * static_cast<size_t>(rope.n_kv_heads);  // one per head
}

bool matvec_rope_in_launch(GgmlType type, MatvecLoads loads, const RopeKvArgs& rope) {
    // The angles tabled, the fp16 cache (rope_kv.cuh head_epilogue), every block within one head (kWarps rows a
    // block; split: one), and not the persistent kernel, whose blocks walk several block-rows (the float types
    // always load directly); a cache of every position (the epilogue writes row pos, not a ring's slot).
    return rope.trig && rope.kv_type == KvType::F16 && rope.ring == 0 && rope.head_dim % kWarps == 0 &&
           (loads != MatvecLoads::Persistent || ggml_is_float_type(type));
}

void matvec_qkv_rope(MatvecTypes types, const MatvecTarget* qkv, int cols, const float* x, int n_tokens,
                     Stream stream, MatvecLoads loads, const void* xq, const RopeKvArgs& rope, unsigned* counters) {
    rope::check_args(rope);
    MatvecJob job = multi_job(qkv, 3);
    const int hd = rope.head_dim;
    detail::require(rope.n_tokens == n_tokens && qkv[0].y == rope.q && qkv[1].y == rope.k && qkv[2].y == rope.v &&
                        qkv[0].rows == rope.n_heads * hd && qkv[1].rows == rope.n_kv_heads * hd &&
                        qkv[2].rows == rope.n_kv_heads * hd,
                    "matvec_qkv_rope: the targets must write rope's q, k and v, whole heads, for its tokens");
    const bool in_launch = counters && matvec_rope_in_launch(types.type, loads, rope) &&
                           matvec_rope_in_launch(types.last, loads, rope);
    if (in_launch) {
        job.rope_counters = counters;
        job.rope = rope;
    }
    route(types, job, cols, x, xq, n_tokens, loads, stream);
    if (!in_launch) rope_kv_write(rope, stream);
}

bool matvec_norm_in_launch(GgmlType type, const void* xq, int rows, int n_tokens, const float* y,
                           const AddRmsNormArgs& norm) {
    // Not the Dots without the epilogue (kNormEpilogue: DotQ5_K, DotQ5_KQ8, DotQ6_KQ8; the route as route() picks
    // it); one token (the epilogue's kernels are the one-token ones); whole blocks of rows, so every warp has one and
    // reaches the epilogue's barriers; the register kernel's layout (rms_norm.cuh), whose order the epilogue follows.
    const bool int8 = xq && matvec_q8_supports(type);
    if (type == GgmlType::Q5_K || (int8 && type == GgmlType::Q6_K)) return false;
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return n_tokens == 1 && rows % kWarps == 0 && rows <= norm::kMaxVecCols && aligned(y) && aligned(norm.x) &&
           aligned(norm.weight) && aligned(norm.out);
}

void matvec_add_rms_norm(GgmlType type, const void* W, size_t row_bytes, int rows, int cols, const float* x,
                         int n_tokens, float* y, Stream stream, MatvecLoads loads, const void* xq,
                         const AddRmsNormArgs& norm, unsigned* counter) {
    detail::require(rows > 0 && norm.x && norm.weight && norm.out, "matvec_add_rms_norm: empty shape");
    MatvecJob job{};
    job.seg0 = {static_cast<const uint8_t*>(W), row_bytes, y, static_cast<size_t>(rows), nullptr, rows};
    job.n_seg = 1;
    job.total_rows = rows;
    const bool in_launch = counter && matvec_norm_in_launch(type, xq, rows, n_tokens, y, norm);
    if (in_launch) {
        job.norm_counter = counter;
        job.norm = {norm.x, norm.weight, norm.out, norm.eps, rows, norm::vec_layout(rows),
                    norm::quant_out(norm.q8_for, norm.xq, rows)};
    }
    route(type, job, cols, x, xq, n_tokens, loads, stream);
    if (!in_launch)
        add_rms_norm(norm.x, y, norm.weight, norm.out, n_tokens, rows, norm.eps, stream, norm.q8_for, norm.xq);
}

size_t matvec_swiglu_counters(int rows) {
    return static_cast<size_t>(rows + q8::block_elems(false) - 1) / q8::block_elems(false);  // one per Q8_1 block
}

void matvec_swiglu(GgmlType type, const void* W_gate, const void* W_up, size_t row_bytes, int rows, int cols,
                   const float* x, int n_tokens, float* out, Stream stream, MatvecLoads loads, const void* xq,
                   const SwigluQuant& quant) {
    detail::require(rows > 0, "matvec: empty shape");
    MatvecJob job{};
    const size_t stride = static_cast<size_t>(rows);
    job.seg0 = {static_cast<const uint8_t*>(W_gate), row_bytes, out, stride, nullptr, rows};
    job.seg1 = {static_cast<const uint8_t*>(W_up), row_bytes, out, stride, nullptr, rows};  // y: never written
    job.n_seg = 2;
    job.total_rows = 2 * rows;
    job.swiglu = true;
    bool quantize_after = false;
    if (quant.out) {
        const bool k_quant = q8::checked_output(quant.q8_for, quant.out, rows,
                                                "matvec_swiglu: the quantized output needs a type with the 8-bit "
                                                "route, whole blocks, alignment");
        const bool in_launch = !k_quant && xq && matvec_q8_supports(type) && quant.counters &&
                               (loads == MatvecLoads::Staged || loads == MatvecLoads::Persistent);
        if (in_launch) {
            job.q8_out = static_cast<uint8_t*>(quant.out);
            job.q8_counters = quant.counters;
        }
        quantize_after = !in_launch;
    }
    route(type, job, cols, x, xq, n_tokens, loads, stream);
    if (quantize_after) quantize_activations(quant.q8_for, out, rows, n_tokens, quant.out, stream);
}

}  // namespace tandem::cuda
