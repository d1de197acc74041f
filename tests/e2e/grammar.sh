#!/usr/bin/env bash
# End-to-end checks of --grammar, --grammar-file and --json-schema on the tiny stories260K: the output follows the
# grammar, a bad grammar or schema is an error on stderr (with line and column, or naming the keyword) and an exit
# status of 1 with nothing on stdout, the three flags exclude one another, --chat refuses them for now, and a draft
# with lookup under a grammar drafts and gives plain decoding's output. The engine itself is unit-tested
# (test_grammar.cpp, test_json_schema.cpp, test_constrained_generation.cpp; drafting under a grammar:
# test_speculative.cpp).
# Usage: grammar.sh BUILD_DIR DATA_DIR
set -uo pipefail
build=$1 data=$2
tandem="$build/tandem"
model="$data/stories260K.gguf"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export HOME="$tmp/home" XDG_STATE_HOME="$tmp/state"
source "$(dirname "$0")/lib/checks.bash"
run() { "$tandem" -m "$model" -p "Once upon a time" -n 60 "$@"; }

# ---- the output follows the grammar, greedy and sampled ------------------------------------------------------
out=$(run --temp 0 --grammar 'root ::= [a-z ]+ "."' 2>"$tmp/err")
check "--grammar exits 0" [ $? -eq 0 ]
check "--grammar: lower-case words and a full stop" grep -qxE '[a-z ]+\.' <<<"$out"
for seed in 1 2 3; do
  out=$(run --temp 1 --seed "$seed" --grammar 'root ::= ("yes" | "no") " " [0-9]{1,3}' 2>/dev/null)
  check "--grammar sampled (seed $seed): yes or no and a number" grep -qxE '(yes|no) [0-9]{1,3}' <<<"$out"
done
printf 'root ::= word (" " word){2}\nword ::= [a-z]+  # three words\n' >"$tmp/three.gbnf"
out=$(run --temp 0 --grammar-file "$tmp/three.gbnf" 2>/dev/null)
check "--grammar-file: three words" grep -qxE '[a-z]+ [a-z]+ [a-z]+' <<<"$out"
echo '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": false}' \
  >"$tmp/schema.json"
out=$(run --temp 0 --json-schema @"$tmp/schema.json" 2>/dev/null)
ws='[[:space:]]*'
check "--json-schema @FILE: an object with an integer n" \
  grep -qxE "$ws\\{$ws\"n\"$ws:$ws-?[0-9]+$ws\\}$ws" <<<"$(tr -d '\n' <<<"$out")"
out=$(run --temp 0 --json-schema '{"enum": ["red", "green"]}' 2>/dev/null)
check "--json-schema inline enum" grep -qxE "$ws\"(red|green)\"$ws" <<<"$out"

# ---- errors --------------------------------------------------------------------------------------------------
run --grammar 'root ::= "a" | (' >"$tmp/out" 2>"$tmp/err"
check "a bad grammar exits 1" [ $? -eq 1 ]
check "a bad grammar: the error has line and column" grep -q 'line 1, column' "$tmp/err"
check "a bad grammar: nothing on stdout" [ ! -s "$tmp/out" ]
printf 'root ::= a\n' >"$tmp/undefined.gbnf"
run --grammar-file "$tmp/undefined.gbnf" >/dev/null 2>"$tmp/err"
check "an undefined rule is named" grep -q 'line 1, column 10' "$tmp/err"
run --json-schema '{"type": "string", "contentEncoding": "base64"}' >"$tmp/out" 2>"$tmp/err"
check "an unsupported schema keyword exits 1" [ $? -eq 1 ]
check "an unsupported schema keyword is named" grep -q 'contentEncoding' "$tmp/err"
run --json-schema '{"type": ' >/dev/null 2>"$tmp/err"
check "a schema that is not JSON: line and column" grep -q 'line 1, column' "$tmp/err"
run --grammar 'root ::= "a"' --json-schema '{}' >/dev/null 2>"$tmp/err"
check "--grammar and --json-schema exclude each other" [ $? -ne 0 ]
"$tandem" -m "$model" --chat --grammar 'root ::= "a"' </dev/null >/dev/null 2>"$tmp/err"
check "--chat refuses a grammar for now" grep -q 'one-shot runs for now' "$tmp/err"
plain=$(run --temp 0 --grammar 'root ::= [a-z ]+ "."' 2>/dev/null)
drafted=$(run --temp 0 --draft "$model" --draft-min 1 --lookup --grammar 'root ::= [a-z ]+ "."' --stats 2>"$tmp/err")
check "a draft and lookup under a grammar: plain decoding's output" [ "$drafted" = "$plain" ]
check "a draft under a grammar: it drafted" grep -qE '[1-9][0-9]* drafted' "$tmp/err"

echo "grammar: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
