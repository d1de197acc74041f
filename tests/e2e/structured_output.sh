#!/usr/bin/env bash
# End-to-end proof that structured output validates on the default model (Qwen2.5-Coder-1.5B with its 0.5B draft,
# from the model cache): for a set of JSON schemas covering what the converter supports (src/grammar/json_schema.cpp,
# docs/structured-output.md), every answer tandem prints for --json-schema parses and validates with a real JSON
# Schema implementation (Python's jsonschema through tests/e2e/lib/validate_json.py), greedy, sampled with a seed,
# with the default draft, with --lookup and with --no-draft; drafting keeps the greedy text and a seed's text; a
# --output-format jsonl record's text validates; a few GBNF grammars (--grammar) give what their regexes say. The
# speculative-stats checks (check_drafting_under_grammar) fail until drafting under a grammar lands. Needs the
# default models in the cache (scripts/fetch-models; scripts/test fetches them) and python3-jsonschema
# (scripts/setup installs it). About 2-4 minutes on 2 cores.
# Usage: structured_output.sh BUILD_DIR DATA_DIR
set -uo pipefail
build=$1
tandem="$build/tandem"
here=$(cd "$(dirname "$0")" && pwd)
validator="$here/lib/validate_json.py"
tmp=$(mktemp -d)
trap '[[ -n ${KEEP_TMP:-} ]] || rm -rf "$tmp"' EXIT  # KEEP_TMP=1: keep the answers (the folder is named on stderr)
source "$here/lib/checks.bash"
started=$SECONDS
[[ -z ${KEEP_TMP:-} ]] || echo "structured_output: the answers are in $tmp" >&2

finish() {
  echo "structured_output: $((SECONDS - started)) s in all" >&2
  echo "structured_output: $passed passed, $failed failed"
  [[ $failed -eq 0 ]]
  exit
}

# ---- what the checks need ------------------------------------------------------------------------------------
# A python3 with jsonschema: the one on PATH, else Debian's (python3-jsonschema installs into /usr/bin/python3's).
py=""
for candidate in python3 /usr/bin/python3; do
  if "$candidate" -c 'import jsonschema' 2>/dev/null; then py=$candidate; break; fi
done
if [[ -z $py ]]; then
  bad "Python's jsonschema is missing (scripts/setup installs python3-jsonschema)"
  finish
fi
models="${TANDEM_MODELS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/models}"
for m in qwen2.5-coder-1.5b-instruct-q4_k_m qwen2.5-coder-0.5b-instruct-q4_k_m; do
  if [[ ! -f $models/$m.gguf ]]; then
    bad "the default model $m is not in the model cache $models: run scripts/fetch-models"
    finish
  fi
done

# ---- the schemas ---------------------------------------------------------------------------------------------
# schema NAME N_PREDICT PROMPT <<<JSON: one schema, the prompt that asks for it, the -n that its answer fits in.
declare -A prompt npredict
schemas=()
schema() {
  local name=$1
  npredict[$name]=$2 prompt[$name]=$3
  schemas+=("$name")
  cat >"$tmp/$name.json"
}

# An object with required and optional properties, additionalProperties false; string lengths, integer bounds.
schema person 96 "Describe a fictional person as JSON." <<'EOF'
{"type": "object", "properties": {
  "name": {"type": "string", "minLength": 2, "maxLength": 40},
  "age": {"type": "integer", "minimum": 18, "maximum": 99},
  "email": {"type": "string", "format": "email"},
  "nickname": {"type": "string", "maxLength": 20},
  "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3}},
 "required": ["name", "age"], "additionalProperties": false}
EOF
# enum and const, of several JSON types.
schema order 96 "Describe an online order as JSON." <<'EOF'
{"type": "object", "properties": {
  "schema_version": {"const": 2},
  "status": {"enum": ["pending", "shipped", "delivered", "cancelled"]},
  "priority": {"enum": ["low", "normal", "high", null]},
  "currency": {"type": "string", "enum": ["EUR", "USD", "GBP"]},
  "quantity": {"enum": [1, 2, 5, 10]},
  "express": {"type": "boolean"}},
 "required": ["schema_version", "status", "priority", "currency", "quantity"], "additionalProperties": false}
EOF
# Arrays: items (objects and strings), minItems/maxItems.
schema shopping 128 "Write a short shopping list as JSON." <<'EOF'
{"type": "object", "properties": {
  "store": {"type": "string", "maxLength": 30},
  "items": {"type": "array", "minItems": 2, "maxItems": 4, "items": {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 30},
    "count": {"type": "integer", "minimum": 1, "maximum": 12}},
   "required": ["name", "count"], "additionalProperties": false}},
  "tags": {"type": "array", "items": {"type": "string", "maxLength": 15}, "minItems": 1, "maxItems": 3}},
 "required": ["store", "items", "tags"], "additionalProperties": false}
EOF
# A tuple: prefixItems, no more items.
schema city 64 "Describe Tokyo as a JSON array: [name, latitude, longitude, population]." <<'EOF'
{"type": "array", "prefixItems": [
  {"type": "string", "maxLength": 30}, {"type": "number"}, {"type": "number"},
  {"type": "integer", "minimum": 0, "maximum": 40000000}],
 "items": false, "minItems": 4}
EOF
# Nested objects through $ref to #/$defs (a definition referring to another).
schema library 192 "Describe a small library with two classic novels as JSON." <<'EOF'
{"$defs": {
  "person": {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "born": {"type": "integer", "minimum": 1000, "maximum": 2024}},
   "required": ["name"], "additionalProperties": false},
  "book": {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 60},
    "author": {"$ref": "#/$defs/person"},
    "year": {"type": "integer", "minimum": 1450, "maximum": 2024}},
   "required": ["title", "author", "year"], "additionalProperties": false}},
 "type": "object", "properties": {
  "library": {"type": "string", "maxLength": 40},
  "books": {"type": "array", "items": {"$ref": "#/$defs/book"}, "minItems": 2, "maxItems": 3}},
 "required": ["library", "books"], "additionalProperties": false}
EOF
# A recursive schema: the root is a $ref to a node whose children are nodes.
schema tree 160 "Show a tiny folder tree, two levels deep, as JSON." <<'EOF'
{"$defs": {"node": {"type": "object", "properties": {
   "name": {"type": "string", "maxLength": 20},
   "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 3}},
  "required": ["name"], "additionalProperties": false}},
 "$ref": "#/$defs/node"}
EOF
# anyOf and oneOf (the oneOf alternatives told apart by a const, so exactly one matches).
schema shape 96 "Describe a shape for a drawing program as JSON." <<'EOF'
{"type": "object", "properties": {
  "id": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 9999},
                   {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}]},
  "shape": {"oneOf": [
    {"type": "object", "properties": {"kind": {"const": "circle"}, "radius": {"type": "number", "minimum": 0}},
     "required": ["kind", "radius"], "additionalProperties": false},
    {"type": "object", "properties": {"kind": {"const": "rectangle"}, "width": {"type": "number", "minimum": 0},
     "height": {"type": "number", "minimum": 0}}, "required": ["kind", "width", "height"],
     "additionalProperties": false}]},
  "color": {"type": "string", "enum": ["red", "green", "blue"]}},
 "required": ["id", "shape", "color"], "additionalProperties": false}
EOF
# Strings: minLength/maxLength and pattern (classes, groups, bounded and open quantifiers, escapes).
schema product 128 "Describe a product in a web shop as JSON." <<'EOF'
{"type": "object", "properties": {
  "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
  "slug": {"type": "string", "pattern": "^[a-z0-9]{1,12}(-[a-z0-9]{1,12}){0,3}$"},
  "name": {"type": "string", "minLength": 3, "maxLength": 40},
  "summary": {"type": "string", "minLength": 10, "maxLength": 80},
  "color": {"type": "string", "pattern": "^#[0-9a-fA-F]{6}$"},
  "version": {"type": "string", "pattern": "^v?\\d+\\.\\d+(\\.\\d+)?$"}},
 "required": ["sku", "slug", "name", "summary", "color", "version"], "additionalProperties": false}
EOF
# format: uuid, date, date-time, time, email.
schema event 128 "Describe a concert as JSON." <<'EOF'
{"type": "object", "properties": {
  "id": {"type": "string", "format": "uuid"},
  "title": {"type": "string", "maxLength": 50},
  "date": {"type": "string", "format": "date"},
  "starts_at": {"type": "string", "format": "date-time"},
  "doors_open": {"type": "string", "format": "time"},
  "contact": {"type": "string", "format": "email"}},
 "required": ["id", "title", "date", "starts_at", "doors_open", "contact"], "additionalProperties": false}
EOF
# number, integer minimum/maximum and exclusive bounds, boolean, null.
schema weather 96 "Give a weather report for a city as JSON." <<'EOF'
{"type": "object", "properties": {
  "city": {"type": "string", "maxLength": 30},
  "temperature_c": {"type": "number"},
  "humidity_percent": {"type": "integer", "minimum": 0, "maximum": 100},
  "wind_kmh": {"type": "number", "minimum": 0},
  "pressure_hpa": {"type": "integer", "exclusiveMinimum": 800, "exclusiveMaximum": 1100},
  "raining": {"type": "boolean"},
  "warning": {"type": "null"}},
 "required": ["city", "temperature_c", "humidity_percent", "wind_kmh", "pressure_hpa", "raining", "warning"],
 "additionalProperties": false}
EOF
# type lists, with keywords for the listed types.
schema contact 96 "Describe an address-book contact as JSON." <<'EOF'
{"type": "object", "properties": {
  "first_name": {"type": "string", "maxLength": 30},
  "middle_name": {"type": ["string", "null"], "maxLength": 30},
  "age": {"type": ["integer", "null"], "minimum": 0, "maximum": 120},
  "favorite": {"type": ["boolean", "string"]},
  "phones": {"type": ["array", "null"], "items": {"type": "string", "maxLength": 20}, "maxItems": 2}},
 "required": ["first_name", "middle_name", "age", "phones"], "additionalProperties": false}
EOF

# ---- running tandem and validating ---------------------------------------------------------------------------
# gen NAME MODE FLAGS...: tandem on NAME's prompt and schema with --stats; $tmp/NAME.MODE.out/.err; one check: it
# exits 0, stops before -n (an answer cut off is not JSON), and its stdout validates against the schema.
gen() {
  local name=$1 mode=$2
  shift 2
  local f="$tmp/$name.$mode"
  "$tandem" -p "${prompt[$name]}" -n "${npredict[$name]}" --json-schema @"$tmp/$name.json" --stats "$@" \
    >"$f.out" 2>"$f.err"
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    bad "$name, $mode: tandem exited $rc: $(tail -1 "$f.err")"
  elif grep -q '(stop: length)' "$f.err"; then
    bad "$name, $mode: the answer ran into -n ${npredict[$name]} before the JSON ended: $(head -c 400 "$f.out")"
  elif ! "$py" "$validator" "$tmp/$name.json" <"$f.out" 2>"$f.why"; then
    bad "$name, $mode: the answer does not validate: $(head -3 "$f.why" | tr '\n' ' ')-- the answer:" \
      "$(head -c 600 "$f.out")"
  else
    ok
  fi
}
same_text() {  # NAME MODE OTHER_MODE WHAT
  check "$1: $4" cmp -s "$tmp/$1.$2.out" "$tmp/$1.$3.out"
}
phase_start=$SECONDS
phase() {  # NAME: the seconds since the last phase, on stderr
  echo "structured_output: $1: $((SECONDS - phase_start)) s" >&2
  phase_start=$SECONDS
}

# ---- drafting under a grammar ---------------------------------------------------------------------------------
# A drafted or --lookup run under a schema really drafts: the stats block has the "speculative:" line of
# SpeculativeStats::summary, and over a mode's runs some tokens were drafted.
declare -A drafted_total
check_drafting_under_grammar() {  # MODE WHAT STDERR_FILE
  local mode=$1 what=$2 err=$3 line drafted
  line=$(grep '^speculative:' "$err")
  if [[ -z $line ]]; then
    bad "drafting under a grammar: $what: no speculative section in --stats"
    return
  fi
  ok
  drafted=$(sed -n 's/.* \([0-9][0-9]*\) drafted,.*/\1/p' <<<"$line")
  drafted_total[$mode]=$((${drafted_total[$mode]:-0} + ${drafted:-0}))
}
check_drafted_some() {  # MODE
  check "drafting under a grammar: $1 runs drafted tokens (${drafted_total[$1]:-0} in all)" \
    [ "${drafted_total[$1]:-0}" -gt 0 ]
}

# ---- every schema, greedy (the default draft, as a plain run) ------------------------------------------------
for name in "${schemas[@]}"; do
  gen "$name" greedy --temp 0
done
phase "${#schemas[@]} schemas greedy"

# ---- --no-draft: valid, and the greedy text (drafting never changes a greedy answer) ------------------------
for name in person library shape event; do
  gen "$name" nodraft --temp 0 --no-draft
  same_text "$name" nodraft greedy "--no-draft gives the greedy text"
done
phase "--no-draft"

# ---- sampled with a seed (--no-draft), then the same seed with the default draft: valid, the same text --------
seed=3
for name in person shopping product weather; do
  seed=$((seed + 4))
  gen "$name" sampled --temp 0.8 --seed "$seed" --no-draft
  gen "$name" drafted --temp 0.8 --seed "$seed"
  same_text "$name" drafted sampled "the default draft gives --no-draft's text for seed $seed"
  check_drafting_under_grammar drafted "$name, drafted (seed $seed)" "$tmp/$name.drafted.err"
done
check_drafted_some drafted
phase "sampled and drafted"

# ---- --lookup, greedy: valid, the greedy text -----------------------------------------------------------------
for name in library tree contact; do
  gen "$name" lookup --temp 0 --lookup
  same_text "$name" lookup greedy "--lookup gives the greedy text"
  check_drafting_under_grammar lookup "$name, --lookup" "$tmp/$name.lookup.err"
done
check_drafted_some lookup
phase "--lookup"

# ---- --output-format jsonl: the record's text validates, and is the greedy text -------------------------------
"$tandem" -p "${prompt[person]}" -n "${npredict[person]}" --json-schema @"$tmp/person.json" --temp 0 \
  --output-format jsonl >"$tmp/person.jsonl" 2>"$tmp/person.jsonl.err"
check "jsonl: exits 0" [ $? -eq 0 ]
if "$py" "$validator" --jsonl-text "$tmp/person.json" <"$tmp/person.jsonl" 2>"$tmp/person.jsonl.why"; then
  ok
else
  bad "jsonl: the record's text does not validate: $(head -3 "$tmp/person.jsonl.why" | tr '\n' ' ')"
fi
jsonl_text=$("$py" -c 'import json, sys; sys.stdout.write(json.loads(sys.stdin.read())["text"])' \
  <"$tmp/person.jsonl" 2>/dev/null)
check "jsonl: the record's text is the greedy answer" [ "$jsonl_text" = "$(cat "$tmp/person.greedy.out")" ]
phase "jsonl"

# ---- GBNF grammars on the default model -------------------------------------------------------------------------
# grammar_run WHAT PROMPT GRAMMAR ERE: greedy, the whole answer matches ERE.
grammar_run() {
  local what=$1 p=$2 g=$3 ere=$4
  out=$("$tandem" -p "$p" -n 48 --temp 0 --grammar "$g" 2>"$tmp/gbnf.err")
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    bad "grammar, $what: tandem exited $rc: $(tail -1 "$tmp/gbnf.err")"
  elif ! grep -qxE -e "$ere" <<<"$out"; then
    bad "grammar, $what: the answer does not match $ere: $out"
  else
    ok
  fi
}
grammar_run "yes or no" "Is the Pacific the largest ocean on Earth? Answer yes or no." \
  'root ::= "yes" | "no"' '(yes|no)'
check "grammar, yes or no: the sensible answer" [ "$out" = "yes" ]
grammar_run "comma-separated numbers" "List the first eight prime numbers." \
  'root ::= num ("," " "? num){1,11}
num ::= "-"? [0-9]{1,6}' '-?[0-9]{1,6}(, ?-?[0-9]{1,6}){1,11}'
grammar_run "an arithmetic expression" \
  "Write an arithmetic expression that equals 24 using the numbers 3, 8, 1 and 2." \
  'root ::= expr
expr ::= term ([-+] term)*
term ::= factor ([*/] factor)*
factor ::= [0-9]{1,4} | "(" expr ")"' '[-+*/()0-9]+'
# The regex cannot see nesting: Python parses it (only digits, operators and parentheses got this far).
check "grammar, an arithmetic expression: it parses ($out)" \
  "$py" -c 'import ast, sys; ast.parse(sys.argv[1], mode="eval")' "$out"
phase "grammars"

finish
