// The CUDA backend: the whole llama forward pass through the kernels of kernels/ (weights uploaded once as they are
// in the GGUF, fp32 activations, an fp16 or Q8_0 KV cache on the device: --kv-type). Plain C++: it sees the kernels only through
// kernels/kernels.h and kernels/device.h. The same source is linked twice (src/cuda/CMakeLists.txt): against
// tandem_cuda (nvcc, a real GPU) into tandem_cuda_backend, and against tandem_cuda_emu (the CPU emulation of CUDA)
// into tandem_cuda_backend_emu, which the tests run against CpuBackend without a GPU.
//
// Two paths through the layers, chosen per forward call (or forward_batch call, by all its slices' tokens) by its
// length:
//  - calls of up to CudaPrefillOptions::matvec_max_call tokens (decode, speculative verification, short chunks) run
//    in steps of 16 tokens through matvec and split-K attention: bitwise batch-invariant among themselves (a
//    position's logits do not depend on how many tokens the call had or where the position fell in it);
//  - longer calls (prompt prefill) run in chunks of CudaPrefillOptions::chunk_tokens through the prefill GEMM and
//    tiled flash attention: within tolerance of the short-call path, not bitwise equal to it. The GEMM is cuBLAS on
//    fp16 tiles in the nvcc build (--cuda-route gemm=simt picks the SIMT kernel), the SIMT kernel under the
//    emulation; the SIMT kernel and the flash attention are themselves batch-invariant across prefill calls. With
//    CudaOptions::int8_gemm (--cuda-route gemm=int8) the types of gemm_q8 take the 8-bit tensor-core GEMM instead.
//
// CUDA graphs (short calls only): a step's 5-7 launches per layer are captured once into a graph per shape (tokens
// in the step, logit rows wanted) and replayed. What changes from step to step lives in device memory the kernels
// read through pointers (the tokens and the start position, uploaded before each replay), so a replay needs no
// re-capture. The one by-value exception is split-K attention's grid, which grows with the number of keys: it is
// rounded up to a power of two of splits, and when the keys outgrow it the step is re-captured and the graph
// updated in place (cudaGraphExecUpdate: same kernels, a larger grid), not re-instantiated. Sizing the grid for the
// whole context instead would launch ctx/64 mostly empty split blocks per head and layer at every step (512 at 32k
// positions); re-capturing every step, as llama.cpp does, would pay a capture and an update walk over every node at
// every token. Here that happens log2(ctx / 64) times per context (~9 at 32k), and at most half the split blocks
// are empty ones that return at once. --cuda-route graphs=0 launches kernel by kernel instead.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "backend.h"
#include "cuda/cuda_options.h"
#include "device.h"
#include "gguf/ggml_types.h"
#include "kernels.h"
#include "kv_rings.h"

namespace tandem {

struct Model;
struct ModelConfig;
struct Weights;

// The sliding windows of a cache's layers and the rings they keep (kv_rings.h): window + margin rows, rounded up to
// a multiple of `align` (cuda::attention_ring_multiple of the backend's split size).
struct CudaKvWindows {
    std::vector<int> windows;  // [layer]: the window, 0 for none (empty: no windowed layers)
    int margin = 0;
    int align = 1;
};

class CudaKvCache : public KvCache {
public:
    // Sliding-window layers keep a ring (kv_rings.h): position p in row p % ring(l); the kernels address them so
    // (AttentionArgs::ring, RopeKvArgs::ring).
    CudaKvCache(int n_layers, int capacity, int kv_dim, cuda::KvType type = cuda::KvType::F16,
                const CudaKvWindows& windows = {});
    // Device pointers to `layer`'s keys / values: rows of cuda::kv_row_bytes(type(), kv_dim), [capacity] of them, or
    // [ring(layer)] for a windowed layer.
    void* key(int layer) const { return k_.as<uint8_t>() + layer_offset_[static_cast<size_t>(layer)]; }
    void* value(int layer) const { return v_.as<uint8_t>() + layer_offset_[static_cast<size_t>(layer)]; }
    int ring(int layer) const { return rings_.ring(layer); }
    KvRings& rings() { return rings_; }
    cuda::KvType type() const { return type_; }
    // Stored rows (KvCache): the device rows as they are (cuda::kv_row_bytes), copied synchronously on the default
    // stream; a ring's positions from what it holds intact.
    RowFormat row_format() const override;
    int held_from(int layer) const override { return rings_.held_from(layer); }
    int needed_from(int layer, int n) const override { return rings_.needed_from(layer, n); }
    void read_rows(int layer, int first, int n, uint8_t* keys, uint8_t* values) const override;
    void write_rows(int layer, int first, int n, const uint8_t* keys, const uint8_t* values) override;
    // Bytes of keys and values for these layers' windows (rings where they are smaller than the capacity).
    static size_t bytes_needed(int n_layers, int capacity, int kv_dim, cuda::KvType type = cuda::KvType::F16,
                               const CudaKvWindows& windows = {});

private:
    int resumable(int n) override { return rings_.resumable(n); }
    void loaded(int m, std::span<const int> firsts) override {
        (void)m;
        rings_.note_loaded(firsts);
    }
    // Copies positions [first, first + n) of `layer` between the device rows and the host (to_host) or back, in at
    // most two runs (a ring wraps once).
    void copy_rows(int layer, int first, int n, uint8_t* keys, uint8_t* values, bool to_host) const;
    cuda::KvType type_;
    size_t row_bytes_;
    KvRings rings_;
    std::vector<size_t> layer_offset_;  // [layer]: bytes before its rows
    cuda::DeviceBuffer k_, v_;
};

// "f16" / "q8_0" (the --kv-type values); nullopt for anything else.
std::optional<cuda::KvType> parse_kv_type(const std::string& name);
const char* kv_type_name(cuda::KvType type);

// How long calls are cut (see the file comment). The defaults: verification of draft_max = 16 drafts is a 17-token
// call, so the bitwise-invariant path covers calls well past 16 tokens; 256 is the generator's prefill chunk.
struct CudaPrefillOptions {
    int chunk_tokens = 256;    // tokens per prefill chunk (sizes the activation scratch)
    int matvec_max_call = 64;  // calls of up to this many tokens keep matvec + split-K
};

// What the CUDA graphs did, counted (under the emulation the counts are all there is to measure).
struct CudaGraphStats {
    int captures = 0;          // steps recorded into a graph: instantiations + updates
    int instantiations = 0;    // a graph made anew (a new shape, or a capture that could not update in place)
    int updates = 0;           // a re-capture patched into the existing graph in place (a larger attention grid,
                               // another cache or workspace)
    int replays = 0;           // graph launches, one per short step
    int direct_steps = 0;      // steps launched kernel by kernel (graphs off, or the prefill path)
    int batched_steps = 0;     // steps of several sequences (forward_batch), launched kernel by kernel
    int persistent_steps = 0;  // one-token steps queued as the persistent launch (directly, or into a graph)
    size_t nodes = 0;          // kernels in the graph replayed last
};

// Device bytes the backend needs, decided before anything is allocated.
struct CudaMemoryPlan {
    size_t weights = 0;   // every tensor once (a tied output shares the embedding's bytes)
    size_t kv_cache = 0;  // one cache of n_ctx positions
    cuda::KvType kv_type = cuda::KvType::F16;
    size_t scratch = 0;  // activations of one prefill chunk, 16 rows of logits, fp16 GEMM operands when cuBLAS
                         // runs the prefill GEMM, attention workspace for n_ctx
    int prefill_chunk = 0;
    bool blas = false;       // the prefill GEMM runs on cuBLAS
    bool int8_gemm = false;  // ... or on int8 tensor cores for the types gemm_q8 takes
    size_t total() const { return weights + kv_cache + scratch; }
    // "1.23 GiB (weights ..., KV cache ... q8_0, scratch ... for 256-token prefill chunks, cuBLAS fp16 GEMM)"
    std::string describe() const;
};

class CudaBackend : public Backend {
public:
    // Tokens per internal step of the matvec path: the matvec kernels' limit.
    static constexpr int kStepTokens = cuda::kMatvecMaxTokens;
    // Halves of the fp16 weight tile the cuBLAS route dequantizes into (32 MiB; less when every matrix is smaller).
    static constexpr size_t kBlasTileHalves = size_t{16} << 20;
    // Plans memory for weights + one cache of `n_ctx` positions + scratch, compares it with the device's free
    // memory (throws tandem::Error naming both figures when it does not fit; nothing is allocated then), then
    // uploads the weights. Throws tandem::Error for a tensor type the kernels cannot handle.
    CudaBackend(const Model& model, int n_ctx, CudaPrefillOptions prefill = {}, CudaOptions options = {});
    ~CudaBackend() override;
    static CudaMemoryPlan plan(const Model& model, int n_ctx, CudaPrefillOptions prefill = {},
                               CudaOptions options = {});
    // For a target and its draft on the same device: throws tandem::Error naming each plan and their sum when
    // together they do not fit in the device's free memory. Checked before either backend allocates anything, so
    // the pair is refused whole instead of the draft failing after the target's upload.
    static void check_pair_fits(const CudaMemoryPlan& target, const CudaMemoryPlan& draft);
    // True when the prefill GEMM runs on cuBLAS: the nvcc build, unless options.simt_gemm.
    static bool use_blas(const CudaOptions& options);

    std::string name() const override { return cuda::device_is_emulated() ? "cuda-emu" : "cuda"; }
    // The device, the prefill chunk and its GEMM route: what decides the bits of a prefill's keys and values.
    std::string kv_signature() const override;
    // Prefill chunks are cut from position 0 (longer calls are not bitwise the shorter ones'): see Backend.
    int resume_multiple() const override { return prefill_.chunk_tokens; }
    std::unique_ptr<KvCache> new_cache(int n_ctx) override;
    void forward(std::span<const int> tokens, KvCache& cache, int n_logits, float* logits) override;
    // The slices' tokens in steps (of kStepTokens, or prefill chunks where the call has more than matvec_max_call
    // tokens in all; a slice may be cut between two steps): every matrix is read once per step for all its tokens,
    // while RoPE, the cache writes and attention run per sequence against its own cache, and the rows whose
    // logits are wanted go through one output projection. A call of at most matvec_max_call tokens gives each
    // slice the bits forward gives it in calls of the same sizes (the matvec path is batch-invariant; except with
    // CudaOptions::persistent_step, whose one-token steps are within rounding of the launches); a longer one agrees
    // within the GEMM's tolerance. One slice is forward itself (its graphs and persistent step); steps
    // of several sequences launch kernel by kernel (CudaGraphStats::batched_steps), not from graphs.
    void forward_batch(std::span<const SequenceSlice> slices) override;
    // The greedy picks on the device (kernels/sampling.cu's argmax, after the output projection, inside the step's
    // graph): only n_rows ints are copied back; `scratch` is not touched.
    void forward_argmax(std::span<const int> tokens, KvCache& cache, int n_rows, int* ids,
                        std::span<float> scratch) override;
    // The greedy picks and their confidence on the device (argmax_top_probability inside the step's graph): two
    // numbers per row are copied back; `scratch` is not touched.
    void forward_argmax_confidence(std::span<const int> tokens, KvCache& cache, int n_rows, int* ids, float* top_probs,
                                   std::span<float> scratch) override;
    // The candidates selected on the device (kernels/sampling.cu's top_k and gather_columns, after the step's graph):
    // only they are copied back; `scratch` is not touched.
    void forward_candidates(std::span<const int> tokens, KvCache& cache, int n_rows, int k, std::span<const int> extra,
                            float* top_logits, int* top_ids, float* extra_logits, std::span<float> scratch) override;
    int max_candidates() const override { return cuda::kTopKMax; }
    // The output projection reads only rows [0, n_first) and the extra ids' rows of the output matrix (matvec over
    // the first rows, matvec_rows over the extras, -inf over the rest): the same bits for the ids computed. A step's
    // graph is captured again when n_first changes or the extra ids outgrow a power of two (see the .cpp).
    bool restrict_logits(int n_first, std::span<const int> extra) override;
    // Deferred outputs (Backend): a call queues its steps and the copies of its outputs into pinned staging (a copy
    // into the caller's pageable memory would make the host wait for the stream) and returns; collect_outputs()
    // synchronizes and hands the staged outputs to the caller's buffers. The emulation runs the kernels in the
    // call (so it does not compute in the background) but stages and delivers the outputs the same way.
    bool computes_in_background() const override { return !cuda::device_is_emulated(); }
    void defer_outputs() override { deferring_ = true; }
    bool outputs_ready() override { return !deferring_ || cuda::stream_done(stream_); }
    void collect_outputs() override;

    const CudaOptions& options() const { return options_; }
    bool stream_high_priority() const { return cuda::stream_high_priority(stream_); }
    const CudaGraphStats& graph_stats() const { return graph_stats_; }
    // The persistent decode step's launch for this model (kernels.h decode_step), when the options ask for it
    // (CudaOptions::persistent_step) and the model's shapes and types allow it; else its one-token steps take the
    // usual launches.
    static std::optional<cuda::DecodeStepPlan> persistent_step_plan(const Model& model, const CudaOptions& options);
    // How its one-token steps run, in words for -v: "kernel by kernel", "in one persistent launch (rows staged)", ...
    static std::string describe_persistent_step(const Model& model, const CudaOptions& options);

private:
    struct DeviceMatrix {
        const uint8_t* data = nullptr;  // device
        GgmlType type = GgmlType::F32;
        size_t row_bytes = 0;
        int rows = 0, cols = 0;
    };
    struct DeviceLayer {
        const float *attn_norm = nullptr, *ffn_norm = nullptr, *bq = nullptr, *bk = nullptr, *bv = nullptr;
        // The block variations' norms (null where the model has none): QK-norm, and the norms after the sublayers.
        const float *q_norm = nullptr, *k_norm = nullptr, *post_attn_norm = nullptr, *post_ffn_norm = nullptr;
        DeviceMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
    };

    struct BlasDeleter {
        void operator()(cuda::BlasHandle* h) const noexcept { cuda::blas_destroy(h); }
    };

    // Where a step's kernels take the start position from: `start` by value (direct launches), or the device int
    // `device` with attention's grid sized for `grid_bound` (a step captured into a graph).
    struct StepPosition {
        int start = 0;
        const int* device = nullptr;
        int grid_bound = 0;
    };
    // A sequence's run of tokens within one step: the step's rows first..first + n - 1, at positions pos.start on of
    // `cache`; the logits of its last n_logits rows go to `logits` (forward_batch). A single-sequence step is one
    // segment covering the step.
    struct StepSegment {
        int first = 0, n = 0;
        CudaKvCache* cache = nullptr;
        StepPosition pos;
        int n_logits = 0;
        float* logits = nullptr;
    };
    // A short step captured into a graph, and what its by-value arguments were captured for.
    struct StepGraph {
        cuda::Graph graph;
        // The first layer's cache rows and the capacity: every layer's are at those plus the layer times the
        // capacity's rows (a cache freed and another of another capacity allocated where it was has the same first).
        const void *k_cache = nullptr, *v_cache = nullptr;
        int capacity = 0;
        const float* workspace = nullptr;
        int splits = 0;            // attention grid
        uint64_t restriction = 0;  // restriction_version_ at capture
    };

    // Where the output rows of a call go, row r at index r of each: their logits, their argmax ids, or their
    // candidates (k > 0: the k best logits with their ids, and the logits of the n_extra ids uploaded to
    // cand_extra_ids_).
    struct CallOutput {
        float* logits = nullptr;
        int* ids = nullptr;
        float* top_probs = nullptr;  // with ids: each row's confidence (argmax_top_probability)
        int k = 0, n_extra = 0;
        float* top_logits = nullptr;
        int* top_ids = nullptr;
        float* extra_logits = nullptr;
        CallOutput advanced(size_t rows, int n_vocab) const;  // the same for the rows from `rows` on
    };
    // A whole call: the output of its last n_out tokens.
    void run_call(std::span<const int> tokens, KvCache& cache, int n_out, const CallOutput& out);
    // One step (prefill = false: up to kStepTokens tokens) or one prefill chunk, with the output of its last n_out
    // tokens.
    void forward_step(std::span<const int> tokens, CudaKvCache& cache, int n_out, const CallOutput& out, bool prefill);
    // A step of forward_batch: `tokens` (at most kStepTokens, or a prefill chunk) made of `segments` of several
    // sequences, in order, covering them all; sets each segment's position (what its cache holds), and commits.
    void batch_step(std::span<const int> tokens, std::span<StepSegment> segments, bool prefill);
    // Queues the embedding and every layer of a step of n tokens made of `segments` (each segment's keys and values
    // go into its cache): the matrices over all n rows, RoPE, the cache writes and attention per segment.
    void enqueue_layers(std::span<const StepSegment> segments, int n, bool prefill);
    // Whether a step of n tokens runs its layers as the persistent launch (CudaOptions::persistent_step: one-token
    // steps, where the model allows it), which enqueue_persistent_step queues after the embedding, reading the layer
    // table that upload_step_layers keeps naming the step's cache.
    bool persistent_step(int n, bool prefill) const { return n == 1 && !prefill && step_plan_.blocks > 0; }
    void enqueue_persistent_step(CudaKvCache& cache);
    void upload_step_layers(const CudaKvCache& cache);
    // What a step computes on the device from its output rows' logits (inside its graph).
    enum class Picks { None, Argmax, ArgmaxConfidence };
    static Picks picks_of(const CallOutput& out) {
        return out.ids ? (out.top_probs ? Picks::ArgmaxConfidence : Picks::Argmax) : Picks::None;
    }
    // Queues the output projection of the normed rows x (rows <= kStepTokens of them, dim apart: the step's xb_
    // rows, or those forward_batch gathered) into logits_, and with `picks` their greedy ids into ids_ (and
    // confidences into top_probs_).
    void enqueue_output(const float* x, int rows, Picks picks);
    // Replays (capturing first when needed) the graph of a short step of n tokens at start_pos.
    void replay_step(CudaKvCache& cache, int n, int start_pos, int n_out, Picks picks);
    // Split-K blocks per (token, head) a graph launches for steps whose keys end at `n_keys`.
    int graph_splits(int n_keys, int capacity) const;
    // y = W x for n tokens: matvec, or in a prefill chunk the GEMM (cuBLAS reads x16_ and gemm_q8 xq_, both filled
    // by gemm_input).
    void matmul(const DeviceMatrix& W, const float* x, int n, float* y, bool prefill);
    // With int8_activations and a type that has the 8-bit route: x (n <= kStepTokens rows of cols) quantized for
    // `type` in xq_: rows that the kernel producing them already quantized in that format, else a quantize launch
    // queued here; otherwise nullptr (the matvec reads x).
    const void* quantized(GgmlType type, const float* x, int n, int cols);
    // What the kernel about to write `out` (n rows of cols: an RMSNorm's xb_, SwiGLU's output) should also quantize
    // it for (the type of the matvecs that read it next): with fused_matvecs and int8_activations on a short step,
    // that type and `into` (xq_ when null); else nothing. Records what that buffer will hold, for quantized().
    struct FusedQuant {
        GgmlType type = GgmlType::F32;
        void* xq = nullptr;
    };
    FusedQuant fused_quant(const float* out, int cols, GgmlType next, int n, bool prefill, uint8_t* into = nullptr);
    // Whether fused_quant would have a producer quantize its output for a matvec of `next`.
    bool fuses_quant(GgmlType next, int n, bool prefill) const;
    // Q/K/V in one launch (fused_matvecs; one type, or V of the other type of a pair cuda::matvec_types_fuse takes,
    // on the same route), and RoPE with the cache write in it (qkv_rope, where the kernel can:
    // cuda::matvec_rope_in_launch).
    bool fuses_qkv(const DeviceLayer& L, bool prefill) const;
    bool fuses_rope(const DeviceLayer& L, const cuda::RopeKvArgs& rope, int n, bool prefill) const;
    // proj_ = W in (attn_output, ffn_down), then the residual add x_ += proj_ and the RMSNorm after it (norm_weight)
    // into xb_, quantized for a matvec of type `next` where fused_quant says: in one launch with matvec_norm
    // (cuda::matvec_add_rms_norm; it decides whether its last block can), else an add_rms_norm launch after the
    // matmul. With post_norm (gemma's post_attention_norm / post_ffw_norm), proj_ is normed before the add, in
    // launches of their own.
    void project_add_norm(const DeviceMatrix& W, const float* in, int n, const float* post_norm,
                          const float* norm_weight, GgmlType next, bool prefill);
    // W as one target of a fused matvec_multi launch (Q/K/V with their biases, gate/up).
    static cuda::MatvecTarget target(const DeviceMatrix& W, float* y, const float* bias);
    // A prefill GEMM input (n rows of cols) in the forms its readers (the weight types of the matrices that
    // multiply it) need: x16_ for cuBLAS, xq_ (Q8_1) for the int8 GEMM; neither is made when no reader takes it.
    void gemm_input(const float* x, int n, int cols, std::initializer_list<GgmlType> readers);
    // Whether a prefill GEMM of this weight type runs on int8 tensor cores (CudaOptions::int8_gemm).
    bool uses_int8_gemm(GgmlType type) const;
    // The loads of a decode or verification matvec of this weight type (CudaOptions::matvec_route).
    cuda::MatvecLoads loads(GgmlType type) const { return options_.matvec_route(type).loads; }
    void ensure_workspace(int n_ctx);
    // `bytes` of device memory at `src` to the caller's `dst`: queued on the stream (run_call synchronizes before
    // returning), or with deferred outputs queued into staging_ and written to `dst` by collect_outputs().
    void copy_output(void* dst, const void* src, size_t bytes);
    // Writes the staged outputs to their destinations (their copies must have finished) and empties the staging.
    void deliver_staged();

    const Model& model_;
    const CudaPrefillOptions prefill_;
    const CudaOptions options_;
    cuda::Stream stream_ = nullptr;
    std::unique_ptr<cuda::BlasHandle, BlasDeleter> blas_;  // this backend's own, bound to stream_; null: SIMT GEMM
    cuda::DeviceBuffer weight_buf_, scratch_buf_, workspace_buf_;
    DeviceMatrix token_embd_, output_;
    const float* output_norm_ = nullptr;
    std::vector<DeviceLayer> layers_;
    // Scratch for one step, row i for the step's i-th token (pointers into scratch_buf_).
    float *x_ = nullptr, *xb_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *att_ = nullptr, *proj_ = nullptr,
          *gate_ = nullptr, *up_ = nullptr, *logits_ = nullptr, *inv_freq_ = nullptr;
    // The step's inputs in device memory, [start position, tokens...]: what a replayed graph reads. step_host_ is
    // their host copy, uploaded in one copy before the step's kernels.
    int *step_in_ = nullptr, *tokens_ = nullptr;
    std::vector<int> step_host_;
    std::vector<int> batch_tokens_;      // forward_batch: the tokens of the step being gathered
    std::vector<StepPart> batch_parts_;  // and its slices' parts
    int* ids_ = nullptr;                 // kStepTokens argmax ids
    float* top_probs_ = nullptr;         // and their confidences
    // forward_candidates: kStepTokens rows of kTopKMax best logits / ids / extra logits, and the extra ids.
    float *cand_logits_ = nullptr, *cand_extra_logits_ = nullptr;
    int *cand_ids_ = nullptr, *cand_extra_ids_ = nullptr;
    // restrict_logits: ids below logit_first_ (n_vocab: no restriction) and the extra ids (>= logit_first_, then
    // padding up to the launched capacity n_extra_logits_) in logit_extra_ids_ (device, room for n_vocab). The
    // version counts changes of the two launch arguments.
    int logit_first_ = 0, n_extra_logits_ = 0;
    int* logit_extra_ids_ = nullptr;
    uint64_t restriction_version_ = 0;
    void* sampling_ws_ = nullptr;  // the argmax kernels' workspace for kStepTokens rows
    uint8_t* xq_ = nullptr;        // an input quantized for the 8-bit route (kStepTokens rows of the widest input)
    uint8_t* xq_ffn_ = nullptr;    // SwiGLU's output quantized for ffn_down (not xq_: the gate/up launch reads that)
    uint8_t* xq_norm_ = nullptr;   // the residual RMSNorm's, for the matvec after it (not xq_: see project_add_norm)
    unsigned* swiglu_counters_ = nullptr;  // matvec_swiglu's, zero between launches (cuda::SwigluQuant)
    unsigned* split_counters_ = nullptr;   // decode attention's, zero between launches (cuda::AttentionArgs)
    float* rope_trig_ = nullptr;           // a step's RoPE angles (cuda::rope_trig_table)
    unsigned* rope_counters_ = nullptr;    // matvec_qkv_rope's, zero between launches
    unsigned* norm_counter_ = nullptr;     // matvec_add_rms_norm's, zero between launches
    unsigned* pick_counters_ = nullptr;    // the one-launch argmax's, kStepTokens, zero between launches
    // What xq_at_ (xq_, xq_ffn_ or xq_norm_) holds at this point of the queue: the rows at xq_of_ (xq_cols_ wide) in
    // xq_format_ (None: nothing known).
    uint8_t* xq_at_ = nullptr;
    const float* xq_of_ = nullptr;
    int xq_cols_ = 0;
    cuda::Q8Format xq_format_ = cuda::Q8Format::None;
    // cuBLAS route only: the chunk's activations in fp16, and the fp16 weight tile of kBlasTileHalves at most.
    uint16_t *x16_ = nullptr, *w_tile_ = nullptr;
    size_t w_tile_halves_ = 0;
    int workspace_ctx_ = 0;  // the context the attention workspace is sized for
    // The persistent step (blocks 0: not used), its layer table (naming the cache rows step_layers_rows_: each
    // layer's key and value rows) and its attention workspace.
    cuda::DecodeStepPlan step_plan_;
    cuda::DeviceBuffer step_layers_buf_, step_ws_buf_;
    std::vector<const void*> step_layers_rows_;
    std::map<std::tuple<int, int, Picks>, StepGraph> graphs_;  // by (tokens in the step, output rows, picks)
    // Deferred outputs: on between defer_outputs() and collect_outputs(); the outputs queued into staging_ since.
    struct StagedOutput {
        void* dst;
        size_t offset, bytes;
    };
    bool deferring_ = false;
    cuda::PinnedBuffer staging_;
    std::vector<StagedOutput> staged_;
    CudaGraphStats graph_stats_;
};

}  // namespace tandem
