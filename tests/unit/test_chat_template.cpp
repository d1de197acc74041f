// Unit tests for src/chat_template.*: every family and case of tests/data/chat-templates.json (Jinja sources
// rendered by Python jinja2) must be detected and rendered byte for byte; plus by_name, fallbacks, raw, end-of-turn
// strings, ChatML default system prompts, prefix stability, and golden strings for Llama 2 and Zephyr.
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "text/chat_template.h"
#include "mini_json.h"
#include "error.h"
#include "test_paths.h"

using tandem::ChatMessage;
using tandem::ChatTemplate;

namespace {

using tandem::test::Json;
Json parse_json(const std::string& text) { return Json::parse(text); }

const Json& reference() {
    static const Json doc = [] {
        const std::string path = std::string(TANDEM_TEST_DATA) + "/chat-templates.json";
        std::ifstream in(path, std::ios::binary);
        if (!in) throw std::runtime_error("cannot open " + path);
        std::stringstream ss;
        ss << in.rdbuf();
        return parse_json(ss.str());
    }();
    return doc;
}

std::vector<ChatMessage> messages_of(const Json& j) {
    std::vector<ChatMessage> out;
    for (const auto& m : j.arr) out.push_back({m["role"].str, m["content"].str});
    return out;
}

// "chatml-qwen2.5" → "chatml"; the other families are named as in ChatTemplate::names().
std::string expected_name(const std::string& family) {
    return family.rfind("chatml", 0) == 0 ? "chatml" : family;
}

const std::string& source_of(const std::string& family) {
    for (const auto& f : reference()["families"].arr)
        if (f["family"].str == family) return f["template"].str;
    throw std::runtime_error("no family " + family);
}

// The well-known templates with no JSON cases, as published in the models' tokenizer_config.json
// (meta-llama/Llama-2-7b-chat-hf and HuggingFaceH4/zephyr-7b-beta). The goldens below were produced from them with
// Python jinja2 3.1.6 (trim_blocks, lstrip_blocks, bos_token "<s>", eos_token "</s>").
const char* const kLlama2Source =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif "
    "%}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
    "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
    "loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if "
    "message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] "
    "== 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";
const char* const kZephyrSource =
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token "
    "}}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% "
    "endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";

const std::vector<ChatMessage> kSystemConversation = {
    {"system", "You are terse."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "What is 2+2?"}};
const std::vector<ChatMessage> kPlainConversation = {
    {"user", "Line one\nline two"}, {"assistant", "Got it."}, {"user", "Thanks"}};

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

}  // namespace

TEST_CASE("chat template JSON reader handles escapes and surrogate pairs") {
    const Json j = parse_json(R"({"a": ["x\n\"\\\/", true, false, null, 1.5], "b": "\u00e9\u4e2d\ud83d\ude00"})");
    CHECK(j["a"].arr.size() == 5);
    CHECK(j["a"].arr[0].str == "x\n\"\\/");
    CHECK(j["a"].arr[1].b);
    CHECK_FALSE(j["a"].arr[2].b);
    CHECK(j["a"].arr[3].kind == Json::Null);
    CHECK(j["a"].arr[4].num == 1.5);
    CHECK(j["b"].str == "\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80");
}

TEST_CASE("chat template reference cases: detect and render match jinja2") {
    const auto& families = reference()["families"].arr;
    REQUIRE(families.size() == 7);
    int rendered = 0, refused = 0;
    for (const auto& f : families) {
        const std::string family = f["family"].str;
        CAPTURE(family);
        std::string warning = "stale";
        ChatTemplate t = ChatTemplate::detect(f["template"].str, &warning);
        // llama.cpp's DeepSeek-R1 template closes the think block unless enable_thinking is true; these renderings
        // leave it undefined, which is tandem's thinking off (chat-templates-families.json has both forms).
        if (family == "deepseek-r1") t.set_thinking(false);
        CHECK(t.name() == expected_name(family));
        CHECK(warning.empty());
        REQUIRE(f["cases"].arr.size() == 6);
        for (const auto& c : f["cases"].arr) {
            const auto messages = messages_of(c["messages"]);
            const bool gen = c["add_generation_prompt"].b;
            CAPTURE(gen);
            CAPTURE(messages.size());
            if (c.has("error")) {
                const Json* error = &c["error"];
                CHECK_THROWS_WITH_AS(t.render(messages, gen), doctest::Contains(error->str.c_str()),
                                     tandem::Error);
                ++refused;
            } else {
                CHECK(t.render(messages, gen) == c["rendered"].str);
                ++rendered;
            }
        }
    }
    CHECK(rendered == 40);
    CHECK(refused == 2);
}

TEST_CASE("chat template ChatML default system prompts come from the source") {
    CHECK(ChatTemplate::detect(source_of("chatml-qwen2.5")).default_system() ==
          "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
    CHECK(ChatTemplate::detect(source_of("chatml-smollm2")).default_system() ==
          "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    // Escapes in the literal are undone; a literal that closes before <|im_end|> is not a default.
    CHECK(ChatTemplate::detect("{{ '<|im_start|>system\\nSay \\'hi\\'\\n\\tplease<|im_end|>\\n' }}").default_system() ==
          "Say 'hi'\n\tplease");
    CHECK(ChatTemplate::detect("{{ \"<|im_start|>system\\nIt's me<|im_end|>\" }}").default_system() == "It's me");
    const ChatTemplate plain = ChatTemplate::detect(
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}");
    CHECK(plain.name() == "chatml");
    CHECK(plain.default_system().empty());
    CHECK(plain.render({{"user", "Hi"}}, true) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    CHECK(ChatTemplate::by_name("chatml")->default_system().empty());
    for (const auto& n : ChatTemplate::names())
        if (n != "chatml") CHECK(ChatTemplate::by_name(n)->default_system().empty());
}

TEST_CASE("chat template by_name round-trips and rejects unknown names") {
    const auto names = ChatTemplate::names();
    CHECK(names.size() == 15);
    for (const auto& n : names) {
        CAPTURE(n);
        const auto t = ChatTemplate::by_name(n);
        REQUIRE(t.has_value());
        CHECK(t->name() == n);
        CHECK(t->is_raw() == (n == "raw"));
    }
    CHECK_FALSE(ChatTemplate::by_name("jinja").has_value());
    CHECK_FALSE(ChatTemplate::by_name("").has_value());
    CHECK_FALSE(ChatTemplate::by_name("ChatML").has_value());
    // Every JSON family is reachable by name and renders the same as the detected template (bar ChatML's default
    // system prompt, which only the source carries).
    for (const auto& f : reference()["families"].arr) {
        const std::string family = f["family"].str;
        if (expected_name(family) == "chatml") continue;
        CAPTURE(family);
        auto t = ChatTemplate::by_name(expected_name(family));
        REQUIRE(t.has_value());
        if (family == "deepseek-r1") t->set_thinking(false);  // as in the reference test above
        for (const auto& c : f["cases"].arr)
            if (!c.has("error"))
                CHECK(t->render(messages_of(c["messages"]), c["add_generation_prompt"].b) ==
                      c["rendered"].str);
    }
}

TEST_CASE("chat template fallbacks: empty source is raw, unknown source is ChatML with a warning") {
    std::string warning;
    const ChatTemplate empty = ChatTemplate::detect("", &warning);
    CHECK(empty.name() == "raw");
    CHECK(empty.is_raw());
    CHECK(warning.empty());
    CHECK(ChatTemplate::detect("  \n", &warning).is_raw());

    const ChatTemplate unknown =
        ChatTemplate::detect("{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}", &warning);
    CHECK(unknown.name() == "chatml");
    CHECK_FALSE(unknown.is_raw());
    CHECK(unknown.default_system().empty());
    CHECK_FALSE(warning.empty());
    CHECK(warning.find("ChatML") != std::string::npos);
    CHECK(ChatTemplate::detect("{{ messages }}").name() == "chatml");  // no warning pointer: still fine
}

TEST_CASE("chat template raw is plain concatenation") {
    const ChatTemplate raw = *ChatTemplate::by_name("raw");
    CHECK(raw.render({{"user", "Once upon a time"}}, true) == "Once upon a time");
    CHECK(raw.render({{"user", "Once upon"}, {"assistant", " a time"}, {"user", ", there"}}, false) ==
          "Once upon a time, there");
    CHECK(raw.render({}, true).empty());
    CHECK(raw.end_of_turn().empty());
}

TEST_CASE("chat template end_of_turn per family") {
    using V = std::vector<std::string>;
    CHECK(ChatTemplate::by_name("chatml")->end_of_turn() == V{"<|im_end|>"});
    CHECK(ChatTemplate::by_name("llama3")->end_of_turn() == V{"<|eot_id|>"});
    CHECK(ChatTemplate::by_name("gemma")->end_of_turn() == V{"<end_of_turn>"});
    CHECK(ChatTemplate::by_name("phi3")->end_of_turn() == V{"<|end|>", "<|endoftext|>"});
    CHECK(ChatTemplate::by_name("mistral")->end_of_turn() == V{"</s>"});
    CHECK(ChatTemplate::by_name("llama2")->end_of_turn() == V{"</s>"});
    CHECK(ChatTemplate::by_name("zephyr")->end_of_turn() == V{"</s>"});
    CHECK(ChatTemplate::by_name("deepseek-r1")->end_of_turn() == V{"<｜end▁of▁sentence｜>"});
    // The end-of-turn string is what the template writes after an assistant message in the reference renderings.
    for (const auto& f : reference()["families"].arr) {
        const ChatTemplate t = ChatTemplate::detect(f["template"].str);
        const std::string text = t.render(kPlainConversation, false);
        CAPTURE(t.name());
        CHECK(text.find("Got it." + t.end_of_turn()[0]) != std::string::npos);
    }
}

TEST_CASE("chat template Llama 2 golden strings") {
    const ChatTemplate t = ChatTemplate::detect(kLlama2Source);
    REQUIRE(t.name() == "llama2");
    CHECK(t.render({{"user", "Hello!"}}, true) == "<s>[INST] Hello! [/INST]");
    CHECK(t.render({{"user", "Hello!"}}, false) == "<s>[INST] Hello! [/INST]");
    CHECK(t.render(kSystemConversation, true) ==
          "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] What is 2+2? [/INST]");
    CHECK(t.render(kPlainConversation, false) ==
          "<s>[INST] Line one\nline two [/INST] Got it. </s><s>[INST] Thanks [/INST]");
    CHECK(t.render({{"user", "  padded \n"}}, false) == "<s>[INST] padded [/INST]");  // content.strip()
    CHECK_THROWS_WITH_AS(t.render({{"assistant", "Hi"}}, true), doctest::Contains("must alternate"), tandem::Error);
}

TEST_CASE("chat template Zephyr golden strings") {
    const ChatTemplate t = ChatTemplate::detect(kZephyrSource);
    REQUIRE(t.name() == "zephyr");
    CHECK(t.render({{"user", "Hello!"}}, true) == "<|user|>\nHello!</s>\n<|assistant|>\n");
    CHECK(t.render({{"user", "Hello!"}}, false) == "<|user|>\nHello!</s>\n");
    CHECK(t.render(kSystemConversation, true) ==
          "<|system|>\nYou are terse.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello.</s>\n<|user|>\nWhat is "
          "2+2?</s>\n<|assistant|>\n");
    CHECK(t.render(kPlainConversation, false) ==
          "<|user|>\nLine one\nline two</s>\n<|assistant|>\nGot it.</s>\n<|user|>\nThanks</s>\n");
}

TEST_CASE("chat template detection markers") {
    CHECK(ChatTemplate::detect("{{ '<|start_header_id|>' + role + '<|end_header_id|>' }}").name() == "llama3.0");
    CHECK(ChatTemplate::detect("{{ '<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: ' }}")
              .name() == "llama3");
    CHECK(ChatTemplate::detect("{{ '<start_of_turn>user\n' }}").name() == "gemma");
    CHECK(ChatTemplate::detect("{{ '<|user|>\n' + c + '<|end|>\n' }}").name() == "phi3");
    CHECK(ChatTemplate::detect("{{ '<|user|>\n' + c + '</s>' }}").name() == "zephyr");
    CHECK(ChatTemplate::detect("{{ '[INST] <<SYS>>\n' }}").name() == "llama2");
    CHECK(ChatTemplate::detect("{{ bos_token + '[INST] ' + c + ' [/INST]' }}").name() == "mistral");
    CHECK(ChatTemplate::detect("{{ '<｜User｜>' + c + '<｜Assistant｜>' }}").name() == "deepseek-r1");
}

TEST_CASE("chat template family rules beyond the reference cases") {
    // Gemma: roles must alternate (the template's other error) and contents are trimmed.
    const ChatTemplate gemma = *ChatTemplate::by_name("gemma");
    CHECK_THROWS_WITH_AS(gemma.render({{"user", "a"}, {"user", "b"}}, true),
                         doctest::Contains("Conversation roles must alternate"), tandem::Error);
    CHECK(gemma.render({{"user", "  hi\n"}}, false) == "<bos><start_of_turn>user\nhi<end_of_turn>\n");
    // Mistral: alternation after the optional system message; the system text is dropped when the last turn is
    // the assistant's (the template only folds it into a last *user* turn).
    const ChatTemplate mistral = *ChatTemplate::by_name("mistral");
    CHECK_THROWS_WITH_AS(mistral.render({{"system", "s"}, {"assistant", "a"}}, true),
                         doctest::Contains("conversation roles must alternate"), tandem::Error);
    CHECK(mistral.render({{"system", "s"}, {"user", "u"}, {"assistant", "a"}}, false) == "<s>[INST]u[/INST]a</s>");
    // Llama 3 trims contents; the system header is present even without a system message.
    const ChatTemplate llama3 = *ChatTemplate::by_name("llama3");
    CHECK(llama3.render({{"system", " sys \n"}}, false) ==
          "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December "
          "2023\nToday Date: 26 Jul 2024\n\nsys<|eot_id|>");
    // Phi-3 skips an empty system message.
    CHECK(ChatTemplate::by_name("phi3")->render({{"system", ""}, {"user", "u"}}, true) ==
          "<|user|>\nu<|end|>\n<|assistant|>\n");
    // DeepSeek-R1 drops the reasoning of past assistant turns.
    CHECK(ChatTemplate::by_name("deepseek-r1")->render({{"user", "q"}, {"assistant", "<think>\nhm\n</think>\n\nA"}},
                                                       false) ==
          "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜>\n\nA<｜end▁of▁sentence｜>");
}

// Renders placeholders in place of the normalized contents, then substitutes them back: must equal render().
std::string render_by_substitution(const ChatTemplate& t, const std::vector<ChatMessage>& messages, bool gen) {
    const auto norm = t.normalized(messages);
    auto marked = norm;
    for (size_t i = 0; i < marked.size(); ++i) {
        marked[i].content = "\x01" + std::to_string(i) + "\x02";
        if (!marked[i].reasoning.empty()) marked[i].reasoning = "\x01r" + std::to_string(i) + "\x02";
    }
    const std::string text = t.render(marked, gen);
    std::string out;
    for (size_t pos = 0; pos < text.size();) {
        if (text[pos] == '\x01') {
            const size_t end = text.find('\x02', pos);
            const bool reasoning = text[pos + 1] == 'r';
            const size_t begin = pos + (reasoning ? 2 : 1);
            const ChatMessage& m = norm.at(std::stoul(text.substr(begin, end - begin)));
            out += reasoning ? m.reasoning : m.content;
            pos = end + 1;
        } else {
            out += text[pos++];
        }
    }
    return out;
}

TEST_CASE("chat template normalized contents render verbatim, so placeholders can be substituted") {
    std::vector<std::vector<ChatMessage>> conversations = {
        kSystemConversation,
        kPlainConversation,
        {{"system", "  Be brief. \n"}, {"user", "\n q1 \t"}, {"assistant", "<think>\nhm\n</think>\n\n a1 "}, {"user", " q2"}},
        {{"user", " q1 "}, {"assistant", "  "}, {"user", "q2\n\n"}},
        {{"system", ""}, {"user", "q"}},
    };
    for (const auto& f : reference()["families"].arr)
        for (const auto& c : f["cases"].arr) conversations.push_back(messages_of(c["messages"]));
    std::vector<ChatTemplate> templates;
    for (const auto& n : ChatTemplate::names()) templates.push_back(*ChatTemplate::by_name(n));
    templates.push_back(ChatTemplate::detect(source_of("chatml-qwen2.5")));
    for (const auto& t : templates) {
        CAPTURE(t.name());
        for (const auto& conv : conversations) {
            CAPTURE(conv.size());
            for (const bool gen : {false, true}) {
                std::string expected;
                try {
                    expected = t.render(conv, gen);
                } catch (const tandem::Error&) {
                    CHECK_THROWS_AS(t.render(t.normalized(conv), gen), tandem::Error);
                    continue;
                }
                CHECK(t.render(t.normalized(conv), gen) == expected);
                CHECK(render_by_substitution(t, conv, gen) == expected);
            }
        }
    }
    // What normalization does, family by family.
    const std::vector<ChatMessage> messy = {{"system", ""}, {"user", " q "}, {"assistant", "<think>x</think> a "}};
    CHECK(ChatTemplate::by_name("gemma")->normalized({{"user", " q "}})[0].content == "q");
    CHECK(ChatTemplate::by_name("llama3")->normalized(messy)[1].content == "q");
    CHECK(ChatTemplate::by_name("chatml")->normalized(messy)[1].content == " q ");
    CHECK(ChatTemplate::by_name("phi3")->normalized(messy).size() == 2);
    CHECK(ChatTemplate::by_name("deepseek-r1")->normalized(messy)[2].content == " a ");
    const auto llama2 = ChatTemplate::by_name("llama2")->normalized({{"system", " s "}, {"user", " q "}, {"assistant", " a "}});
    CHECK(llama2[0].content == " s ");
    CHECK(llama2[1].content == " q");
    CHECK(llama2[2].content == "a");
    CHECK(ChatTemplate::by_name("llama2")->render({{"system", " s "}, {"user", " q "}}, true) ==
          "<s>[INST] <<SYS>>\n s \n<</SYS>>\n\n q [/INST]");
    CHECK(ChatTemplate::by_name("llama2")->render({{"system", "s"}, {"user", " \n"}}, true) ==
          "<s>[INST] <<SYS>>\ns\n<</SYS>> [/INST]");  // the strip reaches into the markup (see the header)
}

TEST_CASE("chat template multi-turn rendering is prefix-stable where the family allows it") {
    const std::vector<ChatMessage> conversation = {{"user", "Hi"},      {"assistant", "Hello."}, {"user", "2+2?"},
                                                   {"assistant", "4"},  {"user", "Thanks"}};
    std::vector<std::pair<ChatTemplate, std::string>> templates;  // (template, text it may append at the end)
    for (const char* n : {"raw", "chatml", "llama2", "llama3", "llama3.0", "mistral", "gemma", "gemma3", "zephyr",
                          "phi4", "deepseek-r1"})
        templates.emplace_back(*ChatTemplate::by_name(n), "");
    templates.emplace_back(ChatTemplate::detect(source_of("chatml-qwen2.5")), "");
    templates.emplace_back(ChatTemplate::detect(source_of("chatml-smollm2")), "");
    templates.emplace_back(*ChatTemplate::by_name("phi3"), "<|endoftext|>");  // the template ends with EOS text
    templates.emplace_back(*ChatTemplate::by_name("phi4-mini"), "<|endoftext|>");
    for (const auto& [t, trailer] : templates) {
        CAPTURE(t.name());
        for (const bool with_system : {false, true}) {
            if (with_system && (t.name() == "gemma" || t.name() == "mistral")) continue;  // refused / re-rendered
            std::vector<ChatMessage> messages;
            if (with_system) messages.push_back({"system", "Be brief."});
            std::string previous = t.render(messages, false);
            for (const auto& m : conversation) {
                messages.push_back(m);
                const std::string text = t.render(messages, false);
                CAPTURE(text);
                std::string stable = previous;
                if (!trailer.empty() && stable.size() >= trailer.size() &&
                    stable.compare(stable.size() - trailer.size(), trailer.size(), trailer) == 0)
                    stable.resize(stable.size() - trailer.size());
                CHECK(starts_with(text, stable));
                previous = text;
            }
        }
    }
    // Mistral with a system message is the documented exception: the system text moves to the last user turn.
    const ChatTemplate mistral = *ChatTemplate::by_name("mistral");
    const std::string one = mistral.render({{"system", "S"}, {"user", "a"}}, false);
    const std::string three = mistral.render({{"system", "S"}, {"user", "a"}, {"assistant", "b"}, {"user", "c"}}, false);
    CHECK_FALSE(starts_with(three, one));
}
