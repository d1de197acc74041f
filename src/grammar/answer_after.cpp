// answer_after (answer_after.h): the marker's automaton as rules in front of the answer's grammar.
#include "grammar/answer_after.h"

#include <algorithm>
#include <string>
#include <vector>

#include "error.h"

namespace tandem::grammar {

namespace {

// The marker's code points (it is trusted text from a chat template, but checked all the same).
std::vector<uint32_t> code_points(std::string_view utf8) {
    std::vector<uint32_t> out;
    for (size_t i = 0; i < utf8.size();) {
        const auto b = static_cast<unsigned char>(utf8[i]);
        const size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
        if (n == 0 || i + n > utf8.size()) throw Error("grammar: the reasoning marker is not valid UTF-8");
        uint32_t cp = n == 1 ? b : b & (0x7F >> n);
        for (size_t k = 1; k < n; ++k) {
            const auto c = static_cast<unsigned char>(utf8[i + k]);
            if ((c >> 6) != 2) throw Error("grammar: the reasoning marker is not valid UTF-8");
            cp = (cp << 6) | (c & 0x3F);
        }
        out.push_back(cp);
        i += n;
    }
    return out;
}

// The state after reading `c` in state q (the marker's first q code points matched): the longest prefix of the
// marker that is a suffix of marker[0, q) + c.
size_t next_state(const std::vector<uint32_t>& m, size_t q, uint32_t c) {
    std::vector<uint32_t> text(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(q));
    text.push_back(c);
    for (size_t len = std::min(text.size(), m.size()); len > 0; --len)
        if (std::equal(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(len),
                       text.end() - static_cast<std::ptrdiff_t>(len)))
            return len;
    return 0;
}

}  // namespace

Grammar answer_after(const Grammar& answer, std::string_view marker) {
    const std::vector<uint32_t> m = code_points(marker);
    if (m.empty()) throw Error("grammar: the reasoning marker is empty");
    Grammar g = answer;
    const auto base = static_cast<uint32_t>(g.rules.size());
    // Rules: text#0 .. text#(L-1), one per state; then newlines#, "\n" newlines# | (empty).
    const size_t n_states = m.size();
    const uint32_t newlines = base + static_cast<uint32_t>(n_states);
    for (size_t q = 0; q < n_states; ++q) {
        GrammarRule rule;
        rule.name = "reasoning#" + std::to_string(q);
        // The code points that lead somewhere other than state 0: the marker's own (each state's way forward, or back
        // to a shorter match). Every other code point returns to state 0.
        std::vector<uint32_t> special = m;
        std::sort(special.begin(), special.end());
        special.erase(std::unique(special.begin(), special.end()), special.end());
        std::vector<CodePointRange> to_start;
        uint32_t from = 0;
        for (const uint32_t c : special) {
            const size_t next = next_state(m, q, c);
            if (next == 0) continue;  // with the rest below
            if (c > from) to_start.push_back({from, c - 1});
            from = c + 1;
            if (next == m.size())  // the marker is complete: newlines, then the answer
                rule.alternatives.push_back({GrammarElement::char_set({{c, c}}), GrammarElement::rule_ref(newlines),
                                             GrammarElement::rule_ref(answer.root)});
            else
                rule.alternatives.push_back(
                    {GrammarElement::char_set({{c, c}}), GrammarElement::rule_ref(base + static_cast<uint32_t>(next))});
        }
        if (from <= kMaxCodePoint) to_start.push_back({from, kMaxCodePoint});
        rule.alternatives.push_back({GrammarElement::char_set(to_start), GrammarElement::rule_ref(base)});
        g.rules.push_back(std::move(rule));
    }
    GrammarRule nl;
    nl.name = "reasoning#newlines";
    nl.alternatives.push_back({GrammarElement::char_set({{'\n', '\n'}}), GrammarElement::rule_ref(newlines)});
    nl.alternatives.push_back({});
    g.rules.push_back(std::move(nl));
    g.root = base;
    return g;
}

}  // namespace tandem::grammar
