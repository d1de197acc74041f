// JSON Schema -> GBNF (llama.cpp's grammar syntax): the grammar that `--json-schema` hands to the grammar engine, so
// that decoding can only produce JSON the schema accepts. A pure function of the schema text; start rule `root`.
//
// Supported (anything else is a tandem::Error naming the keyword, never silently ignored):
//   type (one or a list: object array string number integer boolean null; absent: inferred from the keywords
//     present, none at all = any JSON value), {} and true = any value;
//   properties (emitted in document order; a property schema false: the member may not appear), required,
//     additionalProperties (absent/true: any further members, false: none, a schema: further members of that
//     schema; further keys are not checked against the declared ones); items, prefixItems, minItems, maxItems;
//   enum, const (the value as compact JSON, with optional whitespace between its tokens);
//   anyOf, oneOf (treated as anyOf: exclusivity cannot be enforced), allOf (merged into one schema with JSON
//     Schema's meaning: additionalProperties sees only the properties of its own part, so a member's schema is
//     what every part says of its name (its property schema there, else that part's additionalProperties), and
//     items only the prefixItems of its own part, likewise per position; required united, bounds tightened, types
//     intersected; a required member that a part forbids is an error, the schema having no valid instance; parts
//     that disagree otherwise are an error); keywords next to anyOf/oneOf are merged into each alternative,
//     keywords next to $ref are merged as allOf; an alternative (or a type of a type list) whose own keywords
//     require a member they forbid is left out, and an error only when nothing remains;
//   $ref to any JSON pointer inside the document (#, #/$defs/..., #/definitions/...): one rule per target, so
//     recursive schemas work; a cycle of references that consumes no input is an error;
//   strings: minLength, maxLength, pattern (see below), format date, time, date-time (RFC 3339 less the leap
//     second :60 and year 0000, which Python's jsonschema refuses; only days that exist, February 29 in leap years
//     only), uuid, email (a simplified addr-spec: dot-atoms, no quoted local parts or IP literals);
//   integers: minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers, or the draft-04 booleans), as exact
//     digit-range grammars, bounds within +-(10^18 - 1); numbers: minimum 0 only (no other bounds).
//   Annotations title, description, $schema, $id, $comment, examples, default, deprecated, readOnly, writeOnly,
//   and $defs/definitions (as containers) are ignored.
//
// pattern (ECMA-262 semantics, unanchored unless ^/$): literal characters, escapes \d \D \w \W \s \S \n \r \t \f
// \v \0 \xHH \uHHHH and escaped punctuation, classes [...] / [^...] with ranges and those escapes, '.', groups
// ( ), (?: ), (?<name> ), alternation |, quantifiers * + ? {m} {m,} {m,n} (lazy forms too, which match the same
// strings), ^ only at the start and $ only at the end of the pattern or of a top-level alternative. Refused:
// backreferences, lookarounds, \b \B, \p{..}, possessive quantifiers, and repeating something that can match
// the empty string (e.g. (a?)*). Characters the pattern matches are emitted as their JSON encodings (" as \",
// control characters as their short or \u00XX escapes).
//
// Bounded output: whitespace between tokens is at most one space or a newline with up to 20 spaces/tabs
// (`space`), integers have at most 18 digits, fractions at most 18 and exponents at most 3. Strings are not
// bounded unless the schema bounds them.
#pragma once
#include <string>
#include <string_view>

#include "json/json_value.h"

namespace tandem {

// The GBNF grammar for a JSON Schema given as JSON text. Throws tandem::Error for text that is not JSON ("JSON:
// line L, column C: ...") and for schemas it cannot convert ("JSON Schema at #/pointer: ...").
std::string json_schema_to_gbnf(std::string_view schema_json);

// The same, for a schema already parsed.
std::string json_schema_to_gbnf(const JsonValue& schema);

}  // namespace tandem
