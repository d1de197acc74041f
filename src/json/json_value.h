// JSON for src/ and tools/: a strict reader (RFC 8259, nothing more), a compact writer and the one string escaper.
// The reader: objects keep their members in document order and may not repeat a key, strings must be valid UTF-8
// with escapes decoded (surrogate pairs joined, lone surrogates refused), numbers keep their source text. Errors are
// tandem::Error naming the line and column (1-based, in bytes), and nesting is bounded so that hostile input cannot
// exhaust the stack. Used by the JSON Schema converter and the chat's /load; the escaper by every JSON writer.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem {

struct JsonValue {
    enum class Kind { Null, Bool, Number, String, Array, Object };
    Kind kind = Kind::Null;
    bool boolean = false;
    double number = 0;                                       // Number: its value (may be inf for huge literals)
    std::string text;                                        // String: decoded UTF-8; Number: the source text
    std::vector<JsonValue> items;                            // Array
    std::vector<std::pair<std::string, JsonValue>> members;  // Object, in document order

    // Declared here and defaulted in json_value.cpp, where JsonValue is complete: defaulted in the class, clang with
    // libstdc++ instantiates std::pair<std::string, JsonValue> while JsonValue is still incomplete, and refuses it.
    JsonValue();
    JsonValue(const JsonValue&);
    JsonValue(JsonValue&&) noexcept;
    JsonValue& operator=(const JsonValue&);
    JsonValue& operator=(JsonValue&&) noexcept;
    ~JsonValue();

    bool is_null() const { return kind == Kind::Null; }
    bool is_bool() const { return kind == Kind::Bool; }
    bool is_number() const { return kind == Kind::Number; }
    bool is_string() const { return kind == Kind::String; }
    bool is_array() const { return kind == Kind::Array; }
    bool is_object() const { return kind == Kind::Object; }
    // The member `key` of an object, or nullptr (also when this is not an object).
    const JsonValue* find(std::string_view key) const;
};

// How deep arrays and objects may nest before parse_json refuses the input.
inline constexpr size_t kJsonMaxDepth = 256;

// Parses one JSON document (surrounding whitespace allowed, nothing else). Throws tandem::Error
// "JSON: line L, column C: what" on anything that is not strict JSON.
JsonValue parse_json(std::string_view text);

// Compact serialization: no whitespace, strings as json_quote writes them, numbers as written.
std::string to_json(const JsonValue& value);

// The JSON string literal of the UTF-8 text `s`, quotes included: the one string escaper of src/ and tools/. The
// quote and the backslash are escaped, and so are the control characters U+0000-U+001F that JSON requires escaped:
// \b \f \n \r \t as such, the others as \u00XX (lowercase hex). Everything else passes through as its UTF-8 bytes, DEL (U+007F) included.
// A byte that is not part of well-formed UTF-8 becomes U+FFFD, as in decoded text (utf8::sanitize), so that what
// tandem writes is always JSON that parse_json reads back.
std::string json_quote(std::string_view s);

// json_quote's escaping without the quotes, appended to `out`.
void append_json_escaped(std::string& out, std::string_view s);

// Structural equality; numbers compare by value, object members by key regardless of order.
bool operator==(const JsonValue& a, const JsonValue& b);
inline bool operator!=(const JsonValue& a, const JsonValue& b) { return !(a == b); }

}  // namespace tandem
