// Fuzz target: the GBNF parser, the grammar matcher and token masks (src/grammar/).
// The input is a grammar's text, then optionally a 0x00 byte and bytes to feed the matcher (at most kMaxFed).
// Parsing either works or throws tandem::Error; so does building the matcher (left recursion) and advancing it
// (a grammar too ambiguous). What builds is fed the bytes one by one, and at each step:
//   - a copy advanced with the rest in one call ends in the same state as feeding byte by byte;
//   - the token mask over a small fixed vocabulary (single bytes, split characters, words) equals feeding each
//     token to a copy of the state, and asking twice returns the memoised mask;
//   - a dead matcher stays dead, and accepts() implies not dead.
#include <string>
#include <string_view>
#include <vector>

#include "error.h"
#include "fuzz_target.h"
#include "grammar/gbnf.h"
#include "grammar/grammar_matcher.h"
#include "grammar/token_mask.h"

namespace {

using tandem::grammar::GrammarMatcher;
using tandem::grammar::TokenMasker;

constexpr size_t kMaxFed = 48;  // bytes fed to a matcher: enough to go deep, few enough to stay fast

const std::vector<std::string>& vocabulary() {
    static const std::vector<std::string> vocab = [] {
        std::vector<std::string> v = {"",         "a",        "ab",       "abc",   " ",
                                      "\"",       "{",        "}",        "[",     "]",
                                      ",",        ":",        "0",        "12",    "-",
                                      "true",     "null",     "\n",       "\\",    "\xC3",
                                      "\xA9",     "\xC3\xA9", "\xE4\xB8", "\xAD",  "\xE4\xB8\xAD",
                                      "\xF0\x9F", "\x98\x80", "x\xC3",    "\xA9y", "\x80",
                                      "\xFF"};
        for (int b = 0x20; b < 0x7F; b += 7) v.push_back(std::string(1, static_cast<char>(b)));
        return v;
    }();
    return vocab;
}

void check_mask(TokenMasker& masker, const GrammarMatcher& state) {
    const auto mask = masker.allowed(state);
    const std::vector<std::string>& vocab = vocabulary();
    for (size_t id = 0; id < vocab.size(); ++id) {
        bool allowed = false;
        if (!vocab[id].empty()) {
            GrammarMatcher copy = state;
            allowed = copy.advance(vocab[id]);
        }
        if (mask->test(id) != allowed)
            tandem::fuzz::fail("token mask differs from feeding token " + std::to_string(id));
    }
    if (masker.allowed(state).get() != mask.get()) tandem::fuzz::fail("the mask of the same state is not memoised");
}

void run(std::string_view grammar_text, std::string_view input) {
    tandem::grammar::Grammar grammar;
    try {
        grammar = tandem::grammar::parse_gbnf(grammar_text);
    } catch (const tandem::Error&) {
        return;
    }
    (void)tandem::grammar::to_gbnf(grammar);
    try {
        GrammarMatcher matcher(grammar);
        TokenMasker masker(vocabulary());
        check_mask(masker, matcher);
        input = input.substr(0, kMaxFed);
        for (size_t i = 0; i < input.size(); ++i) {
            GrammarMatcher whole = matcher;
            const bool alive_whole = whole.advance(input.substr(i));
            const bool alive = matcher.advance(static_cast<uint8_t>(input[i]));
            if (matcher.accepts() && matcher.dead()) tandem::fuzz::fail("a dead matcher accepts");
            if (!alive) {
                if (alive_whole) tandem::fuzz::fail("bytes fed at once keep alive what bytes fed one by one kill");
                if (matcher.advance(uint8_t{'a'})) tandem::fuzz::fail("a dead matcher came back to life");
                break;
            }
            GrammarMatcher rest = matcher;
            if (rest.advance(input.substr(i + 1)) != alive_whole || (alive_whole && !(rest == whole)))
                tandem::fuzz::fail("feeding at once and byte by byte end in different states");
            check_mask(masker, matcher);
        }
    } catch (const tandem::Error&) {
        return;
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    const size_t split = bytes.find('\0');
    if (split == std::string_view::npos)
        run(bytes, "");
    else
        run(bytes.substr(0, split), bytes.substr(split + 1));
    return 0;
}

namespace tandem::fuzz {

std::vector<std::pair<std::string, std::string>> fuzz_seeds() {
    auto seed = [](const std::string& grammar, const std::string& input) { return grammar + '\0' + input; };
    std::vector<std::pair<std::string, std::string>> out;
    out.emplace_back("json",
                     seed("root ::= object\n"
                          "value ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
                          "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
                          "array ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
                          "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" "
                          "[0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
                          "number ::= \"-\"? [0-9]+ (\".\" [0-9]+)? ws\n"
                          "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n",
                          "{\"a\": [1, \"\xC3\xA9\\u00e9\", true], \"b\": {}}"));
    out.emplace_back("arithmetic", seed("root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\n"
                                        "term ::= factor ((\"*\" | \"/\") factor)*\n"
                                        "factor ::= [0-9]+ | \"(\" expr \")\"\n",
                                        "(1+2)*3-((4))/5"));
    out.emplace_back("repetitions", seed("root ::= (\"ab\"{2,3} [x-z]? .){1,} [^a-c]* \"\xE4\xB8\xAD\"+ # c\n",
                                         "ababxqababab\xC3\xA9zz\xE4\xB8\xAD"));
    out.emplace_back("left-recursive", seed("root ::= a\na ::= b? a \"x\" | \"y\"\nb ::= \"b\"", "byx"));
    out.emplace_back("self", seed("root ::= root", "a"));
    out.emplace_back("errors", seed("root ::= [z-a] \"\\q\" (\"a\"{3,2}\n", ""));
    out.emplace_back("nullable", seed("root ::= a a a \"x\"\na ::= b? b?\nb ::= \"y\"? \"z\"?", "yzyyzx"));
    return out;
}

}  // namespace tandem::fuzz
