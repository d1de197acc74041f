// Unit tests for src/grammar/: the GBNF parser (errors with their line and column, every construct, the IR), the
// matcher (JSON-like and arithmetic grammars, bounded repetitions, negated classes, UTF-8 split across calls,
// copies, left recursion, stack deduplication) and token masks (a made-up vocabulary with byte-level pieces and
// split characters, masks against a token-by-token reference, memoisation, a 151,936-token timing printout).
#include <chrono>
#include <cstdio>
#include <doctest/doctest.h>
#include <random>
#include <string>
#include <vector>

#include "error.h"
#include "grammar/answer_after.h"
#include "grammar/constraint.h"
#include "grammar/gbnf.h"
#include "grammar/grammar_matcher.h"
#include "grammar/token_mask.h"

using tandem::grammar::answer_after;
using tandem::grammar::CodePointRange;
using tandem::grammar::Grammar;
using tandem::grammar::GrammarElement;
using tandem::grammar::GrammarMatcher;
using tandem::grammar::kMaxCodePoint;
using tandem::grammar::parse_gbnf;
using tandem::grammar::TokenConstraint;
using tandem::grammar::TokenMasker;

namespace {

// The message parse_gbnf throws for `text`, or "" if it parses.
std::string parse_error(const std::string& text) {
    try {
        parse_gbnf(text);
    } catch (const tandem::Error& e) {
        return e.what();
    }
    return "";
}

// The message building a matcher throws (parse or left recursion), or "".
std::string build_error(const std::string& text) {
    try {
        GrammarMatcher::from_gbnf(text);
    } catch (const tandem::Error& e) {
        return e.what();
    }
    return "";
}

bool matches(const GrammarMatcher& fresh, const std::string& input) {
    GrammarMatcher m = fresh;
    return m.advance(input) && m.accepts();
}

bool matches(const std::string& grammar, const std::string& input) {
    return matches(GrammarMatcher::from_gbnf(grammar), input);
}

// A prefix of some sentence: not dead after it.
bool viable(const GrammarMatcher& fresh, const std::string& input) {
    GrammarMatcher m = fresh;
    return m.advance(input);
}

const char* const kJsonGrammar = R"g(# JSON, as llama.cpp's grammars/json.gbnf describes it (written afresh)
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

ws ::= | " " | "\n" [ \t]{0,20}
)g";

const char* const kArithmeticGrammar = R"g(
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= number
         | "(" expr ")"
number ::= [0-9]+
)g";

}  // namespace

TEST_CASE("grammar parse errors name the line and column") {
    struct Case {
        const char* text;
        const char* message;
    };
    const Case cases[] = {
        {"", "gbnf: line 1, column 1: empty grammar"},
        {"  # only a comment\n", "gbnf: line 2, column 1: empty grammar"},
        {"root ::= foo\n", "gbnf: line 1, column 10: undefined rule 'foo'"},
        {"root ::= a\na ::= b c\nb ::= \"x\"", "gbnf: line 2, column 9: undefined rule 'c'"},
        {"root ::= \"abc\n", "gbnf: line 1, column 10: unterminated string literal"},
        {"root ::= \"a\\q\"", "gbnf: line 1, column 12: bad escape '\\q'"},
        {"root ::= \"\\x4\"", "gbnf: line 1, column 11: bad escape: '\\x' needs 2 hex digits"},
        {"root ::= \"\\u12g4\"", "gbnf: line 1, column 11: bad escape: '\\u' needs 4 hex digits"},
        {"root ::= \"\\U00110000\"", "gbnf: line 1, column 11: escape beyond the last Unicode code point"},
        {"root \"a\"", "gbnf: line 1, column 6: expected '::=' after the rule name 'root'"},
        {"root ::= \"x\"\n\nrest = \"y\"", "gbnf: line 3, column 6: expected '::=' after the rule name 'rest'"},
        {"root ::= (\"a\" | \"b\"\n", "gbnf: line 1, column 10: unclosed '('"},
        {"root ::= (\"a\" | \"b\"]", "gbnf: line 1, column 20: expected ')' or an element, found ']'"},
        {"root ::= \"a\")", "gbnf: line 1, column 13: unexpected ')' with no '(' to close"},
        {"root ::= \"a\"{3,2}", "gbnf: line 1, column 13: repetition {3,2} has its minimum over its maximum"},
        {"root ::= \"a\"{20000}", "gbnf: line 1, column 14: repetition bound 20000 is over the limit 10000"},
        {"root ::= \"a\"{2", "gbnf: line 1, column 13: unclosed '{'"},
        {"root ::= \"a\"{x}", "gbnf: line 1, column 14: expected a number"},
        {"root ::= *", "gbnf: line 1, column 10: '*' with nothing before it to repeat"},
        {"root ::= \"a\" | +", "gbnf: line 1, column 16: '+' with nothing before it to repeat"},
        {"foo ::= \"a\"", "gbnf: line 1, column 1: no rule named 'root'"},
        {"root ::= [z-a]", "gbnf: line 1, column 11: character range with its end before its start"},
        {"root ::= [abc", "gbnf: line 1, column 10: unterminated character class"},
        {"root ::= \"a\"\nroot ::= \"b\"",
         "gbnf: line 2, column 1: rule 'root' is defined twice (first at line 1, column 1)"},
        {"root ::= a b ::= c", "gbnf: line 1, column 12: rule 'b' starts inside another rule"},
        {"root ::= \"\xC3\xA9\" x", "gbnf: line 1, column 14: undefined rule 'x'"},  // é is one column
        {"root ::= \"\xC3\"", "gbnf: line 1, column 11: invalid UTF-8 in the string literal"},
        {"root ::= \"a\" $", "gbnf: line 1, column 14: unexpected '$' in rule 'root'"},
        {"::= \"a\"", "gbnf: line 1, column 1: expected a rule name, found ':'"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.text);
        const std::string error = parse_error(c.text);
        CHECK(error.rfind(c.message, 0) == 0);  // starts with the expected message
        if (error.rfind(c.message, 0) != 0) MESSAGE("got: " << error);
    }
    // Nesting is bounded: an error, not a stack overflow.
    CHECK(parse_error("root ::= " + std::string(100000, '(')).find("nested too deeply") != std::string::npos);
    // Expansion is bounded.
    std::string huge = "root ::=";
    for (int i = 0; i < 110; ++i) huge += " [a]{10000}";  // 1.1M elements
    CHECK(parse_error(huge).find("grammar too large") != std::string::npos);
    // Nested repetitions of groups stay linear (each group is one helper rule): not too large.
    CHECK(parse_error("root ::= ((((\"ab\"{10000}){10000}){10000}){10000}){10000}") == "");
}

TEST_CASE("grammar left recursion is refused when the matcher is built") {
    CHECK(build_error("root ::= root").find("rule 'root' is left recursive") != std::string::npos);
    CHECK(build_error("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"").find("rule 'expr' is left recursive") !=
          std::string::npos);
    // Through a nullable prefix and a group.
    CHECK(build_error("root ::= a\na ::= b? (a \"x\") | \"y\"\nb ::= \"b\"").find("left recursive") !=
          std::string::npos);
    CHECK(build_error("root ::= a\na ::= b\nb ::= c\nc ::= a").find("left recursive") != std::string::npos);
    // Right recursion and recursion after a character are fine.
    CHECK(build_error("root ::= \"(\" root \")\" | \"\"") == "");
    CHECK(build_error(kArithmeticGrammar) == "");
    CHECK(matches("root ::= \"(\" root \")\" | \"\"", "((()))"));
    CHECK_FALSE(matches("root ::= \"(\" root \")\" | \"\"", "(()"));
}

TEST_CASE("grammar IR of literals classes and repetitions") {
    const Grammar g = parse_gbnf("root ::= \"a\\n\" [^b] . [c-e0-9x] rest*\nrest ::= [a-a]");
    REQUIRE(g.rules.size() == 3);  // root, rest, and the helper of rest*
    CHECK(g.rules[g.root].name == "root");
    CHECK(g.find_rule("rest") == 1);
    CHECK(g.find_rule("nope") == -1);
    const auto& seq = g.rules[g.root].alternatives.at(0);
    REQUIRE(seq.size() == 6);
    CHECK(seq[0].ranges == std::vector<CodePointRange>{{'a', 'a'}});
    CHECK(seq[1].ranges == std::vector<CodePointRange>{{'\n', '\n'}});
    CHECK(seq[2].ranges == std::vector<CodePointRange>{{0, 'b' - 1}, {'b' + 1, kMaxCodePoint}});
    CHECK(seq[3].ranges == std::vector<CodePointRange>{{0, kMaxCodePoint}});
    CHECK(seq[4].ranges == std::vector<CodePointRange>{{'0', '9'}, {'c', 'e'}, {'x', 'x'}});
    CHECK(seq[5].kind == GrammarElement::Kind::kRuleRef);
    const auto& helper = g.rules[seq[5].rule];
    CHECK(helper.name == "root#1");
    REQUIRE(helper.alternatives.size() == 2);  // rest root#1 | (empty)
    CHECK(helper.alternatives[0].size() == 2);
    CHECK(helper.alternatives[0][0].rule == 1);
    CHECK(helper.alternatives[0][1].rule == seq[5].rule);
    CHECK(helper.alternatives[1].empty());
    // Overlapping and adjacent ranges merge.
    CHECK(GrammarElement::char_set({{5, 9}, {1, 3}, {4, 4}, {20, 30}, {25, 26}}).ranges ==
          std::vector<CodePointRange>{{1, 9}, {20, 30}});
    CHECK(tandem::grammar::to_gbnf(g).find("root ::= \"a\" \"\\n\" [") == 0);
}

TEST_CASE("grammar literals and escapes") {
    const std::string grammar = R"(root ::= "a\n\t\r\\\"\[\]\x41\u00e9\U0001F600" "")";
    CHECK(matches(grammar, "a\n\t\r\\\"[]A\xC3\xA9\xF0\x9F\x98\x80"));
    CHECK_FALSE(matches(grammar, "a\n\t\r\\\"[]A\xC3\xA9"));
    CHECK(matches("root ::= \"caf\xC3\xA9\"", "caf\xC3\xA9"));
    CHECK(matches("root ::= \"\"", ""));
    CHECK_FALSE(matches("root ::= \"\"", "x"));
    // A repetition after a literal repeats the whole literal.
    CHECK(matches("root ::= \"ab\"+", "ababab"));
    CHECK_FALSE(matches("root ::= \"ab\"+", "abb"));
}

TEST_CASE("grammar character classes negation and any") {
    const std::string grammar = R"(root ::= [a-c0-9_\-]+ [^x-z\]\n] .)";
    CHECK(matches(grammar, "a_9-c!\xE4\xB8\xAD"));
    CHECK(matches(grammar, "b\xC3\xA9\xF0\x9F\x98\x80"));
    CHECK_FALSE(matches(grammar, "ay!"));                // y is excluded
    CHECK_FALSE(matches(grammar, "a]!"));                // so is ]
    CHECK_FALSE(matches(grammar, "a\n!"));               // and the newline
    CHECK_FALSE(matches(grammar, "d!!"));                // d is not in [a-c...]
    CHECK(matches("root ::= [^]", "\xF4\x8F\xBF\xBF"));  // [^] is any code point, U+10FFFF included
    CHECK_FALSE(matches("root ::= []", "a"));            // [] is none
    CHECK(matches("root ::= [\\x00-\\x1F]", std::string(1, '\0')));
}

TEST_CASE("grammar groups alternatives comments and line structure") {
    const std::string grammar =
        "# a comment line\n"
        "root ::= greeting (\n"
        "    \" \" name   # comment inside a group\n"
        "  | \"!\"\n"
        ")\n"
        "greeting ::= \"hi\"\n"
        "           | \"hello\"   # continuation lines may start with |\n"
        "name ::=\n"
        "  [A-Z] [a-z]*\r\n";
    CHECK(matches(grammar, "hi Bob"));
    CHECK(matches(grammar, "hello!"));
    CHECK(matches(grammar, "hello X"));
    CHECK_FALSE(matches(grammar, "hello"));
    CHECK_FALSE(matches(grammar, "hey!"));
    CHECK_FALSE(matches(grammar, "hi bob"));
}

TEST_CASE("grammar repetitions with bounds") {
    struct Case {
        const char* op;
        size_t min;
        size_t max;  // SIZE_MAX: unbounded
    };
    const Case cases[] = {{"*", 0, SIZE_MAX}, {"+", 1, SIZE_MAX},    {"?", 0, 1},     {"{3}", 3, 3},
                          {"{0}", 0, 0},      {"{2,}", 2, SIZE_MAX}, {"{2,5}", 2, 5}, {"{ 0 , 2 }", 0, 2}};
    for (const Case& c : cases) {
        for (const char* item : {"\"x\"", "(\"x\")", "[x]", "xs", "(\"x\" | \"x\")"}) {
            const std::string grammar = std::string("root ::= \"<\" ") + item + c.op + " \">\"\nxs ::= \"x\"";
            CAPTURE(grammar);
            const GrammarMatcher m = GrammarMatcher::from_gbnf(grammar);
            for (size_t n = 0; n <= 8; ++n) {
                CAPTURE(n);
                CHECK(matches(m, "<" + std::string(n, 'x') + ">") == (n >= c.min && n <= c.max));
            }
        }
    }
    // Nested bounded repetitions multiply: (ab{1,2}){2} is 2 groups of a then 1-2 b.
    const GrammarMatcher nested = GrammarMatcher::from_gbnf("root ::= (\"a\" \"b\"{1,2}){2}");
    CHECK(matches(nested, "abab"));
    CHECK(matches(nested, "abbab"));
    CHECK(matches(nested, "abbabb"));
    CHECK_FALSE(matches(nested, "ab"));
    CHECK_FALSE(matches(nested, "abbbab"));
    CHECK_FALSE(matches(nested, "ababab"));
    // Large bounds stay linear: 10000 copies.
    const GrammarMatcher wide = GrammarMatcher::from_gbnf("root ::= [0-9]{2,10000}");
    CHECK(matches(wide, std::string(10000, '7')));
    CHECK_FALSE(matches(wide, std::string(10001, '7')));
    CHECK_FALSE(matches(wide, "7"));
}

TEST_CASE("grammar JSON accepts and rejects") {
    const GrammarMatcher json = GrammarMatcher::from_gbnf(kJsonGrammar);
    CHECK(matches(json, "{}"));
    CHECK(matches(json, R"({"a": [1, 2.5, -3e4, true, null, "x\"y\u00e9"], "b": {"c": false}})"));
    CHECK(matches(json, "{\"caf\xC3\xA9\": \"\xF0\x9F\x98\x80\"}\n  "));
    CHECK_FALSE(matches(json, R"({"a" 1})"));
    CHECK_FALSE(matches(json, R"({"a": [1,]})"));
    CHECK_FALSE(matches(json, R"({"a": 01})"));
    CHECK_FALSE(matches(json, R"({"a": "\q"})"));
    CHECK_FALSE(matches(json, "{\"a\": \"line\nbreak\"}"));
    CHECK_FALSE(matches(json, R"([1])"));  // root is an object
    GrammarMatcher m = json;
    CHECK(m.advance(R"({"key": [tr)"));
    CHECK_FALSE(m.accepts());
    CHECK_FALSE(m.dead());
    CHECK_FALSE(m.advance("x"));
    CHECK(m.dead());
    CHECK_FALSE(m.advance("ue"));  // dead stays dead
}

TEST_CASE("grammar arithmetic accepts prefixes and whole sentences") {
    const GrammarMatcher arithmetic = GrammarMatcher::from_gbnf(kArithmeticGrammar);
    CHECK(matches(arithmetic, "1+2*(3-4)/5"));
    CHECK(matches(arithmetic, "((7))"));
    CHECK(matches(arithmetic, "12*34-56"));
    CHECK_FALSE(matches(arithmetic, "1+"));
    CHECK_FALSE(matches(arithmetic, "(1"));
    CHECK_FALSE(matches(arithmetic, "1)"));
    CHECK_FALSE(matches(arithmetic, "1++2"));
    CHECK_FALSE(matches(arithmetic, ""));
    CHECK(viable(arithmetic, "(1+2*"));
    CHECK_FALSE(viable(arithmetic, "(1+2*)"));
    // Deep nesting: the stacks deepen with the input, and there stays one way to parse it.
    GrammarMatcher deep = arithmetic;
    CHECK(deep.advance(std::string(2000, '(') + "1"));
    CHECK(deep.stack_count() <= 8);
    CHECK(deep.advance(std::string(2000, ')')));
    CHECK(deep.accepts());
}

TEST_CASE("grammar UTF-8 characters split across advance calls") {
    const GrammarMatcher fresh =
        GrammarMatcher::from_gbnf("root ::= \"a\" [\xC3\xA0-\xC3\xBF\xE4\xB8\xAD]+ \"\xF0\x9F\x98\x80\"");
    GrammarMatcher m = fresh;
    CHECK(m.advance(uint8_t{'a'}));
    CHECK(m.advance(uint8_t{0xC3}));  // first byte of é
    CHECK(m.mid_character());
    CHECK_FALSE(m.accepts());
    CHECK(m.advance(uint8_t{0xA9}));
    CHECK_FALSE(m.mid_character());
    CHECK(m.advance(std::string_view("\xE4\xB8")));  // 中, split after two of its three bytes
    CHECK(m.mid_character());
    CHECK(m.advance(std::string_view("\xAD\xF0")));
    CHECK(m.advance(std::string_view("\x9F\x98")));
    CHECK_FALSE(m.accepts());
    CHECK(m.advance(uint8_t{0x80}));
    CHECK(m.accepts());
    // A lead byte no allowed character starts with is refused at once (é and à start with C3, not C4).
    GrammarMatcher early = fresh;
    CHECK(early.advance(uint8_t{'a'}));
    CHECK_FALSE(early.advance(uint8_t{0xC4}));
    // So is a three-byte prefix of the wrong character: E4 B8 is 中's start, E4 B9 is not.
    early = fresh;
    CHECK(early.advance(std::string_view("a\xE4")));
    CHECK_FALSE(early.advance(uint8_t{0xB9}));
    // Invalid UTF-8 kills the state even where any character is allowed.
    const GrammarMatcher any = GrammarMatcher::from_gbnf("root ::= .*");
    CHECK(viable(any, "\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80"));
    CHECK_FALSE(viable(any, "\x80"));              // a continuation byte first
    CHECK_FALSE(viable(any, "\xC0\x80"));          // overlong NUL
    CHECK_FALSE(viable(any, "\xE0\x80\x80"));      // overlong
    CHECK_FALSE(viable(any, "\xED\xA0\x80"));      // a surrogate
    CHECK_FALSE(viable(any, "\xF4\x90\x80\x80"));  // beyond U+10FFFF
    CHECK_FALSE(viable(any, "\xF8"));
    CHECK_FALSE(viable(any,
                       "\xC3"
                       "a"));  // a character cut short
    GrammarMatcher pending = any;
    CHECK(pending.advance(uint8_t{0xC3}));
    CHECK_FALSE(pending.accepts());  // not while a character is pending
}

TEST_CASE("grammar matcher copies are independent and compare by state") {
    const GrammarMatcher fresh = GrammarMatcher::from_gbnf(kArithmeticGrammar);
    GrammarMatcher a = fresh;
    CHECK(a.advance("1+"));
    GrammarMatcher saved = a;  // speculative decoding keeps this to roll back to
    CHECK(a.advance("2*3"));
    CHECK(a.accepts());
    CHECK_FALSE(saved.accepts());
    CHECK_FALSE(a == saved);
    a = saved;
    CHECK(a == saved);
    CHECK(a.state_hash() == saved.state_hash());
    CHECK_FALSE(a.advance(")"));
    CHECK(saved.advance("4"));
    CHECK(saved.accepts());
    // The same state reached through different inputs is equal.
    GrammarMatcher x = fresh, y = fresh;
    CHECK(x.advance("1+2"));
    CHECK(y.advance("3*4-5"));
    CHECK(x == y);
    CHECK(x.state_hash() == y.state_hash());
    // But not across grammar instances.
    GrammarMatcher other = GrammarMatcher::from_gbnf(kArithmeticGrammar);
    CHECK(other.advance("1+2"));
    CHECK_FALSE(other == x);
    x.reset();
    CHECK(x == fresh);
}

TEST_CASE("grammar stacks are deduplicated") {
    // Every "a" can be read two ways; without deduplication the stacks would double with each one.
    const GrammarMatcher m = GrammarMatcher::from_gbnf("root ::= (\"a\" | \"a\" | [a-b])* \"!\"");
    GrammarMatcher run = m;
    CHECK(run.advance(std::string(200, 'a')));
    CHECK(run.stack_count() <= 4);
    CHECK(run.advance("!"));
    CHECK(run.accepts());
    // Nested optional rules: many derivations of nothing, few stacks.
    GrammarMatcher nullable =
        GrammarMatcher::from_gbnf("root ::= a a a a \"x\"\na ::= b? b? b?\nb ::= c? c? c?\nc ::= \"y\"?");
    CHECK(nullable.stack_count() == 37);  // a y at 4 * 3 * 3 places, or the x: one stack each
    CHECK(nullable.advance(std::string(30, 'y')));
    CHECK(nullable.advance("x"));
    CHECK(nullable.accepts());
}

namespace {

std::vector<int32_t> reference_mask(const GrammarMatcher& state, const std::vector<std::string>& vocab) {
    std::vector<int32_t> out;
    for (size_t id = 0; id < vocab.size(); ++id) {
        if (vocab[id].empty()) continue;
        GrammarMatcher m = state;
        if (m.advance(vocab[id])) out.push_back(static_cast<int32_t>(id));
    }
    return out;
}

// A BPE-like vocabulary: the 256 single bytes, then words (with and without a leading space), numbers, JSON
// punctuation runs, multi-byte characters whole and cut at every byte. Deterministic.
std::vector<std::string> synthetic_vocabulary(size_t size) {
    std::vector<std::string> vocab;
    vocab.push_back("");  // a special token
    for (int b = 0; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
    const char* const pieces[] = {"{",      "}",    "[",     "]",    "\"",  ":",   ",",   " ",
                                  "\n",     "\\",   "\\\"",  "\":",  "\",", "{\"", "\"}", "\": \"",
                                  "\", \"", "true", "false", "null", "e+",  ".",   "-",   "\\u00"};
    for (const char* p : pieces) vocab.push_back(p);
    const char* const characters[] = {"\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "\xD0\xB6"};
    for (const char* c : characters) {
        const std::string s(c);
        for (size_t cut = 1; cut < s.size(); ++cut) {
            vocab.push_back(s.substr(0, cut));
            vocab.push_back(s.substr(cut));
        }
    }
    std::mt19937 rng(58);
    const std::string letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    while (vocab.size() < size) {
        std::string token;
        const unsigned kind = rng() % 10;
        if (kind < 5) {
            if (rng() % 2) token += ' ';
            for (unsigned n = 1 + rng() % 9; n > 0; --n) token += letters[rng() % letters.size()];
        } else if (kind < 7) {
            for (unsigned n = 1 + rng() % 4; n > 0; --n) token += static_cast<char>('0' + rng() % 10);
        } else if (kind < 8) {
            for (unsigned n = 1 + rng() % 3; n > 0; --n) token += pieces[rng() % std::size(pieces)];
        } else {
            for (unsigned n = 1 + rng() % 3; n > 0; --n) token += characters[rng() % std::size(characters)];
            if (rng() % 3 == 0) token.pop_back();  // ends mid-character
            if (rng() % 3 == 0) token = letters[rng() % letters.size()] + token;
        }
        vocab.push_back(token);
    }
    vocab.resize(size);
    return vocab;
}

}  // namespace

TEST_CASE("grammar token masks on a small vocabulary with split characters") {
    const std::vector<std::string> vocab = {"",
                                            "a",
                                            "b",
                                            "ab",
                                            "\xC3",
                                            "\xA9",
                                            "\xC3\xA9",
                                            "\xC4",
                                            "a\xC3",
                                            "\xA9"
                                            "b",
                                            "\xC3\xA9"
                                            "b",
                                            "ba",
                                            "a",
                                            ""};
    TokenMasker masker(vocab);
    CHECK(masker.vocab_size() == vocab.size());
    const GrammarMatcher fresh = GrammarMatcher::from_gbnf("root ::= \"a\" \"\xC3\xA9\"+ \"b\"");
    GrammarMatcher m = fresh;
    CHECK(masker.allowed_ids(m) == std::vector<int32_t>{1, 8, 12});  // a, a+C3 (a split é), and the duplicate a
    CHECK(m.advance("a"));
    CHECK(masker.allowed_ids(m) == std::vector<int32_t>{4, 6, 10});  // C3, é, éb; not A9 nor C4 nor b
    CHECK(m.advance(uint8_t{0xC3}));
    CHECK(masker.allowed_ids(m) == std::vector<int32_t>{5, 9});  // A9, A9 b
    CHECK(m.advance(uint8_t{0xA9}));
    CHECK(masker.allowed_ids(m) == std::vector<int32_t>{2, 4, 6, 10});  // b, C3, é, éb
    CHECK(m.advance("b"));
    CHECK(m.accepts());
    CHECK(masker.allowed_ids(m).empty());  // only EOS now, which is the caller's
    const auto mask = masker.allowed(fresh);
    CHECK(mask->test(1));
    CHECK_FALSE(mask->test(0));
    CHECK_FALSE(mask->test(2));
    CHECK_FALSE(mask->test(1000));
    CHECK(mask->count() == 3);
}

TEST_CASE("grammar token masks equal the token-by-token reference") {
    const std::vector<std::string> vocab = synthetic_vocabulary(6000);
    TokenMasker masker(vocab);
    const GrammarMatcher json = GrammarMatcher::from_gbnf(kJsonGrammar);
    const GrammarMatcher arithmetic = GrammarMatcher::from_gbnf(kArithmeticGrammar);
    const GrammarMatcher any = GrammarMatcher::from_gbnf("root ::= [^\\xC3]*");
    struct Case {
        const GrammarMatcher* grammar;
        std::string prefix;
    };
    const Case cases[] = {{&json, ""},           {&json, "{"},
                          {&json, "{\"k"},       {&json, "{\"k\\u00"},
                          {&json, "{\"k\xC3"},   {&json, "{\"k\": "},
                          {&json, "{\"k\": [1"}, {&json, "{\"k\": [1.5e"},
                          {&json, "{\"k\": tr"}, {&json, "{\"k\": {}}"},
                          {&arithmetic, ""},     {&arithmetic, "(1+"},
                          {&arithmetic, "(12"},  {&any, ""},
                          {&any, "\xE4\xB8"}};
    for (const Case& c : cases) {
        CAPTURE(c.prefix);
        GrammarMatcher state = *c.grammar;
        REQUIRE(state.advance(c.prefix));
        const std::vector<int32_t> expected = reference_mask(state, vocab);
        CHECK(masker.allowed_ids(state) == expected);
        CHECK_FALSE(expected.empty());
    }
}

TEST_CASE("grammar token masks are memoised per state") {
    const std::vector<std::string> vocab = synthetic_vocabulary(3000);
    TokenMasker masker(vocab);
    const GrammarMatcher fresh = GrammarMatcher::from_gbnf(kArithmeticGrammar);
    GrammarMatcher a = fresh, b = fresh;
    CHECK(a.advance("1+2"));
    CHECK(b.advance("77*3-4"));  // another path to the same state
    REQUIRE(a == b);
    const auto first = masker.allowed(a);
    CHECK(masker.walks() == 1);
    const auto again = masker.allowed(b);
    CHECK(again.get() == first.get());
    CHECK(masker.walks() == 1);
    CHECK(masker.cached_masks() == 1);
    // A different state walks again and differs.
    GrammarMatcher c = fresh;
    CHECK(c.advance("1+"));
    const auto other = masker.allowed(c);
    CHECK(masker.walks() == 2);
    CHECK(other->ids() != first->ids());
    // The same stacks mid-character are another state.
    GrammarMatcher d = GrammarMatcher::from_gbnf("root ::= .*");
    const auto whole = masker.allowed(d);
    CHECK(d.advance(uint8_t{0xE4}));
    const auto partial = masker.allowed(d);
    CHECK(masker.walks() == 4);
    CHECK(partial->count() < whole->count());
}

TEST_CASE("grammar token masks over a 151936-token vocabulary (timing printout)") {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<std::string> vocab = synthetic_vocabulary(151936);
    const auto t1 = std::chrono::steady_clock::now();
    TokenMasker masker(vocab);
    const auto t2 = std::chrono::steady_clock::now();
    auto ms = [](auto from, auto to) { return std::chrono::duration<double, std::milli>(to - from).count(); };
    MESSAGE("vocabulary " << vocab.size() << " tokens made in " << ms(t0, t1) << " ms, trie of " << masker.trie_nodes()
                          << " nodes built in " << ms(t1, t2) << " ms");
    const GrammarMatcher json = GrammarMatcher::from_gbnf(kJsonGrammar);
    for (const char* prefix : {"", "{\"", "{\"key\": ", "{\"key\": 12", "{\"key\": \"some text "}) {
        GrammarMatcher state = json;
        REQUIRE(state.advance(prefix));
        const auto before = std::chrono::steady_clock::now();
        const auto mask = masker.allowed(state);
        const auto after = std::chrono::steady_clock::now();
        const auto memo = masker.allowed(state);
        const auto memo_after = std::chrono::steady_clock::now();
        CHECK(memo.get() == mask.get());
        CHECK(mask->count() > 0);
        MESSAGE("JSON mask after '" << std::string(prefix) << "': " << mask->count() << " tokens allowed, "
                                    << ms(before, after) << " ms (memoised: " << ms(after, memo_after) << " ms)");
    }
    // Spot check against the reference on the largest mask (inside a string most tokens fit).
    GrammarMatcher in_string = json;
    REQUIRE(in_string.advance("{\"key\": \"some text "));
    std::vector<std::string> sample(vocab.begin(), vocab.begin() + 20000);
    std::vector<int32_t> expected = reference_mask(in_string, sample);
    std::vector<int32_t> got = masker.allowed_ids(in_string);
    got.erase(std::lower_bound(got.begin(), got.end(), 20000), got.end());
    CHECK(got == expected);
}

TEST_CASE("grammar answer_after: free text up to the marker, newlines, then the answer's grammar") {
    const Grammar answer = parse_gbnf("root ::= \"{\" [a-z]* \"}\"");
    const Grammar g = answer_after(answer, "</think>");
    const auto accepts = [&](std::string_view text) {
        GrammarMatcher m(g);
        return m.advance(text) && m.accepts();
    };
    const auto alive = [&](std::string_view text) {
        GrammarMatcher m(g);
        return m.advance(text);
    };
    CHECK(accepts("</think>{}"));
    CHECK(accepts("Let me think. x < y, {so} </b> and </thin> too.\n</think>\n\n{abc}"));
    CHECK(accepts("</thin</think>{a}"));   // a partial marker falls back to a shorter match...
    CHECK(accepts("<</think>{a}"));        // ... or to none
    CHECK(accepts("<//think></think>{a}"));
    CHECK(accepts("\xc3\xa9t\xc3\xa9 </think>{a}"));  // multi-byte text in the reasoning
    CHECK_FALSE(accepts("reasoning"));                 // the reasoning cannot end the output
    CHECK(alive("reasoning {not an answer} </thin"));
    CHECK_FALSE(accepts("</think>"));                  // nor can an answer that has not come
    CHECK_FALSE(alive("</think>x"));                   // the answer follows its grammar at once ...
    CHECK_FALSE(alive("</think> {}"));                 // ... after newlines only
    CHECK_FALSE(alive("</think>{a}</think>"));         // a second marker is answer text
    CHECK_FALSE(accepts("</think>{a} "));
    // A long reasoning keeps as many parse stacks as a short one (one per alternative of a state's rule, at most 3
    // here): the states are right-recursive rules.
    GrammarMatcher m(g);
    for (int i = 0; i < 20000; ++i) {
        REQUIRE(m.advance(static_cast<uint8_t>("ab</thin <x\n"[i % 12])));
        REQUIRE(m.stack_count() <= 3);
    }
    CHECK(m.advance("</think>\n{z}"));
    CHECK(m.accepts());
    // The answer's rules keep their meaning (a rule referring to another).
    const Grammar g2 = answer_after(parse_gbnf("root ::= item (\",\" item)*\nitem ::= [0-9]+"), "[/THINK]");
    GrammarMatcher m2(g2);
    CHECK(m2.advance("[/THINK[/THINK]1,22,333"));
    CHECK(m2.accepts());
    CHECK_THROWS_AS(answer_after(answer, ""), tandem::Error);
    CHECK_THROWS_AS(answer_after(answer, "\xff"), tandem::Error);
}

TEST_CASE("grammar answer_after: token masks allow any token but the ends in the reasoning, and the answer's after") {
    // Tokens: reasoning words, the marker whole and in pieces, a token that closes the marker and opens the answer.
    const std::vector<std::string> vocab = {"", "hello", " world", "</think>", "</", "think", ">", "{", "}", "ab",
                                            "\n\n", ">{", ">x", "</think>\n"};
    const int eos = 0;
    TokenConstraint c(answer_after(parse_gbnf("root ::= \"{\" [a-z]* \"}\""), "</think>"), vocab, {eos});
    std::vector<float> logits(vocab.size());
    const auto allowed = [&]() {
        std::fill(logits.begin(), logits.end(), 1.0f);
        c.mask(logits.data(), static_cast<int>(vocab.size()));
        std::vector<int> ids;
        for (size_t i = 0; i < logits.size(); ++i)
            if (logits[i] > 0) ids.push_back(static_cast<int>(i));
        return ids;
    };
    // In the reasoning: everything but EOS (and ">{" / ">x" only once "</think" is there).
    CHECK(allowed() == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13});
    c.accept(1);
    c.accept(4);
    c.accept(5);  // "hello</think": ">{" closes the marker and opens the answer, ">x" would put x in it
    CHECK(allowed() == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13});
    c.accept(11);
    CHECK(allowed() == std::vector<int>{1, 5, 8, 9});  // lower-case letters or the closing brace
    c.accept(8);
    CHECK(allowed() == std::vector<int>{eos});
    c.reset();
    c.accept(13);  // "</think>\n": then newlines or the answer
    CHECK(allowed() == std::vector<int>{7, 10});
}
