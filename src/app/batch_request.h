// One line of a --batch input: a JSON object, {"prompt": ...} with optional "id", "system", "n_predict", "temp",
// "top_k", "top_p", "min_p", "seed", "stop" and "json_schema" (docs/usage.md, "Batch mode"), read into a request whose
// unset fields default to the command line's flags. A pure function of the line's text: no model, no I/O. Strict on
// purpose: an unknown key (a typo such as "temprature") or a value of the wrong type or out of range makes the line an
// error, named in its record, rather than a request that silently runs with the defaults.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "generate/generator.h"

namespace tandem {

// What a line asks for; an unset field takes the command line's value.
struct BatchRequest {
    std::string prompt;
    std::optional<std::string> system;
    std::optional<int> n_predict;                  // -1 .. 2^30, as -n
    std::optional<float> temp;                     // [0, 100], as --temp
    std::optional<int> top_k;                      // >= 0
    std::optional<float> top_p;                    // (0, 1]
    std::optional<float> min_p;                    // [0, 1]
    std::optional<uint64_t> seed;                  // 0 .. 2^64 - 1
    std::optional<std::vector<std::string>> stop;  // replaces the command line's --stop (a string: one)
    // The schema as compact JSON (to_json), an object or a boolean; it replaces the command line's --grammar,
    // --grammar-file or --json-schema. Checked here only for its JSON type: converting it is the runner's (batch.h).
    std::optional<std::string> json_schema;
};

// A parsed line: a request, or why it is none.
struct BatchLine {
    // The record's "id" as JSON text: the line's "id" as it was written (a string or a number), else the 1-based
    // line number. Always valid JSON, also for a line that is not.
    std::string id;
    std::string error;     // why the line is not a request; "" when it is one
    BatchRequest request;  // valid when error is ""
};

// The keys a line may have, in the order the documentation lists them.
const std::vector<std::string>& batch_keys();

// Whether `line` holds nothing but JSON whitespace (space, tab, CR, LF): such a line is skipped, with no record.
bool is_blank_line(std::string_view line);

// Reads one line (without its newline) numbered `line_number` (1-based). Never throws: any input gives a request or
// an error (the JSON reader's message with its column; the key and what it must be; an unknown key by name).
BatchLine parse_batch_line(std::string_view line, uint64_t line_number);

// The generation parameters of `request`: `defaults` (the command line's) with the line's fields in their place.
GenerationParams request_params(const BatchRequest& request, GenerationParams defaults);

}  // namespace tandem
