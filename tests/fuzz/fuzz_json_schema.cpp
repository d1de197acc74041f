// Fuzz target: JSON Schema -> GBNF (src/grammar/json_schema.h) and the strict JSON reader under it. The input is
// a schema's text, arbitrary bytes. Properties:
//   - the reader either parses or throws tandem::Error; what parses writes back (to_json) to JSON that parses to
//     an equal value and writes the same text again;
//   - conversion either returns a grammar or throws tandem::Error (never anything else, never a crash or hang:
//     nesting, $ref cycles and blow-ups are bounded);
//   - a returned grammar is well-formed GBNF: it parses (tests/unit/gbnf_check.h), starts with root, and every
//     rule it refers to is defined.
#include <string>
#include <string_view>

#include "error.h"
#include "fuzz_target.h"
#include "gbnf_check.h"
#include "grammar/json_schema.h"
#include "json/json_value.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    tandem::JsonValue schema;
    try {
        schema = tandem::parse_json(text);
    } catch (const tandem::Error&) {
        return 0;
    }
    const std::string written = tandem::to_json(schema);
    try {
        const tandem::JsonValue again = tandem::parse_json(written);
        if (again != schema) tandem::fuzz::fail("JSON written back parses to a different value");
        if (tandem::to_json(again) != written) tandem::fuzz::fail("writing JSON is not stable");
    } catch (const tandem::Error& e) {
        tandem::fuzz::fail(std::string("JSON written back does not parse: ") + e.what());
    }
    std::string grammar;
    try {
        grammar = tandem::json_schema_to_gbnf(schema);
    } catch (const tandem::Error&) {
        return 0;
    }
    if (grammar.rfind("root ::= ", 0) != 0) tandem::fuzz::fail("the grammar does not start with root");
    try {
        const tandem::test::Gbnf parsed(grammar);
        (void)parsed;
    } catch (const std::exception& e) {
        tandem::fuzz::fail(std::string("the grammar is not well-formed GBNF: ") + e.what() + "\n" + grammar);
    }
    return 0;
}

namespace tandem::fuzz {

std::vector<std::pair<std::string, std::string>> fuzz_seeds() {
    return {
        {"object", R"({"type": "object", "properties": {"name": {"type": "string", "minLength": 1},
            "age": {"type": "integer", "minimum": 0, "maximum": 150}, "email": {"type": "string", "format": "email"},
            "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}, "maxItems": 4}},
            "required": ["name"], "additionalProperties": false})"},
        {"recursive", R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": ["integer", "null"]},
            "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}, "$ref": "#/$defs/node"})"},
        {"combinators", R"({"allOf": [{"properties": {"a": {"const": {"x": [1, true]}}}, "required": ["a"]},
            {"anyOf": [{"required": ["b"]}, {"properties": {"c": {"format": "date-time"}}}]}],
            "definitions": {"d": {"oneOf": [{"type": "number", "minimum": 0}, {"type": "boolean"}]}}})"},
        {"tuple", R"({"prefixItems": [{"type": "string", "format": "uuid"}, {"exclusiveMaximum": -5,
            "type": "integer"}], "items": {"pattern": "^(?:[a-z]+|\\d{2,4})\\.[^\"]?$"}, "minItems": 1})"},
        {"pattern", R"({"type": "string", "pattern": "^(\\w+\\s?)+[.!?]$|x\\u00e9[\\x20-\\x7e]{0,3}"})"},
        {"allof-closed", R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}, "b": false},
            "additionalProperties": {"type": "string"}}, {"properties": {"c": {"maxLength": 2}}, "required": ["c"],
            "additionalProperties": false}, {"prefixItems": [{}], "items": false}], "exclusiveMinimum": true})"},
        {"ref-cycle", R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}]}, "b": {"$ref": "#/$defs/a"}},
            "$ref": "#/$defs/a"})"},
    };
}

}  // namespace tandem::fuzz
