// Unit tests of the JSON Schema -> GBNF converter (grammar/json_schema.h) and its JSON reader (json/json_value.h).
// The grammars are checked by what they accept: gbnf_check.h parses the converter's text with the decoding engine's
// GBNF parser and matches documents against `root` with its GrammarMatcher, so every construct is tested with
// documents it must accept and documents it must reject, on the grammar decoding will enforce.
#include <cstdint>
#include <cstdio>
#include <doctest/doctest.h>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "error.h"
#include "gbnf_check.h"
#include "grammar/json_schema.h"
#include "json/json_value.h"

using namespace tandem;
using tandem::test::Gbnf;

namespace {

Gbnf grammar_of(const std::string& schema) {
    const std::string text = json_schema_to_gbnf(schema);
    try {
        return Gbnf(text);
    } catch (const std::exception& e) {
        FAIL(std::string(e.what()) << "\n" << text);
        throw;
    }
}

std::string error_of(const std::string& schema) {
    try {
        json_schema_to_gbnf(schema);
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

bool contains(const std::string& haystack, const std::string& needle) {
    return haystack.find(needle) != std::string::npos;
}

}  // namespace

// ---- the JSON reader --------------------------------------------------------------------------------------------

TEST_CASE("json schema: the JSON reader keeps order, decodes escapes and refuses what is not strict JSON") {
    const JsonValue v = parse_json(R"( {"b": [1, -2.5e3, true, null], "a": "x\u00e9\ud83d\ude00\n", "c": {}} )");
    REQUIRE(v.is_object());
    REQUIRE(v.members.size() == 3);
    CHECK(v.members[0].first == "b");
    CHECK(v.members[1].first == "a");
    CHECK(v.find("a")->text == "x\xc3\xa9\xf0\x9f\x98\x80\n");
    CHECK(v.find("b")->items[1].number == -2500);
    CHECK(v.find("b")->items[1].text == "-2.5e3");
    CHECK(to_json(v) == R"({"b":[1,-2.5e3,true,null],"a":"xé😀\n","c":{}})");
    CHECK(parse_json(to_json(v)) == v);

    auto error = [](const std::string& text) {
        try {
            parse_json(text);
        } catch (const Error& e) {
            return std::string(e.what());
        }
        return std::string("(no error)");
    };
    CHECK(error("{\"a\": 1,\n  \"b\": }") == "JSON: line 2, column 8: unexpected character '}'");
    CHECK(contains(error("[1, 2,]"), "line 1, column 7"));
    CHECK(contains(error("{\"a\": 1, \"a\": 2}"), "duplicate key \"a\""));
    CHECK(contains(error("01"), "leading zeros"));
    CHECK(contains(error("\"\\q\""), "invalid escape"));
    CHECK(contains(error("\"\xff\""), "invalid UTF-8"));
    CHECK(contains(error("\"\xc0\xaf\""), "invalid UTF-8"));      // overlong '/'
    CHECK(contains(error("\"\xed\xa0\x80\""), "invalid UTF-8"));  // a surrogate, raw
    CHECK(contains(error("\"\xe2\x82"), "truncated UTF-8"));
    CHECK(contains(error("\"\\ud800\""), "surrogate"));
    CHECK(contains(error("\"a\nb\""), "control character"));
    CHECK(contains(error("{} x"), "after the JSON value"));
    CHECK(contains(error("// c\n{}"), "line 1, column 1"));
    CHECK(contains(error(std::string(300, '[') + std::string(300, ']')), "nesting deeper"));
    CHECK(error("") == "JSON: line 1, column 1: unexpected end of input (expected a value)");
}

TEST_CASE("json schema: json_quote escapes what JSON requires, the same way everywhere") {
    CHECK(json_quote("") == R"("")");
    CHECK(json_quote("say \"hi\" \\ /") == R"("say \"hi\" \\ /")");
    CHECK(json_quote("\b\f\n\r\t") == R"("\b\f\n\r\t")");
    CHECK(json_quote(std::string("\0\x01\x1f", 3)) == R"("\u0000\u0001\u001f")");
    // DEL and UTF-8 pass through; a byte outside well-formed UTF-8 becomes U+FFFD, each one.
    CHECK(json_quote("\x7f h\xc3\xa9 \xf0\x9f\x98\x80") == "\"\x7f h\xc3\xa9 \xf0\x9f\x98\x80\"");
    CHECK(json_quote("a\xff\xc3") == "\"a\xef\xbf\xbd\xef\xbf\xbd\"");
    CHECK(json_quote("\xed\xa0\x80") == "\"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"");  // a raw surrogate
    // Every byte string quotes to JSON that reads back as one string: itself, where it was valid UTF-8.
    std::string all;
    for (int c = 0; c < 0x80; ++c) all += static_cast<char>(c);
    const JsonValue back = parse_json(json_quote(all));
    REQUIRE(back.is_string());
    CHECK(back.text == all);
    JsonValue object;
    object.kind = JsonValue::Kind::Object;
    object.members.emplace_back("k\n", parse_json(json_quote("v\x01")));
    CHECK(to_json(object) == R"({"k\n":"v\u0001"})");
    std::string out = "x";
    append_json_escaped(out, "\"\t");
    CHECK(out == R"(x\"\t)");
}

// ---- primitives -------------------------------------------------------------------------------------------------

TEST_CASE("json schema: primitive types accept their values only") {
    const Gbnf s = grammar_of(R"({"type": "string"})");
    CHECK(s.accepts(R"("hello")"));
    CHECK(s.accepts(R"("a \"q\" \\ \n \u00e9 é")"));
    CHECK(s.accepts(R"("")"));
    CHECK_FALSE(s.accepts(R"("a)"));
    CHECK_FALSE(s.accepts("\"a\nb\""));  // a raw control character
    CHECK_FALSE(s.accepts(R"("\q")"));
    CHECK_FALSE(s.accepts("12"));

    const Gbnf n = grammar_of(R"({"type": "number"})");
    for (const char* ok : {"0", "-0", "12", "-3.25", "1e5", "2.5E-3", "123456789012345678"}) CHECK(n.accepts(ok));
    for (const char* no : {"01", "1.", ".5", "+1", "1e", "\"1\"", "1234567890123456789"}) CHECK_FALSE(n.accepts(no));

    const Gbnf i = grammar_of(R"({"type": "integer"})");
    CHECK(i.accepts("42"));
    CHECK(i.accepts("-7"));
    CHECK_FALSE(i.accepts("4.2"));
    CHECK_FALSE(i.accepts("1e3"));

    const Gbnf b = grammar_of(R"({"type": "boolean"})");
    CHECK(b.accepts("true"));
    CHECK(b.accepts("false"));
    CHECK_FALSE(b.accepts("null"));
    const Gbnf z = grammar_of(R"({"type": "null"})");
    CHECK(z.accepts("null"));
    CHECK_FALSE(z.accepts("0"));
}

TEST_CASE("json schema: {} and true accept any JSON value, a type list any of its types") {
    for (const char* schema : {"{}", "true", R"({"description": "anything"})"}) {
        const Gbnf any = grammar_of(schema);
        for (const char* ok : {"1", "\"s\"", "null", "[1, {\"a\": [true]}]", "{ \"k\" : { } }", "[]"})
            CHECK(any.accepts(ok));
        CHECK_FALSE(any.accepts("[1,]"));
        CHECK_FALSE(any.accepts("{\"a\"}"));
        CHECK_FALSE(any.accepts("nul"));
    }
    const Gbnf list = grammar_of(R"({"type": ["string", "null"]})");
    CHECK(list.accepts("\"x\""));
    CHECK(list.accepts("null"));
    CHECK_FALSE(list.accepts("1"));
}

TEST_CASE("json schema: whitespace between tokens is allowed but bounded") {
    const Gbnf g = grammar_of(R"({"type": "array", "items": {"type": "integer"}})");
    CHECK(g.accepts("[1,2]"));
    CHECK(g.accepts("[ 1 , 2 ]"));
    CHECK(g.accepts("[\n  1,\n  2\n]"));
    CHECK(g.accepts("[\n" + std::string(20, ' ') + "1]"));
    CHECK_FALSE(g.accepts("[\n" + std::string(21, ' ') + "1]"));
    CHECK_FALSE(g.accepts("[  1]"));  // two spaces: one space, or a newline and an indent
}

// ---- objects ----------------------------------------------------------------------------------------------------

TEST_CASE("json schema: properties in order, required mandatory, optional optional") {
    const std::string schema = R"({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name"], "additionalProperties": false})";
    const Gbnf g = grammar_of(schema);
    CHECK(g.accepts(R"({"name": "Ann"})"));
    CHECK(g.accepts(R"({"name": "Ann", "age": 3})"));
    CHECK(g.accepts(R"({"name": "Ann", "tags": ["a"]})"));
    CHECK(g.accepts(R"({ "name" : "Ann" , "age" : 3 , "tags" : [ ] })"));
    CHECK_FALSE(g.accepts(R"({"age": 3})"));                   // required missing
    CHECK_FALSE(g.accepts(R"({"age": 3, "name": "Ann"})"));    // out of order
    CHECK_FALSE(g.accepts(R"({"name": "Ann", "other": 1})"));  // additionalProperties false
    CHECK_FALSE(g.accepts(R"({"name": "Ann", "age": "3"})"));  // wrong type
    CHECK_FALSE(g.accepts(R"({"name": "Ann",})"));
    CHECK_FALSE(g.accepts("{}"));
    // The structure: one rule per property, named after it.
    const std::string text = json_schema_to_gbnf(schema);
    CHECK(contains(text, "root-name-kv ::= \"\\\"name\\\"\" space \":\" space string\n"));
    CHECK(text.rfind("root ::= ", 0) == 0);

    const Gbnf optional = grammar_of(R"({"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                      "additionalProperties": false})");
    CHECK(optional.accepts("{}"));
    CHECK(optional.accepts(R"({"a": 1})"));
    CHECK(optional.accepts(R"({"b": 2})"));
    CHECK(optional.accepts(R"({"a": 1, "b": 2})"));
    CHECK_FALSE(optional.accepts(R"({"b": 2, "a": 1})"));
    CHECK_FALSE(optional.accepts(R"({, "b": 2})"));

    const Gbnf middle = grammar_of(R"({"properties": {"a": {"const": 1}, "b": {"const": 2}, "c": {"const": 3}},
                                    "required": ["b"], "additionalProperties": false})");
    CHECK(middle.accepts(R"({"b": 2})"));
    CHECK(middle.accepts(R"({"a": 1, "b": 2, "c": 3})"));
    CHECK(middle.accepts(R"({"a": 1, "b": 2})"));
    CHECK(middle.accepts(R"({"b": 2, "c": 3})"));
    CHECK_FALSE(middle.accepts(R"({"a": 1, "c": 3})"));
}

TEST_CASE("json schema: additionalProperties absent or true allows any members, a schema constrains them") {
    const Gbnf open = grammar_of(R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})");
    CHECK(open.accepts(R"({"a": 1})"));
    CHECK(open.accepts(R"({"a": 1, "x": [1, "y"], "z": null})"));
    CHECK_FALSE(open.accepts(R"({"x": 1})"));
    CHECK(open.accepts(R"({"a": 1, "ab": "x", "": 0})"));
    CHECK_FALSE(open.accepts(R"({"a": 1, "a": "x"})"));  // a further member cannot restate a declared one

    const Gbnf typed = grammar_of(R"({"type": "object", "additionalProperties": {"type": "number"}})");
    CHECK(typed.accepts("{}"));
    CHECK(typed.accepts(R"({"x": 1, "y": 2.5})"));
    CHECK_FALSE(typed.accepts(R"({"x": "1"})"));

    const Gbnf closed = grammar_of(R"({"type": "object", "additionalProperties": false})");
    CHECK(closed.accepts("{}"));
    CHECK(closed.accepts("{ }"));
    CHECK_FALSE(closed.accepts(R"({"x": 1})"));

    // A required name without a property schema takes additionalProperties' schema.
    const Gbnf implicit = grammar_of(R"({"required": ["id"], "additionalProperties": {"type": "integer"}})");
    CHECK(implicit.accepts(R"({"id": 3})"));
    CHECK_FALSE(implicit.accepts(R"({"id": "3"})"));
    CHECK_FALSE(implicit.accepts("{}"));
    CHECK(contains(error_of(R"({"required": ["id"], "additionalProperties": false})"), "'id'"));
}

TEST_CASE("json schema: nested objects and escaped property names") {
    const Gbnf g = grammar_of(R"({"type": "object", "properties": {
        "user": {"type": "object", "properties": {"id": {"type": "integer"}, "say \"hi\"": {"type": "boolean"}},
                 "required": ["id", "say \"hi\""], "additionalProperties": false}},
        "required": ["user"], "additionalProperties": false})");
    CHECK(g.accepts(R"({"user": {"id": 1, "say \"hi\"": true}})"));
    CHECK_FALSE(g.accepts(R"({"user": {"id": 1}})"));
    CHECK_FALSE(g.accepts(R"({"user": {"id": 1, "say "hi"": true}})"));
    CHECK_FALSE(g.accepts(R"({"user": 1})"));
}

// ---- arrays -----------------------------------------------------------------------------------------------------

TEST_CASE("json schema: arrays with items, minItems and maxItems") {
    const Gbnf g = grammar_of(R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3})");
    CHECK_FALSE(g.accepts("[]"));
    CHECK_FALSE(g.accepts("[1]"));
    CHECK(g.accepts("[1, 2]"));
    CHECK(g.accepts("[1, 2, 3]"));
    CHECK_FALSE(g.accepts("[1, 2, 3, 4]"));
    CHECK_FALSE(g.accepts("[1, \"2\"]"));

    const Gbnf at_most = grammar_of(R"({"items": {"type": "boolean"}, "maxItems": 1})");
    CHECK(at_most.accepts("[]"));
    CHECK(at_most.accepts("[true]"));
    CHECK_FALSE(at_most.accepts("[true, false]"));

    const Gbnf any = grammar_of(R"({"type": "array"})");
    CHECK(any.accepts("[]"));
    CHECK(any.accepts("[1, \"a\", [null]]"));

    CHECK(contains(error_of(R"({"type": "array", "minItems": 3, "maxItems": 2})"), "minItems"));
    CHECK(contains(error_of(R"({"type": "array", "minItems": -1})"), "minItems"));
}

TEST_CASE("json schema: prefixItems are a tuple, items constrains what follows") {
    const Gbnf closed = grammar_of(R"({"prefixItems": [{"type": "string"}, {"type": "integer"}], "items": false})");
    CHECK(closed.accepts("[]"));
    CHECK(closed.accepts("[\"a\"]"));
    CHECK(closed.accepts("[\"a\", 1]"));
    CHECK_FALSE(closed.accepts("[\"a\", 1, 2]"));
    CHECK_FALSE(closed.accepts("[1]"));

    const Gbnf full = grammar_of(
        R"({"prefixItems": [{"type": "string"}, {"type": "integer"}], "items": {"type": "boolean"}, "minItems": 2})");
    CHECK_FALSE(full.accepts("[\"a\"]"));
    CHECK(full.accepts("[\"a\", 1]"));
    CHECK(full.accepts("[\"a\", 1, true, false]"));
    CHECK_FALSE(full.accepts("[\"a\", 1, 2]"));

    const Gbnf open = grammar_of(R"({"prefixItems": [{"const": "x"}], "minItems": 1, "maxItems": 3})");
    CHECK(open.accepts("[\"x\"]"));
    CHECK(open.accepts("[\"x\", 1, {}]"));
    CHECK_FALSE(open.accepts("[\"x\", 1, {}, 2]"));
    CHECK_FALSE(open.accepts("[\"y\"]"));

    CHECK(contains(error_of(R"({"items": [{"type": "string"}]})"), "prefixItems"));
    CHECK(contains(error_of(R"({"prefixItems": [{}], "items": false, "minItems": 2})"), "minItems"));
}

// ---- enum, const, anyOf, allOf ----------------------------------------------------------------------------------

TEST_CASE("json schema: enum and const accept exactly their values") {
    const Gbnf e = grammar_of(R"({"enum": ["red", "green", 3, null, [1, {"a": true}]]})");
    CHECK(e.accepts("\"red\""));
    CHECK(e.accepts("\"green\""));
    CHECK(e.accepts("3"));
    CHECK(e.accepts("null"));
    CHECK(e.accepts("[1,{\"a\":true}]"));
    CHECK(e.accepts("[ 1 , { \"a\" : true } ]"));
    CHECK_FALSE(e.accepts("\"blue\""));
    CHECK_FALSE(e.accepts("\"re\""));
    CHECK_FALSE(e.accepts("4"));
    CHECK_FALSE(e.accepts("[1]"));

    const Gbnf typed = grammar_of(R"({"type": "string", "enum": ["a", 1, "b\"c"]})");
    CHECK(typed.accepts("\"a\""));
    CHECK(typed.accepts(R"("b\"c")"));
    CHECK_FALSE(typed.accepts("1"));

    const Gbnf c = grammar_of(R"({"const": "fixed"})");
    CHECK(c.accepts("\"fixed\""));
    CHECK_FALSE(c.accepts("\"fixe\""));
    CHECK(contains(error_of(R"({"enum": ["a"], "minLength": 1})"), "'minLength'"));
    CHECK(contains(error_of(R"({"type": "integer", "enum": ["a"]})"), "no enum/const value"));
}

TEST_CASE("json schema: anyOf and oneOf accept any alternative, with sibling keywords merged in") {
    const Gbnf g = grammar_of(R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]})");
    CHECK(g.accepts("12"));
    CHECK(g.accepts("\"ab\""));
    CHECK_FALSE(g.accepts("\"abc\""));
    CHECK_FALSE(g.accepts("true"));

    const Gbnf one = grammar_of(R"({"oneOf": [{"const": 1}, {"const": 2}]})");
    CHECK(one.accepts("1"));
    CHECK(one.accepts("2"));
    CHECK_FALSE(one.accepts("3"));

    // A common pattern: the object's properties next to alternatives that pick which are required.
    const Gbnf either = grammar_of(R"({"type": "object", "additionalProperties": false,
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "anyOf": [{"required": ["a"]}, {"required": ["b"]}]})");
    CHECK(either.accepts(R"({"a": 1})"));
    CHECK(either.accepts(R"({"b": 1})"));
    CHECK(either.accepts(R"({"a": 1, "b": 2})"));
    CHECK_FALSE(either.accepts("{}"));
}

TEST_CASE("json schema: allOf merges object schemas and refuses parts that disagree") {
    const Gbnf g = grammar_of(R"({"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        {"properties": {"b": {"type": "string"}}, "required": ["b"]}]})");
    CHECK(g.accepts(R"({"a": 1, "b": "x"})"));
    CHECK(g.accepts(R"({"a": 1, "b": "x", "c": 0})"));
    CHECK_FALSE(g.accepts(R"({"a": 1})"));
    CHECK_FALSE(g.accepts(R"({"b": "x"})"));
    CHECK_FALSE(g.accepts(R"({"a": "1", "b": "x"})"));

    const Gbnf bounds = grammar_of(R"({"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 5}, {"minimum": 2}]})");
    CHECK(bounds.accepts("2"));
    CHECK(bounds.accepts("5"));
    CHECK_FALSE(bounds.accepts("1"));
    CHECK_FALSE(bounds.accepts("6"));

    const Gbnf types = grammar_of(R"({"allOf": [{"type": ["integer", "string"]}, {"type": "number"}]})");
    CHECK(types.accepts("3"));
    CHECK_FALSE(types.accepts("\"3\""));

    CHECK(contains(error_of(R"({"allOf": [{"type": "string"}, {"type": "integer"}]})"), "no type in common"));
    CHECK(contains(error_of(R"({"allOf": [{"pattern": "a"}, {"pattern": "b"}]})"), "'pattern'"));
}

TEST_CASE("json schema: additionalProperties in allOf sees only the properties of its own part") {
    // The closed part allows only a, the other requires b: nothing is valid, so it is an error, not a grammar that
    // lets the model write {"a": 1, "b": "..."} (which a validator rejects: 'b' was unexpected).
    const std::string none = "the schema has no valid instance";
    CHECK(
        contains(error_of(R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
        "additionalProperties": false}, {"properties": {"b": {"type": "string"}}, "required": ["b"]}]})"),
                 "'b' is required but not allowed"));
    // The same with the closed object outside: allOf's name is not among the properties beside additionalProperties.
    const std::string outer = error_of(R"({"type": "object", "allOf": [{"properties": {"name": {"type": "string",
        "maxLength": 20}}, "required": ["name"]}], "properties": {"age": {"type": "integer", "minimum": 0,
        "maximum": 120}}, "required": ["age"], "additionalProperties": false})");
    CHECK(contains(outer, "'name' is required but not allowed"));
    CHECK(contains(outer, none));
    // A name required by one part and in no properties, where another part is closed.
    CHECK(contains(error_of(R"({"allOf": [{"additionalProperties": false}, {"required": ["x"]}]})"), none));

    // Not required, the other part's members are simply not allowed.
    const Gbnf optional = grammar_of(R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
        "required": ["a"], "additionalProperties": false}, {"properties": {"b": {"type": "string"}}}]})");
    CHECK(optional.accepts(R"({"a": 1})"));
    CHECK_FALSE(optional.accepts(R"({"a": 1, "b": "x"})"));
    CHECK_FALSE(optional.accepts(R"({"a": 1, "c": 0})"));

    // The closed part names every member the other requires: each member's value satisfies both parts.
    const Gbnf both = grammar_of(R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"},
        "b": {"type": "string"}}, "required": ["a"], "additionalProperties": false},
        {"properties": {"b": {"maxLength": 3}, "a": {"minimum": 0}}, "required": ["b"]}]})");
    CHECK(both.accepts(R"({"a": 1, "b": "xyz"})"));
    CHECK_FALSE(both.accepts(R"({"a": 1, "b": "wxyz"})"));  // b's maxLength from the second part
    CHECK_FALSE(both.accepts(R"({"a": -1, "b": "x"})"));    // a's minimum from the second part
    CHECK_FALSE(both.accepts(R"({"a": 1, "b": 2})"));       // b's type from the first part
    CHECK_FALSE(both.accepts(R"({"a": 1})"));
    CHECK_FALSE(both.accepts(R"({"a": 1, "b": "x", "c": 0})"));

    // Two closed parts: the members both allow.
    const Gbnf common = grammar_of(R"({"allOf": [
        {"properties": {"a": {}, "b": {}, "c": {}}, "additionalProperties": false},
        {"properties": {"b": {}, "c": {}, "d": {}}, "additionalProperties": false}]})");
    CHECK(common.accepts("{}"));
    CHECK(common.accepts(R"({"b": 1, "c": 2})"));
    CHECK_FALSE(common.accepts(R"({"a": 1})"));
    CHECK_FALSE(common.accepts(R"({"b": 1, "d": 2})"));

    // additionalProperties as a schema constrains the other part's members that it does not name.
    const Gbnf typed = grammar_of(R"({"allOf": [{"properties": {"a": {}}, "additionalProperties": {"type": "integer"}},
        {"properties": {"b": {}}, "required": ["b"]}]})");
    CHECK(typed.accepts(R"({"b": 1})"));
    CHECK(typed.accepts(R"({"a": "x", "b": 1, "c": 2})"));
    CHECK_FALSE(typed.accepts(R"({"b": "x"})"));
    CHECK_FALSE(typed.accepts(R"({"b": 1, "c": "x"})"));

    // The outer schema closed, allOf adding constraints on its own members (a common way to reuse parts).
    const Gbnf reuse = grammar_of(R"({"type": "object", "properties": {"name": {"type": "string"},
        "age": {"type": "integer"}}, "required": ["age"], "additionalProperties": false,
        "allOf": [{"properties": {"name": {"maxLength": 3}}, "required": ["name"]}]})");
    CHECK(reuse.accepts(R"({"name": "Bo", "age": 3})"));
    CHECK_FALSE(reuse.accepts(R"({"name": "Bobby", "age": 3})"));
    CHECK_FALSE(reuse.accepts(R"({"age": 3})"));

    // A property whose schema is false may not appear (and may not be required).
    const Gbnf absent = grammar_of(R"({"properties": {"a": {"type": "integer"}, "secret": false}})");
    CHECK(absent.accepts(R"({"a": 1, "other": 2})"));
    CHECK_FALSE(absent.accepts(R"({"secret": 1})"));
    CHECK(contains(error_of(R"({"properties": {"secret": false}, "required": ["secret"]})"), none));
}

TEST_CASE("json schema: an alternative or a type that no value satisfies is left out, the others kept") {
    // The second alternative requires a member the closed object beside the oneOf does not list.
    const std::string tagged = R"({"type": "object", "properties": {"kind": {"enum": ["a", "b"]}},
        "required": ["kind"], "additionalProperties": false, "oneOf": [{"properties": {"kind": {"const": "a"}}},
        {"properties": {"kind": {"const": "b"}, "extra": {"type": "integer"}}, "required": ["extra"]}]})";
    const Gbnf g = grammar_of(tagged);
    CHECK(g.accepts(R"({"kind": "a"})"));
    CHECK_FALSE(g.accepts(R"({"kind": "b"})"));
    CHECK_FALSE(g.accepts(R"({"kind": "b", "extra": 1})"));
    const std::string none = error_of(R"({"type": "object", "additionalProperties": false,
        "anyOf": [{"required": ["x"]}, {"properties": {"y": {}}, "required": ["y"]}]})");
    CHECK(contains(none, "anyOf: no alternative has a valid instance"));
    CHECK(contains(none, "#/anyOf/0: required property 'x'"));
    CHECK(contains(none, "#/anyOf/1: property 'y' is required but not allowed"));

    const Gbnf or_null =
        grammar_of(R"({"type": ["object", "null"], "required": ["x"], "additionalProperties": false})");
    CHECK(or_null.accepts("null"));
    CHECK_FALSE(or_null.accepts("{}"));
}

TEST_CASE("json schema: items in allOf sees only the prefixItems of its own part") {
    const Gbnf tuple = grammar_of(R"({"allOf": [{"prefixItems": [{"type": "string"}], "items": false},
        {"type": "array", "items": {"maxLength": 2}}]})");
    CHECK(tuple.accepts("[]"));
    CHECK(tuple.accepts(R"(["ab"])"));
    CHECK_FALSE(tuple.accepts(R"(["abc"])"));  // the second part's items apply to element 0 too
    CHECK_FALSE(tuple.accepts(R"(["a", "b"])"));

    const Gbnf shorter = grammar_of(R"({"allOf": [{"prefixItems": [{"type": "integer"}], "items": false},
        {"prefixItems": [{"minimum": 0}, {"type": "string"}]}]})");
    CHECK(shorter.accepts("[1]"));
    CHECK_FALSE(shorter.accepts("[-1]"));
    CHECK_FALSE(shorter.accepts(R"([1, "x"])"));
    CHECK(contains(error_of(R"({"allOf": [{"prefixItems": [{"type": "integer"}], "items": false},
        {"prefixItems": [{}, {"type": "string"}], "minItems": 2}]})"),
                   "minItems"));
}

TEST_CASE("json schema: draft-04 exclusive bounds stay with their own minimum/maximum when merged") {
    const Gbnf g = grammar_of(R"({"allOf": [{"type": "integer", "minimum": 5, "exclusiveMinimum": true,
        "maximum": 9, "exclusiveMaximum": false}, {"minimum": 3, "maximum": 8}]})");
    CHECK_FALSE(g.accepts("5"));
    CHECK(g.accepts("6"));
    CHECK(g.accepts("8"));
    CHECK_FALSE(g.accepts("9"));
    const Gbnf flag_alone = grammar_of(R"({"allOf": [{"type": "integer", "exclusiveMinimum": true}, {"minimum": 5}]})");
    CHECK(flag_alone.accepts("5"));  // the flag has no minimum of its own to make exclusive
    CHECK_FALSE(flag_alone.accepts("4"));
}

// ---- $ref -------------------------------------------------------------------------------------------------------

TEST_CASE("json schema: $ref to $defs and definitions, recursive schemas") {
    const std::string tree = R"({"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["value"], "additionalProperties": false}}, "$ref": "#/$defs/node"})";
    const Gbnf g = grammar_of(tree);
    CHECK(g.accepts(R"({"value": 1})"));
    CHECK(g.accepts(R"({"value": 1, "children": [{"value": 2}, {"value": 3, "children": [{"value": 4}]}]})"));
    CHECK_FALSE(g.accepts(R"({"value": 1, "children": [{"value": "x"}]})"));
    CHECK_FALSE(g.accepts(R"({"value": 1, "children": [{}]})"));
    // One rule per definition, referred to by name.
    const std::string text = json_schema_to_gbnf(tree);
    CHECK(contains(text, "\nnode ::= "));
    CHECK(contains(text, "root ::= node\n"));

    const Gbnf list = grammar_of(R"({"definitions": {"list": {"anyOf": [{"type": "null"},
        {"type": "object", "properties": {"head": {"type": "integer"}, "tail": {"$ref": "#/definitions/list"}},
         "required": ["head", "tail"], "additionalProperties": false}]}},
        "type": "object", "properties": {"items": {"$ref": "#/definitions/list"}}, "required": ["items"],
        "additionalProperties": false})");
    CHECK(list.accepts(R"({"items": null})"));
    CHECK(list.accepts(R"({"items": {"head": 1, "tail": {"head": 2, "tail": null}}})"));
    CHECK_FALSE(list.accepts(R"({"items": {"head": 1}})"));

    const Gbnf self = grammar_of(R"({"type": "array", "items": {"anyOf": [{"type": "integer"}, {"$ref": "#"}]}})");
    CHECK(self.accepts("[1, [2, [3]], []]"));
    CHECK_FALSE(self.accepts("[1, [\"x\"]]"));

    const Gbnf siblings =
        grammar_of(R"({"$defs": {"base": {"type": "object", "properties": {"a": {"type": "integer"}}}},
        "$ref": "#/$defs/base", "required": ["a"]})");
    CHECK(siblings.accepts(R"({"a": 1})"));
    CHECK_FALSE(siblings.accepts("{}"));
}

TEST_CASE("json schema: $ref with sibling keywords is an allOf: additionalProperties sees only its own properties") {
    const std::string defs = R"("$defs": {"closed": {"type": "object", "properties": {"a": {"type": "integer"}},
        "additionalProperties": false}, "open": {"type": "object", "properties": {"a": {"type": "integer"}},
        "required": ["a"]}})";
    // Siblings add a member the closed target does not allow: fine while optional, an error when required.
    const Gbnf optional = grammar_of("{" + defs + R"(, "$ref": "#/$defs/closed", "properties": {"b": {}}})");
    CHECK(optional.accepts(R"({"a": 1})"));
    CHECK_FALSE(optional.accepts(R"({"a": 1, "b": 2})"));
    CHECK(contains(error_of("{" + defs + R"(, "$ref": "#/$defs/closed", "properties": {"b": {}}, "required": ["b"]})"),
                   "'b' is required but not allowed"));
    // Closed siblings do not see the target's properties: its required a is not allowed.
    CHECK(contains(error_of("{" + defs + R"(, "$ref": "#/$defs/open", "properties": {"b": {}},
        "additionalProperties": false})"),
                   "'a' is required but not allowed"));
    // Siblings that name the target's members may close the object and narrow them.
    const Gbnf narrowed = grammar_of("{" + defs + R"(, "$ref": "#/$defs/open", "properties": {"a": {"maximum": 9},
        "b": {"type": "boolean"}}, "additionalProperties": false})");
    CHECK(narrowed.accepts(R"({"a": 9, "b": true})"));
    CHECK(narrowed.accepts(R"({"a": 1})"));
    CHECK_FALSE(narrowed.accepts(R"({"a": 10})"));
    CHECK_FALSE(narrowed.accepts(R"({"a": 1, "c": 0})"));
    CHECK_FALSE(narrowed.accepts(R"({"b": true})"));
}

TEST_CASE("json schema: bad $refs are errors naming them") {
    CHECK(contains(error_of(R"({"$ref": "#/$defs/missing"})"), "'#/$defs/missing'"));
    CHECK(contains(error_of(R"({"$ref": "other.json#/x"})"), "'other.json#/x'"));
    CHECK(contains(
        error_of(R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})"),
        "cycle"));
    CHECK(contains(
        error_of(R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"})"),
        "cycle"));
    CHECK(contains(error_of(R"({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"})"), "cycle"));
    CHECK(contains(error_of(R"({"anyOf": [{"$ref": "#"}, {"type": "null"}]})"), "cycle"));
}

// ---- strings ----------------------------------------------------------------------------------------------------

TEST_CASE("json schema: string minLength and maxLength count characters") {
    const Gbnf g = grammar_of(R"({"type": "string", "minLength": 2, "maxLength": 3})");
    CHECK_FALSE(g.accepts("\"a\""));
    CHECK(g.accepts("\"ab\""));
    CHECK(g.accepts("\"abc\""));
    CHECK(g.accepts("\"é\\n\""));  // two characters, one of them escaped
    CHECK_FALSE(g.accepts("\"abcd\""));
    const Gbnf empty = grammar_of(R"({"type": "string", "maxLength": 0})");
    CHECK(empty.accepts("\"\""));
    CHECK_FALSE(empty.accepts("\"a\""));
}

TEST_CASE("json schema: patterns") {
    struct Case {
        const char* pattern;
        std::vector<const char*> ok, no;  // the JSON strings, quotes included
    };
    const std::vector<Case> cases = {
        {"^[a-z]+$", {R"("abc")"}, {R"("")", R"("aBc")", R"("ab1")"}},
        {"^\\d{3}-\\d{4}$", {R"("555-1234")"}, {R"("55-1234")", R"("5555-1234")", R"("555 1234")"}},
        {"^(ab|cd)*e?$", {R"("")", R"("abcdab")", R"("abe")", R"("e")"}, {R"("abc")", R"("ee")"}},
        {"^a.c$", {R"("abc")", R"("a-c")", R"("a\"c")"}, {R"("ac")", R"("a\nc")"}},
        {"^[^0-9]{2}$", {R"("ab")", R"("a\\")", R"("\"\t")"}, {R"("a1")", R"("abc")"}},
        {"^\\w+@\\w+\\.com$", {R"("me@host.com")"}, {R"("me@host.org")", R"("@host.com")"}},
        {"^x{2,}$", {R"("xx")", R"("xxxx")"}, {R"("x")"}},
        {"^(?:a|b){1,2}c$", {R"("ac")", R"("bac")"}, {R"("c")", R"("abac")"}},
        {"^\\$[0-9]+(\\.[0-9]{2})?$", {R"("$5")", R"("$5.25")"}, {R"("$5.2")", R"("5")"}},
        {"^\"\\\\$", {R"("\"\\")"}, {R"("\"")"}},
        {"^[\\s]$", {R"(" ")", R"("\n")", R"("\t")"}, {R"("a")"}},
        {"abc", {R"("abc")", R"("xxabcyy")"}, {R"("ab")", R"("axbc")"}},  // unanchored: anywhere
        {"^ab", {R"("abzz")"}, {R"("zab")"}},
        {"yz$", {R"("xyz")"}, {R"("yzx")"}},
        {"^a$|^b", {R"("a")", R"("bcd")"}, {R"("ab")", R"("cb")"}},
        {"^[-a-c]+$", {R"("a-b")"}, {R"("d")"}},
        {"^\\u00e9\\x41$",
         {"\"\xc3\xa9"
          "A\""},
         {R"("eA")"}},
        {"^é+$", {"\"\xc3\xa9\xc3\xa9\""}, {R"("e")"}},
    };
    for (const Case& c : cases) {
        CAPTURE(c.pattern);
        const JsonValue pattern = [&] {
            JsonValue v;
            v.kind = JsonValue::Kind::String;
            v.text = c.pattern;
            return v;
        }();
        const Gbnf g = grammar_of(R"({"type": "string", "pattern": )" + to_json(pattern) + "}");
        for (const char* ok : c.ok) {
            CAPTURE(ok);
            CHECK(g.accepts(ok));
        }
        for (const char* no : c.no) {
            CAPTURE(no);
            CHECK_FALSE(g.accepts(no));
        }
    }
}

TEST_CASE("json schema: unsupported pattern constructs are errors naming them") {
    auto pattern_error = [](const std::string& pattern) {
        JsonValue v;
        v.kind = JsonValue::Kind::String;
        v.text = pattern;
        return error_of(R"({"type": "string", "pattern": )" + to_json(v) + "}");
    };
    CHECK(contains(pattern_error("(a)\\1"), "unsupported escape '\\1'"));
    CHECK(contains(pattern_error("a(?=b)"), "lookaround"));
    CHECK(contains(pattern_error("\\bword"), "'\\b'"));
    CHECK(contains(pattern_error("\\p{L}"), "'\\p'"));
    CHECK(contains(pattern_error("a^b"), "'^'"));
    CHECK(contains(pattern_error("a$b"), "'$'"));
    CHECK(contains(pattern_error("(a"), "missing ')'"));
    CHECK(contains(pattern_error("a)"), "unmatched ')'"));
    CHECK(contains(pattern_error("*a"), "nothing to repeat"));
    CHECK(contains(pattern_error("a++"), "possessive"));
    CHECK(contains(pattern_error("(a?)*"), "empty string"));
    CHECK(contains(pattern_error("[z-a]"), "out of order"));
    CHECK(contains(pattern_error("[abc"), "unterminated"));
    CHECK(contains(pattern_error("a{3,1}"), "m > n"));
    CHECK(contains(error_of(R"({"type": "string", "pattern": "a", "maxLength": 3})"), "pattern together"));
}

TEST_CASE("json schema: string formats") {
    const Gbnf date = grammar_of(R"({"type": "string", "format": "date"})");
    CHECK(date.accepts("\"2024-02-29\""));
    CHECK_FALSE(date.accepts("\"2024-13-01\""));
    CHECK_FALSE(date.accepts("\"2024-1-01\""));
    CHECK_FALSE(date.accepts("\"2024-01-32\""));
    CHECK_FALSE(date.accepts("\"2023-02-30\""));
    CHECK_FALSE(date.accepts("\"2023-02-29\""));
    CHECK_FALSE(date.accepts("\"2023-04-31\""));
    CHECK_FALSE(date.accepts("\"0000-01-01\""));  // Python's date (and so jsonschema) has no year 0

    const Gbnf time = grammar_of(R"({"format": "time"})");
    CHECK(time.accepts("\"23:59:59Z\""));
    CHECK(time.accepts("\"08:30:00.123+02:00\""));
    CHECK(time.accepts("\"00:00:00z\""));
    CHECK_FALSE(time.accepts("\"23:59:60Z\""));  // a leap second: RFC 3339 allows it, rfc3339-validator does not
    CHECK_FALSE(time.accepts("\"24:00:00Z\""));
    CHECK_FALSE(time.accepts("\"12:60:00Z\""));
    CHECK_FALSE(time.accepts("\"12:00:00+24:00\""));
    CHECK_FALSE(time.accepts("\"12:00:00+05:60\""));
    CHECK_FALSE(time.accepts("\"08:30:00\""));  // RFC 3339 times carry an offset

    const Gbnf dt = grammar_of(R"({"type": "string", "format": "date-time"})");
    CHECK(dt.accepts("\"2024-05-01T12:00:00Z\""));
    CHECK(dt.accepts("\"2024-05-01t12:00:00.5-05:30\""));
    CHECK(dt.accepts("\"2000-02-29T00:00:00Z\""));
    CHECK_FALSE(dt.accepts("\"2023-02-30T12:00:00Z\""));
    CHECK_FALSE(dt.accepts("\"1900-02-29T12:00:00Z\""));
    CHECK_FALSE(dt.accepts("\"2024-05-01 12:00:00Z\""));
    CHECK_FALSE(dt.accepts("\"2024-05-01\""));

    const Gbnf uuid = grammar_of(R"({"type": "string", "format": "uuid"})");
    CHECK(uuid.accepts("\"123e4567-e89b-12d3-a456-426614174000\""));
    CHECK_FALSE(uuid.accepts("\"123e4567e89b12d3a456426614174000\""));
    CHECK_FALSE(uuid.accepts("\"123e4567-e89b-12d3-a456-42661417400g\""));

    const Gbnf email = grammar_of(R"({"type": "string", "format": "email"})");
    CHECK(email.accepts("\"first.last+tag@mail.example.com\""));
    CHECK_FALSE(email.accepts("\"no-at-sign.example.com\""));
    CHECK_FALSE(email.accepts("\"a@nodot\""));
    CHECK_FALSE(email.accepts("\"a..b@example.com\""));
    CHECK_FALSE(email.accepts("\"a@-bad.com\""));

    CHECK(contains(error_of(R"({"type": "string", "format": "hostname"})"), "'hostname'"));
}

TEST_CASE("json schema: format date accepts exactly the days of the Gregorian calendar, leap years included") {
    const auto leap = [](int y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; };
    const auto days_in = [&](int y, int m) {
        static const int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
        return m == 2 && leap(y) ? 29 : kDays[m - 1];
    };
    const Gbnf date = grammar_of(R"({"type": "string", "format": "date"})");
    const Gbnf dt = grammar_of(R"({"type": "string", "format": "date-time"})");
    // Every century rule (0000 is out: year 0 does not exist for Python's date), then every day of 1896-2104.
    std::vector<int> years = {0,    1,    4,    96,   99,   100,  104,  200,  400,  800,  1200, 1600, 1700,
                              1800, 1900, 2000, 2100, 2200, 2300, 2400, 2800, 9600, 9900, 9996, 9999};
    for (int y = 1896; y <= 2104; ++y) years.push_back(y);
    for (const int y : years)
        for (int m = 0; m <= 13; ++m)
            for (int d = 0; d <= 32; ++d) {
                char text[32];
                std::snprintf(text, sizeof text, "\"%04d-%02d-%02d\"", y, m, d);
                CAPTURE(text);
                const bool valid = y >= 1 && m >= 1 && m <= 12 && d >= 1 && d <= days_in(y, m);
                CHECK(date.accepts(text) == valid);
                if (m == 2 && d >= 28) {  // the date part of date-time is the same rule
                    std::string stamp = text;
                    stamp.insert(stamp.size() - 1, "T10:00:00Z");
                    CHECK(dt.accepts(stamp) == valid);
                }
            }
}

// ---- integer ranges ---------------------------------------------------------------------------------------------

TEST_CASE("json schema: integer minimum/maximum accept exactly the integers in range") {
    struct Range {
        const char* keywords;
        long lo, hi;  // the integers expected, within the probed window
    };
    const std::vector<Range> ranges = {
        {R"("minimum": 0, "maximum": 10)", 0, 10},
        {R"("minimum": 7, "maximum": 1234)", 7, 1234},
        {R"("minimum": -123, "maximum": 456)", -123, 456},
        {R"("minimum": -1005, "maximum": -98)", -1005, -98},
        {R"("exclusiveMinimum": 9, "exclusiveMaximum": 101)", 10, 100},
        {R"("minimum": 1.5, "maximum": 19.9)", 2, 19},
        {R"("minimum": 5, "exclusiveMinimum": true, "maximum": 9, "exclusiveMaximum": true)", 6, 8},
        {R"("minimum": 100, "maximum": 100)", 100, 100},
        {R"("minimum": 0, "maximum": 0)", 0, 0},
        {R"("minimum": 990, "maximum": 1010)", 990, 1010},
    };
    for (const Range& r : ranges) {
        CAPTURE(r.keywords);
        const Gbnf g = grammar_of(std::string(R"({"type": "integer", )") + r.keywords + "}");
        for (long v = -1200; v <= 1300; ++v) {
            CAPTURE(v);
            CHECK(g.accepts(std::to_string(v)) == (v >= r.lo && v <= r.hi));
        }
        CHECK_FALSE(g.accepts("-0"));
        CHECK_FALSE(g.accepts("007"));
    }
    const Gbnf open_above = grammar_of(R"({"type": "integer", "minimum": 12})");
    CHECK(open_above.accepts("12"));
    CHECK(open_above.accepts("999999999999"));
    CHECK_FALSE(open_above.accepts("11"));
    CHECK_FALSE(open_above.accepts("-12"));
    const Gbnf open_below = grammar_of(R"({"type": "integer", "exclusiveMaximum": 0})");
    CHECK(open_below.accepts("-1"));
    CHECK(open_below.accepts("-123456789"));
    CHECK_FALSE(open_below.accepts("0"));

    const Gbnf nonnegative = grammar_of(R"({"type": "number", "minimum": 0})");
    CHECK(nonnegative.accepts("0.5"));
    CHECK_FALSE(nonnegative.accepts("-0.5"));
    CHECK(contains(error_of(R"({"type": "number", "maximum": 3})"), "type number"));
    CHECK(contains(error_of(R"({"type": "integer", "minimum": 5, "maximum": 4})"), "no integer"));
    CHECK(contains(error_of(R"({"type": "integer", "minimum": 1e300})"), "minimum"));
}

// ---- errors and structure -----------------------------------------------------------------------------------------

TEST_CASE("json schema: unsupported keywords, bad schemas and bad JSON are errors that say where") {
    CHECK(error_of(R"({"type": "object", "patternProperties": {}})") ==
          "JSON Schema at #: unsupported keyword 'patternProperties'");
    CHECK(error_of(R"({"properties": {"a": {"type": "string", "contentEncoding": "base64"}}})") ==
          "JSON Schema at #/properties/a: unsupported keyword 'contentEncoding'");
    CHECK(contains(error_of(R"({"type": "strng"})"), "unknown type 'strng'"));
    CHECK(contains(error_of("false"), "matches nothing"));
    CHECK(contains(error_of("3"), "object or a boolean"));
    CHECK(error_of("{\"type\": \"string\",\n \"x\" 1}") == "JSON: line 2, column 6: expected ':'");
    // Annotations are ignored.
    CHECK(error_of(R"({"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "x", "title": "t",
                       "description": "d", "examples": [1], "default": 1, "$comment": "c", "type": "integer"})") ==
          "(no error)");
}

TEST_CASE("json schema: counts past the grammar's repetition bound are the schema's error, up to it they convert") {
    // A count over gbnf's kMaxRepetition used to reach the GBNF parser, whose error named a line and column of a
    // grammar the user never wrote (found by fuzz_json_schema; its input is in the corpus).
    CHECK(error_of(R"({"type": "string", "maxLength": 20000})") ==
          "JSON Schema at #: maxLength larger than 10000 is not supported");
    CHECK(contains(error_of(R"({"type": "array", "minItems": 10001})"), "minItems larger than 10000"));
    CHECK(contains(error_of(R"({"type": "string", "pattern": "^a{2,20000}$"})"), "repetition count larger than 10000"));
    for (const char* schema :
         {R"({"type": "string", "minLength": 10000})", R"({"type": "array", "minItems": 10000})",
          R"({"type": "array", "maxItems": 10000})", R"({"type": "string", "pattern": "^a{10000}$"})"})
        CHECK_NOTHROW(grammar_of(schema));
}

TEST_CASE("json schema: rule names are GBNF identifiers, whatever the property names") {
    const std::string text = json_schema_to_gbnf(
        R"({"properties": {"a b/c": {"type": "string"}, "": {"type": "integer"}, "ü": {"type": "boolean"},
                           "string": {"type": "object", "properties": {"x": {"maxLength": 2}}}}})");
    const Gbnf g(text);
    for (const std::string& name : g.rule_names()) {
        CAPTURE(name);
        CHECK(!name.empty());
        for (const char c : name) CHECK((std::isalnum(static_cast<unsigned char>(c)) || c == '-'));
    }
    CHECK(g.rule_names().front() == "root");
    CHECK(g.accepts(R"({"a b/c": "x", "": 1, "ü": true, "string": {"x": "ab"}})"));
    CHECK_FALSE(g.accepts(R"({"string": {"x": "abc"}})"));
}

TEST_CASE("json schema: hostile schemas end in an error, not a hang") {
    std::string deep;
    for (int i = 0; i < 200; ++i) deep += R"({"type": "array", "items": )";
    deep += "{}";
    for (int i = 0; i < 200; ++i) deep += "}";
    CHECK(contains(error_of(deep), "nested deeper"));
    // Each level doubles the work of the next through anyOf + merged siblings: the work bound stops it.
    std::string defs = R"({"$defs": {"d0": {"type": "integer"})";
    for (int i = 1; i <= 40; ++i) {
        const std::string prev = "{\"$ref\": \"#/$defs/d" + std::to_string(i - 1) + "\"}";
        defs += ", \"d" + std::to_string(i) + R"(": {"minimum": 0, "anyOf": [)" + prev + ", " + prev + "]}";
    }
    CHECK(contains(error_of(defs + R"(}, "$ref": "#/$defs/d40"})"), "too complex"));
}
