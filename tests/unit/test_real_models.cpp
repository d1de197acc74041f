// Fidelity of the real default models against llama.cpp (an independent implementation; references in
// tests/data/llamacpp-*.json): tokenization of the rendered chat prompts, and greedy continuations of the chat and
// raw prompts. llama.cpp rounds activations to 8 bits inside its quantized products, so long outputs may part at a
// near-tie; the first 16 tokens must agree on all but at most one prompt per model, and the common-prefix table is
// printed for the record. Needs the models in the cache (scripts/fetch-models; scripts/test fetches them): a
// missing model fails with that instruction. Test names start with "real:" so sanitizer runs can leave them out.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "cpu/cpu_backend.h"
#include "generator.h"
#include "mini_json.h"
#include "model.h"
#include "model_registry.h"

using namespace tandem;

namespace {

const std::string kData = TANDEM_TEST_DATA;

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::unique_ptr<Model> load_real(const std::string& name) {
    const auto path = installed_path(name);
    if (!path) FAIL("model " << name << " is missing from " << models_dir() << ": run scripts/fetch-models");
    return Model::load(*path);
}

size_t common_prefix(const std::vector<int>& a, const std::vector<int>& b) {
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    return n;
}

void check_model(const std::string& name, const std::string& reference_file) {
    auto model = load_real(name);
    const test::Json ref = test::Json::parse(read_text(kData + "/" + reference_file));
    CpuBackend backend(*model, 2, 256);
    int n_cases = 0, n_short = 0;
    std::string table = "| " + name + " prompt | kind | common prefix | reference length |\n|---|---|---|---|\n";
    for (const char* kind : {"chat", "raw"}) {
        for (const test::Json& c : ref[kind].arr) {
            const std::vector<int> prompt = c["prompt_ids"].ints();
            std::vector<int> expected = c["generated_ids"].ints();
            const bool stopped_at_eos = c["stop_type"].str == "eos";
            if (stopped_at_eos) expected.pop_back();  // the end-of-turn token itself
            if (std::string(kind) == "chat") {
                // Our tokenizer, with special tokens recognised, gives llama.cpp's prompt ids for the rendered text.
                CHECK(model->tokenizer->encode(c["rendered"].str, false, true) == prompt);
            }
            auto cache = backend.new_cache(static_cast<int>(prompt.size()) + 80);
            GenerationParams params;
            params.sampler.temperature = 0;
            params.n_predict = static_cast<int>(expected.size());
            params.stop_tokens = {model->tokenizer->eos()};
            const int im_end = model->tokenizer->token_id("<|im_end|>");
            if (im_end >= 0) params.stop_tokens.push_back(im_end);
            Generator gen(*model, backend, *cache);
            const GenerationStats st = gen.generate(prompt, params, [](std::string_view) { return true; });
            const size_t prefix = common_prefix(st.generated, expected);
            const size_t need = std::min<size_t>(16, expected.size());
            ++n_cases;
            if (prefix < need) ++n_short;
            const std::string label = c.has("user") ? c["user"].str : c["prompt"].str;
            char row[256];
            std::snprintf(row, sizeof row, "| %.40s | %s | %zu | %zu |\n", label.c_str(), kind, prefix, expected.size());
            table += row;
        }
    }
    MESSAGE(table);
    std::fputs(table.c_str(), stderr);
    CHECK(n_cases >= 5);
    CHECK(n_short <= 1);
}

}  // namespace

TEST_CASE("real: SmolLM2-135M greedy continuations agree with llama.cpp") {
    check_model("smollm2-135m-instruct-q4_1", "llamacpp-smollm2-135m.json");
}

TEST_CASE("real: Qwen2.5-Coder-0.5B greedy continuations agree with llama.cpp") {
    check_model("qwen2.5-coder-0.5b-instruct-q4_k_m", "llamacpp-qwen2.5-coder-0.5b.json");
}

TEST_CASE("real: Qwen2.5-Coder-1.5B greedy continuations agree with llama.cpp") {
    check_model("qwen2.5-coder-1.5b-instruct-q4_k_m", "llamacpp-qwen2.5-coder-1.5b.json");
}
