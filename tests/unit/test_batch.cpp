// Unit tests of --batch's parts that need no model: reading a line into a request or an error that names what is
// wrong (app/batch_request.h), a request over the command line's defaults, the records and the progress line
// (app/batch_output.h), and a batch file's lines and numbers (app/batch_input.h). The runs themselves:
// tests/e2e/batch.sh.
#include <unistd.h>

#include <doctest/doctest.h>
#include <fstream>

#include "app/batch_input.h"
#include "app/batch_output.h"
#include "app/batch_request.h"
#include "error.h"
#include "json/json_value.h"
#include "test_paths.h"

using namespace tandem;

namespace {

BatchLine parse(std::string_view line, uint64_t number = 1) { return parse_batch_line(line, number); }

// The error of a line that must not parse (and the check that it does not).
std::string error_of(std::string_view line) {
    const BatchLine l = parse(line, 9);
    CHECK_MESSAGE(!l.error.empty(), line);
    return l.error;
}

// A scratch file in the build directory, removed at the end of the test.
struct ScratchFile {
    std::string path;
    explicit ScratchFile(const std::string& text)
        : path(std::string(TANDEM_BUILD_DIR) + "/test_batch_" + std::to_string(::getpid()) + ".jsonl") {
        std::ofstream(path, std::ios::binary) << text;
    }
    ~ScratchFile() { std::remove(path.c_str()); }
};

}  // namespace

TEST_CASE("batch line: a prompt alone takes every default and the line number as its id") {
    const BatchLine l = parse(R"({"prompt": "Hello"})", 3);
    REQUIRE(l.error.empty());
    CHECK(l.id == "3");
    CHECK(l.request.prompt == "Hello");
    CHECK(!l.request.system);
    CHECK(!l.request.n_predict);
    CHECK(!l.request.temp);
    CHECK(!l.request.seed);
    CHECK(!l.request.stop);
    CHECK(!l.request.json_schema);
}

TEST_CASE("batch line: every field read, the id as it was written") {
    const BatchLine l =
        parse(R"({"id": "q-1", "prompt": "P", "system": "S", "n_predict": -1, "temp": 0.5, "top_k": 0, "top_p": 1,)"
              R"( "min_p": 0, "seed": 18446744073709551615, "stop": ["a", ""], "json_schema": {"type": "string"}})");
    REQUIRE(l.error.empty());
    CHECK(l.id == "\"q-1\"");
    const BatchRequest& r = l.request;
    CHECK(r.prompt == "P");
    CHECK(*r.system == "S");
    CHECK(*r.n_predict == -1);
    CHECK(*r.temp == 0.5f);
    CHECK(*r.top_k == 0);
    CHECK(*r.top_p == 1.0f);
    CHECK(*r.min_p == 0.0f);
    CHECK(*r.seed == 18446744073709551615ull);  // every digit, beyond a double's 2^53
    CHECK(*r.stop == std::vector<std::string>{"a", ""});
    CHECK(*r.json_schema == R"({"type":"string"})");  // compact, for the runner's converter and its cache key
    CHECK(parse(R"({"id": 1.50, "prompt": ""})").id == "1.50");
    CHECK(parse(R"({"id": "a\"b\n", "prompt": ""})").id == R"("a\"b\n")");
    CHECK(*parse(R"({"prompt": "", "stop": "."})").request.stop == std::vector<std::string>{"."});
    CHECK(*parse(R"({"prompt": "", "json_schema": true})").request.json_schema == "true");
    CHECK(parse(" \t{\"prompt\": \"x\"}\r").error.empty());  // JSON whitespace around it
}

TEST_CASE("batch line: what is not a request says why, with the given id where there is one") {
    BatchLine l = parse("not json", 4);
    CHECK(l.id == "4");
    CHECK(l.error.find("JSON: line 1, column 1") == 0);
    CHECK(error_of("[1, 2]") == "a line must be a JSON object, got an array");
    CHECK(error_of(R"("prompt")") == "a line must be a JSON object, got a string");
    CHECK(error_of("{}") == "\"prompt\" is missing");
    CHECK(error_of(R"({"prompt": null})") == "\"prompt\" must be a string, got null");
    CHECK(error_of(R"({"prompt": ["a"]})") == "\"prompt\" must be a string, got an array");
    l = parse(R"({"id": "x", "prompt": "p", "temprature": 1})");
    CHECK(l.id == "\"x\"");  // the error record still carries the line's id
    CHECK(l.error.find("unknown key \"temprature\" (the keys are prompt, id,") == 0);
    CHECK(error_of(R"({"prompt": "p", "Prompt": "q"})").find("unknown key \"Prompt\"") == 0);
    // An id of another type cannot be the record's id: the line number is.
    l = parse(R"({"id": {"a": 1}, "prompt": "p"})", 12);
    CHECK(l.id == "12");
    CHECK(l.error == "\"id\" must be a string or a number, got an object");
    CHECK(error_of(R"({"id": true, "prompt": "p"})") == "\"id\" must be a string or a number, got a boolean");
    // A repeated key is the JSON reader's error.
    CHECK(error_of(R"({"prompt": "p", "prompt": "q"})").find("JSON: line 1") == 0);
}

TEST_CASE("batch line: numbers of the wrong form or out of range are refused, naming the key and the value") {
    CHECK(error_of(R"({"prompt": "", "n_predict": 1.5})") ==
          "\"n_predict\" must be an integer from -1 (no limit) to 1073741824, got 1.5");
    CHECK(!error_of(R"({"prompt": "", "n_predict": -2})").empty());
    CHECK(!error_of(R"({"prompt": "", "n_predict": 1073741825})").empty());
    CHECK(!error_of(R"({"prompt": "", "n_predict": 1e2})").empty());  // an integer is written as one
    CHECK(!error_of(R"({"prompt": "", "n_predict": "5"})").empty());
    CHECK(parse(R"({"prompt": "", "n_predict": 1073741824})").error.empty());
    CHECK(error_of(R"({"prompt": "", "temp": -0.1})") == "\"temp\" must be a number from 0 (greedy) to 100, got -0.1");
    CHECK(!error_of(R"({"prompt": "", "temp": 100.5})").empty());
    CHECK(!error_of(R"({"prompt": "", "temp": 1e999})").empty());  // inf
    CHECK(!error_of(R"({"prompt": "", "top_k": -1})").empty());
    CHECK(!error_of(R"({"prompt": "", "top_k": 2147483648})").empty());
    CHECK(!error_of(R"({"prompt": "", "top_p": 0})").empty());  // (0, 1], as the sampler requires
    CHECK(!error_of(R"({"prompt": "", "top_p": 1.01})").empty());
    CHECK(!error_of(R"({"prompt": "", "top_p": 1e-50})").empty());  // 0 as the float the sampler takes
    CHECK(!error_of(R"({"prompt": "", "min_p": 2})").empty());
    CHECK(!error_of(R"({"prompt": "", "seed": -1})").empty());
    CHECK(!error_of(R"({"prompt": "", "seed": 18446744073709551616})").empty());
    CHECK(!error_of(R"({"prompt": "", "seed": 4.0})").empty());
    CHECK(error_of(R"({"prompt": "", "stop": 3})") == "\"stop\" must be a string or an array of strings, got 3");
    CHECK(error_of(R"({"prompt": "", "stop": ["a", 3]})") == "\"stop[1]\" must be a string, got 3");
    CHECK(error_of(R"({"prompt": "", "json_schema": "{}"})") ==
          "\"json_schema\" must be a JSON schema (an object, or true or false), got a string");
    CHECK(!error_of(R"({"prompt": "", "system": 1})").empty());
}

TEST_CASE("batch line: blank lines") {
    CHECK(is_blank_line(""));
    CHECK(is_blank_line(" \t\r"));
    CHECK(!is_blank_line(" x "));
    CHECK(!is_blank_line("{}"));
}

TEST_CASE("batch request: the line's fields replace the command line's, the rest stays") {
    GenerationParams defaults;
    defaults.n_predict = 64;
    defaults.chunk = 32;
    defaults.stops = {"END"};
    defaults.sampler.temperature = 0.7f;
    defaults.sampler.seed = 5;
    defaults.sampler.top_k = 40;
    defaults.speculative.lookup = true;
    GenerationParams p = request_params(parse(R"({"prompt": ""})").request, defaults);
    CHECK(p.n_predict == 64);
    CHECK(p.stops == std::vector<std::string>{"END"});
    CHECK(p.sampler.temperature == 0.7f);
    CHECK(p.sampler.seed == 5);
    p = request_params(parse(R"({"prompt": "", "n_predict": 3, "temp": 0, "top_k": 1, "top_p": 0.5, "min_p": 0.25,)"
                             R"( "seed": 9, "stop": []})")
                           .request,
                       defaults);
    CHECK(p.n_predict == 3);
    CHECK(p.sampler.temperature == 0.0f);
    CHECK(p.sampler.top_k == 1);
    CHECK(p.sampler.top_p == 0.5f);
    CHECK(p.sampler.min_p == 0.25f);
    CHECK(p.sampler.seed == 9);
    CHECK(p.stops.empty());  // an empty list: no stop strings, not the command line's
    CHECK(p.chunk == 32);
    CHECK(p.speculative.lookup);
}

TEST_CASE("batch records: the id first, then the answer's fields, and an error record") {
    CHECK(batch_answer_record("\"a\"", R"("text": "x", "stop": "eos")") ==
          R"({"id": "a", "text": "x", "stop": "eos"})");
    const std::string error = batch_error_record("7", "bad \"thing\"\n");
    CHECK(error == R"({"id": 7, "error": "bad \"thing\"\n"})");
    const JsonValue v = parse_json(error);
    CHECK(v.members.front().first == "id");
    CHECK(v.find("error")->text == "bad \"thing\"\n");
}

TEST_CASE("batch progress line: done/total, tokens/s and ETA for a file, the count alone for stdin") {
    CHECK(batch_progress_line(2, 0, 10, 100, 4.0) == "batch: 2/10 lines, 25.0 tokens/s, ETA 0:16");
    CHECK(batch_progress_line(3, 1, 4, 0, 3.0) == "batch: 3/4 lines (1 failed), 0.0 tokens/s, ETA 0:01");
    CHECK(batch_progress_line(4, 0, 4, 10, 1.0) == "batch: 4/4 lines, 10.0 tokens/s");
    CHECK(batch_progress_line(1, 0, std::nullopt, 10, 2.0) == "batch: 1 line, 5.0 tokens/s");
    CHECK(batch_progress_line(5, 2, std::nullopt, 10, 0.0) == "batch: 5 lines (2 failed), 0.0 tokens/s");
    CHECK(batch_progress_line(1, 0, 3, 0, 3600.0) == "batch: 1/3 lines, 0.0 tokens/s, ETA 2:00:00");
}

TEST_CASE("batch input: a file's lines with their numbers, CRs dropped, the non-blank ones counted") {
    ScratchFile file("{\"prompt\": \"a\"}\r\n\n  \n{\"prompt\": \"b\"}\nlast");
    BatchInput input(file.path);
    CHECK(*input.requests() == 3);
    std::vector<std::pair<uint64_t, std::string>> lines;
    while (const std::optional<std::string> line = input.next_line()) lines.emplace_back(input.line_number(), *line);
    CHECK(lines == std::vector<std::pair<uint64_t, std::string>>{
                       {1, "{\"prompt\": \"a\"}"}, {2, ""}, {3, "  "}, {4, "{\"prompt\": \"b\"}"}, {5, "last"}});
    CHECK(!BatchInput("-").requests());  // stdin: unknown until read
    CHECK_THROWS_WITH_AS(BatchInput(file.path + ".missing"), doctest::Contains("cannot open the batch file"), Error);
    CHECK_THROWS_WITH_AS(BatchInput(TANDEM_BUILD_DIR), doctest::Contains("is a directory"), Error);
}
