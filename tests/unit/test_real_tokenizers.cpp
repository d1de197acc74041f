// The tokenizers of the real default models (Qwen2.5-Coder 1.5B/0.5B: pre "qwen2"; SmolLM2-135M: pre "smollm")
// against llama.cpp (an independent implementation; references in tests/data/llamacpp-*.json): every `tokenize`
// case (plain text, no BOS, special tokens not recognised) encodes to llama.cpp's ids and decodes back, and the
// rendered chat prompts and raw prompts (special tokens recognised, BOS where the model asks for it) encode to
// llama.cpp's prompt ids. Only the vocabulary is read (the weights stay unmapped-in). Needs the models in the
// cache: a missing model fails with "model missing: run scripts/fetch-models". Names start with "real:".
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "gguf/gguf.h"
#include "mini_json.h"
#include "app/environment.h"
#include "app/model_registry.h"
#include "test_paths.h"
#include "text/tokenizer.h"

using namespace tandem;

namespace {

const std::string kData = TANDEM_TEST_DATA;

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    REQUIRE_MESSAGE(in, "cannot open " << path);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

void check_tokenizer(const std::string& name, const std::string& reference_file, const std::string& pre) {
    const auto path = installed_path(name);
    if (!path) FAIL("model missing: run scripts/fetch-models (" << name << " is not in " << environment().models_dir << ")");
    const auto tok = Tokenizer::from_gguf(*GgufFile::open(*path));
    CHECK(tok->model_type() == "gpt2");
    CHECK(tok->pre_tokenizer() == pre);
    const test::Json ref = test::Json::parse(read_text(kData + "/" + reference_file));

    int n = 0;
    for (const test::Json& c : ref["tokenize"].arr) {
        const std::string& text = c["text"].str;
        INFO(name << " tokenize: \"" << text << "\"");
        const std::vector<int> ids = tok->encode(text, false);
        CHECK(ids == c["ids"].ints());
        CHECK(tok->decode(ids) == text);
        TokenStreamDecoder dec(*tok);
        std::string streamed;
        for (int id : ids) streamed += dec.push(id);
        streamed += dec.flush();
        CHECK(streamed == text);
        ++n;
    }
    CHECK(n >= 10);

    for (const test::Json& c : ref["chat"].arr) {
        INFO(name << " chat: \"" << c["rendered"].str << "\"");
        CHECK(tok->encode(c["rendered"].str, tok->add_bos(), true) == c["prompt_ids"].ints());
    }
    for (const test::Json& c : ref["raw"].arr) {
        INFO(name << " raw: \"" << c["prompt"].str << "\"");
        CHECK(tok->encode(c["prompt"].str, tok->add_bos(), true) == c["prompt_ids"].ints());
    }
}

}  // namespace

TEST_CASE("real: tokenizer of SmolLM2-135M-Instruct matches llama.cpp") {
    check_tokenizer("smollm2-135m-instruct-q4_1", "llamacpp-smollm2-135m.json", "smollm");
}

TEST_CASE("real: tokenizer of Qwen2.5-Coder-0.5B-Instruct matches llama.cpp") {
    check_tokenizer("qwen2.5-coder-0.5b-instruct-q4_k_m", "llamacpp-qwen2.5-coder-0.5b.json", "qwen2");
}

TEST_CASE("real: tokenizer of Qwen2.5-Coder-1.5B-Instruct matches llama.cpp") {
    check_tokenizer("qwen2.5-coder-1.5b-instruct-q4_k_m", "llamacpp-qwen2.5-coder-1.5b.json", "qwen2");
}
