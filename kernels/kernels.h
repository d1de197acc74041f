// Host launch functions of tandem's CUDA kernels, in plain C++: src/ (and tests) include this, never a CUDA header.
// The same declarations are defined twice: by nvcc in the tandem_cuda library (the kernels run on the GPU, pointers
// are device pointers, `stream` is a cudaStream_t) and by g++ in tandem_cuda_emu (the kernels run on the CPU
// emulation, pointers are host pointers, the launch is synchronous and `stream` is ignored).
//
// Conventions: fp16 data is raw IEEE binary16 bits (uint16_t); activations are row-major [tokens][width] fp32;
// weight rows are GGUF rows (row_bytes apart). Every function checks its shape arguments on the host and throws
// std::invalid_argument when it cannot handle them; a failed launch throws std::runtime_error (nvcc build) or
// tandem::emu::Error (emulation).
#pragma once
#include <cstddef>
#include <cstdint>

#include "gguf/ggml_types.h"

namespace tandem::cuda {

using Stream = void*;

// ---- RMSNorm (rms_norm.cu) ----------------------------------------------------------------------------------------
// out[r] = weight * (x[r] / sqrt(mean(x[r]^2) + eps)) for rows x cols, in the CPU backend's operation order.
// xq, when set (4-byte aligned): out also quantized for the 8-bit matvec route of type q8_for, bitwise what
// quantize_activations(q8_for, out, cols, rows, xq) writes (one launch instead of two).
void rms_norm(const float* x, const float* weight, float* out, int rows, int cols, float eps, Stream stream,
              GgmlType q8_for = GgmlType::F32, void* xq = nullptr);
// x[r] += residual[r] (written back), then out[r] = rms_norm(x[r]): the residual add fused into the norm.
void add_rms_norm(float* x, const float* residual, const float* weight, float* out, int rows, int cols, float eps,
                  Stream stream, GgmlType q8_for = GgmlType::F32, void* xq = nullptr);

// In place: x[r] = weight * (x[r] / sqrt(mean(x[r]^2) + eps)) for rows of cols <= 256 floats, one weight row for all
// (QK-norm: rows = tokens x heads, cols = head_dim).
void rms_norm_in_place(float* x, const float* weight, int rows, int cols, float eps, Stream stream);
// ---- SwiGLU (swiglu.cu) ---------------------------------------------------------------------------------------------
// out[i] = silu(gate[i]) * up[i]; out may alias gate. xq, when set (4-byte aligned; out 16-byte aligned, n whole
// blocks): out also quantized for the 8-bit matvec route of type q8_for, bitwise quantize_activations of it (rows
// of any whole number of blocks: the quantized rows are contiguous either way).
void swiglu(const float* gate, const float* up, float* out, int64_t n, Stream stream, GgmlType q8_for = GgmlType::F32,
            void* xq = nullptr);

// out[i] = gelu(gate[i]) * up[i], GELU's tanh approximation (gemma's GeGLU); out may alias gate.
void geglu(const float* gate, const float* up, float* out, int64_t n, Stream stream);
// ---- bias add, column fill (elementwise.cu) -------------------------------------------------------------------------
// rows[r][j] += bias[j] for r < n_rows, j < width (the Q/K/V biases of qwen2).
void add_bias(float* rows, const float* bias, int n_rows, int width, Stream stream);
// x[i] *= factor for i < n (gemma's sqrt(dim) on the token embeddings).
void scale(float* x, int64_t n, float factor, Stream stream);
// rows[r][j] = cap * tanh(rows[r][j] / cap) for r < n_rows, j < width, rows `stride` floats apart (gemma2's
// soft-capped logits); -inf stays -inf (the logits a restriction leaves out).
void soft_cap(float* rows, int n_rows, size_t stride, int width, float cap, Stream stream);
// The first `dims` elements of each of `rows` rows of `width` floats multiplied by factor: RoPE's amplitude
// (rope.scaling.attn_factor) on the dims it rotates, applied before rope_kv_write (a rotation is linear, so this
// is the rotation by cos and sin times the factor, as ggml and the CPU backend compute it, up to rounding).
void scale_leading(float* x, int rows, int width, int dims, float factor, Stream stream);
// rows[r][j] = value for r < n_rows, begin <= j < end, rows `stride` floats apart (-inf for the logits that
// restricted logits leave out).
void fill_columns(float* rows, int n_rows, size_t stride, int begin, int end, float value, Stream stream);

// ---- quantized matrix-vector products (matvec.cu) --------------------------------------------------------------
constexpr int kMatvecMaxTokens = 16;
bool matvec_supports(GgmlType type);  // F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K
// How the block types' kernels read W. Direct: a warp per row, each lane loading its 2-4 bytes of a block from
// global memory. Staged: each warp copies its row into shared memory, 2 KiB at a time with 16-byte loads issued
// together, and the lanes decode the copy; bitwise the direct sums. Split: a row's walk divided among a block's four
// warps (4x the warps in flight, each a quarter of the row), the partial sums added in warp order: another order
// than direct, fixed by the row width, so still bitwise the same for any token count, launch or row subset.
// Persistent: staged, with only as many blocks as the device holds at once, each walking rows of the grid one after
// another and requesting the next row's first chunk before it decodes the current row's last, where a staged
// launch would take more than one wave (else the staged kernel); bitwise the staged (so the direct) sums. (F32, F16
// and BF16 always load directly.)
enum class MatvecLoads { Direct, Staged, Split, Persistent };
constexpr MatvecLoads kAllMatvecLoads[] = {MatvecLoads::Direct, MatvecLoads::Staged, MatvecLoads::Split,
                                           MatvecLoads::Persistent};
inline const char* matvec_loads_name(MatvecLoads loads) {  // as --cuda-route matvec spells it
    switch (loads) {
        case MatvecLoads::Staged: return "staged";
        case MatvecLoads::Split: return "split";
        case MatvecLoads::Persistent: return "persistent";
        case MatvecLoads::Direct: break;
    }
    return "direct";
}
// y[t][r] = dot(row r of W, x[t]) for t < n_tokens (<= kMatvecMaxTokens), r < rows. x is [n_tokens][cols] and must
// be 16-byte aligned; W 16-byte aligned (rows are row_bytes apart). y's rows are y_stride floats apart (0: rows),
// so the first rows of a matrix can write into rows as wide as the whole (restricted logits).
// xq: null, or x quantized for this type (quantize_activations below): then a type with an 8-bit route
// (matvec_q8_supports) computes through it and x is not read; other types read x either way.
void matvec(GgmlType type, const void* W, size_t row_bytes, int rows, int cols, const float* x, int n_tokens, float* y,
            Stream stream, size_t y_stride = 0, MatvecLoads loads = MatvecLoads::Direct, const void* xq = nullptr);
// The rows of W named by row_ids (device memory, n_ids >= 1 ids below W's rows, not checked on the device):
// y[t][row_ids[i]] = dot(row row_ids[i] of W, x[t]), y's rows y_stride floats apart; nothing else is written. Each
// is bitwise the value matvec computes for that row (the same kernel and sum).
void matvec_rows(GgmlType type, const void* W, size_t row_bytes, int cols, const int* row_ids, int n_ids,
                 const float* x, int n_tokens, float* y, size_t y_stride, Stream stream,
                 MatvecLoads loads = MatvecLoads::Direct, const void* xq = nullptr);

// Several matrices of one width applied to the same x in one launch (Q, K and V; gate and up): for each target,
// y[t][r] = dot(row r of W, x[t]) (+ bias[r] when bias is set; device memory), y's rows `rows` floats apart.
// Bitwise the separate matvec calls (followed by add_bias): every row is computed by its type's walk. The targets
// are of one type, or (MatvecTypes with `last`) the last of another: llama.cpp's quantization mixtures give attn_v
// more bits than attn_q and attn_k in some layers (Q4_K_M: Q6_K beside Q4_K in half of them; Q8_0 beside Q5_0 where
// rows are not whole super-blocks), and one launch still takes the three where matvec_types_fuse(type, last).
constexpr int kMatvecMaxTargets = 3;
struct MatvecTypes {
    GgmlType type;  // every target's but the last
    GgmlType last;  // the last target's
    MatvecTypes(GgmlType t) : type(t), last(t) {}  // NOLINT(google-explicit-constructor): one type, the usual case
    MatvecTypes(GgmlType t, GgmlType l) : type(t), last(l) {}
};
// True for type == last, and for the pairs with kernels of their own (Q4_K + Q6_K, Q5_0 + Q8_0): on both activation
// routes (their two types read one format) and every load (persistent as staged: the same sums).
bool matvec_types_fuse(GgmlType type, GgmlType last);
struct MatvecTarget {
    const void* W;  // 16-byte aligned
    size_t row_bytes;
    int rows;
    float* y;
    const float* bias;  // null: none
};
void matvec_multi(MatvecTypes types, const MatvecTarget* targets, int n_targets, int cols, const float* x,
                  int n_tokens, Stream stream, MatvecLoads loads = MatvecLoads::Direct, const void* xq = nullptr);
// Q, K and V (qkv[0..2], as matvec_multi) followed by rope_kv_write(rope), bitwise the two calls: rope's q, k and
// v are the targets' y, whole heads (n_heads, n_kv_heads and n_kv_heads of rope.head_dim rows), rope.n_tokens is
// n_tokens. Where matvec_rope_in_launch (rope.trig set, head_dim a multiple of 4, a Q8_0 cache's blocks within
// heads, loads other than persistent for the block types) and with `counters` (matvec_rope_counters(rope)
// unsigneds of device memory, zero before the first call; each call leaves them zero), in one launch: the last
// block to write a head's rows rotates it in place (Q) or into the cache (K), or stores it there (V), with
// rope_kv_write's functions and the angles of rope.trig (one launch fewer a layer; the table is made once a step);
// otherwise rope_kv_write runs after the matvec launch.
struct RopeKvArgs;  // (rope_kv.cu, below)
size_t matvec_rope_counters(const RopeKvArgs& rope);
bool matvec_rope_in_launch(GgmlType type, MatvecLoads loads, const RopeKvArgs& rope);
void matvec_qkv_rope(MatvecTypes types, const MatvecTarget* qkv, int cols, const float* x, int n_tokens,
                     Stream stream, MatvecLoads loads, const void* xq, const RopeKvArgs& rope, unsigned* counters);
// y = W x (matvec) followed by add_rms_norm(norm.x, y, norm.weight, norm.out, n_tokens, rows, norm.eps, stream,
// norm.q8_for, norm.xq), bitwise the two calls: a residual add and the norm after it (attn_output's, ffn_down's).
// Where matvec_norm_in_launch (one token; rows a multiple of 4, at most 16,384; y, norm.x, weight and out 16-byte
// aligned; not Q5_K, nor Q6_K with xq, whose walks have no registers to spare) and with `counter` (one unsigned of
// device memory, zero before the first call; each call leaves it zero), in one launch: its last block to finish
// adds and normalizes the row with add_rms_norm's arithmetic, in its order (one launch fewer after each of those
// matrices); otherwise add_rms_norm runs after the matvec launch.
struct AddRmsNormArgs {
    float* x;             // [n_tokens][rows]: the residual stream, x += y (written back)
    const float* weight;  // [rows]
    float* out;           // [n_tokens][rows]
    float eps;
    GgmlType q8_for = GgmlType::F32;  // with xq: out also quantized, as add_rms_norm's
    void* xq = nullptr;
};
bool matvec_norm_in_launch(GgmlType type, const void* xq, int rows, int n_tokens, const float* y,
                           const AddRmsNormArgs& norm);
void matvec_add_rms_norm(GgmlType type, const void* W, size_t row_bytes, int rows, int cols, const float* x,
                         int n_tokens, float* y, Stream stream, MatvecLoads loads, const void* xq,
                         const AddRmsNormArgs& norm, unsigned* counter);
// The FFN's gate and up matrices (one type and shape) with SwiGLU applied in the same launch: out[t][r] =
// silu(dot(row r of W_gate, x[t])) * dot(row r of W_up, x[t]), out's rows `rows` floats apart. Bitwise matvec_multi
// of the two followed by swiglu(): the same kernels compute the products and swiglu's expression combines them,
// without the products going through memory or a second launch.
// With `quant.out`, also the output quantized for the 8-bit matvec of `quant.q8_for` that reads it next, bitwise
// quantize_activations(quant.q8_for, out, rows, n_tokens, quant.out): for a Q8_1 type (the 32-element ones) in the
// launch itself on the 8-bit route (xq given) with staged or persistent loads and `quant.counters`
// (matvec_swiglu_counters(rows) unsigneds of device memory, zero before the first call; each call leaves them
// zero), by the last block to write each Q8_1 block's rows; otherwise (Q8_K for the k-quants too) by a quantize
// launch after it. quant.out must not overlap xq: the launch reads xq while
// its last blocks write quant.out.
struct SwigluQuant {
    GgmlType q8_for = GgmlType::F32;  // a type of the 8-bit route (matvec_q8_supports) when `out` is set
    void* out = nullptr;
    unsigned* counters = nullptr;
};
size_t matvec_swiglu_counters(int rows);
void matvec_swiglu(GgmlType type, const void* W_gate, const void* W_up, size_t row_bytes, int rows, int cols,
                   const float* x, int n_tokens, float* out, Stream stream, MatvecLoads loads = MatvecLoads::Direct,
                   const void* xq = nullptr, const SwigluQuant& quant = {});

// ---- 8-bit activations (matvec_q8.cu) -------------------------------------------------------------------------------
// The integer route of matvec for the block types, as the CPU backend computes them (cpu/quant_q8.h) and as
// llama.cpp's mmvq does: each token's x is quantized once into 8-bit blocks, and a lane's products with a weight
// block's codes are an exact integer sum (dp4a, four byte products per instruction) scaled by the two blocks' scales.
// The formats: Q8_1 (36-byte blocks of 32: fp16 d, fp16 s = d * sum of the codes, 32 codes) for the 32-element
// types, whose codes and d are bitwise the CPU's Q8_0 / Q8_1 blocks; Q8_K (292-byte blocks of 256: fp32 d, 256
// codes, 16 sums of 16 codes), bitwise the CPU's, for the k-quants. The integer sums equal the CPU's, so a product
// differs from the CPU backend's only by the order its per-block float terms are added in.
bool matvec_q8_supports(GgmlType type);  // Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K
// The activation format a type's route reads (None: no route); types of one format share a quantized x.
enum class Q8Format { None, Q8_1, Q8_K };
Q8Format q8_activation_format(GgmlType type);
// Bytes of one token's quantized row of `cols` columns for `type` (cols a multiple of the type's block columns).
size_t q8_activation_row_bytes(GgmlType type, int cols);
// xq[t] = the quantized x[t] for t < n_tokens (any count), rows q8_activation_row_bytes(type, cols) apart; x
// 16-byte aligned, xq 4-byte aligned.
void quantize_activations(GgmlType type, const float* x, int cols, int n_tokens, void* xq, Stream stream);

// ---- prefill GEMM (gemm.cu) ----------------------------------------------------------------------------------------
// y[t][r] = dot(row r of W, x[t]) for any n_tokens >= 1 (a prefill chunk) and every matvec type: a tiled SIMT
// kernel (64 rows x 64 tokens per block) that dequantizes weight tiles into shared memory and accumulates in fp32.
// Each output is a sum over k in ascending order whatever its tile, so y[t][r] is bitwise the same for any
// n_tokens and any place of token t in the batch (but not bitwise equal to matvec's lane-split sums).
// x is [n_tokens][cols]; W 16-byte aligned.
bool gemm_supports(GgmlType type);  // the types of matvec_supports
void gemm(GgmlType type, const void* W, size_t row_bytes, int rows, int cols, const float* x, int n_tokens, float* y,
          Stream stream);

// The fp16 route, fast on a real GPU: weight rows dequantized to fp16 tiles, activations converted to fp16, and a
// GEMM over fp16 operands with fp32 accumulation: cuBLAS (tensor cores) in the nvcc build, or the SIMT kernel over
// fp16 tiles (gemm_f16), which computes the same products and is what the emulation runs and tests.
// out[i][e] = fp16(element e of row row0 + i of W) for i < n_rows, e < cols (row-major, cols apart).
void dequantize_f16(GgmlType type, const void* W, size_t row_bytes, int row0, int n_rows, int cols, uint16_t* out,
                    Stream stream);
// out[i] = fp16(x[i]) (round to nearest even; beyond the fp16 range becomes +-inf).
void convert_f16(const float* x, size_t n, uint16_t* out, Stream stream);
// y[t * ldy + r] = dot(W16 row r, x16[t]) for r < rows, t < n_tokens: W16 rows are ldw halves apart, x16 rows cols.
void gemm_f16(const uint16_t* W16, int ldw, int rows, int cols, const uint16_t* x16, int n_tokens, float* y, int ldy,
              Stream stream);

// cuBLAS, nvcc build only: an opaque handle bound to one stream. Under the emulation blas_available() is false
// and blas_create throws std::invalid_argument; nothing else in the emulation refers to cuBLAS.
struct BlasHandle;
bool blas_available();
BlasHandle* blas_create(Stream stream);
void blas_destroy(BlasHandle* handle) noexcept;

// The whole fp16 route for one weight matrix: y[t][r] = dot(row r of W, x[t]) with x16 = convert_f16(x). F16
// weights are used in place; F32 weights with a handle are an fp32 cuBLAS GEMM on x (no fp16 rounding); any other
// type is dequantized `tile_elems` halves at a time (whole rows, at least one) into `tile`. `blas` null: every
// product runs on gemm_f16 (F32 on gemm), the emulated mirror of the cuBLAS calls.
void gemm_via_f16(BlasHandle* blas, GgmlType type, const void* W, size_t row_bytes, int rows, int cols, const float* x,
                  const uint16_t* x16, int n_tokens, float* y, uint16_t* tile, size_t tile_elems, Stream stream);

// The 8-bit tensor-core route (gemm_q8.cu; CudaOptions::int8_gemm): y[t][r] = dot(row r of W, x[t]) with x given
// as Q8_1 blocks (xq = quantize_activations(<any 32-element type>, x, ...), rows cols / 32 * 36 bytes apart; the
// k-quants read Q8_1 here too, not matvec's Q8_K) and the weight blocks' codes multiplied as int8 on tensor cores
// (mma.sync m16n8k32; sm_80 and later), each 32-element block's exact integer sum scaled by d_w d_x, plus m_w s_x
// for the types with an offset; Q2_K, Q3_K and Q6_K, which scale every 16 elements, through two m16n8k16 per block
// (Q2_K's offset times each half's own sum of x's codes). Within float rounding of integer products over the same
// blocks. W 2-byte aligned, xq 4-byte aligned, cols whole blocks of the type.
bool gemm_q8_supports(GgmlType type);  // Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
void gemm_q8(GgmlType type, const void* W, size_t row_bytes, int rows, int cols, const void* xq, int n_tokens,
             float* y, Stream stream);

// ---- KV-cache storage (written by rope_kv.cu, read by attention.cu and attention_prefill.cu) -----------------------
// A layer's cache is [capacity] rows, one per position, of kv_row_bytes(type, kv_dim) bytes each:
//  F16:  kv_dim IEEE binary16 values;
//  Q8_0: the same kv_dim values as ggml Q8_0 blocks (34 bytes: an fp16 scale d, then 32 int8 codes; value = d *
//        code), quantized as ggml's quantize_row_q8_0_ref does (d = amax / 127, code = round(x * (1 / d)), the codes
//        from the fp32 d). Blocks run along the position's row, so heads narrower than 32 share blocks, and kv_dim
//        must be a multiple of 32. d * code is exact in fp32 (11 + 8 significant bits), so every reader sees the
//        same dequantized values whatever the order it multiplies in.
enum class KvType { F16, Q8_0 };
size_t kv_row_bytes(KvType type, int kv_dim);
bool kv_type_supports(KvType type, int kv_dim);  // Q8_0: kv_dim % 32 == 0

// ---- RoPE fused with the KV-cache write (rope_kv.cu) --------------------------------------------------------------
enum class RopeMode { AdjacentPairs, NeoxHalves };  // (2i, 2i+1) as llama2.c; (i, i + rope_dim/2) as GPT-NeoX
struct RopeKvArgs {
    float* q;                 // [n_tokens][n_heads * head_dim], rotated in place
    const float* k;           // [n_tokens][n_kv_heads * head_dim], rotated into k_cache
    const float* v;           // [n_tokens][n_kv_heads * head_dim], copied into v_cache
    void* k_cache;            // this layer's cache: [capacity] rows of kv_row_bytes(kv_type, kv_dim)
    void* v_cache;
    const float* inv_freq;    // [rope_dim / 2]: ModelConfig::rope_inv_freq (theta^(-2i/rope_dim), ...) as floats
    int n_tokens, start_pos;  // token i is at position start_pos + i
    int n_heads, n_kv_heads, head_dim, rope_dim;  // rope_dim 0 (rope_kv_write only): no rotation, the cache write
    RopeMode mode;
    KvType kv_type = KvType::F16;
    // CUDA graphs: when set, the kernel reads the start position from this device int when it runs (and ignores
    // start_pos), so a captured launch replays at whatever position the int holds then. A by-value start_pos would
    // be frozen into the graph at capture.
    const int* device_start_pos = nullptr;
    // > 0 (rope_kv_write only): the cache is a ring of this many rows, position p in row p % ring.
    int ring = 0;
    // The step's cosines and sines, from rope_trig_table: what matvec_qkv_rope's in-launch epilogue reads (the
    // matvec kernels do not compute them); rope_kv_write computes its own and ignores this.
    const float* trig = nullptr;
};
void rope_kv_write(const RopeKvArgs& a, Stream stream);
// table[t][i] = {cos, sin} of token t's angle for pair i (float(start position + t) * inv_freq[i]) for the n_tokens
// of `a`: bitwise the values rope_kv_write computes. rope_trig_floats(a) floats, 8-byte aligned.
size_t rope_trig_floats(const RopeKvArgs& a);
void rope_trig_table(const RopeKvArgs& a, float* table, Stream stream);

// ---- embedding gather (embedding.cu) -----------------------------------------------------------------------------
bool embedding_supports(GgmlType type);  // the types of matvec_supports
// out[i] = row tokens[i] of the table, dequantized. Out-of-range ids give a NaN row.
void embedding(GgmlType type, const void* table, size_t row_bytes, int n_vocab, int dim, const int* tokens,
               int n_tokens, float* out, Stream stream);

// ---- decode attention (attention.cu) ----------------------------------------------------------------------------
// Causal GQA attention of n_tokens queries over a cache that already holds their keys and values: query i
// (position start_pos + i) attends to positions 0..start_pos + i. Split-K ("flash decoding"): the keys are cut
// into splits of split_size positions, each block computes a partial softmax for one (token, head, split) into
// `workspace`, and a second kernel combines the splits. head_dim is 1..256 (lanes idle past it: fastest at 32, 64, 128, 256).
struct AttentionArgs {
    const float* q;            // [n_tokens][n_heads * head_dim], RoPE applied
    const void* k_cache;       // [capacity] rows of kv_row_bytes(kv_type, n_kv_heads * head_dim)
    const void* v_cache;
    float* out;                // [n_tokens][n_heads * head_dim]
    float* workspace;          // attention_workspace_floats(...) floats
    int n_tokens, start_pos;
    int n_heads, n_kv_heads, head_dim;
    int split_size;            // key positions per split (> 0)
    KvType kv_type = KvType::F16;
    float scale = 0.0f;  // scores = scale * q.k; 0: 1 / sqrt(head_dim)
    // > 0: a query at position p sees only the keys at p - window + 1 .. p (a sliding-window layer); 0: all before it.
    int window = 0;
    // > 0 (gemma2): scores are soft-capped, s -> softcap * tanh(s * inv_softcap), before the softmax; inv_softcap is
    // 1 / softcap (given, as a division in the kernels would bring its slow-path subroutine).
    float softcap = 0.0f, inv_softcap = 0.0f;
    // > 0: the cache is a ring of this many rows, position t in row t % ring (a sliding-window layer's): at least
    // window + the call's tokens - 1 rows, and a multiple of attention_ring_multiple(split_size), so that every
    // split (split-K) and key tile (prefill) lies in consecutive rows. 0: position t in row t.
    int ring = 0;
    // CUDA graphs (attention only; attention_prefill ignores it): when set, the start position is read from this
    // device int when the kernels run, and start_pos is only a bound it never exceeds: the grid (and the workspace)
    // is sized for start_pos, and splits past a token's last key return at once. A captured launch then replays
    // correctly at any position up to the bound, with the same results as a launch sized for the real position.
    const int* device_start_pos = nullptr;
    // Optional (attention only): n_tokens * n_heads counters in device memory, zero before the launch and zero
    // again after it. With them the split kernel's last block of each (token, head) combines the splits itself
    // (one launch instead of two); without them a combine kernel follows. The results are the same bits.
    unsigned* split_counters = nullptr;
    // Optional (attention only; the 8-bit matvec route of the output projection): with q8_for a type whose inputs
    // are Q8_1 blocks (the 32-element types) and head_dim 32, 64, 96 or 128, out is also written quantized into
    // q8_out, bitwise quantize_activations(q8_for, out, ...): each (token, head)'s combine quantizes its own blocks,
    // which saves the launch. (A k-quant's Q8_K block spans heads.)
    GgmlType q8_for = GgmlType::F32;
    void* q8_out = nullptr;
};
// The quantized output above is possible: q8_for's inputs are Q8_1 blocks and head_dim is 32, 64, 96 or 128.
bool attention_quantizes_for(GgmlType q8_for, int head_dim);
size_t attention_workspace_floats(int n_tokens, int start_pos, int n_heads, int head_dim, int split_size);
// What a ring's row count must be a multiple of (AttentionArgs::ring): the split size and the prefill kernel's key
// tile (32 positions at most), so that a split or a tile starting at a multiple of its size never wraps.
int attention_ring_multiple(int split_size);
void attention(const AttentionArgs& a, Stream stream);

// ---- prefill attention (attention_prefill.cu) ------------------------------------------------------------------
// The causal GQA attention of `attention` for prefill chunks, tiled flash attention: one block per (query tile,
// head) walks key tiles of the cache (either KvType) with an online softmax (running max and sum) in fp32; the kv
// head is indexed, not copied. No workspace (a.workspace and a.split_size are ignored). head_dim 1..256 (tiles sized for
// 32, 64, 128 and 256). A query's result does not depend on its tile or n_tokens: key tiles always start at
// position 0 and a tile past a query's last key leaves its state exactly as it was.
void attention_prefill(const AttentionArgs& a, Stream stream);

// ---- the persistent decode step (decode_step.cu) --------------------------------------------------------------
// One token through every layer in one cooperative launch (every block resident, grid-wide barriers between the
// phases: decode_step.cu's comment), from the embedded token in x to the output norm's input and output; the output
// head stays the matvec launches above. Each weight row is computed with matvec's one-token walk of its type; the
// norms' and attention's sums are in other orders than rms_norm's and attention's, so the step is within float
// rounding of those launches, not bitwise: a backend uses it where that does not matter (a draft's steps, whose
// proposals the target verifies) or everywhere when asked (CudaOptions::persistent_step).
struct DecodeMatrix {
    const void* data;  // GGUF rows, row_bytes apart, 16-byte aligned
    size_t row_bytes;
    GgmlType type;     // decode_step_supports(type, cols)
};
struct DecodeStepLayer {
    DecodeMatrix wq, wk, wv, wo, gate, up, down;
    const float* attn_norm;
    const float* ffn_norm;
    const float *bq, *bk, *bv;  // null: no bias
    void* k_cache;              // this layer's fp16 cache, rows of n_kv_heads * head_dim
    void* v_cache;
};
constexpr int kDecodeStepMaxHeadDim = 128;
constexpr int kDecodeStepMaxHeads = 256;  // n_heads + 2 * n_kv_heads
struct DecodeStepShape {
    int n_layers, dim, hidden_dim, n_heads, n_kv_heads, head_dim;
    KvType kv_type = KvType::F16;
};
// How a step reads the block types' weight rows: staged through shared memory (each warp's next chunk, or next row's
// first, in flight while it walks the current one) by one of two kernels, or directly (each lane loads its share as
// it walks); the same sums. A kernel inlines the walk of each type it stages, and ptxas kept one within its
// registers only for some types together (decode_step.cu), hence two staged kernels:
//   StagedQ4K: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K (the legacy types' files and Q4_K_M's mixtures);
//   StagedQ5K: Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (Q5_K_M's and Q4_K_S's).
// The float types walk directly in both. A model with Q2_K or Q3_K rows takes Direct (CudaBackend: so does one of
// float types only, the same sums without the stage).
// With 8-bit activations (matvec_q8's walks), two kernels of two types each (ptxas spilled any three):
//   Int8Q4_0: Q4_0, Q8_0 (those types' files);  Int8Q4K: Q4_K, Q6_K (Q4_K_M's where rows are whole super-blocks).
// Each block quantizes a phase's input in its shared memory to the Q8_1 / Q8_K rows its matrices read: a quarter of
// the fp32 activation bytes that each weight row's walk otherwise reads from shared memory (a 4-bit row 7x its own
// bytes). Within float rounding of the 8-bit launches (CudaOptions::int8_activations), not bitwise (the norms'
// order of summation).
enum class DecodeStepRows { Direct, StagedQ4K, StagedQ5K, Int8Q4_0, Int8Q4K };
// Whether the kernel of `rows` takes rows of `type` (Direct: every decode_step_supports type).
bool decode_step_stages(DecodeStepRows rows, GgmlType type);
bool decode_step_int8(DecodeStepRows rows);  // the Int8* kernels
const char* decode_step_rows_name(DecodeStepRows rows);  // "staged, Q4_K set", ..., "walked directly"
// What a launch takes: the grid (every block resident), shared memory, and the attention workspace it needs.
struct DecodeStepPlan {
    int blocks = 0, threads = 0;
    DecodeStepRows rows = DecodeStepRows::StagedQ4K;
    size_t shared_bytes = 0;
    int max_splits = 0;           // key splits per head at most
    size_t workspace_floats = 0;  // DecodeStepArgs::workspace
};
struct DecodeStepArgs {
    const DecodeStepLayer* layers;  // device memory, n_layers of them
    int n_layers, dim, hidden_dim, n_heads, n_kv_heads, head_dim, rope_dim;
    RopeMode mode;
    float eps;                 // RMSNorm epsilon
    const float* inv_freq;     // as RopeKvArgs
    const float* trig;         // rope_trig_table of this step's one token
    const float* output_norm;  // [dim]
    const int* device_pos;     // the token's position, read when the kernel runs (CUDA graphs)
    float* x;                  // [dim]: the embedded token in, the residual stream after the last layer out
    float* out;                // [dim]: RMSNorm(x) * output_norm
    float *q, *k, *v, *att, *h;  // scratch: [n_heads * head_dim], [kv dim], [kv dim], [n_heads * head_dim], [hidden]
    float* workspace;            // DecodeStepPlan::workspace_floats
    unsigned* head_counters;     // [n_heads], zero before a launch and left zero by it
    unsigned* rope_counters;     // [n_heads + 2 n_kv_heads], the same
};
// head_dim <= 128, n_heads a multiple of n_kv_heads, n_heads + 2 n_kv_heads <= 256, an fp16 cache
bool decode_step_supports(const DecodeStepShape& shape);
bool decode_step_supports(GgmlType type, int cols);       // matvec's types, rows of whole blocks
// The launch for `shape` on this device: `blocks` (0: two per SM) capped at what a cooperative launch may have, the
// rows read as `rows` says (the caller checks decode_step_stages for every matrix).
DecodeStepPlan decode_step_plan(const DecodeStepShape& shape, int blocks = 0,
                                DecodeStepRows rows = DecodeStepRows::StagedQ4K);
void decode_step(const DecodeStepArgs& a, const DecodeStepPlan& plan, Stream stream);

// ---- sampling (sampling.cu) ------------------------------------------------------------------------------------
// Rows are [n_rows][n_vocab] fp32 logits (n_rows <= 65535), ordered and cleaned as Sampler (src/sample/sampler.cpp) does:
// NaN counts as -inf, equal logits rank by lower id. `workspace` is sampling_workspace_bytes(n_rows, n_vocab) of
// device memory (8-byte aligned), enough for any of these calls on that shape; it is scratch between the kernels
// of one call.
// The most candidates top_k returns per row: a sampler's top-k plus the distinct ids of a repeat penalty's window
// (40 + 64 with the defaults; Backend::forward_candidates). At most the kernels' block size (256): the final ranking
// gives each candidate a thread.
constexpr int kTopKMax = 256;
size_t sampling_workspace_bytes(int n_rows, int n_vocab);
// out_ids[r] = the id of row r's largest logit, the lowest on ties (Sampler's greedy pick); -1 when every logit of
// the row is -inf or NaN (where Sampler throws). With `counters` (argmax_counters(n_rows) unsigneds of device memory,
// zero before the first call; each call leaves them zero) in one launch, the last block of each row combining its
// splits; else two.
size_t argmax_counters(int n_rows);
void argmax(const float* logits, int n_rows, int n_vocab, int* out_ids, void* workspace, Stream stream,
            unsigned* counters = nullptr);
// argmax, and out_top[r] = the largest probability of row r under a plain softmax (temperature 1):
// 1 / sum(exp(l - max)), summed in double (NaN for a row without a logit above -inf). A greedy draft's confidence.
// With `counters` (as argmax's) in one launch instead of three: each split sums against its own max and the row's
// last block scales the splits' sums to the row's max, which moves the total by float rounding (a term exp(l - m_s)
// * exp(m_s - m) instead of exp(l - m)); the ids are the same.
void argmax_top_probability(const float* logits, int n_rows, int n_vocab, int* out_ids, float* out_top,
                            void* workspace, Stream stream, unsigned* counters = nullptr);
// probs[r] = softmax(logits[r] / temperature) in Sampler::softmax's operation order: m = max, e = (l == m ? 1 :
// exp((l - m) / temperature)), summed in double, p = float(e * (1.0 / sum)). temperature 0 gives the greedy one-hot
// row (Sampler::distribution's); a row whose logits are all -inf / NaN comes out NaN. No top-k / top-p / min-p /
// penalty: the full-vocabulary distribution of a sampler with those off. probs may not alias logits.
void softmax(const float* logits, int n_rows, int n_vocab, float temperature, float* probs, void* workspace,
             Stream stream);
// The k (1..min(kTopKMax, n_vocab)) largest logits of each row and their ids, best first: out_logits / out_ids are
// [n_rows][k]. Exactly Sampler::top_k's candidates in its order (a NaN logit is reported as -inf).
void top_k(const float* logits, int n_rows, int n_vocab, int k, float* out_logits, int* out_ids, void* workspace,
           Stream stream);
// out[r] = rows[r][ids[r]] (NaN for an id outside 0..n_vocab-1): p(x_i) and q(x_i) of drafted tokens.
void gather_rows(const float* rows, int n_rows, int n_vocab, const int* ids, float* out, Stream stream);
// out[r][j] = rows[r][ids[j]] for j < n_ids (NaN for an id outside 0..n_vocab-1; nothing for n_ids = 0): the raw
// logits of given tokens in every row, e.g. a repeat penalty's window beside the top_k candidates.
void gather_columns(const float* rows, int n_rows, int n_vocab, const int* ids, int n_ids, float* out, Stream stream);
// out[i] = max(0, p[i] - q[i]): the residual distribution of a rejected draft, unnormalised, as verify_proposal.
void residual(const float* p, const float* q, float* out, int n, Stream stream);

}  // namespace tandem::cuda
