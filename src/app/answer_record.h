// The machine-readable record of one answer (--output-format jsonl): one JSON object on one line, with stable field
// names (docs/usage.md, "Output contract"), for scripts; --batch writes the same fields after each line's "id".
#pragma once
#include <optional>
#include <string>

#include "generate/generator.h"

namespace tandem {

// {"text": ..., ["reasoning": ...,] "prompt_tokens": N, "generated_tokens": N, "stop": "eos" | "length" |
//  "stop_string" | "context_full", "time_to_first_token_s": x, "prefill_tokens_per_s": x, "decode_tokens_per_s": x
//  [, "drafted": N, "accepted": N, "acceptance": x]} (the drafting fields when the speculative loop ran), without a
// trailing newline. Strings are written by json_quote (json/json_value.h).
std::string answer_record(const std::string& text, const std::optional<std::string>& reasoning,
                          const GenerationStats& stats);

// The same members without the braces ("\"text\": ..., ..."), for a record that puts its own fields first.
std::string answer_record_fields(const std::string& text, const std::optional<std::string>& reasoning,
                                 const GenerationStats& stats);

}  // namespace tandem
