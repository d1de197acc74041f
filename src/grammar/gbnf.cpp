// The GBNF parser: text -> Grammar IR, with repetitions and groups expanded into helper rules (see gbnf.h).
#include "grammar/gbnf.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <limits>
#include <unordered_map>

#include "error.h"

namespace tandem::grammar {

GrammarElement GrammarElement::char_set(std::vector<CodePointRange> ranges) {
    std::vector<CodePointRange> valid;
    for (const CodePointRange& r : ranges)
        if (r.first <= r.last && r.first <= kMaxCodePoint) valid.push_back({r.first, std::min(r.last, kMaxCodePoint)});
    std::sort(valid.begin(), valid.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    GrammarElement e;
    e.kind = Kind::kCharSet;
    for (const CodePointRange& r : valid) {
        if (!e.ranges.empty() && r.first <= e.ranges.back().last + 1)
            e.ranges.back().last = std::max(e.ranges.back().last, r.last);
        else
            e.ranges.push_back(r);
    }
    return e;
}

GrammarElement GrammarElement::rule_ref(uint32_t rule) {
    GrammarElement e;
    e.kind = Kind::kRuleRef;
    e.rule = rule;
    return e;
}

bool GrammarElement::matches(uint32_t code_point) const {
    auto it = std::upper_bound(ranges.begin(), ranges.end(), code_point,
                               [](uint32_t cp, const CodePointRange& r) { return cp < r.first; });
    return it != ranges.begin() && code_point <= std::prev(it)->last;
}

int64_t Grammar::find_rule(std::string_view name) const {
    for (size_t i = 0; i < rules.size(); ++i)
        if (rules[i].name == name) return static_cast<int64_t>(i);
    return -1;
}

namespace {

constexpr int kMaxNesting = 200;  // parentheses inside parentheses; deeper is an error, not a stack overflow

bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

std::vector<CodePointRange> complement(const std::vector<CodePointRange>& sorted) {
    std::vector<CodePointRange> out;
    uint32_t next = 0;
    for (const CodePointRange& r : sorted) {
        if (r.first > next) out.push_back({next, r.first - 1});
        next = r.last + 1;
    }
    if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
    return out;
}

class Parser {
public:
    explicit Parser(std::string_view text) : text_(text) {}

    Grammar parse() {
        skip_space(true);
        if (at_end()) fail(pos_, "empty grammar (no rules)");
        while (!at_end()) {
            parse_rule();
            skip_space(true);
        }
        // The earliest reference to a rule never defined.
        size_t undefined_at = std::numeric_limits<size_t>::max();
        std::string undefined_name;
        for (size_t i = 0; i < grammar_.rules.size(); ++i)
            if (!defined_[i] && first_reference_[i] < undefined_at) {
                undefined_at = first_reference_[i];
                undefined_name = grammar_.rules[i].name;
            }
        if (!undefined_name.empty()) fail(undefined_at, "undefined rule '" + undefined_name + "'");
        const int64_t root = grammar_.find_rule("root");
        if (root < 0) fail(0, "no rule named 'root' (the start rule)");
        grammar_.root = static_cast<uint32_t>(root);
        return std::move(grammar_);
    }

private:
    std::string_view text_;
    size_t pos_ = 0;
    Grammar grammar_;
    std::unordered_map<std::string, uint32_t> index_;  // user rule names
    std::vector<bool> defined_;                        // per rule
    std::vector<size_t> first_reference_;              // per rule: offset of its first reference (or max)
    std::vector<size_t> defined_at_;                   // per rule: offset of its name where defined
    size_t element_count_ = 0;
    std::string current_rule_;
    int helper_count_ = 0;

    bool at_end() const { return pos_ >= text_.size(); }
    char peek(size_t ahead = 0) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0'; }

    [[noreturn]] void fail(size_t offset, const std::string& what) const {
        throw Error("gbnf: " + location(offset) + ": " + what);
    }

    // "line L, column C" of a byte offset: 1-based, the column counting code points.
    std::string location(size_t offset) const {
        offset = std::min(offset, text_.size());
        size_t line = 1, column = 1;
        for (size_t i = 0; i < offset; ++i) {
            const auto c = static_cast<unsigned char>(text_[i]);
            if (c == '\n') {
                ++line;
                column = 1;
            } else if ((c & 0xC0) != 0x80) {
                ++column;
            }
        }
        return "line " + std::to_string(line) + ", column " + std::to_string(column);
    }

    static std::string describe(char c) {
        const auto u = static_cast<unsigned char>(c);
        if (u >= 0x21 && u < 0x7F) return std::string("'") + c + "'";
        char buf[16];
        std::snprintf(buf, sizeof buf, "byte 0x%02X", u);
        return buf;
    }

    // Spaces, tabs and comments; newlines too where `newlines` (inside parentheses, after `::=` and `|`).
    void skip_space(bool newlines) {
        while (!at_end()) {
            const char c = peek();
            if (c == ' ' || c == '\t') {
                ++pos_;
            } else if ((c == '\n' || c == '\r') && newlines) {
                ++pos_;
            } else if (c == '#') {
                while (!at_end() && peek() != '\n' && peek() != '\r') ++pos_;
            } else {
                break;
            }
        }
    }

    uint32_t rule_index(const std::string& name) {
        auto [it, inserted] = index_.emplace(name, static_cast<uint32_t>(grammar_.rules.size()));
        if (inserted) add_rule(name, false);
        return it->second;
    }

    uint32_t add_rule(const std::string& name, bool defined) {
        grammar_.rules.push_back({name, {}});
        defined_.push_back(defined);
        first_reference_.push_back(std::numeric_limits<size_t>::max());
        defined_at_.push_back(0);
        return static_cast<uint32_t>(grammar_.rules.size() - 1);
    }

    uint32_t add_helper(std::vector<GrammarSequence> alternatives) {
        const uint32_t id = add_rule(current_rule_ + "#" + std::to_string(++helper_count_), true);
        grammar_.rules[id].alternatives = std::move(alternatives);
        return id;
    }

    void count_elements(size_t added, size_t at) {
        element_count_ += added;
        if (element_count_ > kMaxGrammarElements)
            fail(at, "grammar too large: over " + std::to_string(kMaxGrammarElements) +
                         " elements once repetitions are expanded");
    }

    std::string parse_name() {
        const size_t start = pos_;
        while (!at_end() && is_name_char(peek())) ++pos_;
        return std::string(text_.substr(start, pos_ - start));
    }

    void parse_rule() {
        const size_t start = pos_;
        const std::string name = parse_name();
        if (name.empty()) {
            if (peek() == ')') fail(pos_, "unexpected ')' with no '(' to close");
            fail(pos_, "expected a rule name, found " + describe(peek()));
        }
        skip_space(false);
        if (text_.substr(pos_, 3) != "::=") fail(pos_, "expected '::=' after the rule name '" + name + "'");
        pos_ += 3;
        const uint32_t id = rule_index(name);
        if (defined_[id]) {
            fail(start, "rule '" + name + "' is defined twice (first at " + location(defined_at_[id]) + ")");
        }
        defined_[id] = true;
        defined_at_[id] = start;
        current_rule_ = name;
        helper_count_ = 0;
        skip_space(true);
        std::vector<GrammarSequence> alternatives = parse_alternatives(false, 0);
        grammar_.rules[id].alternatives = std::move(alternatives);
        skip_space(false);
        if (at_end() || peek() == '\n' || peek() == '\r') return;
        if (peek() == ')') fail(pos_, "unexpected ')' with no '(' to close");
        fail(pos_, "unexpected " + describe(peek()) + " in rule '" + name + "'");
    }

    std::vector<GrammarSequence> parse_alternatives(bool nested, int depth) {
        std::vector<GrammarSequence> alternatives;
        alternatives.push_back(parse_sequence(nested, depth));
        while (true) {
            if (peek() == '|') {
                ++pos_;
                skip_space(true);
                alternatives.push_back(parse_sequence(nested, depth));
                continue;
            }
            if (!nested) {  // a continuation line starting with '|'
                const size_t saved = pos_;
                skip_space(true);
                if (peek() == '|') continue;
                pos_ = saved;
            }
            break;
        }
        return alternatives;
    }

    GrammarSequence parse_sequence(bool nested, int depth) {
        GrammarSequence seq;
        size_t last_start = std::numeric_limits<size_t>::max();  // where the last repeatable item begins in seq
        while (!at_end()) {
            const size_t here = pos_;
            const char c = peek();
            if (c == '"') {
                last_start = seq.size();
                parse_literal(seq);
            } else if (c == '[') {
                last_start = seq.size();
                seq.push_back(parse_class());
                count_elements(1, here);
            } else if (c == '.') {
                ++pos_;
                last_start = seq.size();
                seq.push_back(GrammarElement::char_set({{0, kMaxCodePoint}}));
                count_elements(1, here);
            } else if (c == '(') {
                if (depth >= kMaxNesting) fail(here, "parentheses nested too deeply");
                ++pos_;
                skip_space(true);
                std::vector<GrammarSequence> inner = parse_alternatives(true, depth + 1);
                skip_space(true);
                if (peek() != ')') {
                    if (at_end()) fail(here, "unclosed '('");
                    fail(pos_, "expected ')' or an element, found " + describe(peek()));
                }
                ++pos_;
                last_start = seq.size();
                seq.push_back(GrammarElement::rule_ref(add_helper(std::move(inner))));
                count_elements(1, here);
            } else if (is_name_char(c)) {
                const std::string name = parse_name();
                const size_t after = pos_;
                skip_space(nested);
                if (text_.substr(pos_, 3) == "::=")
                    fail(here, "rule '" + name + "' starts inside another rule (a rule must start on a new line)");
                pos_ = after;
                const uint32_t id = rule_index(name);
                first_reference_[id] = std::min(first_reference_[id], here);
                last_start = seq.size();
                seq.push_back(GrammarElement::rule_ref(id));
                count_elements(1, here);
            } else if (c == '*' || c == '+' || c == '?' || c == '{') {
                if (last_start >= seq.size()) fail(here, std::string("'") + c + "' with nothing before it to repeat");
                uint32_t min_times = 0, max_times = 0;
                bool unbounded = false;
                ++pos_;
                if (c == '*') {
                    unbounded = true;
                } else if (c == '+') {
                    min_times = 1;
                    unbounded = true;
                } else if (c == '?') {
                    max_times = 1;
                } else {
                    parse_bounds(here, &min_times, &max_times, &unbounded);
                }
                expand_repetition(seq, last_start, min_times, max_times, unbounded, here);
            } else {
                break;
            }
            skip_space(nested);
        }
        return seq;
    }

    uint32_t parse_number(size_t brace) {
        skip_space(true);
        const size_t start = pos_;
        uint64_t value = 0;
        while (!at_end() && peek() >= '0' && peek() <= '9') {
            value = std::min<uint64_t>(value * 10 + static_cast<uint64_t>(peek() - '0'), uint64_t{1} << 40);
            ++pos_;
        }
        if (pos_ == start) fail(pos_, "expected a number in the repetition '{...}'");
        if (value > kMaxRepetition)
            fail(start, "repetition bound " + std::string(text_.substr(start, pos_ - start)) + " is over the limit " +
                            std::to_string(kMaxRepetition));
        (void)brace;
        return static_cast<uint32_t>(value);
    }

    void parse_bounds(size_t brace, uint32_t* min_times, uint32_t* max_times, bool* unbounded) {
        *min_times = parse_number(brace);
        skip_space(true);
        if (peek() == ',') {
            ++pos_;
            skip_space(true);
            if (peek() == '}') {
                *unbounded = true;
            } else {
                *max_times = parse_number(brace);
                skip_space(true);
            }
        } else {
            *max_times = *min_times;
        }
        if (peek() != '}') {
            if (at_end()) fail(brace, "unclosed '{'");
            fail(pos_, "expected '}' to end the repetition, found " + describe(peek()));
        }
        ++pos_;
        if (!*unbounded && *min_times > *max_times)
            fail(brace, "repetition {" + std::to_string(*min_times) + "," + std::to_string(*max_times) +
                            "} has its minimum over its maximum");
    }

    // Replaces seq[last_start...] (the item) by its repetition, see gbnf.h.
    void expand_repetition(GrammarSequence& seq, size_t last_start, uint32_t min_times, uint32_t max_times,
                           bool unbounded, size_t at) {
        GrammarSequence item_elements(std::make_move_iterator(seq.begin() + static_cast<ptrdiff_t>(last_start)),
                                      std::make_move_iterator(seq.end()));
        seq.resize(last_start);
        GrammarElement item = item_elements.size() == 1 ? std::move(item_elements[0])
                                                        : GrammarElement::rule_ref(add_helper({item_elements}));
        const size_t optional = unbounded ? 1 : max_times - min_times;
        count_elements(min_times + 2 * optional + 1, at);
        for (uint32_t i = 0; i < min_times; ++i) seq.push_back(item);
        if (unbounded) {
            const uint32_t star = add_helper({});
            grammar_.rules[star].alternatives = {{item, GrammarElement::rule_ref(star)}, {}};
            seq.push_back(GrammarElement::rule_ref(star));
        } else if (optional > 0) {
            // g_1 ::= item | ; g_k ::= item g_(k-1) | ; seq gets g_optional.
            uint32_t previous = add_helper({{item}, {}});
            for (size_t k = 2; k <= optional; ++k)
                previous = add_helper({{item, GrammarElement::rule_ref(previous)}, {}});
            seq.push_back(GrammarElement::rule_ref(previous));
        }
    }

    // One code point of a literal or class at pos_: an escape or a UTF-8 character.
    uint32_t parse_char(const char* where) {
        const size_t start = pos_;
        const auto c = static_cast<unsigned char>(peek());
        if (c == '\\') {
            ++pos_;
            if (at_end()) fail(start, std::string("unfinished escape at the end of the ") + where);
            const char e = peek();
            ++pos_;
            switch (e) {
                case 'n': return '\n';
                case 't': return '\t';
                case 'r': return '\r';
                case 'x': return parse_hex(start, 2);
                case 'u': return parse_hex(start, 4);
                case 'U': return parse_hex(start, 8);
                default:
                    // Any ASCII punctuation escapes itself (\\ \" \[ \] \- \. ...); letters and digits do not.
                    if (e > 0x20 && e < 0x7F && !std::isalnum(static_cast<unsigned char>(e)))
                        return static_cast<uint32_t>(e);
                    fail(start, "bad escape '\\" + std::string(1, e) + "' in the " + where);
            }
        }
        // UTF-8
        int length = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
        if (length == 0) fail(start, "invalid UTF-8 in the " + std::string(where));
        uint32_t cp = length == 1 ? c : length == 2 ? (c & 0x1F) : length == 3 ? (c & 0x0F) : (c & 0x07);
        for (int i = 1; i < length; ++i) {
            const auto n = static_cast<unsigned char>(peek(static_cast<size_t>(i)));
            if ((n & 0xC0) != 0x80) fail(start, "invalid UTF-8 in the " + std::string(where));
            cp = (cp << 6) | (n & 0x3F);
        }
        static constexpr uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < kMinForLength[length] || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF))
            fail(start, "invalid UTF-8 in the " + std::string(where));
        pos_ += static_cast<size_t>(length);
        return cp;
    }

    uint32_t parse_hex(size_t start, int digits) {
        uint32_t value = 0;
        for (int i = 0; i < digits; ++i) {
            const int h = hex_value(peek());
            if (h < 0)
                fail(start, "bad escape: '\\" + std::string(1, text_[start + 1]) + "' needs " + std::to_string(digits) +
                                " hex digits");
            value = (value << 4) | static_cast<uint32_t>(h);
            ++pos_;
        }
        if (value > kMaxCodePoint) fail(start, "escape beyond the last Unicode code point U+10FFFF");
        return value;
    }

    void parse_literal(GrammarSequence& seq) {
        const size_t open = pos_;
        ++pos_;
        size_t count = 0;
        while (true) {
            if (at_end()) fail(open, "unterminated string literal");
            if (peek() == '"') break;
            const size_t here = pos_;
            const uint32_t cp = parse_char("string literal");
            seq.push_back(GrammarElement::char_set({{cp, cp}}));
            count_elements(1, here);
            ++count;
        }
        ++pos_;
        (void)count;
    }

    GrammarElement parse_class() {
        const size_t open = pos_;
        ++pos_;
        bool negated = false;
        if (peek() == '^') {
            negated = true;
            ++pos_;
        }
        std::vector<CodePointRange> ranges;
        while (true) {
            if (at_end()) fail(open, "unterminated character class");
            if (peek() == ']') break;
            const size_t here = pos_;
            const uint32_t first = parse_char("character class");
            uint32_t last = first;
            if (peek() == '-' && peek(1) != ']' && pos_ + 1 < text_.size()) {
                ++pos_;
                last = parse_char("character class");
                if (last < first) fail(here, "character range with its end before its start");
            }
            ranges.push_back({first, last});
        }
        ++pos_;
        GrammarElement set = GrammarElement::char_set(std::move(ranges));
        if (negated) set.ranges = complement(set.ranges);
        return set;
    }
};

void append_code_point(std::string& out, uint32_t cp, bool in_class) {
    if (cp == '\n')
        out += "\\n";
    else if (cp == '\t')
        out += "\\t";
    else if (cp == '\r')
        out += "\\r";
    else if (cp == '\\' || cp == '"' || (in_class && (cp == ']' || cp == '-' || cp == '^' || cp == '['))) {
        out += '\\';
        out += static_cast<char>(cp);
    } else if (cp >= 0x20 && cp < 0x7F) {
        out += static_cast<char>(cp);
    } else {
        char buf[16];
        if (cp <= 0xFF)
            std::snprintf(buf, sizeof buf, "\\x%02X", cp);
        else if (cp <= 0xFFFF)
            std::snprintf(buf, sizeof buf, "\\u%04X", cp);
        else
            std::snprintf(buf, sizeof buf, "\\U%08X", cp);
        out += buf;
    }
}

}  // namespace

Grammar parse_gbnf(std::string_view text) { return Parser(text).parse(); }

std::string to_gbnf(const Grammar& grammar) {
    std::string out;
    for (const GrammarRule& rule : grammar.rules) {
        out += rule.name + " ::=";
        for (size_t a = 0; a < rule.alternatives.size(); ++a) {
            if (a > 0) out += " |";
            for (const GrammarElement& e : rule.alternatives[a]) {
                out += ' ';
                if (e.kind == GrammarElement::Kind::kRuleRef) {
                    out += grammar.rules[e.rule].name;
                } else if (e.ranges.size() == 1 && e.ranges[0].first == e.ranges[0].last) {
                    out += '"';
                    append_code_point(out, e.ranges[0].first, false);
                    out += '"';
                } else {
                    out += '[';
                    for (const CodePointRange& r : e.ranges) {
                        append_code_point(out, r.first, true);
                        if (r.last != r.first) {
                            out += '-';
                            append_code_point(out, r.last, true);
                        }
                    }
                    out += ']';
                }
            }
        }
        out += '\n';
    }
    return out;
}

}  // namespace tandem::grammar
