// The JSON Schema -> GBNF converter of json_schema.h: the schema walk (Converter), the pattern translator
// (PatternConverter), integer range grammars, and the fixed rules every grammar draws from (kPrimitives).
#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "error.h"
#include "grammar/gbnf.h"
#include "text/utf8.h"

namespace tandem {
namespace {

constexpr size_t kMaxDepth = 64;    // nested schemas (and pattern groups)
constexpr size_t kMaxWork = 20000;  // schema nodes converted, copies made by merging included
constexpr size_t kMaxGrammarBytes = 4 << 20;
constexpr size_t kMaxPrefixItems = 1000;  // each nests the rest of the tuple one group deeper
// minItems, maxLength, {m,n}, ...: the grammar's own bound on a repetition (gbnf.h), so that a schema the converter
// takes always gives a grammar the parser takes (a larger count used to surface as a GBNF error about a grammar the
// user never wrote).
constexpr uint64_t kMaxCount = grammar::kMaxRepetition;
constexpr uint64_t kUnbounded = std::numeric_limits<uint64_t>::max();
constexpr int64_t kMaxIntegerMagnitude = 999999999999999999;  // 18 digits, the integer rule's limit

// The fixed rules, added to a grammar only when used. Their names are reserved: schema rules never take them.
struct Primitive {
    const char* name;
    const char* body;
    std::vector<const char*> deps;
};
const std::vector<Primitive> kPrimitives = {
    {"space", R"(( " " | "\n" [ \t]{0,20} )?)", {}},
    {"char", R"([^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ))", {}},
    {"json-ctrl", R"("\\" [bfnrt] | "\\u00" ( "0" [0-7be-f] | "1" [0-9a-f] ))", {}},
    {"string", R"("\"" char* "\"" space)", {"char", "space"}},
    {"boolean", R"(( "true" | "false" ) space)", {"space"}},
    {"null", R"("null" space)", {"space"}},
    {"integer", R"("-"? ( "0" | [1-9] [0-9]{0,17} ) space)", {"space"}},
    {"number", R"("-"? ( "0" | [1-9] [0-9]{0,17} ) ( "." [0-9]{1,18} )? ( [eE] [-+]? [0-9]{1,3} )? space)", {"space"}},
    {"number-nonnegative",
     R"(( "0" | [1-9] [0-9]{0,17} ) ( "." [0-9]{1,18} )? ( [eE] [-+]? [0-9]{1,3} )? space)",
     {"space"}},
    {"value",
     R"(object | array | string | number | boolean | null)",
     {"object", "array", "string", "number", "boolean", "null"}},
    {"object",
     R"("{" space ( string ":" space value ( "," space string ":" space value )* )? "}" space)",
     {"space", "string", "value"}},
    {"array", R"("[" space ( value ( "," space value )* )? "]" space)", {"space", "value"}},
    // Dates that exist: years 0001-9999 (Python's date and rfc3339-validator refuse year 0), each month's days,
    // February 29 only in leap years (divisible by 4; centuries only when divisible by 400).
    {"date-year", R"([1-9] [0-9]{3} | "0" [1-9] [0-9]{2} | "00" [1-9] [0-9] | "000" [1-9])", {}},
    {"date-leap-year",
     R"([0-9] [0-9] ( [02468] [48] | [13579] [26] | [2468] "0" ) | ( "0" [48] | [2468] [048] | [13579] [26] ) "00")",
     {}},
    {"date",
     R"(date-year "-" ( ( "0" [13578] | "1" [02] ) "-" ( "0" [1-9] | [12] [0-9] | "3" [01] ) | ( "0" [469] | "11" ) "-" ( "0" [1-9] | [12] [0-9] | "30" ) | "02-" ( "0" [1-9] | "1" [0-9] | "2" [0-8] ) ) | date-leap-year "-02-29")",
     {"date-year", "date-leap-year"}},
    // Seconds 00-59: RFC 3339 allows a leap second :60, but validators (Python's rfc3339-validator) refuse it.
    {"time",
     R"(( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,9} )? ( [zZ] | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ))",
     {}},
    {"date-time", R"(date [tT] time)", {"date", "time"}},
    {"uuid", R"([0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12})", {}},
    {"email-atom", R"([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)", {}},
    {"email-label", R"([A-Za-z0-9] ( [A-Za-z0-9-]{0,61} [A-Za-z0-9] )?)", {}},
    {"email", R"(email-atom ( "." email-atom )* "@" email-label ( "." email-label )+)", {"email-atom", "email-label"}},
};

const std::set<std::string_view> kAnnotations = {"title",    "description", "$schema",    "$id",      "$comment",
                                                 "examples", "default",     "deprecated", "readOnly", "writeOnly"};
const std::set<std::string_view> kKeywords = {"type",
                                              "properties",
                                              "required",
                                              "additionalProperties",
                                              "items",
                                              "prefixItems",
                                              "minItems",
                                              "maxItems",
                                              "enum",
                                              "const",
                                              "anyOf",
                                              "oneOf",
                                              "allOf",
                                              "$ref",
                                              "$defs",
                                              "definitions",
                                              "minLength",
                                              "maxLength",
                                              "pattern",
                                              "format",
                                              "minimum",
                                              "maximum",
                                              "exclusiveMinimum",
                                              "exclusiveMaximum"};
const std::set<std::string_view> kTypes = {"object", "array", "string", "number", "integer", "boolean", "null"};
// Without `type`, the keywords present say which types a schema is about (none of them: any JSON value).
const std::vector<std::string_view> kObjectWords = {"properties", "required", "additionalProperties"};
const std::vector<std::string_view> kArrayWords = {"items", "prefixItems", "minItems", "maxItems"};
const std::vector<std::string_view> kStringWords = {"minLength", "maxLength", "pattern", "format"};
const std::vector<std::string_view> kNumberWords = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};

const char* const kQuote = R"("\"")";  // the GBNF literal of a JSON string's quote

[[noreturn]] void fail(const std::string& path, const std::string& what) {
    throw Error("JSON Schema at " + path + ": " + what);
}

bool is_ignored(std::string_view key) { return kAnnotations.count(key) || key == "$defs" || key == "definitions"; }

// The keywords of a schema object that constrain values (not annotations or definition containers).
std::vector<std::string> constraints(const JsonValue& s) {
    std::vector<std::string> out;
    for (const auto& [key, value] : s.members)
        if (!is_ignored(key)) out.push_back(key);
    return out;
}

JsonValue without(const JsonValue& s, std::initializer_list<std::string_view> keys) {
    JsonValue out;
    out.kind = JsonValue::Kind::Object;
    for (const auto& member : s.members)
        if (std::find(keys.begin(), keys.end(), member.first) == keys.end()) out.members.push_back(member);
    return out;
}

JsonValue* find_mut(JsonValue& s, std::string_view key) {
    for (auto& [name, value] : s.members)
        if (name == key) return &value;
    return nullptr;
}

JsonValue string_value(const std::string& text) {
    JsonValue v;
    v.kind = JsonValue::Kind::String;
    v.text = text;
    return v;
}

JsonValue all_of(const JsonValue& a, const JsonValue& b) {
    JsonValue list;
    list.kind = JsonValue::Kind::Array;
    list.items = {a, b};
    JsonValue out;
    out.kind = JsonValue::Kind::Object;
    out.members.emplace_back("allOf", std::move(list));
    return out;
}

JsonValue bool_value(bool b) {
    JsonValue v;
    v.kind = JsonValue::Kind::Bool;
    v.boolean = b;
    return v;
}

// Sets s's member `key` to `value`, where it is if s has it, else at the end.
void set_member(JsonValue& s, const std::string& key, JsonValue value) {
    if (JsonValue* at = find_mut(s, key))
        *at = std::move(value);
    else
        s.members.emplace_back(key, std::move(value));
}

bool is_false_schema(const JsonValue& s) { return s.is_bool() && !s.boolean; }

// true, or an object that constrains nothing ({} or annotations only).
bool is_true_schema(const JsonValue& s) { return s.is_bool() ? s.boolean : s.is_object() && constraints(s).empty(); }

// The schema of the values valid against both a and b: false when either is false, the other when one constrains
// nothing, else their allOf.
JsonValue conjunction(const JsonValue& a, const JsonValue& b) {
    if (is_false_schema(a) || is_true_schema(b) || a == b) return a;
    if (is_false_schema(b) || is_true_schema(a)) return b;
    return all_of(a, b);
}

std::string pointer_escape(const std::string& key) {
    std::string out;
    for (const char c : key) {
        if (c == '~')
            out += "~0";
        else if (c == '/')
            out += "~1";
        else
            out += c;
    }
    return out;
}

// A GBNF string literal matching exactly the UTF-8 text `s`.
std::string gbnf_literal(const std::string& s) {
    static const char* hex = "0123456789ABCDEF";
    std::string out = "\"";
    for (const char c : s) {
        const auto u = static_cast<unsigned char>(c);
        if (c == '"')
            out += "\\\"";
        else if (c == '\\')
            out += "\\\\";
        else if (c == '\n')
            out += "\\n";
        else if (c == '\r')
            out += "\\r";
        else if (c == '\t')
            out += "\\t";
        else if (u < 0x20 || u == 0x7F)
            out += std::string("\\x") + hex[u >> 4] + hex[u & 15];
        else
            out += c;
    }
    return out + "\"";
}

// A repetition suffix for {lo,hi} (hi may be kUnbounded).
std::string repeat(uint64_t lo, uint64_t hi) {
    if (hi == kUnbounded) return lo == 0 ? "*" : lo == 1 ? "+" : "{" + std::to_string(lo) + ",}";
    if (lo == 0 && hi == 1) return "?";
    if (lo == hi) return lo == 1 ? "" : "{" + std::to_string(lo) + "}";
    return "{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
    return out;
}

bool is_identifier(const std::string& s) {
    if (s.empty()) return false;
    for (const char c : s)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
    return true;
}

// ---- integer ranges --------------------------------------------------------------------------------------------

std::string digit_class(char lo, char hi) {
    if (lo == hi) return std::string("\"") + lo + "\"";
    return std::string("[") + lo + "-" + hi + "]";
}

std::string any_digits(size_t n) { return n == 0 ? "" : n == 1 ? "[0-9]" : "[0-9]{" + std::to_string(n) + "}"; }

std::string seq(const std::string& a, const std::string& b) { return a.empty() ? b : b.empty() ? a : a + " " + b; }

// The decimal strings of one length n between lo and hi (both n digits, lo <= hi), as a GBNF expression.
std::string same_length_range(const std::string& lo, const std::string& hi) {
    const size_t n = lo.size();
    if (n == 0) return "";
    if (lo == hi) return gbnf_literal(lo);
    const std::string lo_rest = lo.substr(1), hi_rest = hi.substr(1);
    if (lo[0] == hi[0]) return seq(gbnf_literal(std::string(1, lo[0])), same_length_range(lo_rest, hi_rest));
    const bool lo_full = lo_rest == std::string(n - 1, '0');  // lo[0] takes every continuation
    const bool hi_full = hi_rest == std::string(n - 1, '9');
    std::vector<std::string> alts;
    if (!lo_full) alts.push_back(seq(digit_class(lo[0], lo[0]), same_length_range(lo_rest, std::string(n - 1, '9'))));
    const char mid_lo = lo_full ? lo[0] : static_cast<char>(lo[0] + 1);
    const char mid_hi = hi_full ? hi[0] : static_cast<char>(hi[0] - 1);
    if (mid_lo <= mid_hi) alts.push_back(seq(digit_class(mid_lo, mid_hi), any_digits(n - 1)));
    if (!hi_full) alts.push_back(seq(digit_class(hi[0], hi[0]), same_length_range(std::string(n - 1, '0'), hi_rest)));
    return alts.size() == 1 ? alts[0] : "( " + join(alts, " | ") + " )";
}

// The decimal numbers a..b (0 <= a <= b), without leading zeros.
std::string nonnegative_range(uint64_t a, uint64_t b) {
    std::vector<std::string> alts;
    uint64_t power = 1;  // 10^(len-1)
    for (size_t len = 1; len <= 19; ++len, power *= 10) {
        const uint64_t first = len == 1 ? 0 : power, last = power * 10 - 1;
        if (last < a) continue;
        if (first > b) break;
        alts.push_back(same_length_range(std::to_string(std::max(a, first)), std::to_string(std::min(b, last))));
    }
    return alts.size() == 1 ? alts[0] : "( " + join(alts, " | ") + " )";
}

// The integers lo..hi as JSON number text (no "-0").
std::string integer_range(int64_t lo, int64_t hi) {
    std::vector<std::string> alts;
    if (lo < 0) {
        const uint64_t mag_lo = hi < 0 ? static_cast<uint64_t>(-hi) : 1, mag_hi = static_cast<uint64_t>(-lo);
        alts.push_back("\"-\" " + nonnegative_range(mag_lo, mag_hi));
    }
    if (hi >= 0) alts.push_back(nonnegative_range(static_cast<uint64_t>(std::max<int64_t>(lo, 0)), hi));
    return alts.size() == 1 ? alts[0] : "( " + join(alts, " | ") + " )";
}

// ---- character sets and patterns -------------------------------------------------------------------------------

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
constexpr uint32_t kMaxCodePoint = 0x10FFFF;

Ranges normalized(Ranges r) {
    std::sort(r.begin(), r.end());
    Ranges out;
    for (const auto& range : r) {
        if (!out.empty() && range.first <= out.back().second + 1)
            out.back().second = std::max(out.back().second, range.second);
        else
            out.push_back(range);
    }
    return out;
}

Ranges complement(const Ranges& r) {
    Ranges out;
    uint32_t next = 0;
    for (const auto& [lo, hi] : normalized(r)) {
        if (lo > next) out.emplace_back(next, lo - 1);
        next = hi + 1;
    }
    if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
    return out;
}

bool contains(const Ranges& r, uint32_t cp) {
    for (const auto& [lo, hi] : r)
        if (cp >= lo && cp <= hi) return true;
    return false;
}

// r without the code points of `remove`.
Ranges subtract(const Ranges& r, const Ranges& remove) {
    const Ranges keep = complement(remove);
    Ranges out;
    for (const auto& [a, b] : normalized(r))
        for (const auto& [c, d] : keep)
            if (std::max(a, c) <= std::min(b, d)) out.emplace_back(std::max(a, c), std::min(b, d));
    return out;
}

std::string class_char(uint32_t cp) {
    static const char* hex = "0123456789ABCDEF";
    if (cp < 0x80 &&
        (std::isalnum(static_cast<int>(cp)) ||
         std::string_view(" !#$%&'()*+,./:;<=>?@_`{|}~").find(static_cast<char>(cp)) != std::string_view::npos))
        return std::string(1, static_cast<char>(cp));
    std::string out = cp < 0x100 ? "\\x" : cp < 0x10000 ? "\\u" : "\\U";
    const int digits = cp < 0x100 ? 2 : cp < 0x10000 ? 4 : 8;
    for (int i = digits - 1; i >= 0; --i) out += hex[(cp >> (4 * i)) & 15];
    return out;
}

std::string utf8_of(uint32_t cp) {
    std::string s;
    utf8::append(s, cp);
    return s;
}

// How a JSON string writes the character cp, as json_quote escapes it (" and \ escaped, control characters as \n
// and the like or \u00XX, anything else as its UTF-8): the form to_json gives a const or an enum string too.
std::string json_encoding(uint32_t cp) {
    std::string out;
    append_json_escaped(out, utf8_of(cp));
    return out;
}

struct Piece {
    std::string expr;
    bool nullable = false;
    std::string literal;  // set when the piece is exactly this text (one character), so runs merge into one literal
    bool is_literal = false;
};

// Translates an ECMA-262 pattern (the subset json_schema.h lists) into a GBNF expression over the JSON encoding of
// the string's characters (between the quotes).
class PatternConverter {
public:
    PatternConverter(const std::string& pattern, const std::string& path, std::function<std::string(const char*)> prim)
        : path_(path), prim_(std::move(prim)) {
        for (size_t i = 0; i < pattern.size();) {  // valid UTF-8: the JSON reader checked it
            const auto b = static_cast<unsigned char>(pattern[i]);
            const size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
            uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
            for (size_t k = 1; k < n && i + k < pattern.size(); ++k)
                cp = (cp << 6) | (static_cast<unsigned char>(pattern[i + k]) & 0x3F);
            cps_.push_back(cp);
            i += n;
        }
    }

    std::string convert() {
        Piece p = alternatives(0);
        if (p_ < cps_.size()) fail_here("unmatched ')'");
        return p.expr;
    }

private:
    std::string path_;
    std::function<std::string(const char*)> prim_;
    std::vector<uint32_t> cps_;
    size_t p_ = 0;

    [[noreturn]] void fail_here(const std::string& what) {
        fail(path_, "pattern: " + what + " (at character " + std::to_string(p_ + 1) + ")");
    }
    bool at_end() const { return p_ >= cps_.size(); }
    uint32_t peek(size_t ahead = 0) const { return p_ + ahead < cps_.size() ? cps_[p_ + ahead] : 0xFFFFFFFF; }

    Piece alternatives(size_t depth) {
        std::vector<Piece> branches{sequence(depth)};
        while (peek() == '|') {
            ++p_;
            branches.push_back(sequence(depth));
        }
        if (branches.size() == 1) return branches[0];
        Piece out;
        std::vector<std::string> exprs;
        for (const Piece& b : branches) {
            exprs.push_back(b.expr);
            out.nullable = out.nullable || b.nullable;
        }
        out.expr = "( " + join(exprs, " | ") + " )";
        return out;
    }

    Piece sequence(size_t depth) {
        const bool top = depth == 0;
        bool anchored_start = false, anchored_end = false;
        if (top && peek() == '^') {
            ++p_;
            anchored_start = true;
        }
        std::vector<Piece> items;
        while (!at_end() && peek() != '|' && peek() != ')') {
            if (peek() == '$') {
                ++p_;
                if (top && (at_end() || peek() == '|')) {
                    anchored_end = true;
                    break;
                }
                --p_;
                fail_here("'$' is only supported at the end of the pattern or of a top-level alternative");
            }
            if (peek() == '^')
                fail_here("'^' is only supported at the start of the pattern or of a top-level alternative");
            Piece atom_piece = atom(depth);
            items.push_back(quantified(std::move(atom_piece)));
        }
        Piece any;  // what an unanchored end allows: any characters
        any.expr = prim_("char") + "*";
        any.nullable = true;
        if (top && !anchored_start) items.insert(items.begin(), any);
        if (top && !anchored_end) items.push_back(any);
        Piece out;
        out.nullable = true;
        std::vector<std::string> exprs;
        std::string run;
        auto flush = [&] {
            if (!run.empty()) exprs.push_back(gbnf_literal(run));
            run.clear();
        };
        for (const Piece& item : items) {
            out.nullable = out.nullable && item.nullable;
            if (item.is_literal) {
                run += item.literal;
                continue;
            }
            flush();
            exprs.push_back(item.expr);
        }
        flush();
        if (exprs.empty())
            out.expr = "\"\"";
        else
            out.expr = exprs.size() == 1 ? exprs[0] : "( " + join(exprs, " ") + " )";
        return out;
    }

    // Reads a decimal count of a {m,n} quantifier; false (nothing consumed) when there is none.
    bool count(uint64_t* out) {
        const size_t start = p_;
        uint64_t v = 0;
        while (peek() >= '0' && peek() <= '9') {
            v = v * 10 + (peek() - '0');
            if (v > kMaxCount) fail_here("repetition count larger than " + std::to_string(kMaxCount));
            ++p_;
        }
        *out = v;
        return p_ > start;
    }

    // {m}, {m,}, {m,n} at p_ (which is '{'); false, with p_ unchanged, when it is not one (then '{' is literal).
    bool braces(uint64_t* lo, uint64_t* hi) {
        const size_t start = p_;
        ++p_;
        if (!count(lo)) {
            p_ = start;
            return false;
        }
        *hi = *lo;
        if (peek() == ',') {
            ++p_;
            if (!count(hi)) *hi = kUnbounded;
        }
        if (peek() != '}') {
            p_ = start;
            return false;
        }
        ++p_;
        return true;
    }

    Piece quantified(Piece atom_piece) {
        uint64_t lo, hi;
        const uint32_t c = peek();
        if (c == '*')
            lo = 0, hi = kUnbounded, ++p_;
        else if (c == '+')
            lo = 1, hi = kUnbounded, ++p_;
        else if (c == '?')
            lo = 0, hi = 1, ++p_;
        else if (c == '{' && braces(&lo, &hi)) {
            if (hi < lo) fail_here("repetition {m,n} with m > n");
        } else {
            return atom_piece;
        }
        if (peek() == '?')
            ++p_;  // lazy: the same strings match
        else if (peek() == '+')
            fail_here("possessive quantifiers are not supported");
        if (atom_piece.nullable && hi > 1) fail_here("repeating something that can match the empty string");
        Piece out;
        out.nullable = lo == 0 || atom_piece.nullable;
        if (hi == 0)
            out.expr = "\"\"";
        else
            out.expr = atom_piece.expr + repeat(lo, hi);
        return out;
    }

    Piece atom(size_t depth) {
        const uint32_t c = cps_[p_++];
        Ranges set;
        switch (c) {
            case '(': {
                if (depth + 1 > kMaxDepth) fail_here("groups nested deeper than " + std::to_string(kMaxDepth));
                if (peek() == '?') {
                    if (peek(1) == ':') {
                        p_ += 2;
                    } else if ((peek(1) == '<' && peek(2) != '=' && peek(2) != '!') ||
                               (peek(1) == 'P' && peek(2) == '<')) {
                        while (!at_end() && peek() != '>') ++p_;  // a named group: the name does not matter here
                        if (at_end()) fail_here("unterminated group name");
                        ++p_;
                    } else {
                        fail_here("lookarounds and group flags ('(?" + utf8_of(peek(1)) + "') are not supported");
                    }
                }
                Piece inner = alternatives(depth + 1);
                if (peek() != ')') fail_here("missing ')'");
                ++p_;
                Piece out;
                out.nullable = inner.nullable;
                out.expr =
                    inner.expr.front() == '(' && inner.expr.back() == ')' ? inner.expr : "( " + inner.expr + " )";
                return out;
            }
            case '[': set = char_class(); break;
            case '.': set = complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}); break;
            case '\\': set = escape(false); break;
            case '*':
            case '+':
            case '?': --p_; fail_here("nothing to repeat");
            case '{': {
                uint64_t lo, hi;
                --p_;
                if (braces(&lo, &hi)) {
                    fail_here("nothing to repeat");
                }
                ++p_;
                set = {{c, c}};
                break;
            }
            default: set = {{c, c}};
        }
        return render(normalized(set));
    }

    Ranges char_class() {
        const bool negate = peek() == '^';
        if (negate) ++p_;
        Ranges set;
        bool first = true;
        for (;;) {
            if (at_end()) fail_here("unterminated character class");
            if (peek() == ']' && !first) break;
            if (peek() == ']') fail_here("empty character class '[]'");
            first = false;
            if (peek() == '[' && peek(1) == ':') fail_here("POSIX classes ([:name:]) are not supported");
            Ranges item;
            bool single = true;
            uint32_t lo = peek();
            if (lo == '\\') {
                ++p_;
                item = escape(true);
                single = item.size() == 1 && item[0].first == item[0].second;
                lo = item[0].first;
            } else {
                ++p_;
                item = {{lo, lo}};
            }
            if (single && peek() == '-' && p_ + 1 < cps_.size() && peek(1) != ']') {
                ++p_;
                uint32_t hi = peek();
                if (hi == '\\') {
                    ++p_;
                    const Ranges end = escape(true);
                    if (end.size() != 1 || end[0].first != end[0].second) fail_here("a class range ending in a class");
                    hi = end[0].first;
                } else {
                    ++p_;
                }
                if (hi < lo) fail_here("class range out of order");
                item = {{lo, hi}};
            }
            set.insert(set.end(), item.begin(), item.end());
        }
        ++p_;  // ']'
        return negate ? complement(set) : normalized(set);
    }

    uint32_t hex_digits(int n) {
        uint32_t v = 0;
        for (int i = 0; i < n; ++i) {
            const uint32_t c = peek();
            v <<= 4;
            if (c >= '0' && c <= '9')
                v |= c - '0';
            else if (c >= 'a' && c <= 'f')
                v |= c - 'a' + 10;
            else if (c >= 'A' && c <= 'F')
                v |= c - 'A' + 10;
            else
                fail_here("expected a hex digit in an escape");
            ++p_;
        }
        return v;
    }

    // The set an escape stands for (p_ just past the backslash).
    Ranges escape(bool in_class) {
        if (at_end()) fail_here("trailing backslash");
        const uint32_t c = cps_[p_++];
        const Ranges digit = {{'0', '9'}};
        const Ranges word = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
        const Ranges space = {{'\t', '\r'},     {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
                              {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
        switch (c) {
            case 'd': return digit;
            case 'D': return complement(digit);
            case 'w': return word;
            case 'W': return complement(word);
            case 's': return normalized(space);
            case 'S': return complement(space);
            case 'n': return {{'\n', '\n'}};
            case 'r': return {{'\r', '\r'}};
            case 't': return {{'\t', '\t'}};
            case 'f': return {{'\f', '\f'}};
            case 'v': return {{'\v', '\v'}};
            case 'x': {
                const uint32_t v = hex_digits(2);
                return {{v, v}};
            }
            case 'u': {
                const uint32_t v = hex_digits(4);
                if (v >= 0xD800 && v <= 0xDFFF) fail_here("surrogate escapes are not supported");
                return {{v, v}};
            }
            case '0':
                if (peek() >= '0' && peek() <= '9') break;
                return {{0, 0}};
            case 'b':
                if (in_class) return {{'\b', '\b'}};
                break;
            default:
                if (c >= 0x80 || !std::isalnum(static_cast<int>(c))) return {{c, c}};  // escaped punctuation
        }
        --p_;
        fail_here("unsupported escape '\\" + utf8_of(c) + "'");
    }

    // A set of characters as the GBNF of their JSON encodings.
    Piece render(const Ranges& set) {
        if (set.empty()) fail_here("a character class that matches nothing");
        const Ranges raw = subtract(set, {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
        std::vector<std::string> alts;
        Piece out;
        if (raw.size() == 1 && raw[0].first == raw[0].second) {
            if (set.size() == 1) {
                out.is_literal = true;
                out.literal = utf8_of(raw[0].first);
            }
            alts.push_back(gbnf_literal(utf8_of(raw[0].first)));
        } else if (!raw.empty()) {
            std::string cls = "[";
            for (const auto& [lo, hi] : raw) cls += class_char(lo) + (lo == hi ? "" : "-" + class_char(hi));
            alts.push_back(cls + "]");
        }
        for (const uint32_t special : {uint32_t{'"'}, uint32_t{'\\'}})
            if (contains(set, special)) alts.push_back(gbnf_literal(json_encoding(special)));
        const Ranges controls = subtract(set, complement({{0, 0x1F}}));
        if (controls.size() == 1 && controls[0] == std::pair<uint32_t, uint32_t>{0, 0x1F}) {
            alts.push_back(prim_("json-ctrl"));
        } else {
            for (const auto& [lo, hi] : controls)
                for (uint32_t cp = lo; cp <= hi; ++cp) alts.push_back(gbnf_literal(json_encoding(cp)));
        }
        out.expr = alts.size() == 1 ? alts[0] : "( " + join(alts, " | ") + " )";
        return out;
    }
};

// ---- the schema walk ---------------------------------------------------------------------------------------------

class Converter {
public:
    explicit Converter(const JsonValue& root) : root_(root) {
        for (const Primitive& p : kPrimitives) names_.insert(p.name);
    }

    std::string run() {
        prim("space");
        const std::string root = reserve("root");
        ref_rules_["#"] = root;
        no_progress_.push_back("#");
        define(root, body(root_, root, "#"));
        std::string out = root + " ::= " + rules_[index_.at(root)].body + "\n";  // the start rule first
        for (const Rule& r : rules_)
            if (r.name != root) out += r.name + " ::= " + r.body + "\n";
        return out;
    }

private:
    struct Rule {
        std::string name, body;
    };
    const JsonValue& root_;
    std::vector<Rule> rules_;
    std::set<std::string> names_;
    std::unordered_map<std::string, size_t> index_;
    std::unordered_map<std::string, std::string> by_body_;
    std::set<std::string> prims_added_;
    std::map<std::string, std::string> ref_rules_;  // $ref -> its rule
    std::vector<std::string> no_progress_;          // $refs entered since the grammar last consumed a token
    size_t depth_ = 0, work_ = 0, bytes_ = 0;

    // Entering an object's or array's members: a token ("{", "[") was consumed, so reference cycles from here on
    // make progress.
    struct ProgressScope {
        std::vector<std::string>& refs;
        std::vector<std::string> saved;
        explicit ProgressScope(std::vector<std::string>& r) : refs(r), saved(std::move(r)) { refs.clear(); }
        ~ProgressScope() { refs = std::move(saved); }
    };
    struct DepthScope {
        size_t& depth;
        explicit DepthScope(size_t& d) : depth(d) { ++depth; }
        ~DepthScope() { --depth; }
    };

    std::string prim(const std::string& name) {
        if (prims_added_.insert(name).second) {
            const auto it = std::find_if(kPrimitives.begin(), kPrimitives.end(),
                                         [&](const Primitive& p) { return name == p.name; });
            for (const char* dep : it->deps) prim(dep);
            add(name, it->body);
        }
        return name;
    }

    void add(const std::string& name, const std::string& body) {
        bytes_ += name.size() + body.size() + 6;
        if (bytes_ > kMaxGrammarBytes) fail("#", "the grammar would be larger than 4 MiB");
        index_[name] = rules_.size();
        rules_.push_back({name, body});
        by_body_.emplace(body, name);
    }

    std::string unique_name(const std::string& hint) {
        std::string base;
        for (const char c : hint.substr(0, 48)) base += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
        if (base.empty()) base = "r";
        std::string name = base;
        for (size_t i = 2; names_.count(name); ++i) name = base + "-" + std::to_string(i);
        names_.insert(name);
        return name;
    }

    // A rule for `body` (an existing one with the same body if there is one); a body that is a rule name already
    // is returned as it is.
    std::string add_rule(const std::string& hint, const std::string& body) {
        if (is_identifier(body)) return body;
        if (const auto it = by_body_.find(body); it != by_body_.end()) return it->second;
        const std::string name = unique_name(hint);
        add(name, body);
        return name;
    }

    std::string reserve(const std::string& hint) {
        const std::string name = unique_name(hint);
        index_[name] = rules_.size();
        rules_.push_back({name, ""});
        return name;
    }

    void define(const std::string& name, const std::string& body) {
        bytes_ += body.size();
        if (bytes_ > kMaxGrammarBytes) fail("#", "the grammar would be larger than 4 MiB");
        rules_[index_.at(name)].body = body;
        by_body_.emplace(body, name);
    }

    void count_work(const std::string& path) {
        if (++work_ > kMaxWork)
            fail(path, "the schema is too complex (more than " + std::to_string(kMaxWork) + " schemas to convert)");
    }

    void check_keywords(const JsonValue& s, const std::string& path) {
        for (const auto& [key, value] : s.members)
            if (!kAnnotations.count(key) && !kKeywords.count(key)) fail(path, "unsupported keyword '" + key + "'");
    }

    const JsonValue& resolve(const std::string& ref, const std::string& path) {
        if (ref.empty() || ref[0] != '#')
            fail(path, "$ref '" + ref + "': only references inside the document (starting with '#') are supported");
        const JsonValue* at = &root_;
        if (ref.size() == 1) return *at;
        if (ref[1] != '/') fail(path, "$ref '" + ref + "': only JSON pointers (#/...) are supported");
        size_t start = 2;
        for (;;) {
            const size_t end = std::min(ref.find('/', start), ref.size());
            std::string segment;
            for (size_t i = start; i < end; ++i) {
                if (ref[i] == '~' && i + 1 < end && (ref[i + 1] == '0' || ref[i + 1] == '1')) {
                    segment += ref[++i] == '0' ? '~' : '/';
                } else {
                    segment += ref[i];
                }
            }
            const JsonValue* next = nullptr;
            if (at->is_object()) {
                next = at->find(segment);
            } else if (at->is_array() && !segment.empty() && segment.size() < 10 &&
                       std::all_of(segment.begin(), segment.end(), [](char c) { return c >= '0' && c <= '9'; })) {
                const size_t i = std::stoul(segment);
                if (i < at->items.size()) next = &at->items[i];
            }
            if (!next) fail(path, "$ref '" + ref + "' points to nothing (no '" + segment + "')");
            at = next;
            if (end == ref.size()) return *at;
            start = end + 1;
        }
    }

    std::string ref_rule(const JsonValue& ref_value, const std::string& path) {
        if (!ref_value.is_string()) fail(path, "$ref must be a string");
        const std::string& ref = ref_value.text;
        if (std::find(no_progress_.begin(), no_progress_.end(), ref) != no_progress_.end())
            fail(path, "$ref cycle that consumes no input: " + join(no_progress_, " -> ") + " -> " + ref);
        if (const auto it = ref_rules_.find(ref); it != ref_rules_.end()) return it->second;
        const JsonValue& target = resolve(ref, path);
        const size_t slash = ref.rfind('/');
        const std::string name = reserve(slash == std::string::npos ? "root" : ref.substr(slash + 1));
        ref_rules_[ref] = name;
        no_progress_.push_back(ref);
        const std::string b = body(target, name, ref);
        no_progress_.pop_back();
        define(name, b);
        return name;
    }

    // The schema with its $ref and allOf merged into it (recursively), as one schema object.
    JsonValue flatten(const JsonValue& s, const std::string& path, size_t hops) {
        if (hops > kMaxDepth) fail(path, "$ref/allOf nested deeper than " + std::to_string(kMaxDepth) + " (a cycle?)");
        count_work(path);
        if (s.is_bool()) {
            if (!s.boolean) fail(path, "the schema false matches nothing");
            return without(JsonValue{}, {});
        }
        if (!s.is_object()) fail(path, "a schema must be an object or a boolean");
        check_keywords(s, path);
        JsonValue out = without(s, {"$ref", "allOf"});
        if (const JsonValue* ref = s.find("$ref")) {
            if (!ref->is_string()) fail(path, "$ref must be a string");
            out = merge(flatten(resolve(ref->text, path), ref->text, hops + 1), out, path);
        }
        if (const JsonValue* all = s.find("allOf")) {
            if (!all->is_array() || all->items.empty()) fail(path, "allOf must be a non-empty array");
            for (size_t i = 0; i < all->items.size(); ++i) {
                const std::string sub = path + "/allOf/" + std::to_string(i);
                out = merge(out, flatten(all->items[i], sub, hops + 1), sub);
            }
        }
        return out;
    }

    static std::vector<std::string> type_list(const JsonValue& t, const std::string& path) {
        std::vector<std::string> out;
        if (t.is_string())
            out.push_back(t.text);
        else if (t.is_array() && !t.items.empty())
            for (const JsonValue& item : t.items) {
                if (!item.is_string()) fail(path, "type must be a string or a non-empty array of strings");
                if (std::find(out.begin(), out.end(), item.text) == out.end()) out.push_back(item.text);
            }
        else
            fail(path, "type must be a string or a non-empty array of strings");
        for (const std::string& name : out)
            if (!kTypes.count(name)) fail(path, "unknown type '" + name + "'");
        return out;
    }

    // Draft-04's boolean exclusiveMinimum/exclusiveMaximum make the minimum/maximum of their own schema object
    // exclusive: rewritten as the numeric forms, they keep that meaning next to another part's bounds.
    static JsonValue numeric_exclusive_bounds(const JsonValue& s) {
        JsonValue out = s;
        for (const auto& [flag, bound] : {std::pair{"exclusiveMinimum", "minimum"}, {"exclusiveMaximum", "maximum"}}) {
            const JsonValue* f = out.find(flag);
            const JsonValue* b = out.find(bound);
            if (!f || !f->is_bool()) continue;
            if (f->boolean && b && b->is_number()) {
                const JsonValue value = *b;
                out = without(out, {flag, bound});
                out.members.emplace_back(flag, value);
            } else if (!f->boolean || !b) {
                out = without(out, {flag});  // no bound of its own to make exclusive
            }
        }
        return out;
    }

    // allOf of two parts' members. additionalProperties sees only the properties of its own schema object, so a
    // member's schema is what both parts say of its name: the part's property schema for it, else the part's
    // additionalProperties (absent: any value). A name that either part forbids gets the property schema false: the
    // object may not have it (object_body), and if it is required the schema has no valid instance.
    void merge_members(const JsonValue& a, const JsonValue& b, JsonValue& out, const std::string& path) {
        auto check = [&](const JsonValue& part) {
            const JsonValue* props = part.find("properties");
            if (props && !props->is_object()) fail(path, "properties must be an object");
            const JsonValue* additional = part.find("additionalProperties");
            if (additional && !additional->is_bool() && !additional->is_object())
                fail(path, "additionalProperties must be a boolean or a schema");
            return props || additional;
        };
        check(a);
        if (!check(b)) return;  // out has a's
        auto additional = [](const JsonValue& part) {
            const JsonValue* ap = part.find("additionalProperties");
            return ap ? *ap : bool_value(true);
        };
        auto member = [&](const JsonValue& part, const std::string& key) {
            const JsonValue* props = part.find("properties");
            const JsonValue* schema = props ? props->find(key) : nullptr;
            return schema ? *schema : additional(part);
        };
        JsonValue props;
        props.kind = JsonValue::Kind::Object;
        for (const JsonValue* part : {&a, &b})
            if (const JsonValue* p = part->find("properties"))
                for (const auto& [key, schema] : p->members)
                    if (!props.find(key)) props.members.emplace_back(key, conjunction(member(a, key), member(b, key)));
        if (a.find("properties") || b.find("properties")) set_member(out, "properties", props);
        if (a.find("additionalProperties") || b.find("additionalProperties"))
            set_member(out, "additionalProperties", conjunction(additional(a), additional(b)));
    }

    // allOf of two parts' items, the same way: items sees only the prefixItems of its own schema object, so element
    // i's schema is what both parts say of position i (a part's prefixItems[i], else its items, absent: any). Where
    // that is false no element may be, so the tuple ends before it (items false).
    void merge_items(const JsonValue& a, const JsonValue& b, JsonValue& out, const std::string& path) {
        auto check = [&](const JsonValue& part) {
            const JsonValue* prefix = part.find("prefixItems");
            if (prefix && !prefix->is_array()) fail(path, "prefixItems must be an array of schemas");
            const JsonValue* items = part.find("items");
            if (items && items->is_array())
                fail(path, "items as an array (draft-04 tuples) is not supported: use prefixItems");
            if (items && !items->is_bool() && !items->is_object()) fail(path, "items must be a schema");
            return prefix || items;
        };
        check(a);
        if (!check(b)) return;  // out has a's
        auto rest = [](const JsonValue& part) {
            const JsonValue* items = part.find("items");
            return items ? *items : bool_value(true);
        };
        auto prefix_size = [](const JsonValue& part) {
            const JsonValue* prefix = part.find("prefixItems");
            return prefix ? prefix->items.size() : size_t{0};
        };
        auto element = [&](const JsonValue& part, size_t i) {
            return i < prefix_size(part) ? part.find("prefixItems")->items[i] : rest(part);
        };
        JsonValue prefix;
        prefix.kind = JsonValue::Kind::Array;
        JsonValue items = conjunction(rest(a), rest(b));
        for (size_t i = 0; i < std::max(prefix_size(a), prefix_size(b)); ++i) {
            JsonValue schema = conjunction(element(a, i), element(b, i));
            if (is_false_schema(schema)) {
                items = schema;
                break;
            }
            prefix.items.push_back(std::move(schema));
        }
        if (a.find("prefixItems") || b.find("prefixItems")) set_member(out, "prefixItems", prefix);
        if (a.find("items") || b.find("items") || !is_true_schema(items)) set_member(out, "items", items);
    }

    // Both parts of an allOf at once (a and b are flattened: no $ref or allOf at their top).
    JsonValue merge(const JsonValue& a_part, const JsonValue& b_part, const std::string& path) {
        count_work(path);
        const JsonValue a = numeric_exclusive_bounds(a_part), b = numeric_exclusive_bounds(b_part);
        JsonValue out = a;
        merge_members(a, b, out, path);
        merge_items(a, b, out, path);
        for (const auto& [key, bv] : b.members) {
            if (key == "properties" || key == "additionalProperties" || key == "prefixItems" || key == "items")
                continue;  // merged above
            JsonValue* av = find_mut(out, key);
            if (!av) {
                out.members.emplace_back(key, bv);
                continue;
            }
            if (*av == bv || is_ignored(key)) continue;
            static const std::set<std::string_view> kLower = {"minLength", "minItems", "minimum", "exclusiveMinimum"};
            static const std::set<std::string_view> kUpper = {"maxLength", "maxItems", "maximum", "exclusiveMaximum"};
            if (key == "required" && av->is_array() && bv.is_array()) {
                for (const JsonValue& name : bv.items)
                    if (std::find(av->items.begin(), av->items.end(), name) == av->items.end())
                        av->items.push_back(name);
            } else if (key == "type") {
                const std::vector<std::string> ta = type_list(*av, path), tb = type_list(bv, path);
                JsonValue common;
                common.kind = JsonValue::Kind::Array;
                for (const std::string& t : ta) {
                    const bool in_b = std::find(tb.begin(), tb.end(), t) != tb.end();
                    const bool integer_of_number =
                        t == "integer" && std::find(tb.begin(), tb.end(), "number") != tb.end();
                    if (in_b || integer_of_number) common.items.push_back(string_value(t));
                }
                for (const std::string& t : tb)
                    if (t == "integer" && std::find(ta.begin(), ta.end(), "number") != ta.end() &&
                        std::find(ta.begin(), ta.end(), "integer") == ta.end())
                        common.items.push_back(string_value(t));
                if (common.items.empty()) fail(path, "allOf: the parts have no type in common");
                *av = common;
            } else if ((kLower.count(key) || kUpper.count(key)) && av->is_number() && bv.is_number()) {
                if ((kLower.count(key) != 0) == (bv.number > av->number)) *av = bv;
            } else if (key == "enum" && av->is_array() && bv.is_array()) {
                JsonValue common;
                common.kind = JsonValue::Kind::Array;
                for (const JsonValue& v : av->items)
                    if (std::find(bv.items.begin(), bv.items.end(), v) != bv.items.end()) common.items.push_back(v);
                if (common.items.empty()) fail(path, "allOf: the parts' enums have no value in common");
                *av = common;
            } else if ((key == "anyOf" || key == "oneOf") && av->is_array() && bv.is_array()) {
                JsonValue cross;
                cross.kind = JsonValue::Kind::Array;
                for (const JsonValue& x : av->items)
                    for (const JsonValue& y : bv.items) {
                        count_work(path);
                        cross.items.push_back(all_of(x, y));
                    }
                *av = cross;
            } else {
                fail(path, "allOf: the parts disagree on '" + key + "', which cannot be merged");
            }
        }
        return out;
    }

    // The GBNF expression for the values schema `s` accepts; `name` is the hint for the rules it adds.
    std::string body(const JsonValue& s, const std::string& name, const std::string& path) {
        DepthScope depth(depth_);
        if (depth_ > kMaxDepth) fail(path, "schemas nested deeper than " + std::to_string(kMaxDepth));
        count_work(path);
        if (s.is_bool()) {
            if (!s.boolean) fail(path, "the schema false matches nothing");
            return prim("value");
        }
        if (!s.is_object()) fail(path, "a schema must be an object or a boolean");
        check_keywords(s, path);
        const std::vector<std::string> keys = constraints(s);
        if (const JsonValue* ref = s.find("$ref")) {
            if (keys.size() == 1) return ref_rule(*ref, path);
            return body(flatten(s, path, 0), name, path);
        }
        if (s.find("allOf")) return body(flatten(s, path, 0), name, path);

        const JsonValue* any = s.find("anyOf");
        const JsonValue* one = s.find("oneOf");
        if (any && one) fail(path, "anyOf and oneOf together are not supported");
        if (any || one) {
            const std::string key = any ? "anyOf" : "oneOf";
            const JsonValue& list = any ? *any : *one;
            if (!list.is_array() || list.items.empty()) fail(path, key + " must be a non-empty array");
            const JsonValue rest = without(s, {key});
            const bool has_rest = !constraints(rest).empty();
            std::vector<std::string> alts, dropped;
            for (size_t i = 0; i < list.items.size(); ++i) {
                const std::string sub = path + "/" + key + "/" + std::to_string(i);
                const std::string hint = name + "-" + std::to_string(i);
                const JsonValue merged = has_rest ? merge(rest, flatten(list.items[i], sub, 0), sub) : JsonValue{};
                const JsonValue& alternative = has_rest ? merged : list.items[i];
                if (const std::string why = no_instance(alternative); !why.empty()) {
                    dropped.push_back(sub + ": " + why);  // nothing satisfies it: the others may still be chosen
                    continue;
                }
                const std::string alt = visit(alternative, hint, sub);
                if (std::find(alts.begin(), alts.end(), alt) == alts.end()) alts.push_back(alt);
            }
            if (alts.empty()) fail(path, key + ": no alternative has a valid instance (" + join(dropped, "; ") + ")");
            return join(alts, " | ");
        }

        if (s.find("const") || s.find("enum")) return enum_body(s, keys, path);

        std::vector<std::string> types;
        if (const JsonValue* t = s.find("type")) {
            types = type_list(*t, path);
        } else {
            if (has_any(s, kObjectWords)) types.push_back("object");
            if (has_any(s, kArrayWords)) types.push_back("array");
            if (has_any(s, kStringWords)) types.push_back("string");
            if (has_any(s, kNumberWords)) types.push_back("number");
            if (types.empty()) return prim("value");
        }
        if (types.size() == 1) return type_body(s, types[0], name, path);
        std::vector<std::string> alts;
        for (const std::string& t : types) {
            if (t == "object" && !forbidden_required(s).empty()) continue;  // no object is valid; the others may be
            alts.push_back(add_rule(name + "-" + t, type_body(s, t, name + "-" + t, path)));
        }
        return join(alts, " | ");
    }

    static bool has_any(const JsonValue& s, const std::vector<std::string_view>& words) {
        return std::any_of(words.begin(), words.end(), [&](std::string_view w) { return s.find(w) != nullptr; });
    }

    // The first required member that schema object s forbids (its property schema is false, or it is in no
    // properties and additionalProperties is false), as the reason no object is valid for s; "" when there is none.
    // A check of s's own keywords: s may still have no valid instance further down.
    static std::string forbidden_required(const JsonValue& s) {
        const JsonValue* required = s.find("required");
        if (!required || !required->is_array()) return "";
        const JsonValue* props = s.find("properties");
        const JsonValue* additional = s.find("additionalProperties");
        const bool closed = additional && is_false_schema(*additional);
        for (const JsonValue& key : required->items) {
            if (!key.is_string()) continue;
            const JsonValue* schema = props && props->is_object() ? props->find(key.text) : nullptr;
            if (schema && is_false_schema(*schema))
                return "property '" + key.text +
                       "' is required but not allowed (its schema is false, or additionalProperties false of a part "
                       "merged by allOf or $ref leaves it out: additionalProperties sees only the properties beside "
                       "it)";
            if (!schema && closed)
                return "required property '" + key.text + "' is not in properties and additionalProperties is false";
        }
        return "";
    }

    // Why schema s has no valid instance, where its own keywords show it (s can only be an object, and
    // forbidden_required rules every object out); "" otherwise. For leaving out alternatives nothing satisfies.
    static std::string no_instance(const JsonValue& s) {
        if (!s.is_object()) return "";
        for (const char* key : {"$ref", "allOf", "anyOf", "oneOf", "enum", "const"})
            if (s.find(key)) return "";  // other ways to a value than this object's keywords
        if (const JsonValue* t = s.find("type")) {
            const bool object_only =
                (t->is_string() && t->text == "object") ||
                (t->is_array() && t->items.size() == 1 && t->items[0].is_string() && t->items[0].text == "object");
            if (!object_only) return "";
        } else if (has_any(s, kArrayWords) || has_any(s, kStringWords) || has_any(s, kNumberWords)) {
            return "";
        }
        return forbidden_required(s);
    }

    std::string visit(const JsonValue& s, const std::string& name, const std::string& path) {
        return add_rule(name, body(s, name, path));
    }

    std::string type_body(const JsonValue& s, const std::string& type, const std::string& name,
                          const std::string& path) {
        if (type == "object") return object_body(s, name, path);
        if (type == "array") return array_body(s, name, path);
        if (type == "string") return string_body(s, path);
        if (type == "integer") return integer_body(s, path);
        if (type == "number") return number_body(s, path);
        return prim(type);  // boolean, null
    }

    // const/enum: the values themselves (filtered by `type` when it is given).
    std::string enum_body(const JsonValue& s, const std::vector<std::string>& keys, const std::string& path) {
        for (const std::string& key : keys)
            if (key != "const" && key != "enum" && key != "type")
                fail(path, "'" + key + "' next to enum/const is not supported");
        std::vector<JsonValue> values;
        if (const JsonValue* e = s.find("enum")) {
            if (!e->is_array() || e->items.empty()) fail(path, "enum must be a non-empty array");
            values = e->items;
        }
        if (const JsonValue* c = s.find("const")) {
            if (s.find("enum") && std::find(values.begin(), values.end(), *c) == values.end())
                fail(path, "const is not one of the enum's values");
            values = {*c};
        }
        if (const JsonValue* t = s.find("type")) {
            const std::vector<std::string> types = type_list(*t, path);
            auto has = [&](const char* type) { return std::find(types.begin(), types.end(), type) != types.end(); };
            std::vector<JsonValue> kept;
            for (const JsonValue& v : values) {
                const bool integral = v.is_number() && std::isfinite(v.number) && std::floor(v.number) == v.number;
                if ((v.is_null() && has("null")) || (v.is_bool() && has("boolean")) ||
                    (v.is_string() && has("string")) || (v.is_array() && has("array")) ||
                    (v.is_object() && has("object")) ||
                    (v.is_number() && (has("number") || (integral && has("integer")))))
                    kept.push_back(v);
            }
            if (kept.empty()) fail(path, "no enum/const value has the schema's type");
            values = kept;
        }
        std::vector<std::string> alts;
        for (const JsonValue& v : values) {
            const std::string lit = literal(v);
            if (std::find(alts.begin(), alts.end(), lit) == alts.end()) alts.push_back(lit);
        }
        return alts.size() == 1 ? alts[0] : "( " + join(alts, " | ") + " )";
    }

    // Exactly the JSON value v, with optional whitespace after each token.
    std::string literal(const JsonValue& v) {
        if (v.is_array()) {
            std::vector<std::string> parts;
            for (const JsonValue& item : v.items) parts.push_back(literal(item));
            return R"("[" space )" + (parts.empty() ? "" : join(parts, R"( "," space )") + " ") + R"("]" space)";
        }
        if (v.is_object()) {
            std::vector<std::string> parts;
            for (const auto& [key, value] : v.members)
                parts.push_back(gbnf_literal(to_json(string_value(key))) + R"( space ":" space )" + literal(value));
            return R"("{" space )" + (parts.empty() ? "" : join(parts, R"( "," space )") + " ") + R"("}" space)";
        }
        return gbnf_literal(to_json(v)) + " space";
    }

    std::string object_body(const JsonValue& s, const std::string& name, const std::string& path) {
        ProgressScope progress(no_progress_);
        struct Member {
            std::string kv;
            bool required;
        };
        std::vector<std::string> required;
        if (const JsonValue* r = s.find("required")) {
            if (!r->is_array()) fail(path, "required must be an array of strings");
            for (const JsonValue& item : r->items) {
                if (!item.is_string()) fail(path, "required must be an array of strings");
                if (std::find(required.begin(), required.end(), item.text) == required.end())
                    required.push_back(item.text);
            }
        }
        const JsonValue* props = s.find("properties");
        if (props && !props->is_object()) fail(path, "properties must be an object");
        const JsonValue* additional = s.find("additionalProperties");
        if (additional && !additional->is_bool() && !additional->is_object())
            fail(path, "additionalProperties must be a boolean or a schema");
        if (const std::string why = forbidden_required(s); !why.empty())
            fail(path, why + ": the schema has no valid instance");
        const bool closed = additional && additional->is_bool() && !additional->boolean;
        auto additional_value = [&] {
            return !additional || additional->is_bool()
                       ? prim("value")
                       : visit(*additional, name + "-additional", path + "/additionalProperties");
        };

        std::vector<Member> members;
        auto add_member = [&](const std::string& key, const std::string& value, bool is_required) {
            const std::string kv = add_rule(name + "-" + key + "-kv",
                                            gbnf_literal(to_json(string_value(key))) + R"( space ":" space )" + value);
            members.push_back({kv, is_required});
        };
        if (props)
            for (const auto& [key, schema] : props->members) {
                const bool is_required = std::find(required.begin(), required.end(), key) != required.end();
                if (is_false_schema(schema)) continue;  // a name it may not have (declared, so not a further one)
                add_member(key, visit(schema, name + "-" + key, path + "/properties/" + pointer_escape(key)),
                           is_required);
            }
        for (const std::string& key : required)  // not closed: forbidden_required would have said so
            if (!props || !props->find(key)) add_member(key, additional_value(), true);
        std::string additional_kv;
        if (!closed) {
            std::vector<std::string> declared;
            if (props)
                for (const auto& member : props->members) declared.push_back(member.first);
            for (const std::string& key : required)
                if (std::find(declared.begin(), declared.end(), key) == declared.end()) declared.push_back(key);
            const std::string key =
                declared.empty() ? prim("string") : add_rule(name + "-additional-key", other_key(declared));
            additional_kv = add_rule(name + "-additional-kv", key + R"( ":" space )" + additional_value());
        }

        const std::string comma = R"("," space )";
        std::string inner;
        const auto first_required =
            std::find_if(members.begin(), members.end(), [](const Member& m) { return m.required; });
        if (first_required != members.end()) {
            std::vector<std::string> parts;
            const size_t r = static_cast<size_t>(first_required - members.begin());
            for (size_t i = 0; i < members.size(); ++i) {
                if (i < r)
                    parts.push_back("( " + members[i].kv + " " + comma + ")?");
                else if (i == r)
                    parts.push_back(members[i].kv);
                else if (members[i].required)
                    parts.push_back(comma + members[i].kv);
                else
                    parts.push_back("( " + comma + members[i].kv + " )?");
            }
            if (!additional_kv.empty()) parts.push_back("( " + comma + additional_kv + " )*");
            inner = join(parts, " ") + " ";
        } else {
            // Every member optional: whichever comes first has no comma; rest[j] allows members j.. after it.
            std::vector<std::string> rest(members.size() + 1);
            if (!additional_kv.empty())
                rest[members.size()] = add_rule(name + "-rest", "( " + comma + additional_kv + " )*");
            for (size_t j = members.size(); j-- > 0;) {
                const std::string b = seq("( " + comma + members[j].kv + " )?", rest[j + 1]);
                rest[j] = add_rule(name + "-rest", b);
            }
            std::vector<std::string> alts;
            for (size_t j = 0; j < members.size(); ++j) alts.push_back(seq(members[j].kv, rest[j + 1]));
            if (!additional_kv.empty()) alts.push_back(seq(additional_kv, rest[members.size()]));
            if (!alts.empty()) inner = "( " + join(alts, " | ") + " )? ";
        }
        return R"("{" space )" + inner + R"("}" space)";
    }

    // A JSON string (with its trailing space) whose text is none of `keys`, so that further members cannot
    // restate a declared one: a trie of the keys, leaving it at any character. Only unescaped spellings of the keys
    // are excluded (an escape may spell a declared key's character).
    std::string other_key(const std::vector<std::string>& keys) {
        struct Trie {
            std::map<uint32_t, Trie> next;
            bool terminal = false;
        };
        Trie trie;
        for (const std::string& key : keys) {
            Trie* at = &trie;
            for (size_t i = 0; i < key.size();) {  // valid UTF-8 (the JSON reader checked it)
                const auto b = static_cast<unsigned char>(key[i]);
                const size_t n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
                uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
                for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(key[i + k]) & 0x3F);
                at = &at->next[cp];
                i += n;
            }
            at->terminal = true;
        }
        const std::string any = prim("char");
        std::function<std::string(const Trie&)> expr = [&](const Trie& node) {
            std::vector<std::string> alts;
            std::string excluded;
            for (const auto& [cp, child] : node.next) {
                alts.push_back(gbnf_literal(json_encoding(cp)) + " " + expr(child));
                if (cp >= 0x20 && cp != '"' && cp != '\\') excluded += class_char(cp);
            }
            alts.push_back("( [^" + excluded + R"("\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) ) )" + any +
                           "*");
            if (!node.terminal) alts.push_back("\"\"");
            return "( " + join(alts, " | ") + " )";
        };
        return std::string(kQuote) + " " + expr(trie) + " " + kQuote + " space";
    }

    uint64_t count(const JsonValue& s, const char* key, uint64_t fallback, const std::string& path) {
        const JsonValue* v = s.find(key);
        if (!v) return fallback;
        if (!v->is_number() || !(v->number >= 0) || std::floor(v->number) != v->number)
            fail(path, std::string(key) + " must be a non-negative integer");
        if (v->number > static_cast<double>(kMaxCount))
            fail(path, std::string(key) + " larger than " + std::to_string(kMaxCount) + " is not supported");
        return static_cast<uint64_t>(v->number);
    }

    std::string array_body(const JsonValue& s, const std::string& name, const std::string& path) {
        ProgressScope progress(no_progress_);
        std::vector<std::string> prefix;
        if (const JsonValue* p = s.find("prefixItems")) {
            if (!p->is_array()) fail(path, "prefixItems must be an array of schemas");
            if (p->items.size() > kMaxPrefixItems)
                fail(path, "prefixItems longer than " + std::to_string(kMaxPrefixItems) + " is not supported");
            for (size_t i = 0; i < p->items.size(); ++i)
                prefix.push_back(
                    visit(p->items[i], name + "-" + std::to_string(i), path + "/prefixItems/" + std::to_string(i)));
        }
        std::string item;  // empty: no items beyond the prefix
        const JsonValue* items = s.find("items");
        if (items && items->is_array())
            fail(path, "items as an array (draft-04 tuples) is not supported: use prefixItems");
        if (!items || (items->is_bool() && items->boolean))
            item = prim("value");
        else if (items->is_object())
            item = visit(*items, name + "-item", path + "/items");
        else if (!items->is_bool())
            fail(path, "items must be a schema");
        const uint64_t lo = count(s, "minItems", 0, path), hi = count(s, "maxItems", kUnbounded, path);
        if (lo > hi) fail(path, "minItems is larger than maxItems");
        const uint64_t k = prefix.size();
        if (item.empty() && lo > k) fail(path, "minItems is larger than prefixItems allows (items is false)");
        const uint64_t k_used = std::min(k, hi);
        const uint64_t extra_lo = lo > k ? lo - k : 0;
        const uint64_t extra_hi = item.empty() ? 0 : hi == kUnbounded ? kUnbounded : hi > k ? hi - k : 0;
        const std::string comma = R"("," space )";
        std::string tail;  // the items after the prefix
        if (extra_hi > 0) {
            if (k == 0) {
                const std::string more = extra_hi == 1 ? ""
                                                       : "( " + comma + item + " )" +
                                                             repeat(extra_lo ? extra_lo - 1 : 0,
                                                                    extra_hi == kUnbounded ? kUnbounded : extra_hi - 1);
                tail = seq(item, more);
                if (extra_lo == 0) tail = "( " + tail + " )?";
            } else {
                tail = "( " + comma + item + " )" + repeat(extra_lo, extra_hi);
            }
        }
        // The prefix from the end: element i, then what may follow it, optional from element minItems on.
        std::string elements = tail;
        for (uint64_t i = k_used; i-- > 0;) {
            std::string element = seq((i ? comma : "") + prefix[i], elements);
            elements = i >= lo ? "( " + element + " )?" : element;
        }
        return R"("[" space )" + (elements.empty() ? "" : elements + " ") + R"("]" space)";
    }

    std::string string_body(const JsonValue& s, const std::string& path) {
        const JsonValue* pattern = s.find("pattern");
        const JsonValue* format = s.find("format");
        const bool lengths = s.find("minLength") || s.find("maxLength");
        if (pattern) {
            if (!pattern->is_string()) fail(path, "pattern must be a string");
            if (format || lengths) fail(path, "pattern together with format/minLength/maxLength is not supported");
            PatternConverter converter(pattern->text, path, [this](const char* p) { return prim(p); });
            return std::string(kQuote) + " " + converter.convert() + " " + kQuote + " space";
        }
        if (format) {
            if (!format->is_string()) fail(path, "format must be a string");
            if (lengths) fail(path, "format together with minLength/maxLength is not supported");
            static const std::set<std::string_view> kFormats = {"date", "time", "date-time", "uuid", "email"};
            if (!kFormats.count(format->text)) fail(path, "unsupported format '" + format->text + "'");
            return std::string(kQuote) + " " + prim(format->text) + " " + kQuote + " space";
        }
        if (lengths) {
            const uint64_t lo = count(s, "minLength", 0, path), hi = count(s, "maxLength", kUnbounded, path);
            if (lo > hi) fail(path, "minLength is larger than maxLength");
            const std::string chars = hi == 0 ? "" : prim("char") + repeat(lo, hi) + " ";
            return std::string(kQuote) + " " + chars + kQuote + " space";
        }
        return prim("string");
    }

    std::string number_body(const JsonValue& s, const std::string& path) {
        const JsonValue* minimum = s.find("minimum");
        const bool other = s.find("maximum") || s.find("exclusiveMinimum") || s.find("exclusiveMaximum");
        if (!minimum && !other) return prim("number");
        if (!other && minimum->is_number() && minimum->number == 0) return prim("number-nonnegative");
        fail(path, "bounds on type number are only supported as minimum 0 (use type integer for integer ranges)");
    }

    std::string integer_body(const JsonValue& s, const std::string& path) {
        const JsonValue* minimum = s.find("minimum");
        const JsonValue* maximum = s.find("maximum");
        const JsonValue* ex_min = s.find("exclusiveMinimum");
        const JsonValue* ex_max = s.find("exclusiveMaximum");
        if (!minimum && !maximum && !ex_min && !ex_max) return prim("integer");
        // Bounds are read as doubles, exact up to 2^53; the unbounded sides stop at the integer rule's 18 digits.
        constexpr double kExact = 9007199254740991.0;
        auto bound = [&](const JsonValue* v, const char* key) {
            if (!v->is_number() || !std::isfinite(v->number)) fail(path, std::string(key) + " must be a number");
            if (std::fabs(v->number) > kExact) fail(path, std::string(key) + " beyond +-(2^53 - 1) is not supported");
            return v->number;
        };
        int64_t lo = -kMaxIntegerMagnitude, hi = kMaxIntegerMagnitude;
        auto raise = [&](double v) { lo = std::max(lo, static_cast<int64_t>(v)); };
        auto lower = [&](double v) { hi = std::min(hi, static_cast<int64_t>(v)); };
        // Draft-04: exclusiveMinimum/Maximum are booleans that make minimum/maximum exclusive.
        const bool min_exclusive_flag = ex_min && ex_min->is_bool() && ex_min->boolean;
        const bool max_exclusive_flag = ex_max && ex_max->is_bool() && ex_max->boolean;
        if (minimum) {
            const double m = bound(minimum, "minimum");
            raise(min_exclusive_flag ? std::floor(m) + 1 : std::ceil(m));
        }
        if (maximum) {
            const double m = bound(maximum, "maximum");
            lower(max_exclusive_flag ? std::ceil(m) - 1 : std::floor(m));
        }
        if (ex_min && !ex_min->is_bool()) raise(std::floor(bound(ex_min, "exclusiveMinimum")) + 1);
        if (ex_max && !ex_max->is_bool()) lower(std::ceil(bound(ex_max, "exclusiveMaximum")) - 1);
        if (lo > hi) fail(path, "no integer lies within minimum/maximum");
        return integer_range(lo, hi) + " space";
    }
};

}  // namespace

std::string json_schema_to_gbnf(const JsonValue& schema) { return Converter(schema).run(); }

std::string json_schema_to_gbnf(std::string_view schema_json) { return json_schema_to_gbnf(parse_json(schema_json)); }

}  // namespace tandem
