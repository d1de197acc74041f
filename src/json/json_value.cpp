// The strict JSON reader, the compact writer and the string escaper of json_value.h.
#include "json/json_value.h"

#include <cstdint>
#include <cstdlib>
#include <unordered_set>

#include "error.h"
#include "text/utf8.h"

namespace tandem {

JsonValue::JsonValue() = default;
JsonValue::JsonValue(const JsonValue&) = default;
JsonValue::JsonValue(JsonValue&&) noexcept = default;
JsonValue& JsonValue::operator=(const JsonValue&) = default;
JsonValue& JsonValue::operator=(JsonValue&&) noexcept = default;
JsonValue::~JsonValue() = default;

const JsonValue* JsonValue::find(std::string_view key) const {
    if (kind != Kind::Object) return nullptr;
    for (const auto& [name, value] : members)
        if (name == key) return &value;
    return nullptr;
}

namespace {

class Parser {
public:
    explicit Parser(std::string_view text) : s_(text) {}

    JsonValue document() {
        skip_ws();
        JsonValue v = value(0);
        skip_ws();
        if (p_ != s_.size()) fail("unexpected text after the JSON value");
        return v;
    }

private:
    std::string_view s_;
    size_t p_ = 0;

    [[noreturn]] void fail_at(size_t at, const std::string& what) const {
        size_t line = 1, column = 1;
        for (size_t i = 0; i < at && i < s_.size(); ++i) {
            if (s_[i] == '\n') {
                ++line;
                column = 1;
            } else {
                ++column;
            }
        }
        throw Error("JSON: line " + std::to_string(line) + ", column " + std::to_string(column) + ": " + what);
    }
    [[noreturn]] void fail(const std::string& what) const { fail_at(p_, what); }

    bool at_end() const { return p_ >= s_.size(); }
    char peek() const { return at_end() ? '\0' : s_[p_]; }

    void skip_ws() {
        while (!at_end() && (s_[p_] == ' ' || s_[p_] == '\t' || s_[p_] == '\n' || s_[p_] == '\r')) ++p_;
    }

    void expect(char c, const char* what) {
        if (peek() != c || at_end()) fail(std::string("expected ") + what);
        ++p_;
    }

    void literal(std::string_view word) {
        if (s_.substr(p_, word.size()) != word) fail("invalid literal (expected '" + std::string(word) + "')");
        p_ += word.size();
    }

    JsonValue value(size_t depth) {
        if (at_end()) fail("unexpected end of input (expected a value)");
        JsonValue v;
        switch (s_[p_]) {
            case '{': return object(depth);
            case '[': return array(depth);
            case '"':
                v.kind = JsonValue::Kind::String;
                v.text = string();
                return v;
            case 't':
                literal("true");
                v.kind = JsonValue::Kind::Bool;
                v.boolean = true;
                return v;
            case 'f':
                literal("false");
                v.kind = JsonValue::Kind::Bool;
                return v;
            case 'n': literal("null"); return v;
            default:
                if (s_[p_] == '-' || (s_[p_] >= '0' && s_[p_] <= '9')) return number();
                fail(std::string("unexpected character ") + describe(s_[p_]));
        }
    }

    static std::string describe(char c) {
        const auto u = static_cast<unsigned char>(c);
        if (u >= 0x20 && u < 0x7F) return std::string("'") + c + "'";
        static const char* hex = "0123456789ABCDEF";
        return std::string("byte 0x") + hex[u >> 4] + hex[u & 15];
    }

    JsonValue object(size_t depth) {
        if (depth >= kJsonMaxDepth) fail("nesting deeper than " + std::to_string(kJsonMaxDepth));
        JsonValue v;
        v.kind = JsonValue::Kind::Object;
        ++p_;  // '{'
        skip_ws();
        if (peek() == '}' && !at_end()) {
            ++p_;
            return v;
        }
        std::unordered_set<std::string> keys;
        for (;;) {
            skip_ws();
            const size_t key_at = p_;
            if (peek() != '"' || at_end()) fail("expected a string key");
            std::string key = string();
            if (!keys.insert(key).second) fail_at(key_at, "duplicate key \"" + key + "\"");
            skip_ws();
            expect(':', "':'");
            skip_ws();
            JsonValue member = value(depth + 1);
            v.members.emplace_back(std::move(key), std::move(member));
            skip_ws();
            if (peek() == ',' && !at_end()) {
                ++p_;
                continue;
            }
            expect('}', "',' or '}'");
            return v;
        }
    }

    JsonValue array(size_t depth) {
        if (depth >= kJsonMaxDepth) fail("nesting deeper than " + std::to_string(kJsonMaxDepth));
        JsonValue v;
        v.kind = JsonValue::Kind::Array;
        ++p_;  // '['
        skip_ws();
        if (peek() == ']' && !at_end()) {
            ++p_;
            return v;
        }
        for (;;) {
            skip_ws();
            v.items.push_back(value(depth + 1));
            skip_ws();
            if (peek() == ',' && !at_end()) {
                ++p_;
                continue;
            }
            expect(']', "',' or ']'");
            return v;
        }
    }

    JsonValue number() {
        const size_t start = p_;
        auto digits = [&] {
            const size_t from = p_;
            while (!at_end() && s_[p_] >= '0' && s_[p_] <= '9') ++p_;
            return p_ - from;
        };
        if (peek() == '-') ++p_;
        if (peek() == '0' && !at_end()) {
            ++p_;
            if (!at_end() && s_[p_] >= '0' && s_[p_] <= '9') fail("leading zeros are not allowed in numbers");
        } else if (digits() == 0) {
            fail("expected a digit");
        }
        if (peek() == '.' && !at_end()) {
            ++p_;
            if (digits() == 0) fail("expected a digit after '.'");
        }
        if ((peek() == 'e' || peek() == 'E') && !at_end()) {
            ++p_;
            if (peek() == '+' || peek() == '-') ++p_;
            if (digits() == 0) fail("expected a digit in the exponent");
        }
        JsonValue v;
        v.kind = JsonValue::Kind::Number;
        v.text = std::string(s_.substr(start, p_ - start));
        v.number = std::strtod(v.text.c_str(), nullptr);
        return v;
    }

    uint32_t hex4() {
        if (p_ + 4 > s_.size()) fail("truncated \\u escape");
        uint32_t v = 0;
        for (int i = 0; i < 4; ++i) {
            const char c = s_[p_ + i];
            v <<= 4;
            if (c >= '0' && c <= '9')
                v |= static_cast<uint32_t>(c - '0');
            else if (c >= 'a' && c <= 'f')
                v |= static_cast<uint32_t>(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F')
                v |= static_cast<uint32_t>(c - 'A' + 10);
            else
                fail_at(p_ + i, "invalid hex digit in \\u escape");
        }
        p_ += 4;
        return v;
    }

    // One UTF-8 sequence starting at p_, validated (no overlongs, surrogates or values past U+10FFFF).
    void utf8_char(std::string& out) {
        const int n = utf8::sequence_length(reinterpret_cast<const unsigned char*>(s_.data()) + p_, s_.size() - p_);
        if (n < 0) fail("truncated UTF-8 sequence");
        if (n == 0) fail("invalid UTF-8");
        out.append(s_.substr(p_, static_cast<size_t>(n)));
        p_ += static_cast<size_t>(n);
    }

    std::string string() {
        ++p_;  // '"'
        std::string out;
        for (;;) {
            if (at_end()) fail("unterminated string");
            const char c = s_[p_];
            if (c == '"') {
                ++p_;
                return out;
            }
            if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string (must be escaped)");
            if (c != '\\') {
                utf8_char(out);
                continue;
            }
            ++p_;
            if (at_end()) fail("unterminated escape");
            const char e = s_[p_++];
            switch (e) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': {
                    uint32_t cp = hex4();
                    if (cp >= 0xDC00 && cp <= 0xDFFF) fail("lone low surrogate in \\u escape");
                    if (cp >= 0xD800 && cp <= 0xDBFF) {
                        if (s_.substr(p_, 2) != "\\u") fail("high surrogate without a low surrogate");
                        p_ += 2;
                        const uint32_t lo = hex4();
                        if (lo < 0xDC00 || lo > 0xDFFF) fail("high surrogate without a low surrogate");
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    }
                    utf8::append(out, cp);
                    break;
                }
                default: --p_; fail("invalid escape '\\" + std::string(1, e) + "'");
            }
        }
    }
};

void write(std::string& out, const JsonValue& v) {
    switch (v.kind) {
        case JsonValue::Kind::Null: out += "null"; break;
        case JsonValue::Kind::Bool: out += v.boolean ? "true" : "false"; break;
        case JsonValue::Kind::Number: out += v.text; break;
        case JsonValue::Kind::String: out += json_quote(v.text); break;
        case JsonValue::Kind::Array:
            out += '[';
            for (size_t i = 0; i < v.items.size(); ++i) {
                if (i) out += ',';
                write(out, v.items[i]);
            }
            out += ']';
            break;
        case JsonValue::Kind::Object:
            out += '{';
            for (size_t i = 0; i < v.members.size(); ++i) {
                if (i) out += ',';
                out += json_quote(v.members[i].first);
                out += ':';
                write(out, v.members[i].second);
            }
            out += '}';
            break;
    }
}

}  // namespace

JsonValue parse_json(std::string_view text) { return Parser(text).document(); }

void append_json_escaped(std::string& out, std::string_view s) {
    static const char* hex = "0123456789abcdef";
    const auto* bytes = reinterpret_cast<const unsigned char*>(s.data());
    for (size_t i = 0; i < s.size();) {
        const unsigned char c = bytes[i];
        if (c >= 0x80) {
            // Well-formed UTF-8 as it is; a byte outside it as U+FFFD, one for each such byte (as utf8::sanitize).
            const int n = utf8::sequence_length(bytes + i, s.size() - i);
            if (n > 0) {
                out.append(s.substr(i, static_cast<size_t>(n)));
                i += static_cast<size_t>(n);
            } else {
                out += "\xEF\xBF\xBD";
                ++i;
            }
            continue;
        }
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (c < 0x20) {
                    out += "\\u00";
                    out += hex[c >> 4];
                    out += hex[c & 15];
                } else {
                    out += static_cast<char>(c);
                }
        }
        ++i;
    }
}

std::string json_quote(std::string_view s) {
    std::string out;
    out.reserve(s.size() + 2);
    out += '"';
    append_json_escaped(out, s);
    out += '"';
    return out;
}

std::string to_json(const JsonValue& value) {
    std::string out;
    write(out, value);
    return out;
}

bool operator==(const JsonValue& a, const JsonValue& b) {
    if (a.kind != b.kind) return false;
    switch (a.kind) {
        case JsonValue::Kind::Null: return true;
        case JsonValue::Kind::Bool: return a.boolean == b.boolean;
        case JsonValue::Kind::Number: return a.number == b.number;
        case JsonValue::Kind::String: return a.text == b.text;
        case JsonValue::Kind::Array: return a.items == b.items;
        case JsonValue::Kind::Object:
            if (a.members.size() != b.members.size()) return false;
            for (const auto& [key, value] : a.members) {
                const JsonValue* other = b.find(key);
                if (!other || *other != value) return false;
            }
            return true;
    }
    return false;
}

}  // namespace tandem
