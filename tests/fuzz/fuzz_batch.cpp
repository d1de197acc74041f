// Fuzz target: a --batch line read into a request (src/app/batch_request.h) and the records written for it
// (src/app/batch_output.h). The input is one line's bytes, arbitrary. Properties:
//   - parse_batch_line never throws: any line gives a request or an error;
//   - the id is JSON text of a string or a number (the line number when the line gives none, or none usable);
//   - an error line's record parses to {"id", "error"} in that order, with the same id and a non-empty message;
//   - a request written back as a line (every field it set, in the documented JSON types) reads back to the same
//     request and id: nothing is lost or changed between the line and what the runner uses, floats included;
//   - a request's json_schema is compact JSON of an object or a boolean, which writes back to itself;
//   - its answer record (the prompt as the text) parses, with the id first.
#include <cstdio>
#include <string>
#include <string_view>

#include "app/answer_record.h"
#include "app/batch_output.h"
#include "app/batch_request.h"
#include "error.h"
#include "fuzz_target.h"
#include "json/json_value.h"

namespace {

using tandem::BatchLine;
using tandem::BatchRequest;
using tandem::JsonValue;
using tandem::fuzz::fail;

JsonValue parse_or_fail(const std::string& text, const char* what) {
    try {
        return tandem::parse_json(text);
    } catch (const tandem::Error& e) {
        fail(std::string(what) + " is not JSON: " + e.what() + "\n" + text);
    }
}

std::string float_text(float v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);  // 9 significant digits: a float reads back as itself
    return buf;
}

// The line a request stands for.
std::string line_of(const std::string& id, const BatchRequest& r) {
    std::string s = "{\"id\": " + id + ", \"prompt\": " + tandem::json_quote(r.prompt);
    if (r.system) s += ", \"system\": " + tandem::json_quote(*r.system);
    if (r.n_predict) s += ", \"n_predict\": " + std::to_string(*r.n_predict);
    if (r.temp) s += ", \"temp\": " + float_text(*r.temp);
    if (r.top_k) s += ", \"top_k\": " + std::to_string(*r.top_k);
    if (r.top_p) s += ", \"top_p\": " + float_text(*r.top_p);
    if (r.min_p) s += ", \"min_p\": " + float_text(*r.min_p);
    if (r.seed) s += ", \"seed\": " + std::to_string(*r.seed);
    if (r.stop) {
        s += ", \"stop\": [";
        for (size_t i = 0; i < r.stop->size(); ++i) s += (i ? ", " : "") + tandem::json_quote((*r.stop)[i]);
        s += "]";
    }
    if (r.json_schema) s += ", \"json_schema\": " + *r.json_schema;
    return s + "}";
}

bool same(const BatchRequest& a, const BatchRequest& b) {
    return a.prompt == b.prompt && a.system == b.system && a.n_predict == b.n_predict && a.temp == b.temp &&
           a.top_k == b.top_k && a.top_p == b.top_p && a.min_p == b.min_p && a.seed == b.seed && a.stop == b.stop &&
           a.json_schema == b.json_schema;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view line(reinterpret_cast<const char*>(data), size);
    BatchLine l;
    try {
        l = tandem::parse_batch_line(line, 42);
    } catch (const std::exception& e) {
        fail(std::string("parse_batch_line threw: ") + e.what());
    }
    const JsonValue id = parse_or_fail(l.id, "the id");
    if (!id.is_string() && !id.is_number()) fail("the id is neither a string nor a number: " + l.id);
    if (tandem::to_json(id) != l.id) fail("the id is not compact JSON: " + l.id);
    if (!l.error.empty()) {
        const JsonValue record = parse_or_fail(tandem::batch_error_record(l.id, l.error), "an error record");
        if (record.members.size() != 2 || record.members[0].first != "id" || record.members[1].first != "error" ||
            record.members[0].second != id || !record.members[1].second.is_string())
            fail("an error record is not {\"id\", \"error\"}");
        return 0;
    }
    if (tandem::is_blank_line(line)) fail("a blank line parsed as a request");
    const BatchRequest& r = l.request;
    if (r.json_schema) {
        const JsonValue schema = parse_or_fail(*r.json_schema, "json_schema");
        if (!schema.is_object() && !schema.is_bool()) fail("json_schema is neither an object nor a boolean");
        if (tandem::to_json(schema) != *r.json_schema) fail("json_schema is not compact JSON");
    }
    const std::string written = line_of(l.id, r);
    const BatchLine again = tandem::parse_batch_line(written, 7);
    if (!again.error.empty()) fail("a request written back is refused: " + again.error + "\n" + written);
    if (again.id != l.id || !same(again.request, r)) fail("a request written back reads differently:\n" + written);
    const tandem::GenerationStats stats;
    const JsonValue record = parse_or_fail(
        tandem::batch_answer_record(l.id, tandem::answer_record_fields(r.prompt, std::nullopt, stats)), "a record");
    if (record.members.empty() || record.members[0].first != "id" || record.members[0].second != id)
        fail("a record does not start with its id");
    return 0;
}

namespace tandem::fuzz {

std::vector<std::pair<std::string, std::string>> fuzz_seeds() {
    return {
        {"full", R"({"id": "q-1", "prompt": "Write a haiku.", "system": "Be brief.", "n_predict": 64, "temp": 0.7,)"
                 R"( "top_k": 40, "top_p": 0.95, "min_p": 0.05, "seed": 18446744073709551615, "stop": ["\n\n", "END"],)"
                 R"( "json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}})"},
        {"minimal", R"({"prompt": ""})"},
        {"number-id", R"({"id": -1.50e3, "prompt": "caf\u00e9 \ud83d\ude00", "stop": ".", "json_schema": true})"},
        {"unknown-key", R"({"id": 7, "prompt": "p", "temprature": 0.5})"},
        {"wrong-types", R"({"id": null, "prompt": "p", "n_predict": 1.5, "top_p": 1e-50, "seed": -1, "stop": [1]})"},
        {"not-an-object", R"([{"prompt": "p"}])"},
        {"not-json", "{\"prompt\": \"p\"\r"},
        {"blank", " \t\r"},
    };
}

}  // namespace tandem::fuzz
