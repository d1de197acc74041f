// Unit tests for src/text/reasoning_split.*: synthetic token streams (no model thinks among the test models), cut at
// every byte and at every pair of places, with and without a think block, a block opened by the generation prompt,
// unterminated reasoning, tags that only look like tags, a consumer that stops, and agreement with the Qwen3
// template's own split of a stored turn (the strings of tests/data/chat-templates-families.json's cases).
#include <doctest/doctest.h>
#include <string>
#include <vector>

#include "text/reasoning_split.h"

using tandem::ReasoningSplitter;
using Part = ReasoningSplitter::Part;

namespace {

struct Split {
    std::string reasoning, answer;
    std::vector<Part> order;  // the part of each sink call, in order
    bool saw = false, open = false;
};

// Feeds `pieces` one by one and finishes.
Split run(const std::vector<std::string>& pieces, bool opened = false) {
    Split s;
    ReasoningSplitter splitter(opened, [&](Part part, std::string_view text) {
        CHECK_FALSE(text.empty());  // the sink never gets empty pieces
        (part == Part::Reasoning ? s.reasoning : s.answer) += text;
        s.order.push_back(part);
        return true;
    });
    for (const auto& p : pieces) CHECK(splitter.push(p));
    CHECK(splitter.finish());
    s.saw = splitter.saw_reasoning();
    s.open = splitter.in_reasoning();
    return s;
}

// The same text cut into single bytes, and at every pair of cut points: the result must never depend on the cuts.
void check_all_cuts(const std::string& text, bool opened, const std::string& reasoning, const std::string& answer) {
    CAPTURE(text);
    const Split whole = run({text}, opened);
    CHECK(whole.reasoning == reasoning);
    CHECK(whole.answer == answer);
    std::vector<std::string> bytes;
    for (const char c : text) bytes.emplace_back(1, c);
    const Split by_byte = run(bytes, opened);
    CHECK(by_byte.reasoning == reasoning);
    CHECK(by_byte.answer == answer);
    for (size_t i = 0; i <= text.size(); ++i)
        for (size_t j = i; j <= text.size(); ++j) {
            const Split s = run({text.substr(0, i), text.substr(i, j - i), text.substr(j)}, opened);
            if (s.reasoning != reasoning || s.answer != answer) {
                CAPTURE(i);
                CAPTURE(j);
                CHECK(s.reasoning == reasoning);
                CHECK(s.answer == answer);
                return;
            }
        }
}

}  // namespace

TEST_CASE("reasoning split: a think block at the start, Qwen3's canonical form") {
    check_all_cuts("<think>\nThe user adds 2 and 2.\n</think>\n\n4", false, "The user adds 2 and 2.", "4");
    const Split s = run({"<think>", "\n", "Let me ", "think.", "\n", "</think>", "\n\n", "The answer", " is 4."});
    CHECK(s.saw);
    CHECK_FALSE(s.open);
    CHECK(s.reasoning == "Let me think.");
    CHECK(s.answer == "The answer is 4.");
    // Reasoning is handed out as it comes (streamed), and all of it before any answer text.
    CHECK(s.order.front() == Part::Reasoning);
    CHECK(s.order.back() == Part::Answer);
    for (size_t i = 1; i < s.order.size(); ++i)
        CHECK_FALSE((s.order[i - 1] == Part::Answer && s.order[i] == Part::Reasoning));
}

TEST_CASE("reasoning split: tags cut inside, across every piece boundary") {
    check_all_cuts("<think>abc</think>def", false, "abc", "def");
    check_all_cuts("<think>\n\nmulti\nline\n\n</think>\n\n\nanswer\n", false, "multi\nline", "answer\n");
    // Newlines inside the reasoning stay; only those at its two ends go.
    check_all_cuts("<think>\na\n\nb\n</think>x", false, "a\n\nb", "x");
    // Spaces are not newlines: the template strips only '\n'.
    check_all_cuts("<think> a </think> b", false, " a ", " b");
}

TEST_CASE("reasoning split: streamed reasoning is not held back longer than a possible tag") {
    std::string reasoning;
    ReasoningSplitter splitter(false, [&](Part part, std::string_view text) {
        if (part == Part::Reasoning) reasoning += text;
        return true;
    });
    splitter.push("<think>\nstep one, ");
    CHECK(reasoning == "step one, ");
    splitter.push("step two </th");  // might be the closing tag: held
    CHECK(reasoning == "step one, step two ");
    splitter.push("ing> and more");  // it was not
    CHECK(reasoning == "step one, step two </thing> and more");
    splitter.push("\n\n");  // newlines might precede the tag: held
    CHECK(reasoning == "step one, step two </thing> and more");
    splitter.push("then\n");
    CHECK(reasoning == "step one, step two </thing> and more\n\nthen");
    CHECK(splitter.in_reasoning());
}

TEST_CASE("reasoning split: no think block passes the text through byte for byte") {
    check_all_cuts("Just an answer.", false, "", "Just an answer.");
    check_all_cuts("  \n indented answer\n", false, "", "  \n indented answer\n");
    check_all_cuts("", false, "", "");
    check_all_cuts("\n\n", false, "", "\n\n");
    // Things that start like the tag but are not it.
    check_all_cuts("<thinking>no</thinking>", false, "", "<thinking>no</thinking>");
    check_all_cuts("<th", false, "", "<th");
    check_all_cuts("<b>bold</b>", false, "", "<b>bold</b>");
    check_all_cuts("</think>stray", false, "", "</think>stray");
    // A think block later in the answer is answer text.
    check_all_cuts("Answer first <think>x</think> y", false, "", "Answer first <think>x</think> y");
    const Split s = run({"Hello", " world"});
    CHECK_FALSE(s.saw);
    CHECK_FALSE(s.open);
}

TEST_CASE("reasoning split: whitespace before the opening tag goes with it") {
    check_all_cuts("\n  <think>r</think>a", false, "r", "a");
    check_all_cuts("\t<think>\n</think>\n\nonly answer", false, "", "only answer");
}

TEST_CASE("reasoning split: an empty think block (Qwen3 thinking off, or a model that skips thinking)") {
    check_all_cuts("<think>\n\n</think>\n\nDirect answer.", false, "", "Direct answer.");
    const Split s = run({"<think>\n\n</think>\n\n", "Direct."});
    CHECK(s.saw);
    CHECK(s.reasoning.empty());
    for (const Part p : s.order) CHECK(p == Part::Answer);
}

TEST_CASE("reasoning split: the generation prompt opened the block (DeepSeek-R1)") {
    check_all_cuts("Okay, 2+2.\n</think>\n\n4", true, "Okay, 2+2.", "4");
    check_all_cuts("\nOkay.</think>4", true, "Okay.", "4");
    // The opening tag is not expected again: if the model writes one, it is reasoning text.
    check_all_cuts("<think>x</think>y", true, "<think>x", "y");
    const Split s = run({"reason"}, true);
    CHECK(s.saw);
    CHECK(s.open);
    CHECK(s.answer.empty());
}

TEST_CASE("reasoning split: a turn that ends inside its reasoning") {
    Split s = run({"<think>\nstill thinking\n\n"});
    CHECK(s.saw);
    CHECK(s.open);
    CHECK(s.reasoning == "still thinking");
    CHECK(s.answer.empty());
    // A partial closing tag at the end is reasoning text, since the tag never came.
    s = run({"<think>a</thi"});
    CHECK(s.open);
    CHECK(s.reasoning == "a</thi");
    s = run({"<think>"});
    CHECK(s.open);
    CHECK(s.reasoning.empty());
    check_all_cuts("<think>\nunfinished\n</thi", false, "unfinished\n</thi", "");
}

TEST_CASE("reasoning split: a second closing tag is answer text") {
    // Streaming cannot take back the answer, unlike the template's split('</think>')[-1].
    check_all_cuts("<think>a</think>b</think>\nc", false, "a", "b</think>\nc");
}

TEST_CASE("reasoning split: UTF-8 text is never cut inside a character") {
    const std::string text = "<think>\nnaïve 日本語 🙂\n</think>\n\ncafé 🙂";
    check_all_cuts(text, false, "naïve 日本語 🙂", "café 🙂");
    // Pieces that are whole characters come out whole (the cuts fall only before '<' or '\n').
    ReasoningSplitter splitter(false, [&](Part, std::string_view piece) {
        const unsigned char last = static_cast<unsigned char>(piece.back());
        CHECK((last < 0x80 || (last & 0xC0) == 0x80));  // ends on ASCII or a continuation byte, never a lead byte
        return true;
    });
    for (const char* p : {"<think>", "\n", "naïve", " 日本語", " 🙂", "\n", "</think>", "\n\n", "café", " 🙂"})
        splitter.push(p);
    splitter.finish();
}

TEST_CASE("reasoning split: a consumer that stops ends the splitter") {
    int calls = 0;
    ReasoningSplitter splitter(false, [&](Part, std::string_view) { return ++calls < 2; });
    CHECK(splitter.push("<think>one "));
    CHECK_FALSE(splitter.push("two </think> answer"));  // the second call returns false
    CHECK_FALSE(splitter.push("more"));
    CHECK_FALSE(splitter.finish());
    CHECK(calls == 2);
}

TEST_CASE("reasoning split agrees with the Qwen3 template's split of a stored turn") {
    // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') and
    // content.split('</think>')[-1].lstrip('\n'), evaluated by jinja2 in chat-templates-families.json (qwen3 cases:
    // the last assistant turn renders "<think>\n" + reasoning + "\n</think>\n\n" + answer).
    struct Case {
        const char* turn;
        const char* reasoning;
        const char* answer;
    };
    const Case cases[] = {
        {"<think>\nThe user adds 2 and 2.\n</think>\n\n4", "The user adds 2 and 2.", "4"},
        {"<think>\n\nsecond\nthought\n\n</think>\n\n\nA2", "second\nthought", "A2"},
        {"plain answer", "", "plain answer"},
    };
    for (const Case& c : cases) check_all_cuts(c.turn, false, c.reasoning, c.answer);
}
