// Forward-pass tests on stories260K against llama2.c's outputs (an independent implementation): logits at
// positions 4..7 of "Once upon a time", greedy continuations of every reference prompt, and batch invariance; logits
// restricted to part of the vocabulary (Backend::restrict_logits); fp16 and q8_0 KV caches (CpuKvType).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <unistd.h>

#include "cpu/cpu_backend.h"
#include "cpu/fp16.h"
#include "cpu/quant.h"
#include "error.h"
#include "generate/generator.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "model/model.h"
#include "reference_files.h"
#include "common/synthetic_model.h"
#include "test_paths.h"

using namespace tandem;

namespace {

const std::string kData = TANDEM_TEST_DATA;

std::vector<float> run_logits(Backend& backend, KvCache& cache, const std::vector<int>& tokens, int chunk,
                              int n_vocab) {
    // Logits of every position, feeding the tokens `chunk` at a time.
    std::vector<float> all(tokens.size() * static_cast<size_t>(n_vocab));
    for (size_t b = 0; b < tokens.size(); b += static_cast<size_t>(chunk)) {
        const size_t n = std::min(tokens.size() - b, static_cast<size_t>(chunk));
        backend.forward(std::span<const int>(tokens.data() + b, n), cache, static_cast<int>(n),
                        all.data() + b * n_vocab);
    }
    return all;
}

std::vector<int> greedy_ids(Backend& backend, KvCache& cache, const std::vector<int>& prompt, int n_positions,
                            int n_vocab, int chunk) {
    std::vector<float> logits(n_vocab);
    std::vector<int> out;
    for (size_t b = 0; b < prompt.size(); b += static_cast<size_t>(chunk)) {
        const size_t n = std::min(prompt.size() - b, static_cast<size_t>(chunk));
        backend.forward(std::span<const int>(prompt.data() + b, n), cache, b + n == prompt.size() ? 1 : 0,
                        logits.data());
    }
    // llama2.c runs `steps` = 200 positions: the token sampled at the last one is printed but never fed, so
    // prompt + output hold n_positions + 1 tokens. It stops early when the model emits BOS (kept in the ids).
    for (;;) {
        const int tok = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        out.push_back(tok);
        if (tok == 1 || static_cast<int>(prompt.size() + out.size()) == n_positions + 1) break;
        backend.forward(std::span<const int>(&tok, 1), cache, 1, logits.data());
    }
    return out;
}

}  // namespace

TEST_CASE("model: stories260K config from GGUF") {
    auto model = Model::load(kData + "/stories260K.gguf");
    const ModelConfig& c = model->config;
    CHECK(c.arch == "llama");
    CHECK(c.dim == 64);
    CHECK(c.hidden_dim == 172);
    CHECK(c.n_layers == 5);
    CHECK(c.n_heads == 8);
    CHECK(c.n_kv_heads == 4);
    CHECK(c.head_dim == 8);
    CHECK(c.n_vocab == 512);
    CHECK(model->weights.tied_output == false);
}

TEST_CASE("model: logits match llama2.c for 'Once upon a time'") {
    auto model = Model::load(kData + "/stories260K.gguf");
    const auto ref = test::read_reference_logits(kData + "/stories260K-logits.txt");
    REQUIRE(ref.size() == 4);
    const std::vector<int> prompt = {1, 403, 407, 261, 378};
    for (int chunk : {1, 5}) {
        CpuBackend backend(*model, 2, 64);
        auto cache = backend.new_cache(64);
        // Feed the prompt, then the greedy tokens the reference fed, collecting logits at positions 4..7.
        std::vector<int> tokens = prompt;
        std::vector<float> all = run_logits(backend, *cache, tokens, chunk, 512);
        float max_diff = 0;
        for (const auto& [pos, logits] : ref) {
            if (pos >= static_cast<int>(tokens.size())) {
                // Next token: greedy from the previous position, as llama2.c fed it.
                const float* prev = all.data() + static_cast<size_t>(pos - 1) * 512;
                const int tok = static_cast<int>(std::max_element(prev, prev + 512) - prev);
                tokens.push_back(tok);
                std::vector<float> next(512);
                backend.forward(std::span<const int>(&tokens.back(), 1), *cache, 1, next.data());
                all.insert(all.end(), next.begin(), next.end());
            }
            for (int v = 0; v < 512; ++v)
                max_diff = std::max(max_diff, std::fabs(all[static_cast<size_t>(pos) * 512 + v] - logits[v]));
        }
        INFO("chunk " << chunk << ": max |logit - llama2.c| = " << max_diff);
        CHECK(max_diff <= 1e-4f);
    }
}

TEST_CASE("model: greedy continuations equal llama2.c's for every reference prompt") {
    auto model = Model::load(kData + "/stories260K.gguf");
    const auto cases = test::read_greedy_reference(kData + "/stories260K-greedy.txt");
    REQUIRE(cases.size() >= 5);
    CpuBackend backend(*model, 2, 64);
    for (const auto& c : cases) {
        CHECK(model->tokenizer->encode(c.prompt, true) == c.prompt_ids);
        auto cache = backend.new_cache(256);
        const std::vector<int> got = greedy_ids(backend, *cache, c.prompt_ids, 200, 512, 64);
        INFO("prompt: " << c.prompt);
        CHECK(got == c.generated_ids);
    }
}

TEST_CASE("model: batch invariance — chunk sizes 1, 2, 7 and 64 give bitwise identical logits") {
    auto model = Model::load(kData + "/stories260K.gguf");
    const auto cases = test::read_greedy_reference(kData + "/stories260K-greedy.txt");
    std::vector<int> tokens = cases[0].prompt_ids;
    tokens.insert(tokens.end(), cases[0].generated_ids.begin(), cases[0].generated_ids.begin() + 95);
    std::vector<float> baseline;
    for (int chunk : {1, 2, 7, 64}) {
        for (int threads : {1, 2}) {
            CpuBackend backend(*model, threads, chunk == 64 ? 64 : 16);
            auto cache = backend.new_cache(128);
            std::vector<float> all = run_logits(backend, *cache, tokens, chunk, 512);
            if (baseline.empty()) {
                baseline = all;
                continue;
            }
            INFO("chunk " << chunk << ", threads " << threads);
            CHECK(std::memcmp(all.data(), baseline.data(), all.size() * sizeof(float)) == 0);
        }
    }
}

TEST_CASE("model: attention over tiles of a KV group's heads gives each head's bits, whatever the threads and chunks") {
    // The CPU attends up to four query heads of one KV group together (they share each key and value load); how
    // many depends on the step's tokens and the pool's threads. Each head's scores and sums are one fixed sequence
    // of operations however heads are tiled, so every thread count and chunk size must give the same bits. Groups
    // of 7 (tiles of 4 + 3 down to 1), 3, and 5 heads of width 12 (the scalar path: not whole 8-lane groups).
    struct Case {
        int dim, n_heads, n_kv_heads;
    };
    for (const Case cs : {Case{112, 7, 1}, Case{96, 6, 2}, Case{60, 5, 1}}) {
        const std::string path = (std::filesystem::temp_directory_path() /
                                  ("tandem-tiles-" + std::to_string(::getpid()) + ".gguf")).string();
        write_synthetic_model(path, {"tiles", cs.dim, 64, 2, cs.n_heads, cs.n_kv_heads, 320, 64, false, "qwen2"},
                              GgmlType::F32, 5);
        auto model = Model::load(path);
        std::filesystem::remove(path);
        std::vector<int> tokens;
        for (int i = 0; i < 40; ++i) tokens.push_back(3 + (i * 37) % 300);
        std::vector<float> baseline;
        for (CpuKvType kv : {CpuKvType::F32, CpuKvType::F16}) {
            baseline.clear();
            for (int threads : {1, 2, 3, 8}) {
                for (int chunk : {1, 5, 40}) {
                    CpuBackend backend(*model, threads, 40, {.kv_type = kv});
                    auto cache = backend.new_cache(40);
                    const std::vector<float> all = run_logits(backend, *cache, tokens, chunk, 320);
                    if (baseline.empty()) {
                        baseline = all;
                        continue;
                    }
                    INFO("heads " << cs.n_heads << "/" << cs.n_kv_heads << ", head width " << cs.dim / cs.n_heads
                                  << ", threads " << threads << ", chunk " << chunk);
                    CHECK(std::memcmp(all.data(), baseline.data(), all.size() * sizeof(float)) == 0);
                }
            }
        }
    }
}

TEST_CASE("model: fp16 and q8_0 KV caches hold the fp32 cache's values rounded, and keep batch invariance") {
    // CpuKvType::F16 / Q8_0 (--kv-type): each stored key / value row is the fp32 cache's, rounded to nearest even
    // (what the CUDA backend's fp16 cache holds) or quantized as ggml's Q8_0 (its q8_0 cache's bytes); attention
    // reads them back as dequantize_row does, so chunk sizes still give the same bits. On stories260K the greedy
    // text with fp16 is still llama2.c's (fp32 throughout) for every reference prompt.
    auto model = Model::load(kData + "/stories260K.gguf");
    const ModelConfig& c = model->config;
    REQUIRE(c.kv_dim() % 32 == 0);
    const size_t f32_bytes = CpuKvCache::bytes_needed(c.n_layers, 64, c.kv_dim(), CpuKvType::F32);
    CHECK(CpuKvCache::bytes_needed(c.n_layers, 64, c.kv_dim(), CpuKvType::F16) * 2 == f32_bytes);
    CHECK(CpuKvCache::bytes_needed(c.n_layers, 64, c.kv_dim(), CpuKvType::Q8_0) * 128 == f32_bytes * 34);
    const auto cases = test::read_greedy_reference(kData + "/stories260K-greedy.txt");
    std::vector<int> tokens = cases[0].prompt_ids;
    tokens.insert(tokens.end(), cases[0].generated_ids.begin(), cases[0].generated_ids.begin() + 40);
    CpuBackend f32(*model, 1, 64);
    auto f32_cache = f32.new_cache(64);
    const std::vector<float> f32_logits = run_logits(f32, *f32_cache, tokens, 64, 512);
    const auto& exact = static_cast<const CpuKvCache&>(*f32_cache);
    for (CpuKvType type : {CpuKvType::F16, CpuKvType::Q8_0}) {
        const std::string type_name = type == CpuKvType::F16 ? "f16" : "q8_0";
        CAPTURE(type_name);
        std::vector<float> baseline;
        for (int chunk : {1, 7, 64}) {
            CAPTURE(chunk);
            CpuBackend backend(*model, 2, chunk == 64 ? 64 : 16, {.kv_type = type});
            auto cache = backend.new_cache(64);
            const auto& held = static_cast<const CpuKvCache&>(*cache);
            REQUIRE(held.type() == type);
            const std::vector<float> all = run_logits(backend, *cache, tokens, chunk, 512);
            if (!baseline.empty()) {
                CHECK(std::memcmp(all.data(), baseline.data(), all.size() * sizeof(float)) == 0);
                continue;
            }
            baseline = all;
            // The stored rows: the fp32 cache's, rounded (the keys after RoPE). In the first layer only: its keys
            // and values come from the embeddings alone; every later layer's input has passed through attention
            // over the rounded values, and differs.
            int differing = 0, rounded = 0;
            std::vector<uint8_t> want(held.row_bytes());
            std::vector<float> back(static_cast<size_t>(c.kv_dim()));
            for (int pos = 0; pos < static_cast<int>(tokens.size()); ++pos)
                for (const bool key : {true, false}) {
                    const std::vector<uint8_t> exact_row = exact.position_bytes(0, pos, key);
                    const auto* x = reinterpret_cast<const float*>(exact_row.data());
                    const std::vector<uint8_t> got = held.position_bytes(0, pos, key);
                    if (type == CpuKvType::F16) {
                        for (int j = 0; j < c.kv_dim(); ++j) {
                            reinterpret_cast<uint16_t*>(want.data())[j] = fp32_to_fp16(x[j]);
                            back[j] = fp16_to_fp32(reinterpret_cast<const uint16_t*>(want.data())[j]);
                        }
                    } else {
                        cpu::quantize_row(GgmlType::Q8_0, x, want.data(), c.kv_dim());
                        cpu::dequantize_row(GgmlType::Q8_0, want.data(), back.data(), c.kv_dim());
                    }
                    differing += got != want;
                    for (int j = 0; j < c.kv_dim(); ++j) rounded += back[j] != x[j];
                }
            CHECK(differing == 0);
            CHECK(rounded > 0);  // (values the storage holds exactly would make the test vacuous)
            // The logits move by the rounding, and only a little.
            double worst = 0.0;
            for (size_t i = 0; i < all.size(); ++i) worst = std::max(worst, double{std::abs(all[i] - f32_logits[i])});
            MESSAGE("stories260K, ", type_name, " vs fp32 KV cache: max |logit difference| ", worst);
            CHECK(worst > 0.0);
            // (measured 1.4e-2 (f16) and 0.87 (q8_0: 8-bit codes in blocks that span four of the 8-wide heads) in a
            // logit range of ~20; a wrong scale or code moves them by the whole range)
            CHECK(worst <= (type == CpuKvType::F16 ? 5e-2 : 2.0));
        }
    }
    CpuBackend f16(*model, 2, 64, {.kv_type = CpuKvType::F16});
    for (const auto& g : cases) {
        CAPTURE(g.prompt);
        auto cache = f16.new_cache(256);
        CHECK(greedy_ids(f16, *cache, g.prompt_ids, 200, 512, 64) == g.generated_ids);
    }
    // Q8_0 needs whole blocks: a width that is not a multiple of 32 is a clear error, not a misread row.
    CHECK_THROWS_WITH_AS(CpuKvCache(1, 4, 48, CpuKvType::Q8_0), doctest::Contains("multiple of 32"), Error);
}

TEST_CASE("model: the KV cache keeps each head's positions together, and a position's bytes are a row's") {
    // Attention streams one KV head's positions, so the cache is head-major (a slab per head) wherever a head can
    // be its own run of elements: every type, except Q8_0 with heads narrower than its 32-element blocks, which
    // keeps whole rows (one slab). Either way a position's bytes, heads in order, are what a row-major cache of
    // the same type holds, so the numbers attention reads do not depend on the layout.
    struct Shape { int kv_dim, heads; CpuKvType type; int slabs; };
    const Shape shapes[] = {{64, 2, CpuKvType::F32, 2}, {64, 2, CpuKvType::F16, 2}, {64, 2, CpuKvType::Q8_0, 2},
                            {64, 4, CpuKvType::F16, 4}, {64, 4, CpuKvType::Q8_0, 1}, {96, 1, CpuKvType::F16, 1}};
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    for (const Shape& sh : shapes) {
        CAPTURE(sh.kv_dim);
        CAPTURE(sh.heads);
        CpuKvCache heads(3, 10, sh.kv_dim, sh.type, sh.heads), rows(3, 10, sh.kv_dim, sh.type, 1);
        CHECK(heads.slabs() == sh.slabs);
        REQUIRE(rows.slabs() == 1);
        std::vector<float> k(static_cast<size_t>(sh.kv_dim)), v(k.size());
        for (int layer = 0; layer < 3; ++layer)
            for (int pos = 0; pos < 10; ++pos) {
                for (size_t j = 0; j < k.size(); ++j) k[j] = normal(rng), v[j] = normal(rng);
                heads.store(layer, pos, k.data(), v.data());
                rows.store(layer, pos, k.data(), v.data());
            }
        int differing = 0;
        for (int layer = 0; layer < 3; ++layer)
            for (int pos = 0; pos < 10; ++pos)
                for (bool key : {true, false}) {
                    const std::vector<uint8_t> a = heads.position_bytes(layer, pos, key);
                    const std::vector<uint8_t> b = rows.position_bytes(layer, pos, key);
                    REQUIRE(b.size() == rows.row_bytes());
                    differing += a != b;
                    // ... and slab s, position pos, is the head's part of the row, where attention reads it.
                    const size_t part = heads.slab_row_bytes();
                    const uint8_t* slab = key ? heads.key_slab(layer, sh.slabs - 1) : heads.value_slab(layer, sh.slabs - 1);
                    differing += std::memcmp(slab + static_cast<size_t>(pos) * part,
                                             b.data() + static_cast<size_t>(sh.slabs - 1) * part, part) != 0;
                }
        CHECK(differing == 0);
        CHECK(heads.same_position(heads, 2, 9));
        if (sh.slabs > 1) CHECK_FALSE(heads.same_position(rows, 0, 0));  // other layouts never compare equal
    }
}

TEST_CASE("model: truncating the cache and refeeding reproduces the logits") {
    auto model = Model::load(kData + "/stories260K.gguf");
    CpuBackend backend(*model, 2, 64);
    auto cache = backend.new_cache(64);
    const std::vector<int> tokens = {1, 403, 407, 261, 378, 432, 383, 286};
    std::vector<float> first = run_logits(backend, *cache, tokens, 8, 512);
    cache->truncate(5);
    CHECK(cache->n_committed() == 5);
    std::vector<int> wrong = {300, 301, 302};
    std::vector<float> scratch(3 * 512);
    backend.forward(wrong, *cache, 3, scratch.data());
    cache->truncate(5);
    std::vector<float> again(3 * 512);
    backend.forward(std::span<const int>(tokens.data() + 5, 3), *cache, 3, again.data());
    CHECK(std::memcmp(again.data(), first.data() + 5 * 512, again.size() * sizeof(float)) == 0);
}

TEST_CASE("generator: stop strings are cut and held back across pieces") {
    StopStringFilter f({"STOP", "\n\n"});
    std::string out = f.push("hello ST");
    CHECK(out == "hello ");
    out += f.push("O");
    CHECK(out == "hello ");
    out += f.push("x world\n");
    CHECK(out == "hello STOx world");
    out += f.push("\nmore");
    CHECK(f.stopped());
    CHECK(out == "hello STOx world");
    CHECK(f.flush().empty());

    StopStringFilter g({"abc"});
    std::string s = g.push("xxab");
    s += g.flush();
    CHECK(s == "xxab");
    CHECK_FALSE(g.stopped());
}

TEST_CASE("model: a synthetic qwen2 model has the architecture's biases, RoPE and constants, and counts its parameters") {
    // The qwen1.5b / qwen0.5b presets stand in for the default pair on a lent GPU, so they carry what makes a qwen2
    // step cost what it does: Q/K/V biases and NEOX RoPE (the loader's rule for the architecture), with Qwen2.5's
    // RoPE base and RMSNorm epsilon. A small shape of that architecture here.
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("tandem-synth-qwen2-" + std::to_string(::getpid()) + ".gguf")).string();
    SyntheticShape shape = *synthetic_preset("tiny");
    shape.arch = "qwen2";
    write_synthetic_model(path, shape, GgmlType::Q8_0, 3);
    {
        auto model = Model::load(path);
        const ModelConfig& c = model->config;
        CHECK(c.arch == "qwen2");
        CHECK(c.qkv_bias);
        CHECK(c.rope_style == RopeStyle::Neox);
        CHECK(c.rope_theta == 1e6f);
        CHECK(c.rms_eps == 1e-6f);
        for (const LayerWeights& L : model->weights.layers) {
            REQUIRE(L.bq.data != nullptr);
            REQUIRE(L.bk.data != nullptr);
            REQUIRE(L.bv.data != nullptr);
        }
        uint64_t in_file = 0;
        const auto file = GgufFile::open(path);
        for (const GgufTensorInfo& t : file->tensors()) in_file += t.n_elements();
        CHECK(shape.n_params() == in_file);
        CHECK(synthetic_preset("qwen1.5b")->arch == "qwen2");
        CHECK(synthetic_preset("qwen0.5b")->arch == "qwen2");
        CHECK(synthetic_preset("7b")->arch == "llama");
    }
    std::filesystem::remove(path);
    shape.arch = "gpt2";
    CHECK_THROWS_WITH_AS(write_synthetic_model(path, shape, GgmlType::Q8_0, 3),
                         doctest::Contains("architecture 'gpt2'"), Error);
    CHECK_FALSE(std::filesystem::exists(path));
}


TEST_CASE("model: what a llama file declares is honoured or refused, naming the key or tensor") {
    // Llama 3.1+ files carry rope_freqs, Mistral-Nemo-class files a head size of their own, others a sliding window
    // or RoPE scaling: each changes the model, so each is computed (ModelConfig's description) or refused; none is
    // dropped (the model would be another one: wrong text, no error).
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("tandem-unsupported-" + std::to_string(::getpid()) + ".gguf")).string();
    auto source = GgufFile::open(kData + "/stories260K.gguf");
    auto variant = [&](const std::function<void(GgufWriter&)>& extra) {
        GgufWriter w;
        for (const auto& [key, value] : source->metadata()) w.add_value(key, value);
        extra(w);
        for (const GgufTensorInfo& t : source->tensors())
            w.add_tensor(t.name, t.type, std::vector<uint64_t>(t.ne, t.ne + t.n_dims),
                         std::vector<uint8_t>(t.data, t.data + t.n_bytes));
        w.write(path);
    };
    auto refused = [&](const std::string& what) {
        CAPTURE(what);
        CHECK_THROWS_WITH_AS(Model::load(path), doctest::Contains(what.c_str()), Error);
    };
    auto f32_bytes = [](const std::vector<float>& v) {
        std::vector<uint8_t> b(v.size() * 4);
        std::memcpy(b.data(), v.data(), b.size());
        return b;
    };
    const std::vector<float> plain = Model::load(kData + "/stories260K.gguf")->config.rope_inv_freq.at(0);
    REQUIRE(plain.size() == 4);  // stories260K: 8 heads of 8, rope dims 8
    CHECK(plain[1] == static_cast<float>(std::pow(10000.0, -2.0 / 8)));

    variant([](GgufWriter& w) { w.add_u32("llama.attention.key_length", 8); });
    CHECK(Model::load(path)->config.head_dim == 8);  // the head size it implies anyway
    // A head size of its own: Q is 8 x 16 = 128 wide, which stories260K's attn_q (64 rows) is not.
    variant([](GgufWriter& w) { w.add_u32("llama.attention.key_length", 16); });
    refused("tensor 'blk.0.attn_q.weight' has shape [64, 64], expected [64, 128]");
    variant([](GgufWriter& w) { w.add_u32("llama.attention.value_length", 4); });
    refused("llama.attention.value_length 4 differs from the key length 8");
    // A llama sliding window applies to every layer (Mistral's); qwen2 has none.
    variant([](GgufWriter& w) { w.add_u32("llama.attention.sliding_window", 4096); });
    {
        const auto m = Model::load(path);
        REQUIRE(m->config.layers.size() == 5);
        for (const LayerAttention& l : m->config.layers) CHECK(l.window == 4096);
        CHECK_FALSE(m->config.is_plain_block());
    }
    variant([&](GgufWriter& w) {
        w.add_string("general.architecture", "qwen3");
        for (const auto& [key, value] : source->metadata()) {
            const std::string k(key);
            if (k.rfind("llama.", 0) == 0) w.add_value("qwen3." + k.substr(6), value);
        }
        w.add_u32("qwen3.attention.sliding_window", 64);
    });
    refused("qwen3.attention.sliding_window is 64 (the qwen3 architecture has no sliding-window attention)");
    // Linear RoPE scaling divides every frequency by the factor; "none" ignores it; YaRN is refused.
    variant([](GgufWriter& w) { w.add_f32("llama.rope.scaling.factor", 8.0f); });
    {
        const auto inv = Model::load(path)->config.rope_inv_freq.at(0);
        for (size_t i = 0; i < inv.size(); ++i)
            CHECK(inv[i] == static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / 8) / 8));
    }
    variant([](GgufWriter& w) {
        w.add_string("llama.rope.scaling.type", "none");
        w.add_f32("llama.rope.scaling.factor", 8.0f);
    });
    CHECK(Model::load(path)->config.rope_inv_freq.at(0) == plain);
    variant([](GgufWriter& w) { w.add_string("llama.rope.scaling.type", "yarn"); });
    refused("llama.rope.scaling.type 'yarn' is not supported (supported: none, linear, and longrope for phi3)");
    variant([](GgufWriter& w) {
        w.add_f32("llama.rope.scaling.factor", 1.0f);  // no scaling, stated
        w.add_u32("llama.attention.sliding_window", 0);
    });
    CHECK(Model::load(path)->config.is_plain_block());
    // rope_freqs: the frequencies divided by its factors (Llama 3.1's long-context rule); bad factors refused.
    variant([&](GgufWriter& w) { w.add_tensor("rope_freqs.weight", GgmlType::F32, {4}, f32_bytes({1, 2, 4, 8})); });
    {
        const auto inv = Model::load(path)->config.rope_inv_freq.at(0);
        for (size_t i = 0; i < inv.size(); ++i)
            CHECK(inv[i] == static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(i) / 8) /
                                               static_cast<double>(1 << i)));
    }
    variant([&](GgufWriter& w) { w.add_tensor("rope_freqs.weight", GgmlType::F32, {4}, f32_bytes({1, 0, 1, 1})); });
    refused("tensor 'rope_freqs.weight' holds a factor 0.000000 (factors must be finite and positive)");
    variant([&](GgufWriter& w) { w.add_tensor("rope_freqs.weight", GgmlType::F32, {3}, f32_bytes({1, 1, 1})); });
    refused("tensor 'rope_freqs.weight' has shape [3] and type f32, expected f32 [4]");
    variant([&](GgufWriter& w) {
        w.add_tensor("rope_factors_long.weight", GgmlType::F32, {4}, f32_bytes({1, 1, 1, 1}));
    });
    refused("LongRoPE factors (rope_factors_long / rope_factors_short) are not part of the llama architecture");
    // A tensor the block does not read (an output bias) is refused rather than dropped.
    variant([&](GgufWriter& w) { w.add_tensor("output.bias", GgmlType::F32, {512}, f32_bytes(std::vector<float>(512))); });
    refused("tensor 'output.bias' is not part of the llama block as tandem computes it");
    std::filesystem::remove(path);
}

TEST_CASE("model: the synthetic _K_M mixtures follow llama.cpp's rules for their base type") {
    // llama_tensor_get_type for Q4_K_M and Q5_K_M: the base type, Q6_K for the output and for attn_v / ffn_down in
    // the layers use_more_bits picks (of 8: 0, 3, 6, 7), and rows that are not whole super-blocks in the base's and
    // Q6_K's fallbacks (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0). (Q4_K_M is also checked against the default
    // models' files in test_real_models.cpp.)
    SyntheticShape shape = *synthetic_preset("tiny");
    shape.n_layers = 8;
    const SyntheticTypes q4 = SyntheticTypes::Q4_K_M(), q5 = SyntheticTypes::Q5_K_M();
    CHECK(q4.name() == "q4_k_m");
    CHECK(q5.name() == "q5_k_m");
    CHECK(synthetic_types_from_name("Q5_K_M")->name() == "q5_k_m");
    CHECK(synthetic_types_from_name("q5_k")->name() == "q5_K");  // a type, not the mixture
    const auto type = [&](const SyntheticTypes& t, const char* tensor, int layer, int64_t cols) {
        return std::string(ggml_type_name(synthetic_matrix_type(shape, t, tensor, layer, cols)));
    };
    for (int layer = 0; layer < 8; ++layer) {
        CAPTURE(layer);
        const bool more = layer == 0 || layer == 3 || layer == 6 || layer == 7;
        CHECK(type(q5, "attn_q", layer, 512) == "q5_K");
        CHECK(type(q5, "ffn_down", layer, 512) == (more ? "q6_K" : "q5_K"));
        CHECK(type(q5, "attn_v", layer, 896) == (more ? "q8_0" : "q5_1"));
        CHECK(type(q4, "ffn_down", layer, 512) == (more ? "q6_K" : "q4_K"));
        CHECK(type(q4, "attn_v", layer, 896) == (more ? "q8_0" : "q5_0"));
    }
    CHECK(type(q5, "output", -1, 512) == "q6_K");
    CHECK(type(q5, "token_embd", -1, 896) == "q5_1");
}
// Restricted logits (a draft model's): ids below n_first and the extra ids bitwise the unrestricted ones, every other
// -inf, whether the output matrix is used in the file's layout (stories260K, f32) or repacked (a synthetic model
// in Q6_K, where this CPU has the repacked kernels), the restricted backend copying only the kept first rows;
// several tokens at once; the restriction lifted again.
TEST_CASE("model: restricted logits are the unrestricted ones on the kept ids and -inf elsewhere") {
    const std::string synth = (std::filesystem::temp_directory_path() /
                               ("tandem-restrict-" + std::to_string(::getpid()) + ".gguf")).string();
    write_synthetic_model(synth, *synthetic_preset("tiny"), GgmlType::Q6_K, 7);
    for (const std::string& path : {kData + "/stories260K.gguf", synth}) {
        CAPTURE(path);
        auto model = Model::load(path);
        const int V = model->config.n_vocab;
        const int n_first = 100;
        // `restricted` copies only the output's first n_first rows (as a draft's backend does): the extra ids and,
        // once the restriction is lifted, every id beyond come from the file's layout, the same bits.
        CpuBackend full(*model, 2, 16),
            restricted(*model, 2, 16, {.head_rows = n_first});
        full.wait_for_repacking();
        restricted.wait_for_repacking();
        if (full.repacked_bytes() > 0) CHECK(restricted.repacked_bytes() < full.repacked_bytes());
        const std::vector<int> extra = {V - 1, 300, 5, 300, 177};  // unsorted, a repeat, one below n_first
        REQUIRE(restricted.restrict_logits(n_first, extra));
        const std::vector<int> tokens = {1, 403, 407, 261, 378, 432};
        auto cache_a = full.new_cache(32), cache_b = restricted.new_cache(32);
        const std::vector<float> a = run_logits(full, *cache_a, tokens, 3, V);
        const std::vector<float> b = run_logits(restricted, *cache_b, tokens, 3, V);
        int kept = 0;
        for (size_t t = 0; t < tokens.size(); ++t)
            for (int id = 0; id < V; ++id) {
                const bool keep = id < n_first || id == V - 1 || id == 300 || id == 177;
                const float got = b[t * V + id], want = a[t * V + id];
                if (keep) {
                    kept += std::memcmp(&got, &want, sizeof got) == 0;
                } else if (got != -std::numeric_limits<float>::infinity()) {
                    FAIL_CHECK("id " << id << " of token " << t << " is " << got << ", not -inf");
                }
            }
        CHECK(kept == static_cast<int>(tokens.size()) * (n_first + 3));
        // Lifted: the next positions are bitwise the unrestricted backend's again.
        REQUIRE(restricted.restrict_logits(V, {}));
        const std::vector<int> more = {286, 300};
        const std::vector<float> c = run_logits(full, *cache_a, more, 2, V);
        const std::vector<float> d = run_logits(restricted, *cache_b, more, 2, V);
        CHECK(std::memcmp(c.data(), d.data(), c.size() * sizeof(float)) == 0);
    }
    std::filesystem::remove(synth);
}
