// Models and statistics the speculative-decoding tests share (test_speculative.cpp, test_draft_ahead.cpp): drafts
// of stories260K that agree with it to different degrees, made once per test run, and a chi-square test.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

#include "gguf/gguf_writer.h"
#include "convert/llama2c.h"
#include "convert/quantize_model.h"
#include "test_paths.h"

namespace tandem::test {

// Draft models made once per test run in a temporary directory: q8_0 and q4_0 requantizations of stories260K,
// and the llama2.c int8 export converted to f32 (it parts from the fp32 model after ~110 tokens).
struct Drafts {
    std::string dir, q8_0, q4_0, q80bin, sharp;
    // stories260K with every token's embedding replaced by token 1's (BOS): its hidden states, and so its next-token
    // distribution, no longer depend on the context (only the repeat penalty moves them), and neighbouring tokens
    // are drawn from one broad distribution. Noise that repeats across positions couples them visibly, which the
    // story model's context-specific distributions (of little overlap) hide. `blind_sharp`: the same with its
    // output matrix scaled by 3, an overconfident draft beside it.
    std::string blind, blind_sharp;
    Drafts() {
        const std::string data = TANDEM_TEST_DATA;
        dir = std::filesystem::temp_directory_path() / ("tandem-spec-" + std::to_string(getpid()));
        std::filesystem::create_directories(dir);
        auto target = GgufFile::open(data + "/stories260K.gguf");
        q8_0 = dir + "/q8_0.gguf";
        requantize_gguf(*target, GgmlType::Q8_0).write(q8_0);
        q4_0 = dir + "/q4_0.gguf";
        requantize_gguf(*target, GgmlType::Q4_0).write(q4_0);
        q80bin = dir + "/q80bin.gguf";
        llama2c_to_gguf(read_llama2c(data + "/stories260K_q80.bin"), load_spm_vocab(data + "/tok512.model"),
                        GgmlType::F32, "stories260K_q80")
            .write(q80bin);
        // A draft that deliberately disagrees: stories260K with its output matrix scaled by 3, i.e. its logits at
        // temperature 1/3 — overconfident, the way a weak draft fails, so that many proposals get rejected and a
        // wrong correction step would visibly bias the output.
        sharp = dir + "/sharp.gguf";
        variant(*target, false, 3.0f, sharp);
        blind = dir + "/blind.gguf";
        variant(*target, true, 1.0f, blind);
        blind_sharp = dir + "/blind_sharp.gguf";
        variant(*target, true, 3.0f, blind_sharp);
    }
    // `target` with its output matrix scaled by `output_scale`, and with `blind`, every row of its (f32) token
    // embedding replaced by row 1.
    static void variant(const GgufFile& target, bool blind, float output_scale, const std::string& path) {
        GgufWriter w;
        for (const auto& [key, value] : target.metadata()) w.add_value(key, value);
        for (const GgufTensorInfo& t : target.tensors()) {
            std::vector<uint8_t> bytes(t.data, t.data + t.n_bytes);
            if (t.name == "output.weight" && output_scale != 1.0f) {
                REQUIRE(t.type == GgmlType::F32);
                for (size_t i = 0; i < bytes.size(); i += 4) {
                    float f;
                    std::memcpy(&f, &bytes[i], 4);
                    f *= output_scale;
                    std::memcpy(&bytes[i], &f, 4);
                }
            }
            if (t.name == "token_embd.weight" && blind) {
                REQUIRE(t.type == GgmlType::F32);
                const size_t row = static_cast<size_t>(t.ne[0]) * 4;
                for (size_t r = 0; r < bytes.size() / row; ++r) std::memcpy(&bytes[r * row], &bytes[row], row);
            }
            std::vector<uint64_t> dims(t.ne, t.ne + t.n_dims);
            w.add_tensor(t.name, t.type, dims, std::move(bytes));
        }
        w.write(path);
    }
    ~Drafts() { std::filesystem::remove_all(dir); }
};
inline const Drafts& drafts() {
    static Drafts d;
    return d;
}

// Pearson's chi-square statistic of `observed` counts against `expected` probabilities (n samples), with bins of
// expected count < 5 pooled; returns {statistic, critical value}. The critical value is the chi-square quantile at
// an upper-tail probability of 1e-6 (Wilson–Hilferty approximation, z = 4.753): a correct sampler fails this with
// probability about one in a million for a given seed set — and the seeds are fixed, so the test is deterministic.
inline std::pair<double, double> chi_square(const std::map<int, int>& observed, const std::map<int, double>& expected, int n) {
    std::vector<std::pair<double, double>> bins;  // (expected count, observed count)
    double pooled_e = 0, pooled_o = 0;
    std::map<int, int> obs = observed;
    for (const auto& [tok, p] : expected) {
        const double e = p * n;
        const double o = obs.count(tok) ? obs[tok] : 0;
        obs.erase(tok);
        if (e >= 5)
            bins.push_back({e, o});
        else
            pooled_e += e, pooled_o += o;
    }
    for (const auto& [tok, o] : obs) pooled_o += o;  // tokens the target gives probability 0
    if (pooled_e >= 5 || pooled_o > 0) bins.push_back({std::max(pooled_e, 1e-12), pooled_o});
    double stat = 0;
    for (const auto& [e, o] : bins) stat += (o - e) * (o - e) / e;
    const double df = static_cast<double>(bins.size() - 1);
    const double z = 4.753, h = 2.0 / (9.0 * df);
    const double crit = df * std::pow(1.0 - h + z * std::sqrt(h), 3.0);
    return {stat, crit};
}


}  // namespace tandem::test
