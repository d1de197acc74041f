// Unit tests of the chat REPL's bookkeeping (repl_session.h): turn rendering, KV reuse across turns, rollback on
// /undo and /regen, context-overflow trimming, the /save JSON round trip, and how an input line splits into a
// command and its argument (repl.h). Runs stories260K on the CPU.
#include <algorithm>
#include <doctest/doctest.h>

#include "app/repl.h"
#include "app/repl_session.h"
#include "cpu/cpu_backend.h"
#include "error.h"
#include "generate/generator.h"
#include "json/json_value.h"
#include "model/model.h"
#include "test_paths.h"

using namespace tandem;

namespace {

const std::string kData = TANDEM_TEST_DATA;

struct Rig {
    std::unique_ptr<Model> model = Model::load(kData + "/stories260K.gguf");
    CpuBackend backend{*model, 2, 64};
    std::unique_ptr<KvCache> cache;
    std::unique_ptr<Generator> generator;
    explicit Rig(int n_ctx = 512) : cache(backend.new_cache(n_ctx)) {
        generator = std::make_unique<Generator>(*model, backend, *cache);
    }
};

GenerationParams greedy(int n) {
    GenerationParams p;
    p.n_predict = n;
    p.sampler.temperature = 0;
    return p;
}

const ChatSession::Emit kKeep = [](std::string_view) { return true; };

bool is_prefix(const std::vector<int>& a, const std::vector<int>& b) {
    return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// The answer a fresh cache gives for `tokens`: what KV reuse must reproduce.
std::string fresh_answer(Rig& rig, const std::vector<int>& tokens, int n) {
    auto cache = rig.backend.new_cache(rig.cache->capacity());
    Generator g(*rig.model, rig.backend, *cache);
    std::string text;
    g.generate(tokens, greedy(n), [&](std::string_view s) {
        text += s;
        return true;
    });
    return text;
}

}  // namespace

TEST_CASE("repl: raw turns are running text, and the second turn prefills only its new tokens") {
    Rig rig;
    ChatSession s(*rig.model, *rig.generator, *rig.cache, {}, *ChatTemplate::by_name("raw"));
    const TurnReport t1 = s.send("Once upon a time", greedy(12), kKeep);
    CHECK(t1.n_reused == 0);
    CHECK(t1.answer.rfind(", there was", 0) == 0);
    CHECK(s.cached().size() == static_cast<size_t>(rig.cache->n_committed()));

    const std::vector<int> before = s.render_tokens(true);
    const TurnReport t2 = s.send("She went", greedy(12), kKeep);
    CHECK(t2.n_reused > 0);
    CHECK(t2.stats.n_prompt == t2.n_conversation - t2.n_reused);
    CHECK(t2.stats.n_prompt < t2.n_conversation / 2);
    // A user turn glued to a word gets one space; the rest is verbatim.
    REQUIRE(s.messages().size() == 4);
    CHECK(s.messages()[1].content == t1.answer);

    // Reusing the cache gives exactly what prefilling the whole conversation from scratch gives.
    std::vector<ChatMessage> upto = s.messages();
    upto.pop_back();
    ChatSession probe(*rig.model, *rig.generator, *rig.cache, {}, *ChatTemplate::by_name("raw"));
    probe.replace("", upto);
    CHECK(fresh_answer(rig, probe.render_tokens(true), 12) == t2.answer);
}

TEST_CASE("repl: chatml turns reuse the cached prefix") {
    Rig rig;
    ChatSession s(*rig.model, *rig.generator, *rig.cache, {}, *ChatTemplate::by_name("chatml"), "Be brief.");
    const TurnReport t1 = s.send("Hello there", greedy(8), kKeep);
    const TurnReport t2 = s.send("And then?", greedy(8), kKeep);
    CHECK(t2.n_reused >= t1.n_conversation);
    CHECK(t2.stats.n_prompt < t2.n_conversation - t1.n_conversation + 8);
    CHECK(s.messages().size() == 4);
    CHECK(s.system() == "Be brief.");
}

TEST_CASE("repl: /undo and /regen roll the cache back") {
    Rig rig;
    ChatSession s(*rig.model, *rig.generator, *rig.cache, {}, *ChatTemplate::by_name("raw"));
    s.send("Once upon a time", greedy(10), kKeep);
    const TurnReport t2 = s.send("The dog", greedy(10), kKeep);
    const int full = rig.cache->n_committed();

    // /regen: the same user message again, only one token re-prefilled (its logits start the answer).
    const TurnReport r = s.regenerate(greedy(10), kKeep);
    CHECK(r.answer == t2.answer);
    CHECK(r.stats.n_prompt == 1);
    CHECK(s.messages().size() == 4);
    CHECK(rig.cache->n_committed() == full);

    // /undo: back to one exchange, the cache cut to a prefix of what remains.
    CHECK(s.undo());
    CHECK(s.messages().size() == 2);
    CHECK(rig.cache->n_committed() < full);
    CHECK(static_cast<int>(s.cached().size()) == rig.cache->n_committed());
    CHECK(is_prefix(s.cached(), s.render_tokens(false)));
    CHECK(s.undo());
    CHECK(s.messages().empty());
    CHECK_FALSE(s.undo());
    CHECK_THROWS_AS(s.regenerate(greedy(4), kKeep), Error);

    s.send("Once upon a time", greedy(4), kKeep);
    s.reset();
    CHECK(s.messages().empty());
    CHECK(rig.cache->n_committed() == 0);
}

TEST_CASE("repl: a full context drops the oldest exchanges and keeps the system prompt") {
    Rig rig(96);
    ChatSession s(*rig.model, *rig.generator, *rig.cache, {}, *ChatTemplate::by_name("raw"), "A story.");
    std::vector<std::string> notices;
    s.notice = [&](const std::string& n) { notices.push_back(n); };
    for (int i = 0; i < 8; ++i) {
        const TurnReport t = s.send("Then the cat", greedy(16), kKeep);
        CHECK(t.n_conversation + 16 <= 96);
        CHECK(static_cast<int>(s.cached().size()) == rig.cache->n_committed());
    }
    CHECK_FALSE(notices.empty());
    CHECK(s.system() == "A story.");
    REQUIRE_FALSE(s.messages().empty());
    CHECK(s.messages().front().role == "user");
    CHECK(s.messages().size() < 16);

    // A single message longer than the context is refused, and the conversation stays as it was.
    const auto before = s.messages();
    std::string huge;
    for (int i = 0; i < 200; ++i) huge += "dog ";
    CHECK_THROWS_AS(s.send(huge, greedy(4), kKeep), Error);
    CHECK(s.messages().size() <= before.size());
}

TEST_CASE("repl: an interrupted answer stays in the conversation") {
    Rig rig;
    ChatSession s(*rig.model, *rig.generator, *rig.cache, {}, *ChatTemplate::by_name("raw"));
    int pieces = 0;
    const TurnReport t = s.send("Once upon a time", greedy(50), [&](std::string_view) { return ++pieces <= 3; });
    CHECK(t.interrupted);
    CHECK_FALSE(t.answer.empty());
    CHECK(s.messages().back().content == t.answer);
    const TurnReport t2 = s.send("Then", greedy(5), kKeep);
    CHECK_FALSE(t2.interrupted);
}

TEST_CASE("repl: conversation JSON round trip with tricky strings") {
    const std::string system = "Quote \" backslash \\ slash / tab\t newline\n cr\r bell\x07 nul-free \x01\x1f del\x7f";
    const std::vector<ChatMessage> messages = {
        {"user", "héllo wörld — 日本語 😀 \"quoted\" \\n (literal)"},
        {"assistant", "</think> {\"json\": [1, 2]} \n\n"},
        {"user", ""},
        {"assistant", "\\u0041 not an escape"},
    };
    const std::string json = conversation_to_json(system, messages);
    CHECK(json.find('\n', json.find("\"system\"")) != std::string::npos);
    CHECK(json.find("\x07") == std::string::npos);  // control characters are escaped
    std::string sys2;
    std::vector<ChatMessage> msgs2;
    conversation_from_json(json, &sys2, &msgs2);
    CHECK(sys2 == system);
    REQUIRE(msgs2.size() == messages.size());
    for (size_t i = 0; i < messages.size(); ++i) {
        CHECK(msgs2[i].role == messages[i].role);
        CHECK(msgs2[i].content == messages[i].content);
    }

    // Escapes other writers use, unknown keys, a system message inside the list.
    conversation_from_json(
        R"({"model": "x", "options": {"a": [1, 2.5e3, true, null]}, "messages": [)"
        R"({"role": "system", "content": "sys"}, {"role": "user", "content": "\u00e9\ud83d\ude00\/"}]})",
        &sys2, &msgs2);
    CHECK(sys2 == "sys");
    REQUIRE(msgs2.size() == 1);
    CHECK(msgs2[0].content == "é😀/");

    // Each error names what is wrong (a syntax error by line and column), and the outputs stay as they were.
    const std::string kept_system = sys2;
    const std::vector<ChatMessage> kept = msgs2;
    for (const auto& [bad, says] : std::vector<std::pair<std::string, std::string>>{
             {"", "conversation JSON: line 1, column 1: unexpected end of input"},
             {"{", "conversation JSON: line 1, column 2: expected a string key"},
             {"[]", "conversation JSON: not an object"},
             {R"({"system": "s"})", R"(conversation JSON: no "messages" array)"},
             {R"({"messages": {}})", R"(conversation JSON: "messages" is not an array)"},
             {R"({"system": 1, "messages": []})", R"(conversation JSON: "system" is not a string or null)"},
             {R"({"messages": [{"role": "user"}]})", R"(conversation JSON: messages[0] needs "role" and "content")"},
             {R"({"messages": [{"content": "x"}]})", R"(conversation JSON: messages[0] needs "role" and "content")"},
             {R"({"messages": [1]})", "conversation JSON: messages[0] is not an object"},
             {R"({"messages": [{"role": "user", "content": null}]})",
              "conversation JSON: messages[0].content is not a string"},
             {R"({"messages": [{"role": "user", "content": ""}, {"role": "robot", "content": ""}]})",
              R"(conversation JSON: messages[1]: unknown role "robot")"},
             {R"({"messages": [{"role": "user", "content": ""}, {"role": "system", "content": ""}]})",
              "conversation JSON: messages[1]: a system message is allowed only first"},
             {R"({"messages": []} x)", "conversation JSON: line 1, column 18: unexpected text after the JSON value"},
             {R"({"messages": [{"role": "user", "content": "\ud800"}]})", "surrogate"},
             {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\nb\"}]}",
              "conversation JSON: line 1, column 45: control character in a string"},
             {"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\"}]}", "invalid UTF-8"},  // strict JSON
             {R"({"messages": [], "messages": []})", R"(duplicate key "messages")"},
             {R"({"messages": [], "x": [1, 2,]})", "conversation JSON: line 1, column 29: unexpected character ']'"},
         }) {
        CAPTURE(bad);
        CHECK_THROWS_WITH_AS(conversation_from_json(bad, &sys2, &msgs2), doctest::Contains(says.c_str()), Error);
        CHECK(sys2 == kept_system);
        REQUIRE(msgs2.size() == kept.size());
        CHECK(msgs2[0].content == kept[0].content);
    }

    // A conversation with bytes outside UTF-8 (typed at a terminal that is not UTF-8) saves as JSON that loads, each
    // such byte as U+FFFD.
    conversation_from_json(conversation_to_json("a\xff", {{"user", "\xc3("}}), &sys2, &msgs2);
    CHECK(sys2 == "a\xef\xbf\xbd");
    REQUIRE(msgs2.size() == 1);
    CHECK(msgs2[0].content == "\xef\xbf\xbd(");

    // Deep nesting in an unknown key is an error, not a stack overflow (a million levels overflowed the stack);
    // nesting up to the reader's bound, the file's object included, is read.
    for (const char* open : {"[", "{\"k\": "}) {
        std::string deep = "{\"messages\": [], \"x\": ";
        for (int i = 0; i < 1000000; ++i) deep += open;
        CHECK_THROWS_WITH_AS(conversation_from_json(deep, &sys2, &msgs2),
                             doctest::Contains(("nesting deeper than " + std::to_string(kJsonMaxDepth)).c_str()),
                             Error);
    }
    const auto nested = [](size_t levels) {
        std::string text = "{\"messages\": [], \"x\": ";
        for (size_t i = 0; i < levels; ++i) text += "[";
        for (size_t i = 0; i < levels; ++i) text += "]";
        return text + "}";
    };
    conversation_from_json(nested(kJsonMaxDepth - 1), &sys2, &msgs2);
    CHECK(msgs2.empty());
    CHECK_THROWS_WITH_AS(conversation_from_json(nested(kJsonMaxDepth), &sys2, &msgs2),
                         doctest::Contains("nesting deeper than"), Error);
}

TEST_CASE("repl: /load replaces the conversation and keeps the matching cache prefix") {
    Rig rig;
    ChatSession s(*rig.model, *rig.generator, *rig.cache, {}, *ChatTemplate::by_name("raw"));
    s.send("Once upon a time", greedy(10), kKeep);
    s.send("The dog", greedy(10), kKeep);
    const std::string json = s.to_json();
    std::string sys;
    std::vector<ChatMessage> msgs;
    conversation_from_json(json, &sys, &msgs);
    const int held = rig.cache->n_committed();
    s.replace(sys, msgs);
    CHECK(s.to_json() == json);
    CHECK(rig.cache->n_committed() > 0);
    CHECK(rig.cache->n_committed() <= held);
    const TurnReport t = s.send("Then", greedy(5), kKeep);
    CHECK(t.n_reused > 0);
}

TEST_CASE("repl: a reasoning template's thinking streams apart and stays out of the conversation") {
    // stories260K does not think; under deepseek-r1 (thinking on) the generation prompt opens the think block, so
    // all it writes is reasoning that never closes: no answer, and nothing of it in the history.
    Rig rig;
    ChatSession s(*rig.model, *rig.generator, *rig.cache, {}, *ChatTemplate::by_name("deepseek-r1"));
    std::string shown, thought;
    s.on_reasoning = [&](std::string_view t) {
        thought += t;
        return true;
    };
    const TurnReport t1 = s.send("Once upon a time", greedy(10), [&](std::string_view t) {
        shown += t;
        return true;
    });
    CHECK(shown.empty());
    CHECK(t1.answer.empty());
    CHECK_FALSE(t1.reasoning.empty());
    CHECK(t1.reasoning == thought);
    CHECK(t1.reasoning_unfinished);
    REQUIRE(s.messages().size() == 2);
    CHECK(s.messages()[1].content.empty());
    // The next turn renders the empty answer, not the reasoning.
    s.send("Then", greedy(4), kKeep);
    const std::vector<int> rendered = s.render_tokens(false);
    const std::string text = rig.model->tokenizer->decode(rendered);
    CHECK(text.find(t1.reasoning) == std::string::npos);

    // A consumer of the reasoning that stops ends the turn, like a closed stdout.
    s.on_reasoning = [](std::string_view) { return false; };
    const TurnReport t3 = s.send("Again", greedy(10), kKeep);
    CHECK(t3.interrupted);
    CHECK(t3.reasoning_unfinished);

    // qwen3: text that does not open <think> is all answer, the same as plain ChatML gives for the same prompt.
    Rig rig2;
    ChatSession q(*rig2.model, *rig2.generator, *rig2.cache, {}, *ChatTemplate::by_name("qwen3"));
    std::string q_thought;
    q.on_reasoning = [&](std::string_view t) {
        q_thought += t;
        return true;
    };
    const TurnReport qa = q.send("Once upon a time", greedy(10), kKeep);
    CHECK(q_thought.empty());
    CHECK_FALSE(qa.reasoning_unfinished);
    Rig rig3;
    ChatSession c(*rig3.model, *rig3.generator, *rig3.cache, {}, *ChatTemplate::by_name("chatml"));
    CHECK(c.send("Once upon a time", greedy(10), kKeep).answer == qa.answer);
}

TEST_CASE("repl: a command line splits into its word and its argument, which may span lines") {
    const auto split = [](const std::string& input) {
        const CommandLine c = split_command(input);
        return c.word + "|" + c.arg;
    };
    CHECK(split("/stats") == "/stats|");
    CHECK(split("  /system  Answer in French.  ") == "/system|Answer in French.");
    CHECK(split("/grammar root ::= \"yes\" | \"no\"") == "/grammar|root ::= \"yes\" | \"no\"");
    // A line ended with a backslash, or a \"\"\" block: the argument keeps its inner newlines.
    CHECK(split("/grammar root ::= item\nitem ::= \"x\"\n") == "/grammar|root ::= item\nitem ::= \"x\"");
    CHECK(split("/grammar\nroot ::= \"x\"") == "/grammar|root ::= \"x\"");
    CHECK(split("/json-schema\t@~/user.json\r") == "/json-schema|@~/user.json");
    // Not commands: text that does not start with '/', and nothing at all.
    CHECK(split("Once upon a /time") == "|");
    CHECK(split("") == "|");
    CHECK(split(" \n ") == "|");
}
