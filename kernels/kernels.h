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

#include "ggml_types.h"

namespace tandem::cuda {

using Stream = void*;

// ---- RMSNorm (rms_norm.cu) ----------------------------------------------------------------------------------------
// out[r] = weight * (x[r] / sqrt(mean(x[r]^2) + eps)) for rows x cols, in the CPU backend's operation order.
void rms_norm(const float* x, const float* weight, float* out, int rows, int cols, float eps, Stream stream);
// x[r] += residual[r] (written back), then out[r] = rms_norm(x[r]): the residual add fused into the norm.
void add_rms_norm(float* x, const float* residual, const float* weight, float* out, int rows, int cols, float eps,
                  Stream stream);

// ---- SwiGLU (swiglu.cu) ---------------------------------------------------------------------------------------------
// out[i] = silu(gate[i]) * up[i]; out may alias gate.
void swiglu(const float* gate, const float* up, float* out, int64_t n, Stream stream);

// ---- bias add (elementwise.cu) -----------------------------------------------------------------------------------
// rows[r][j] += bias[j] for r < n_rows, j < width (the Q/K/V biases of qwen2).
void add_bias(float* rows, const float* bias, int n_rows, int width, Stream stream);

// ---- quantized matrix-vector products (matvec.cu) --------------------------------------------------------------
constexpr int kMatvecMaxTokens = 16;
bool matvec_supports(GgmlType type);  // F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K
// y[t][r] = dot(row r of W, x[t]) for t < n_tokens (<= kMatvecMaxTokens), r < rows. x is [n_tokens][cols] and must
// be 16-byte aligned; W 16-byte aligned (rows are row_bytes apart).
void matvec(GgmlType type, const void* W, size_t row_bytes, int rows, int cols, const float* x, int n_tokens, float* y,
            Stream stream);

// ---- RoPE fused with the KV-cache write (rope_kv.cu) --------------------------------------------------------------
enum class RopeMode { AdjacentPairs, NeoxHalves };  // (2i, 2i+1) as llama2.c; (i, i + rope_dim/2) as GPT-NeoX
struct RopeKvArgs {
    float* q;                 // [n_tokens][n_heads * head_dim], rotated in place
    const float* k;           // [n_tokens][n_kv_heads * head_dim], rotated into k_cache
    const float* v;           // [n_tokens][n_kv_heads * head_dim], copied into v_cache
    uint16_t* k_cache;        // this layer's cache: [capacity][n_kv_heads * head_dim] fp16
    uint16_t* v_cache;
    const float* inv_freq;    // [rope_dim / 2]: theta^(-2i/rope_dim), computed in double, rounded to float
    int n_tokens, start_pos;  // token i is at position start_pos + i
    int n_heads, n_kv_heads, head_dim, rope_dim;
    RopeMode mode;
};
void rope_kv_write(const RopeKvArgs& a, Stream stream);

// ---- embedding gather (embedding.cu) -----------------------------------------------------------------------------
bool embedding_supports(GgmlType type);  // the types of matvec_supports
// out[i] = row tokens[i] of the table, dequantized. Out-of-range ids give a NaN row.
void embedding(GgmlType type, const void* table, size_t row_bytes, int n_vocab, int dim, const int* tokens,
               int n_tokens, float* out, Stream stream);

// ---- decode attention (attention.cu) ----------------------------------------------------------------------------
// Causal GQA attention of n_tokens queries over an fp16 cache that already holds their keys and values: query i
// (position start_pos + i) attends to positions 0..start_pos + i. Split-K ("flash decoding"): the keys are cut
// into splits of split_size positions, each block computes a partial softmax for one (token, head, split) into
// `workspace`, and a second kernel combines the splits. head_dim is 1..256 (lanes idle past it: fastest at 32, 64, 128, 256).
struct AttentionArgs {
    const float* q;            // [n_tokens][n_heads * head_dim], RoPE applied
    const uint16_t* k_cache;   // [capacity][n_kv_heads * head_dim]
    const uint16_t* v_cache;
    float* out;                // [n_tokens][n_heads * head_dim]
    float* workspace;          // attention_workspace_floats(...) floats
    int n_tokens, start_pos;
    int n_heads, n_kv_heads, head_dim;
    int split_size;            // key positions per split (> 0)
};
size_t attention_workspace_floats(int n_tokens, int start_pos, int n_heads, int head_dim, int split_size);
void attention(const AttentionArgs& a, Stream stream);

}  // namespace tandem::cuda
