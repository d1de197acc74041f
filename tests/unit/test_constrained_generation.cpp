// Constrained generation (grammar/constraint.h through Generator): on stories260K (a sentencepiece vocabulary with
// byte fallback), greedy and sampled outputs follow GBNF grammars and a JSON schema, generation ends only where the
// grammar can end, and a dead end is an error; mask() keeps exactly the allowed logits. Also Tokenizer::token_bytes,
// which the constraint matches tokens by. The "real:" case runs the default draft's byte-level BPE vocabulary.
#include <doctest/doctest.h>

#include <cmath>
#include <regex>
#include <string>
#include <vector>

#include "app/environment.h"
#include "app/model_registry.h"
#include "cpu/cpu_backend.h"
#include "error.h"
#include "generate/generator.h"
#include "grammar/answer_after.h"
#include "grammar/constraint.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "mini_json.h"
#include "model/model.h"
#include "test_paths.h"
#include "text/tokenizer.h"

using namespace tandem;

namespace {

const std::string kData = TANDEM_TEST_DATA;

// The text stories260K generates after "Once upon a time" under `g`, greedy (temperature 0) or sampled.
std::string constrained(const Model& model, const grammar::Grammar& g, float temperature, uint64_t seed,
                        int n_predict = 80, GenerationStats* stats_out = nullptr) {
    CpuBackend backend(model, 1, 64);
    auto cache = backend.new_cache(256);
    std::vector<std::string> bytes;
    for (int id = 0; id < model.config.n_vocab; ++id) bytes.push_back(model.tokenizer->token_bytes(id));
    grammar::TokenConstraint constraint(g, bytes, {model.tokenizer->eos()});
    GenerationParams params;
    params.n_predict = n_predict;
    params.sampler.temperature = temperature;
    params.sampler.seed = seed;
    params.constraint = &constraint;
    Generator gen(model, backend, *cache);
    std::string text;
    const GenerationStats st = gen.generate(model.tokenizer->encode("Once upon a time", true), params,
                                            [&](std::string_view piece) {
                                                text += piece;
                                                return true;
                                            });
    CHECK(constraint.mask_calls() == st.n_generated + (st.stop == StopReason::Eos ? 1 : 0));
    if (stats_out) *stats_out = st;
    return text;
}
std::string constrained(const Model& model, const std::string& gbnf, float temperature, uint64_t seed,
                        int n_predict = 80, GenerationStats* stats_out = nullptr) {
    return constrained(model, grammar::parse_gbnf(gbnf), temperature, seed, n_predict, stats_out);
}

}  // namespace

TEST_CASE("constrained generation: token bytes are what each token decodes to, spaces and bytes included") {
    const auto model = Model::load(kData + "/stories260K.gguf");
    const Tokenizer& t = *model->tokenizer;
    CHECK(t.token_bytes(t.eos()).empty());  // control tokens spell nothing: a grammar never allows them
    int bytes = 0, spaced = 0;
    for (int id = 0; id < t.n_vocab(); ++id) {
        const std::string b = t.token_bytes(id);
        if (t.is_byte(id)) {
            ++bytes;
            CHECK(b == std::string(1, static_cast<char>(t.byte_value(id))));
        }
        if (t.piece(id).rfind("\xE2\x96\x81", 0) == 0) {  // "▁word" renders with its space, wherever it is
            ++spaced;
            CHECK(b == " " + t.piece(id).substr(3));
        }
    }
    CHECK(bytes == 256);
    CHECK(spaced > 50);
    CHECK_THROWS_AS(t.token_bytes(t.n_vocab()), Error);
}

TEST_CASE("constrained generation: greedy and sampled outputs follow the grammar and end where it can end") {
    const auto model = Model::load(kData + "/stories260K.gguf");
    // Lower-case words and one full stop: the model must end there (EOS is the only token the grammar then allows).
    const std::string sentence = R"(root ::= [a-z ]+ "." )";
    const std::regex sentence_re("[a-z ]+\\.");
    GenerationStats st;
    const std::string greedy = constrained(*model, sentence, 0.0f, 1, 80, &st);
    CAPTURE(greedy);
    CHECK(std::regex_match(greedy, sentence_re));
    CHECK(st.stop == StopReason::Eos);
    CHECK(constrained(*model, sentence, 0.0f, 2) == greedy);  // greedy ignores the seed
    int differing = 0;
    for (uint64_t seed = 1; seed <= 6; ++seed) {
        const std::string sampled = constrained(*model, sentence, 1.0f, seed);
        CAPTURE(sampled);
        CHECK(std::regex_match(sampled, sentence_re));
        CHECK(constrained(*model, sentence, 1.0f, seed) == sampled);  // the same seed, the same text
        differing += sampled != greedy;
    }
    CHECK(differing > 0);
    // Without the grammar the model writes capitals and commas: the constraint is what shapes the text above.
    const std::string free_text = constrained(*model, "root ::= [^\\x00]*", 0.0f, 1, 60);
    CHECK_FALSE(std::regex_match(free_text, sentence_re));
    // Alternatives, bounded repetition, a digit class: the output is exactly one of the forms.
    const std::string choice = constrained(*model, R"(root ::= ("yes" | "no") ", " [0-9]{2,3} "!")", 1.0f, 7);
    CAPTURE(choice);
    CHECK(std::regex_match(choice, std::regex("(yes|no), [0-9]{2,3}!")));
}

TEST_CASE("constrained generation: a JSON schema's output parses and has the required fields") {
    const auto model = Model::load(kData + "/stories260K.gguf");
    const std::string gbnf = json_schema_to_gbnf(
        R"({"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 99},
            "tag": {"enum": ["cat", "dog"]}}, "required": ["id", "tag"], "additionalProperties": false})");
    for (const float temperature : {0.0f, 0.8f}) {
        for (uint64_t seed = 1; seed <= 3; ++seed) {
            GenerationStats st;
            const std::string text = constrained(*model, gbnf, temperature, seed, 120, &st);
            CAPTURE(text);
            REQUIRE(st.stop == StopReason::Eos);
            const test::Json json = test::Json::parse(text);
            REQUIRE(json.has("id"));
            CHECK(json["id"].num >= 1);
            CHECK(json["id"].num <= 99);
            CHECK((json["tag"].str == "cat" || json["tag"].str == "dog"));
            CHECK(json.obj.size() == 2);
        }
    }
}

TEST_CASE("constrained generation: a grammar no token can continue is an error, not a hang") {
    const auto model = Model::load(kData + "/stories260K.gguf");
    // After "a" the grammar wants a character from an empty set: no token may follow, and it cannot end.
    CHECK_THROWS_WITH_AS(constrained(*model, R"(root ::= "a" [^\x00-\U0010FFFF])", 0.0f, 1),
                         doctest::Contains("grammar"), Error);
}

TEST_CASE("constrained generation: mask() keeps exactly the allowed ids' logits, and the end ids' where it can end") {
    const auto model = Model::load(kData + "/stories260K.gguf");
    const Tokenizer& t = *model->tokenizer;
    std::vector<std::string> bytes;
    for (int id = 0; id < t.n_vocab(); ++id) bytes.push_back(t.token_bytes(id));
    const grammar::Grammar g = grammar::parse_gbnf(R"(root ::= "ab" | "a" [0-9]* )");
    grammar::TokenConstraint constraint(g, bytes, {t.eos(), t.bos()});
    grammar::GrammarMatcher reference(g);
    const int V = t.n_vocab();
    auto check_row = [&](bool can_end) {
        std::vector<float> row(static_cast<size_t>(V));
        for (int id = 0; id < V; ++id) row[static_cast<size_t>(id)] = 0.25f * static_cast<float>(id % 7);
        const std::vector<float> before = row;
        constraint.mask(row.data(), V);
        int kept = 0;
        for (int id = 0; id < V; ++id) {
            grammar::GrammarMatcher m = reference;
            const bool end = id == t.eos() || id == t.bos();
            const bool allowed = end ? can_end : !bytes[static_cast<size_t>(id)].empty() &&
                                                     m.advance(bytes[static_cast<size_t>(id)]);
            CAPTURE(id);
            CHECK(row[static_cast<size_t>(id)] == (allowed ? before[static_cast<size_t>(id)] : -INFINITY));
            kept += allowed;
        }
        CHECK(kept > 0);
    };
    check_row(false);  // nothing yet: "a" is needed, the grammar cannot end
    const auto id_of = [&](const std::string& spelled) {
        for (int id = 0; id < V; ++id)
            if (bytes[static_cast<size_t>(id)] == spelled) return id;
        return -1;
    };
    const int a = id_of("a");
    REQUIRE(a >= 0);
    constraint.accept(a);
    CHECK(reference.advance("a"));
    check_row(true);  // "a" is a whole sentence: the end ids keep their logits
    REQUIRE(id_of("z") >= 0);
    CHECK_THROWS_AS(constraint.accept(id_of("z")), Error);
}

TEST_CASE("real: constrained generation on Qwen2.5-Coder 0.5B (byte-level BPE) gives JSON valid for the schema") {
    // The default draft's vocabulary (151,936 byte-level BPE tokens, spaces as "Ġ", multi-byte characters split
    // across tokens): token_bytes maps them back, and the chat-formatted answer parses and has the fields.
    const auto path = installed_path("qwen2.5-coder-0.5b-instruct-q4_k_m");
    if (!path) FAIL("the default draft is missing from " << environment().models_dir << ": run scripts/fetch-models");
    const auto model = Model::load(*path);
    const Tokenizer& t = *model->tokenizer;
    std::vector<std::string> bytes;
    for (int id = 0; id < model->config.n_vocab; ++id) bytes.push_back(id < t.n_vocab() ? t.token_bytes(id) : "");
    CHECK(bytes[static_cast<size_t>(t.encode(" the", false).at(0))] == " the");
    CHECK(t.token_bytes(t.token_id("<|im_end|>")).empty());
    const std::string schema = R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
        "population": {"type": "integer", "minimum": 0}, "country": {"enum": ["France", "Japan", "Peru"]}},
        "required": ["city", "population", "country"], "additionalProperties": false})";
    const int im_end = t.token_id("<|im_end|>");
    for (const float temperature : {0.0f, 0.7f}) {
        CpuBackend backend(*model, 2, 64);
        auto cache = backend.new_cache(512);
        grammar::TokenConstraint constraint(grammar::parse_gbnf(json_schema_to_gbnf(schema)), bytes,
                                            {t.eos(), im_end});
        GenerationParams params;
        params.n_predict = 80;
        params.sampler.temperature = temperature;
        params.sampler.seed = 5;
        params.stop_tokens = {im_end};
        params.constraint = &constraint;
        const std::vector<int> prompt = t.encode(
            "<|im_start|>user\nDescribe the capital of Japan as JSON.<|im_end|>\n<|im_start|>assistant\n", false, true);
        Generator gen(*model, backend, *cache);
        std::string text;
        const GenerationStats st = gen.generate(prompt, params, [&](std::string_view piece) {
            text += piece;
            return true;
        });
        CAPTURE(text);
        REQUIRE(st.stop == StopReason::Eos);
        const test::Json json = test::Json::parse(text);
        CHECK(json["city"].str.size() <= 40);
        CHECK(json["population"].num >= 0);
        const std::string& country = json["country"].str;
        CHECK((country == "France" || country == "Japan" || country == "Peru"));
        CHECK(json.obj.size() == 3);
        MESSAGE("temperature " << temperature << ": " << text << " (" << constraint.mask_calls() << " masks, "
                               << constraint.mask_seconds() * 1e3 / constraint.mask_calls() << " ms each)");
    }
}

TEST_CASE("constrained generation: with answer_after, the text up to the marker is free and the answer follows") {
    // A reasoning model's think block and answer, played by the story model with "." as the end of its reasoning:
    // its first sentence must be exactly what it writes unconstrained, the rest the answer's grammar.
    const auto model = Model::load(kData + "/stories260K.gguf");
    const std::string free_text = constrained(*model, "root ::= [^\\x00]*", 0.0f, 0, 40);
    const size_t dot = free_text.find('.');
    REQUIRE(dot != std::string::npos);
    for (const float temp : {0.0f, 0.9f}) {
        GenerationStats st;
        const std::string text = constrained(
            *model, grammar::answer_after(grammar::parse_gbnf("root ::= \" yes\" | \" no\""), "."), temp, 3, 80, &st);
        INFO(text);
        if (temp == 0.0f) CHECK(text.substr(0, dot + 1) == free_text.substr(0, dot + 1));
        const size_t end = text.find('.');
        REQUIRE(end != std::string::npos);
        CHECK(std::regex_match(text.substr(end + 1), std::regex("\n*( yes| no)")));
        CHECK(st.stop == StopReason::Eos);  // the answer complete, only the end was left
    }
}
