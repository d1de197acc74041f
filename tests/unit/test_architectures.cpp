// Every supported architecture against llama.cpp: the fixtures of tests/data/arch/ (tiny random-weight files with
// every variation of their family switched on, tools/common/architecture_fixtures.h) and llama.cpp's logits for a
// fixed token sequence (llamacpp-logits.json, scripts/make-arch-references). Per position, every logit within a
// tight tolerance and the greedy id equal; the CPU's chunk sizes 1 and 64 bitwise equal.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <unistd.h>

#include "common/architecture_fixtures.h"
#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "error.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "mini_json.h"
#include "model/model.h"
#include "test_paths.h"

using namespace tandem;

namespace {

const std::string kArch = std::string(TANDEM_TEST_DATA) + "/arch";

const test::Json& references() {
    static const test::Json json = [] {
        std::ifstream in(kArch + "/llamacpp-logits.json", std::ios::binary);
        REQUIRE_MESSAGE(in, "cannot open " << kArch << "/llamacpp-logits.json");
        std::ostringstream ss;
        ss << in.rdbuf();
        return test::Json::parse(ss.str());
    }();
    return json;
}

// Logits of every position of `tokens`, fed `chunk` tokens per forward call, in a cache of n_ctx positions (the
// context llama.cpp's reference had: LongRoPE picks its factors by it).
std::vector<float> cpu_logits(const Model& model, const std::vector<int>& tokens, int chunk, int n_ctx) {
    CpuBackend backend(model, 2, 64);
    auto cache = backend.new_cache(n_ctx);
    const size_t V = static_cast<size_t>(model.config.n_vocab);
    std::vector<float> logits(tokens.size() * V);
    for (size_t at = 0; at < tokens.size(); at += static_cast<size_t>(chunk)) {
        const size_t n = std::min(static_cast<size_t>(chunk), tokens.size() - at);
        backend.forward(std::span<const int>(tokens).subspan(at, n), *cache, static_cast<int>(n),
                        logits.data() + at * V);
    }
    return logits;
}

// The same through the CUDA backend (on the emulation in CI; its fp16 KV cache): `calls` splits the tokens into
// forward calls of those sizes.
std::vector<float> cuda_logits(const Model& model, const std::vector<int>& tokens, int n_ctx,
                               const std::vector<int>& calls, CudaPrefillOptions prefill = {}) {
    CudaBackend backend(model, n_ctx, prefill);
    auto cache = backend.new_cache(n_ctx);
    const size_t V = static_cast<size_t>(model.config.n_vocab);
    std::vector<float> logits(tokens.size() * V);
    size_t at = 0;
    for (int n : calls) {
        backend.forward(std::span<const int>(tokens).subspan(at, static_cast<size_t>(n)), *cache, n,
                        logits.data() + at * V);
        at += static_cast<size_t>(n);
    }
    REQUIRE(at == tokens.size());
    return logits;
}

// Each position's logits against llama.cpp's: within `tolerance` of the row's spread (its largest |logit|, a
// scale-free bound), and the same greedy id.
void check_against_reference(const std::vector<float>& logits, const test::Json& ref, size_t n_vocab,
                             float tolerance) {
    const test::Json& rows = ref["logits"];
    const std::vector<int> greedy = ref["greedy"].ints();
    REQUIRE(logits.size() == rows.size() * n_vocab);
    float worst = 0;
    for (size_t p = 0; p < rows.size(); ++p) {
        CAPTURE(p);
        REQUIRE(rows[p].size() == n_vocab);
        float scale = 0;
        for (size_t v = 0; v < n_vocab; ++v) scale = std::max(scale, std::fabs(static_cast<float>(rows[p][v].num)));
        for (size_t v = 0; v < n_vocab; ++v)
            worst = std::max(worst, std::fabs(logits[p * n_vocab + v] - static_cast<float>(rows[p][v].num)) / scale);
        CHECK(Backend::argmax_row(&logits[p * n_vocab], n_vocab) == greedy[p]);
    }
    MESSAGE("largest difference from llama.cpp, relative to the row's largest logit: " << worst);
    CHECK(worst <= tolerance);
}

// The CPU's bound against llama.cpp. gemma2's is looser: llama.cpp's CPU GELU reads an fp16 table (the input and
// the output rounded to fp16, ggml-cpu/vec.h GGML_GELU_FP16), ~5e-4 of each activation, where tandem computes it in
// fp32; gemma3 shows it too (5.5e-5), and gemma2's logits, soft-capped at 8, are measured against that capped
// maximum. With llama.cpp's table emulated in tandem's GeGLU, gemma2 came to 3.6e-5 (2026-12-07); without the
// attention scores' cap it is 0.21, without the logits' cap 7.2.
float cpu_tolerance(const std::string& name) { return name == "gemma2" ? 6e-4f : 1e-4f; }

}  // namespace

TEST_CASE("architectures: the committed fixtures are the ones the writer makes") {
    // The references were computed on these bytes; a writer change that alters them needs new references.
    for (const std::string& name : architecture_fixture_names()) {
        CAPTURE(name);
        const std::string fresh = (std::filesystem::temp_directory_path() /
                                   ("tandem-fixture-" + name + "-" + std::to_string(::getpid()) + ".gguf")).string();
        write_architecture_fixture(name, fresh);
        auto read = [](const std::string& path) {
            std::ifstream in(path, std::ios::binary);
            return std::string(std::istreambuf_iterator<char>(in), {});
        };
        CHECK(read(fresh) == read(kArch + "/" + name + ".gguf"));
        std::filesystem::remove(fresh);
        CHECK(references()["fixtures"].has(name));
    }
}

TEST_CASE("architectures: every fixture's logits match llama.cpp's on the CPU, chunk sizes 1 and 64 bitwise equal") {
    for (const auto& [name, ref] : references()["fixtures"].obj) {  // each fixture, and phi3 at a long context too
        CAPTURE(name);
        const auto model = Model::load(kArch + "/" + ref["file"].str);
        const std::vector<int> tokens = ref["tokens"].ints();
        const int n_ctx = static_cast<int>(ref["n_ctx"].num);
        const std::vector<float> whole = cpu_logits(*model, tokens, 64, n_ctx);
        check_against_reference(whole, ref, static_cast<size_t>(model->config.n_vocab), cpu_tolerance(name));
        CHECK(cpu_logits(*model, tokens, 1, n_ctx) == whole);
    }
}

TEST_CASE("architectures: every fixture's logits match llama.cpp's on the emulated CUDA backend, every route") {
    // The kernel-by-kernel path with the block variations: one 24-token call (matvec and split-K attention), the
    // tokens one by one (decode steps, through CUDA graphs), and prefill calls (GEMM and tiled flash attention; the
    // window masks inside tiles and skips tiles). The fp16 KV cache rounds keys and values (llama.cpp's reference
    // kept f32): a looser bound than the CPU's, the same greedy ids.
    for (const auto& [name, ref] : references()["fixtures"].obj) {
        CAPTURE(name);
        const auto model = Model::load(kArch + "/" + ref["file"].str);
        const std::vector<int> tokens = ref["tokens"].ints();
        const int n_ctx = static_cast<int>(ref["n_ctx"].num);
        const size_t V = static_cast<size_t>(model->config.n_vocab);
        const std::vector<float> whole = cuda_logits(*model, tokens, n_ctx, {24});
        check_against_reference(whole, ref, V, 2e-3f);
        check_against_reference(cuda_logits(*model, tokens, n_ctx, std::vector<int>(24, 1)), ref, V, 2e-3f);
        check_against_reference(cuda_logits(*model, tokens, n_ctx, {9, 15}, {256, 4}), ref, V, 2e-3f);
        // The CPU backend with the same fp16 cache: the two backends' rounding of the same computation.
        CpuBackend cpu(*model, 2, 64, {.activations = cpu::Activations::Float, .kv_type = CpuKvType::F16});
        auto cache = cpu.new_cache(n_ctx);
        std::vector<float> cpu_f16(tokens.size() * V);
        cpu.forward(tokens, *cache, static_cast<int>(tokens.size()), cpu_f16.data());
        float worst = 0;
        for (size_t i = 0; i < whole.size(); ++i) worst = std::max(worst, std::fabs(whole[i] - cpu_f16[i]));
        MESSAGE("largest |CUDA - CPU| with fp16 caches: " << worst);
        CHECK(worst < 1e-3f);
    }
}

TEST_CASE("architectures: sliding-window layers keep a ring of the cache, with the logits of a full cache") {
    // gemma3's fixture (window 5) over 600 positions, 16 tokens a step: its windowed layers keep 5 + 16 + 128 slots
    // (and 5 mirrored) instead of 600 positions, and give bitwise the logits of a cache that keeps every position,
    // through rollbacks as speculative decoding makes them. Cutting back further than the ring keeps is an error.
    const auto model = Model::load(kArch + "/gemma3.gguf");
    const ModelConfig& c = model->config;
    const int n_ctx = 700, n = 600;
    std::vector<int> tokens;
    for (int i = 0; i < n; ++i) tokens.push_back(3 + (i * 7919) % (c.n_vocab - 3));
    CpuBackend backend(*model, 2, 16);
    auto ring = backend.new_cache(n_ctx);
    CpuKvCache full(c.n_layers, n_ctx, c.kv_dim(), CpuKvType::F32, c.n_kv_heads);
    const auto& ring_cache = static_cast<const CpuKvCache&>(*ring);
    MESSAGE("KV bytes with rings " << ring_cache.allocated_bytes() << ", without " << full.allocated_bytes());
    CHECK(ring_cache.allocated_bytes() < full.allocated_bytes() / 2);
    const size_t V = static_cast<size_t>(c.n_vocab);
    std::vector<float> a(16 * V), b(16 * V);
    int at = 0, round = 0;
    while (at < n) {
        const int step = std::min(16, n - at);
        const auto chunk = std::span<const int>(tokens).subspan(static_cast<size_t>(at), static_cast<size_t>(step));
        backend.forward(chunk, *ring, step, a.data());
        backend.forward(chunk, full, step, b.data());
        REQUIRE(std::memcmp(a.data(), b.data(), static_cast<size_t>(step) * V * 4) == 0);
        at += step;
        if (++round % 3 == 0 && at < n) {  // a rejected draft: cut back and go on from there
            at -= 9;
            ring->truncate(at);
            full.truncate(at);
        }
    }
    // Cutting back further than a ring keeps (a chat re-rendering an early turn) starts over from position 0, which
    // the caller reads back; a full cache keeps what it is asked to.
    ring->truncate(at - 200);
    CHECK(ring->n_committed() == 0);
    full.truncate(at - 200);
    CHECK(full.n_committed() == at - 200);
    backend.forward(std::span<const int>(tokens).subspan(0, 16), *ring, 16, a.data());
    full.truncate(0);
    backend.forward(std::span<const int>(tokens).subspan(0, 16), full, 16, b.data());
    CHECK(std::memcmp(a.data(), b.data(), 16 * V * 4) == 0);
}

TEST_CASE("architectures: the CUDA backend's sliding-window rings give the logits of a full cache") {
    // gemma3's fixture on the emulated CUDA backend, 600 positions: prefill calls of 16 (the GEMM and tiled attention
    // path: matvec_max_call 4), single-token steps (split-K attention, graphs) and rollbacks, through a cache whose
    // windowed layers keep rings of 5 + 16 + 128 rows rounded up to 32 (splits of 4 keys, key tiles of 32), and
    // through one that keeps every position: bitwise the same.
    const auto model = Model::load(kArch + "/gemma3.gguf");
    const ModelConfig& c = model->config;
    const int n_ctx = 700, n = 600;
    std::vector<int> tokens;
    for (int i = 0; i < n; ++i) tokens.push_back(3 + (i * 7919) % (c.n_vocab - 3));
    CudaOptions options;
    options.attention_split = 4;
    CudaBackend gpu(*model, n_ctx, {16, 4}, options);
    auto ring = gpu.new_cache(n_ctx);
    CudaKvCache full(c.n_layers, n_ctx, c.kv_dim());
    const auto& ring_cache = static_cast<const CudaKvCache&>(*ring);
    CHECK(ring_cache.ring(0) == 160);
    CHECK(ring_cache.ring(5) == 0);  // the global layer
    CudaKvWindows windows{{}, 16 + 128, 32};
    for (const LayerAttention& l : c.layers) windows.windows.push_back(l.window);
    CHECK(CudaKvCache::bytes_needed(c.n_layers, n_ctx, c.kv_dim(), cuda::KvType::F16, windows) <
          CudaKvCache::bytes_needed(c.n_layers, n_ctx, c.kv_dim()) / 2);
    const size_t V = static_cast<size_t>(c.n_vocab);
    std::vector<float> a(16 * V), b(16 * V);
    int at = 0, round = 0;
    while (at < n) {
        const int step = std::min(round % 4 == 3 ? 1 : 16, n - at);
        const auto chunk = std::span<const int>(tokens).subspan(static_cast<size_t>(at), static_cast<size_t>(step));
        gpu.forward(chunk, *ring, step, a.data());
        gpu.forward(chunk, full, step, b.data());
        REQUIRE(std::memcmp(a.data(), b.data(), static_cast<size_t>(step) * V * 4) == 0);
        at += step;
        if (++round % 5 == 0 && at < n) {
            at -= 9;
            ring->truncate(at);
            full.truncate(at);
        }
    }
    ring->truncate(at - 300);
    CHECK(ring->n_committed() == 0);
}

TEST_CASE("architectures: each fixture switches on its family's variations") {
    // The fixtures are only a test of what they contain: this pins that each carries what its family adds.
    auto config = [](const std::string& name) { return Model::load(kArch + "/" + name + ".gguf")->config; };
    const ModelConfig llama3 = config("llama3"), qwen3 = config("qwen3"), gemma2 = config("gemma2"),
                      gemma3 = config("gemma3"), smollm3 = config("smollm3"), phi3 = config("phi3");
    CHECK(phi3.rope_dim < phi3.head_dim);  // partial rotary dims
    CHECK(phi3.long_rope_table == 1);
    CHECK(phi3.rope_table(0, 256) == 0);  // up to the original context: the short factors
    CHECK(phi3.rope_table(0, 257) == 1);
    CHECK(phi3.rope_amplitude == 1.19f);
    CHECK(phi3.layers[0].window == 0);  // the declared window is ignored, as llama.cpp does
    for (const char* fused : {"blk.0.attn_qkv.weight", "blk.0.ffn_up.weight"})
        CHECK(Model::load(kArch + "/phi3.gguf")->file->find_tensor(fused) != nullptr);
    CHECK(Model::load(kArch + "/phi3.gguf")->file->find_tensor("blk.0.ffn_gate.weight") == nullptr);
    CHECK(llama3.head_dim * llama3.n_heads != llama3.dim);
    CHECK(llama3.rope_inv_freq[0].back() != static_cast<float>(std::pow(500000.0, -2.0 * 15 / 32)));  // rope_freqs
    CHECK(qwen3.qk_norm);
    CHECK(qwen3.head_dim * qwen3.n_heads != qwen3.dim);
    CHECK(gemma3.qk_norm);
    CHECK(gemma3.post_norms);
    CHECK(gemma3.activation == FfnActivation::GeluTanh);
    CHECK(gemma3.embedding_scale == 8.0f);
    CHECK(gemma3.rope_inv_freq.size() == 2);
    const std::vector<int> windows = {5, 5, 5, 5, 5, 0, 5};
    for (int l = 0; l < gemma3.n_layers; ++l) {
        CAPTURE(l);
        CHECK(gemma3.layers[static_cast<size_t>(l)].window == windows[static_cast<size_t>(l)]);
        CHECK(gemma3.layers[static_cast<size_t>(l)].rope_table == (windows[static_cast<size_t>(l)] > 0 ? 1 : 0));
    }
    CHECK(gemma3.layers[0].window < static_cast<int>(references()["fixtures"]["gemma3"]["tokens"].size()));
    CHECK_FALSE(gemma2.qk_norm);
    CHECK(gemma2.post_norms);
    CHECK(gemma2.attention_softcap == 2.0f);
    CHECK(gemma2.logit_softcap == 8.0f);
    CHECK(gemma2.attention_scale == 1.0f / std::sqrt(32.0f));  // the head size (dim / heads would be 16)
    for (int l = 0; l < gemma2.n_layers; ++l) {  // alternate layers windowed, all with the global RoPE base
        CAPTURE(l);
        CHECK(gemma2.layers[static_cast<size_t>(l)].window == (l % 2 == 0 ? 5 : 0));
        CHECK(gemma2.rope_inv_freq[static_cast<size_t>(gemma2.layers[static_cast<size_t>(l)].rope_table)] ==
              gemma2.rope_inv_freq[0]);
    }
    CHECK(smollm3.layers[3].rope_table == -1);
    CHECK(smollm3.layers[2].rope_table == 0);
    CHECK(Model::load(kArch + "/smollm3.gguf")->file->find_tensor("blk.0.attn_qkv.weight") != nullptr);
    for (const ModelConfig* c : {&qwen3, &gemma2, &gemma3, &smollm3, &phi3}) CHECK_FALSE(c->is_plain_block());
    CHECK(gemma2.describe_block() ==
          "gemma2 block: post-norms, GeGLU, sqrt(dim) embeddings, soft-capped scores (2) and logits (8), window 5 on 2 of "
          "4 layers");
    CHECK(gemma3.describe_block() ==
          "gemma3 block: QK-norm, post-norms, GeGLU, sqrt(dim) embeddings, window 5 on 6 of 7 layers");
    CHECK(smollm3.describe_block() == "smollm3 block: no RoPE on 1 of 4 layers");
    CHECK(phi3.describe_block() == "phi3 block: RoPE on 12 of 16 dims, LongRoPE (long factors past 256)");
}

TEST_CASE("architectures: gemma2's defaults and bad soft-caps, as llama.cpp reads its keys") {
    // gemma2's fixture rewritten with keys dropped or replaced: without attention.sliding_window llama.cpp's default
    // window (4096) applies; rope.freq_base_swa gives the windowed layers their own base; a cap that is not finite and
    // positive is an error naming the key.
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("tandem-gemma2-" + std::to_string(::getpid()) + ".gguf")).string();
    auto source = GgufFile::open(kArch + "/gemma2.gguf");
    auto variant = [&](const std::string& drop, const std::function<void(GgufWriter&)>& extra) {
        GgufWriter w;
        for (const auto& [key, value] : source->metadata())
            if (key != drop) w.add_value(key, value);
        extra(w);
        for (const GgufTensorInfo& t : source->tensors())
            w.add_tensor(t.name, t.type, std::vector<uint64_t>(t.ne, t.ne + t.n_dims),
                         std::vector<uint8_t>(t.data, t.data + t.n_bytes));
        w.write(path);
    };
    variant("gemma2.attention.sliding_window", [](GgufWriter&) {});
    {
        const ModelConfig c = Model::load(path)->config;
        CHECK(c.layers[0].window == 4096);
        CHECK(c.layers[1].window == 0);
    }
    variant("", [](GgufWriter& w) { w.add_f32("gemma2.rope.freq_base_swa", 500.0f); });
    {
        const ModelConfig c = Model::load(path)->config;
        const std::vector<float>& local = c.rope_inv_freq[static_cast<size_t>(c.layers[0].rope_table)];
        CHECK(c.layers[1].rope_table == 0);
        CHECK(local[1] == static_cast<float>(std::pow(500.0, -2.0 / 32)));
    }
    for (const char* key : {"gemma2.attn_logit_softcapping", "gemma2.final_logit_softcapping"}) {
        CAPTURE(key);
        variant(key, [&](GgufWriter& w) { w.add_f32(key, 0.0f); });
        CHECK_THROWS_WITH_AS(Model::load(path), doctest::Contains((std::string(key) + " 0.000000 is out of range").c_str()),
                             Error);
        variant(key, [](GgufWriter&) {});  // absent: llama.cpp's defaults
        const ModelConfig c = Model::load(path)->config;
        CHECK((std::string(key) == "gemma2.attn_logit_softcapping" ? c.attention_softcap : c.logit_softcap) ==
              (std::string(key) == "gemma2.attn_logit_softcapping" ? 50.0f : 30.0f));
    }
    std::filesystem::remove(path);
}
