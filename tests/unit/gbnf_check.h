// Checks a grammar's text against documents with the decoding engine itself (src/grammar/): Gbnf(text) parses it
// (tandem::Error on bad syntax, a missing root or an undefined rule) and accepts(doc) feeds the whole document to a
// GrammarMatcher and asks whether root can end there. For the JSON Schema converter's tests and its fuzz target: what
// they prove about the converter's grammars holds for the grammars decoding will enforce.
#pragma once
#include <string>
#include <vector>

#include "grammar/gbnf.h"
#include "grammar/grammar_matcher.h"

namespace tandem::test {

class Gbnf {
public:
    explicit Gbnf(const std::string& text) : grammar_(grammar::parse_gbnf(text)), matcher_(grammar_) {}

    // The grammar's own rules (not the helpers the parser generates), in the order the grammar has them.
    std::vector<std::string> rule_names() const {
        std::vector<std::string> names;
        for (const grammar::GrammarRule& rule : grammar_.rules)
            if (rule.name.find('#') == std::string::npos) names.push_back(rule.name);
        return names;
    }

    bool accepts(const std::string& document) const {
        grammar::GrammarMatcher m = matcher_;
        return m.advance(document) && m.accepts();
    }

private:
    grammar::Grammar grammar_;
    grammar::GrammarMatcher matcher_;
};

}  // namespace tandem::test
