// The GBNF grammar parser (llama.cpp's grammar syntax) and the grammar IR every other part of src/grammar/ reads.
//
// IR: a Grammar is a list of rules; a rule is a list of alternatives; an alternative is a sequence of elements, each
// either a character set (code-point ranges, already normalized: sorted, merged, never negated; `[^...]` and `.` are
// stored as their complement over [0, 0x10FFFF]) or a reference to a rule by index. String literals become one
// single-code-point set per character. Repetitions and parenthesized groups are NOT represented directly: they are
// expanded into generated helper rules (as llama.cpp does), named "<rule>#<n>" ('#' cannot appear in a user's rule
// name), so that the matcher only ever sees sequences, alternatives and references:
//   (a | b)   -> g ::= a | b
//   x*        -> g ::= x g |                    (right recursive, so the matcher's stacks do not grow with repeats)
//   x+        -> x g, g as for x*
//   x?        -> g ::= x |
//   x{m}      -> x x ... x (m copies)
//   x{m,}     -> m copies, then g as for x*
//   x{m,n}    -> m copies, then a chain g_k ::= x g_(k-1) |  of n - m optional copies
// A repeated item of more than one element (a group, a multi-character literal) is first wrapped in a helper rule.
//
// Syntax accepted (a superset of llama.cpp's): `name ::= alternatives` rules separated by newlines; names of letters,
// digits, '-' and '_'; `|` alternatives (a continuation line may also start with `|`); `( )` groups, inside which
// newlines are free; `*` `+` `?` `{m}` `{m,}` `{m,n}` (bounds up to kMaxRepetition); "string" literals and [classes]
// with escapes \n \t \r \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH (and any other non-alphanumeric character escaped as
// itself); `[^...]` negation and `a-z` ranges; `.` any code point; `# comment` to the end of a line. A newline
// continues a rule right after `::=` or `|`. `root` is the start rule. Defining a rule twice is an error.
//
// Errors are tandem::Error with "gbnf: line L, column C: what" (1-based; the column counts code points).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::grammar {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;
inline constexpr uint32_t kMaxRepetition = 10000;       // the largest m or n in {m,n}
inline constexpr size_t kMaxGrammarElements = 1 << 20;  // elements of all rules together, after expansion

struct CodePointRange {
    uint32_t first;  // inclusive
    uint32_t last;   // inclusive
    bool operator==(const CodePointRange&) const = default;
};

struct GrammarElement {
    enum class Kind : uint8_t { kCharSet, kRuleRef };
    Kind kind = Kind::kCharSet;
    std::vector<CodePointRange> ranges;  // kCharSet: sorted, disjoint, non-adjacent; empty matches nothing
    uint32_t rule = 0;                   // kRuleRef: index into Grammar::rules

    static GrammarElement char_set(std::vector<CodePointRange> ranges);  // normalizes (sorts and merges) them
    static GrammarElement rule_ref(uint32_t rule);
    bool matches(uint32_t code_point) const;  // kCharSet only
};

using GrammarSequence = std::vector<GrammarElement>;

struct GrammarRule {
    std::string name;  // a user's name, or "<rule>#<n>" for a generated helper
    std::vector<GrammarSequence> alternatives;
};

struct Grammar {
    std::vector<GrammarRule> rules;
    uint32_t root = 0;  // index of the rule named "root"

    // The index of the rule with that name, or -1.
    int64_t find_rule(std::string_view name) const;
};

// Parses GBNF text. Throws tandem::Error (with line and column) on any syntax error, an undefined or twice-defined
// rule, a missing root, bad repetition bounds or a grammar over kMaxGrammarElements. Left recursion is not checked
// here but when a matcher is built (grammar_matcher.h).
Grammar parse_gbnf(std::string_view text);

// The grammar back as GBNF text, one rule per line, generated helpers included (for messages and debugging; the
// helpers' '#' names mean it is not meant to be parsed again).
std::string to_gbnf(const Grammar& grammar);

}  // namespace tandem::grammar
