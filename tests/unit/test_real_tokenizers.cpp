// The tokenizers of the real models (Qwen2.5-Coder 1.5B/0.5B: byte-level BPE, pre "qwen2"; SmolLM2-135M: pre
// "smollm"; Gemma 3 270M: sentencepiece-style, 262,144 pieces) against llama.cpp (an independent implementation;
// references in tests/data/llamacpp-*.json): every `tokenize` case (plain text, no BOS, special tokens not
// recognised) encodes to llama.cpp's ids and decodes back, and the rendered chat prompts and raw prompts (special
// tokens recognised, BOS where the model asks for it) encode to llama.cpp's prompt ids. Only the vocabulary is
// read (the weights stay unmapped-in), so Gemma's tokenizer is checked whatever architectures tandem runs. Needs
// the models in the cache: a missing model fails with "model missing: run scripts/fetch-models". Names start
// with "real:".
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
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

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& name) {
    const auto path = installed_path(name);
    if (!path)
        FAIL("model missing: run scripts/fetch-models (" << name << " is not in " << environment().models_dir << ")");
    return Tokenizer::from_gguf(*GgufFile::open(*path));
}

// `model_type` "gpt2" (byte-level BPE, with pre-tokenizer `pre`) or "llama" (sentencepiece-style, no `pre`).
// Returns the number of prompts (chat and raw) compared.
int check_tokenizer(const std::string& name, const std::string& reference_file, const std::string& model_type,
                    const std::string& pre) {
    const auto tok = load_tokenizer(name);
    CHECK(tok->model_type() == model_type);
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

    int prompts = 0;
    for (const test::Json& c : ref["chat"].arr) {
        INFO(name << " chat: \"" << c["rendered"].str << "\"");
        CHECK(tok->encode(c["rendered"].str, tok->add_bos(), true) == c["prompt_ids"].ints());
        ++prompts;
    }
    for (const test::Json& c : ref["raw"].arr) {
        INFO(name << " raw: \"" << c["prompt"].str << "\"");
        CHECK(tok->encode(c["prompt"].str, tok->add_bos(), true) == c["prompt_ids"].ints());
        ++prompts;
    }
    return prompts;
}

}  // namespace

TEST_CASE("real: tokenizer of SmolLM2-135M-Instruct matches llama.cpp") {
    check_tokenizer("smollm2-135m-instruct-q4_1", "llamacpp-smollm2-135m.json", "gpt2", "smollm");
}

TEST_CASE("real: tokenizer of Qwen2.5-Coder-0.5B-Instruct matches llama.cpp") {
    check_tokenizer("qwen2.5-coder-0.5b-instruct-q4_k_m", "llamacpp-qwen2.5-coder-0.5b.json", "gpt2", "qwen2");
}

TEST_CASE("real: tokenizer of Qwen2.5-Coder-1.5B-Instruct matches llama.cpp") {
    check_tokenizer("qwen2.5-coder-1.5b-instruct-q4_k_m", "llamacpp-qwen2.5-coder-1.5b.json", "gpt2", "qwen2");
}

TEST_CASE("real: tokenizer of Gemma 3 270M matches llama.cpp") {
    // The base model: its reference has no chat prompts, only raw ones (each starting with BOS, id 2).
    CHECK(check_tokenizer("gemma-3-270m-q4_k_m", "llamacpp-gemma3-270m.json", "llama", "") >= 3);

    const auto tok = load_tokenizer("gemma-3-270m-q4_k_m");
    CHECK(tok->n_vocab() == 262144);
    CHECK(tok->bos() == 2);
    CHECK(tok->eos() == 1);
    CHECK(tok->unk() == 3);
    CHECK(tok->add_bos());
    // Gemma's chat markup: control tokens, recognised only when asked; "\n" is a user-defined token, split off
    // either way; no space prefix after a special token (add_space_prefix is false).
    const int start = tok->token_id("<start_of_turn>"), end = tok->token_id("<end_of_turn>");
    const int newline = tok->token_id("\n");
    REQUIRE(start == 105);
    REQUIRE(end == 106);
    REQUIRE(newline == 107);
    CHECK(tok->is_control(start));
    std::vector<int> expected = {2, start};
    for (int id : tok->encode("user", false)) expected.push_back(id);
    expected.push_back(newline);
    for (int id : tok->encode("Hi there", false)) expected.push_back(id);
    expected.insert(expected.end(), {end, newline, start});
    for (int id : tok->encode("model", false)) expected.push_back(id);
    expected.push_back(newline);
    CHECK(tok->encode("<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n", true, true) == expected);
    // Runs of newlines are user-defined tokens of 1 to 31 newlines (ids 107 to 137): the longest first.
    CHECK(tok->encode(std::string(40, '\n'), false) == std::vector<int>{137, 115});
    const std::vector<int> plain = tok->encode("<start_of_turn>user", false);
    CHECK(std::find(plain.begin(), plain.end(), start) == plain.end());
    CHECK(tok->decode(plain) == "<start_of_turn>user");
    CHECK(tok->decode(expected) == "user\nHi there\nmodel\n");  // control tokens render as nothing

    // A long text: lossless (no normalization, byte fallback for what the vocabulary lacks) and quick. The bound
    // is far above the few milliseconds it takes, and far below what a cost proportional to the vocabulary per
    // token (262,144 x ~8,000 tokens) would take.
    const std::string gpl = read_text(kData + "/gpl-3.txt");
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int> ids = tok->encode(gpl, true);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(ids.size() > 5000);
    CHECK(ids.size() < 12000);
    CHECK(seconds < 2.0);
    CHECK(tok->decode(ids) == gpl);
    // An emoji, rare characters, control characters and a byte that is not UTF-8 (decoded as U+FFFD).
    const std::string odd = "\xF0\x9F\xA6\x99 \xE2\x80\xAF\xEF\xB7\xBD a\tb\r\n\x01 \xFF";
    CHECK(tok->decode(tok->encode(odd, false)) ==
          "\xF0\x9F\xA6\x99 \xE2\x80\xAF\xEF\xB7\xBD a\tb\r\n\x01 \xEF\xBF\xBD");
}
