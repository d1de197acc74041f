// Reading a --batch line (batch_request.h).
#include "app/batch_request.h"

#include <charconv>
#include <limits>

#include "error.h"
#include "json/json_value.h"

namespace tandem {

namespace {

const char* kind_name(const JsonValue& v) {
    switch (v.kind) {
        case JsonValue::Kind::Null: return "null";
        case JsonValue::Kind::Bool: return "a boolean";
        case JsonValue::Kind::Number: return "a number";
        case JsonValue::Kind::String: return "a string";
        case JsonValue::Kind::Array: return "an array";
        case JsonValue::Kind::Object: return "an object";
    }
    return "a value";
}

// "\"key\" must be WHAT, got X": the message of a value of the wrong type or out of range.
[[noreturn]] void refuse(const std::string& key, const std::string& what, const JsonValue& got) {
    const std::string shown = got.is_number() ? got.text : kind_name(got);
    throw Error(json_quote(key) + " must be " + what + ", got " + shown);
}

// An integer written as one (digits, an optional minus; no fraction or exponent) within [lo, hi]. The number's
// source text is read, not its double, so that a seed above 2^53 keeps every digit.
template <typename T>
T integer(const std::string& key, const JsonValue& v, T lo, T hi, const std::string& what) {
    if (!v.is_number()) refuse(key, what, v);
    T out{};
    const char* end = v.text.data() + v.text.size();
    const auto [ptr, ec] = std::from_chars(v.text.data(), end, out);
    if (ec != std::errc() || ptr != end || out < lo || out > hi) refuse(key, what, v);
    return out;
}

// A number within [lo, hi] (`lo_open`: above lo), as the float the sampler takes. The bounds apply to that float, so
// that a value which rounds onto a refused one (a top_p of 1e-50 is 0 as a float) is refused too.
float real(const std::string& key, const JsonValue& v, float lo, float hi, bool lo_open, const std::string& what) {
    // Checked as a double first: converting one beyond float's range (or NaN) would be undefined behaviour.
    if (!v.is_number() || !(v.number >= lo - 1.0 && v.number <= hi + 1.0)) refuse(key, what, v);
    const float f = static_cast<float>(v.number);
    if (f > hi || f < lo || (lo_open && f <= lo)) refuse(key, what, v);
    return f;
}

std::string string_value(const std::string& key, const JsonValue& v) {
    if (!v.is_string()) refuse(key, "a string", v);
    return v.text;
}

// Everything but "id", which parse_batch_line reads first so that an error record carries it.
void read_member(const std::string& key, const JsonValue& v, BatchRequest& r) {
    if (key == "prompt") {
        r.prompt = string_value(key, v);
    } else if (key == "system") {
        r.system = string_value(key, v);
    } else if (key == "n_predict") {
        r.n_predict = integer<int>(key, v, -1, 1 << 30, "an integer from -1 (no limit) to 1073741824");
    } else if (key == "temp") {
        r.temp = real(key, v, 0, 100, false, "a number from 0 (greedy) to 100");
    } else if (key == "top_k") {
        r.top_k = integer<int>(key, v, 0, std::numeric_limits<int>::max(), "an integer >= 0 (0: off)");
    } else if (key == "top_p") {
        r.top_p = real(key, v, 0, 1, true, "a number above 0 and at most 1 (1: off)");
    } else if (key == "min_p") {
        r.min_p = real(key, v, 0, 1, false, "a number from 0 (off) to 1");
    } else if (key == "seed") {
        r.seed = integer<uint64_t>(key, v, 0, std::numeric_limits<uint64_t>::max(),
                                   "an integer from 0 to 18446744073709551615");
    } else if (key == "stop") {
        if (v.is_string()) {
            r.stop = std::vector<std::string>{v.text};
        } else if (v.is_array()) {
            std::vector<std::string> stops;
            for (size_t i = 0; i < v.items.size(); ++i)
                stops.push_back(string_value(key + "[" + std::to_string(i) + "]", v.items[i]));
            r.stop = std::move(stops);
        } else {
            refuse(key, "a string or an array of strings", v);
        }
    } else if (key == "json_schema") {
        if (!v.is_object() && !v.is_bool()) refuse(key, "a JSON schema (an object, or true or false)", v);
        r.json_schema = to_json(v);
    } else {
        std::string known;
        for (const std::string& k : batch_keys()) known += (known.empty() ? "" : ", ") + k;
        throw Error("unknown key " + json_quote(key) + " (the keys are " + known + ")");
    }
}

}  // namespace

const std::vector<std::string>& batch_keys() {
    static const std::vector<std::string> keys = {"prompt", "id",    "system", "n_predict", "temp",       "top_k",
                                                  "top_p",  "min_p", "seed",   "stop",      "json_schema"};
    return keys;
}

bool is_blank_line(std::string_view line) { return line.find_first_not_of(" \t\r\n") == std::string_view::npos; }

BatchLine parse_batch_line(std::string_view line, uint64_t line_number) {
    BatchLine out;
    out.id = std::to_string(line_number);
    try {
        const JsonValue v = parse_json(line);
        if (!v.is_object()) throw Error(std::string("a line must be a JSON object, got ") + kind_name(v));
        if (const JsonValue* id = v.find("id")) {
            if (!id->is_string() && !id->is_number()) refuse("id", "a string or a number", *id);
            out.id = to_json(*id);
        }
        for (const auto& [key, value] : v.members)
            if (key != "id") read_member(key, value, out.request);
        if (!v.find("prompt")) throw Error("\"prompt\" is missing");
    } catch (const Error& e) {
        out.error = e.what();
        out.request = {};
    }
    return out;
}

GenerationParams request_params(const BatchRequest& r, GenerationParams p) {
    if (r.n_predict) p.n_predict = *r.n_predict;
    if (r.temp) p.sampler.temperature = *r.temp;
    if (r.top_k) p.sampler.top_k = *r.top_k;
    if (r.top_p) p.sampler.top_p = *r.top_p;
    if (r.min_p) p.sampler.min_p = *r.min_p;
    if (r.seed) p.sampler.seed = *r.seed;
    if (r.stop) p.stops = *r.stop;
    return p;
}

}  // namespace tandem
