// Unit tests of the answer's grammar as the CLI and the chat hold it (app/answer_grammar.h): reading a grammar from
// inline GBNF, a file or a JSON schema with errors that say where, a reasoning turn's free reasoning, and a chat whose every
// answer follows the grammar from its own start (a reset copy per answer). Runs stories260K on the CPU.
#include <unistd.h>

#include <doctest/doctest.h>
#include <fstream>
#include <regex>

#include "app/answer_grammar.h"
#include "app/repl_session.h"
#include "cpu/cpu_backend.h"
#include "error.h"
#include "generate/generator.h"
#include "grammar/grammar_matcher.h"
#include "model/model.h"
#include "test_paths.h"

using namespace tandem;

namespace {

const std::string kData = TANDEM_TEST_DATA;

// A scratch file in the build directory, removed at the end of the test.
struct ScratchFile {
    std::string path;
    ScratchFile(const std::string& name, const std::string& text)
        : path(std::string(TANDEM_BUILD_DIR) + "/test_answer_grammar_" + std::to_string(::getpid()) + "_" + name) {
        std::ofstream(path, std::ios::binary) << text;
    }
    ~ScratchFile() { std::remove(path.c_str()); }
};

std::string error_of(GrammarSource source, const std::string& arg) {
    try {
        read_grammar(source, arg);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Whether `text` is a whole sentence of `g`, by the matcher the constraint runs.
bool accepts(const grammar::Grammar& g, const std::string& text) {
    grammar::GrammarMatcher m(g);
    return m.advance(text) && m.accepts();
}

}  // namespace

TEST_CASE("answer grammar: inline GBNF, a GBNF file and a JSON schema give the grammar they say") {
    CHECK(accepts(read_grammar(GrammarSource::Gbnf, "root ::= \"yes\" | \"no\""), "no"));
    const ScratchFile file("three.gbnf", "root ::= word (\" \" word){2}\nword ::= [a-z]+\n");
    const grammar::Grammar from_file = read_grammar(GrammarSource::GbnfFile, file.path);
    CHECK(accepts(from_file, "one two three"));
    CHECK_FALSE(accepts(from_file, "one two"));
    const std::string schema = R"({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                                   "additionalProperties": false})";
    const grammar::Grammar inline_schema = read_grammar(GrammarSource::JsonSchema, schema);
    CHECK(accepts(inline_schema, "{\"n\": 42}"));
    CHECK_FALSE(accepts(inline_schema, "{\"m\": 42}"));
    const ScratchFile schema_file("schema.json", schema);
    CHECK(accepts(read_grammar(GrammarSource::JsonSchema, "@" + schema_file.path), "{ \"n\" : -7 }"));
}

TEST_CASE("answer grammar: errors give the parser's line and column and name the file") {
    CHECK(contains(error_of(GrammarSource::Gbnf, "root ::= \"a\" | ("), "gbnf: line 1, column"));
    const ScratchFile bad("bad.gbnf", "root ::= a\na ::= [b\n");
    const std::string file_error = error_of(GrammarSource::GbnfFile, bad.path);
    CHECK(file_error.rfind(bad.path + ": gbnf: line 2, column", 0) == 0);
    const std::string missing = std::string(TANDEM_BUILD_DIR) + "/no-such-grammar.gbnf";
    CHECK(contains(error_of(GrammarSource::GbnfFile, missing), missing + ": cannot open a grammar file"));
    CHECK(contains(error_of(GrammarSource::GbnfFile, TANDEM_BUILD_DIR), "is a directory"));
    CHECK(contains(error_of(GrammarSource::JsonSchema, "{\"type\": "), "JSON: line 1, column"));
    CHECK(contains(error_of(GrammarSource::JsonSchema, R"({"type": "string", "contentEncoding": "base64"})"),
                   "contentEncoding"));
    const ScratchFile bad_schema("bad.json", "{\"type\": \"object\",\n \"if\": {}}");
    const std::string schema_error = error_of(GrammarSource::JsonSchema, "@" + bad_schema.path);
    CHECK(schema_error.rfind(bad_schema.path + ": ", 0) == 0);
    CHECK(contains(schema_error, "'if'"));
    CHECK(contains(error_of(GrammarSource::JsonSchema, "@" + missing), missing + ": cannot open a JSON schema file"));
}

TEST_CASE("answer grammar: how the chat names the grammar in force") {
    CHECK(describe_grammar(GrammarSource::Gbnf, "root ::= \"a\"") == "grammar: root ::= \"a\"");
    CHECK(describe_grammar(GrammarSource::GbnfFile, "list.gbnf") == "grammar file list.gbnf");
    CHECK(describe_grammar(GrammarSource::JsonSchema, "{}") == "JSON schema: {}");
    CHECK(describe_grammar(GrammarSource::JsonSchema, "@user.json") == "JSON schema file user.json");
}

TEST_CASE("answer grammar: a chat's reasoning turn stays free, the grammar applies after its think block") {
    // The story model never closes a think block, so under deepseek-r1 (whose prompt opens it) the whole turn is
    // reasoning: with a grammar it must be the reasoning written without one, token for token, and no answer. With
    // qwen3 a grammar makes the prompt open the think block itself (the model would). With thinking off the grammar
    // applies from the first token.
    const std::unique_ptr<Model> model = Model::load(kData + "/stories260K.gguf");
    CpuBackend backend{*model, 2, 64};
    const grammar::Grammar g = read_grammar(GrammarSource::Gbnf, "root ::= \"a\" \"b\"?");
    const auto turn = [&](const char* family, bool thinking, bool constrained) {
        const std::unique_ptr<KvCache> cache = backend.new_cache(256);
        Generator generator(*model, backend, *cache);
        std::optional<ChatTemplate> tmpl = ChatTemplate::by_name(family);
        tmpl->set_thinking(thinking);
        ChatSession chat(*model, generator, *cache, {}, *tmpl);
        std::optional<grammar::TokenConstraint> constraint;
        GenerationParams p;
        p.n_predict = 12;
        p.sampler.temperature = 0;
        if (constrained) p.constraint = &constraint.emplace(answer_constraint(*model, g, tmpl));
        return chat.send("Once upon a time", p, [](std::string_view) { return true; });
    };
    const TurnReport free_r1 = turn("deepseek-r1", true, false);
    const TurnReport r1 = turn("deepseek-r1", true, true);
    CHECK(r1.reasoning == free_r1.reasoning);
    CHECK_FALSE(r1.reasoning.empty());
    CHECK(r1.answer.empty());
    CHECK(r1.reasoning_unfinished);
    const TurnReport free_qwen = turn("qwen3", true, false);
    const TurnReport qwen = turn("qwen3", true, true);
    CHECK(free_qwen.reasoning.empty());  // the story model does not open a think block of its own ...
    CHECK_FALSE(free_qwen.answer.empty());
    CHECK(qwen.answer.empty());  // ... but under a grammar the prompt opened it
    CHECK_FALSE(qwen.reasoning.empty());
    const TurnReport off = turn("deepseek-r1", false, true);
    CHECK(std::regex_match(off.answer, std::regex("ab?")));
}

TEST_CASE("answer grammar: every answer of a chat follows the grammar from its own start") {
    const std::unique_ptr<Model> model = Model::load(kData + "/stories260K.gguf");
    CpuBackend backend{*model, 2, 64};
    const std::unique_ptr<KvCache> cache = backend.new_cache(512);
    Generator generator(*model, backend, *cache);
    const std::optional<ChatTemplate> raw = ChatTemplate::by_name("raw");
    ChatSession chat(*model, generator, *cache, {}, *raw);
    const std::string gbnf = "root ::= \"{\" [0-9]{1,3} \"}\"";
    const AnswerGrammar in_force{describe_grammar(GrammarSource::Gbnf, gbnf),
                                 answer_constraint(*model, read_grammar(GrammarSource::Gbnf, gbnf), raw)};
    const std::regex shape(R"(\{[0-9]{1,3}\})");
    for (const char* turn : {"Once upon a time", "Then", "The end"}) {
        grammar::TokenConstraint constraint = in_force.for_answer();
        GenerationParams p;
        p.n_predict = 40;
        p.sampler.temperature = 0;
        p.constraint = &constraint;
        const TurnReport r = chat.send(turn, p, [](std::string_view) { return true; });
        CHECK_MESSAGE(std::regex_match(r.answer, shape), turn, ": ", r.answer);
        CHECK(r.stats.stop == StopReason::Eos);
        CHECK(constraint.accepts());
    }
    // The copies advanced; the grammar in force did not: it still starts an answer.
    CHECK_FALSE(in_force.constraint.accepts());
    CHECK(in_force.constraint.mask_calls() > 0);  // the figures are shared with the copies
}
