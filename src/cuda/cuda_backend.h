// The CUDA backend: the whole llama forward pass through the kernels of kernels/ (weights uploaded once as they are
// in the GGUF, fp32 activations, fp16 KV cache on the device). Plain C++: it sees the kernels only through
// kernels/kernels.h and kernels/device.h. The same source is linked twice (src/cuda/CMakeLists.txt): against
// tandem_cuda (nvcc, a real GPU) into tandem_cuda_backend, and against tandem_cuda_emu (the CPU emulation of CUDA)
// into tandem_cuda_backend_emu, which the tests run against CpuBackend without a GPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "device.h"
#include "ggml_types.h"

namespace tandem {

struct Model;
struct ModelConfig;
struct Weights;

class CudaKvCache : public KvCache {
public:
    CudaKvCache(int n_layers, int capacity, int kv_dim);
    // Device pointers to `layer`'s keys / values: [capacity][kv_dim] fp16 bits.
    uint16_t* key(int layer) const { return k_.as<uint16_t>() + layer_offset(layer); }
    uint16_t* value(int layer) const { return v_.as<uint16_t>() + layer_offset(layer); }
    static size_t bytes_needed(int n_layers, int capacity, int kv_dim) {
        return 2 * sizeof(uint16_t) * static_cast<size_t>(n_layers) * capacity * kv_dim;
    }

private:
    size_t layer_offset(int layer) const { return static_cast<size_t>(layer) * capacity() * kv_dim_; }
    int kv_dim_;
    cuda::DeviceBuffer k_, v_;
};

// Device bytes the backend needs, decided before anything is allocated.
struct CudaMemoryPlan {
    size_t weights = 0;   // every tensor once (a tied output shares the embedding's bytes)
    size_t kv_cache = 0;  // one cache of n_ctx positions
    size_t scratch = 0;   // activations of one 16-token step, logits, attention workspace for n_ctx
    size_t total() const { return weights + kv_cache + scratch; }
    std::string describe() const;  // "1.23 GiB (weights ..., KV cache ..., scratch ...)"
};

class CudaBackend : public Backend {
public:
    // Tokens per internal step: the matvec kernels' limit. Longer calls are split into steps of this many.
    static constexpr int kStepTokens = cuda::kMatvecMaxTokens;
    // Key positions per attention split (split-K).
    static constexpr int kAttentionSplit = 64;

    // Plans memory for weights + one cache of `n_ctx` positions + scratch, compares it with the device's free
    // memory (throws tandem::Error naming both figures when it does not fit; nothing is allocated then), then
    // uploads the weights. Throws tandem::Error for a tensor type the kernels cannot handle.
    CudaBackend(const Model& model, int n_ctx);
    ~CudaBackend() override;
    static CudaMemoryPlan plan(const Model& model, int n_ctx);

    std::string name() const override { return cuda::device_is_emulated() ? "cuda-emu" : "cuda"; }
    std::unique_ptr<KvCache> new_cache(int n_ctx) override;
    void forward(std::span<const int> tokens, KvCache& cache, int n_logits, float* logits) override;

private:
    struct DeviceMatrix {
        const uint8_t* data = nullptr;  // device
        GgmlType type = GgmlType::F32;
        size_t row_bytes = 0;
        int rows = 0, cols = 0;
    };
    struct DeviceLayer {
        const float *attn_norm = nullptr, *ffn_norm = nullptr, *bq = nullptr, *bk = nullptr, *bv = nullptr;
        DeviceMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
    };

    void forward_step(std::span<const int> tokens, CudaKvCache& cache, int n_logits, float* logits);
    void matvec(const DeviceMatrix& W, const float* x, int n, float* y);
    void ensure_workspace(int n_ctx);

    const Model& model_;
    cuda::Stream stream_ = nullptr;
    cuda::DeviceBuffer weight_buf_, scratch_buf_, workspace_buf_;
    DeviceMatrix token_embd_, output_;
    const float* output_norm_ = nullptr;
    std::vector<DeviceLayer> layers_;
    // Scratch for one step, row i for the step's i-th token (pointers into scratch_buf_).
    float *x_ = nullptr, *xb_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *att_ = nullptr,
          *proj_ = nullptr, *gate_ = nullptr, *up_ = nullptr, *logits_ = nullptr, *inv_freq_ = nullptr;
    int* tokens_ = nullptr;
    int workspace_ctx_ = 0;  // the context the attention workspace is sized for
};

}  // namespace tandem
