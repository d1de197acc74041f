#!/usr/bin/env bash
# End-to-end checks of --grammar, --grammar-file and --json-schema on the tiny stories260K: the output follows the
# grammar, a bad grammar or schema is an error on stderr (with line and column, or naming the keyword) and an exit
# status of 1 with nothing on stdout, the three flags exclude one another, and a draft with lookup under a grammar
# drafts and gives plain decoding's output; in --chat over a pipe every answer follows the grammar from its own start
# (with --output-format jsonl: one record per answer), the /grammar commands work in the pipe too, and a reasoning
# template with thinking on keeps its reasoning free. The interactive chat's commands are checked in repl.sh. The
# engine itself is unit-tested (test_grammar.cpp, test_json_schema.cpp, test_constrained_generation.cpp; drafting
# under a grammar: test_speculative.cpp).
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
plain=$(run --temp 0 --grammar 'root ::= [a-z ]+ "."' 2>/dev/null)
drafted=$(run --temp 0 --draft "$model" --draft-min 1 --lookup --grammar 'root ::= [a-z ]+ "."' --stats 2>"$tmp/err")
check "a draft and lookup under a grammar: plain decoding's output" [ "$drafted" = "$plain" ]
check "a draft under a grammar: it drafted" grep -qE '[1-9][0-9]* drafted' "$tmp/err"

# ---- --chat over a pipe ---------------------------------------------------------------------------------------
# Two turns under a schema: each answer line is the schema's JSON, the second one too (it starts afresh, after the
# first answer and the second turn in the conversation).
chat() { "$tandem" -m "$model" --chat --temp 0 "$@"; }
printf 'one\ntwo\n' | chat -n 80 --json-schema @"$tmp/schema.json" >"$tmp/out" 2>"$tmp/err"
check "--chat --json-schema exits 0" [ $? -eq 0 ]
# shellcheck disable=SC2016
check "--chat --json-schema: two answers, each an object with an integer n" python3 -c '
import json, sys
lines = open(sys.argv[1]).read().split("\n")
assert len(lines) == 3 and lines[2] == "", lines
for line in lines[:2]:
    v = json.loads(line)
    assert list(v) == ["n"] and isinstance(v["n"], int), line
' "$tmp/out"
check "--chat --json-schema: a summary per answer on stderr" [ "$(grep -c 'tokens' "$tmp/err")" -eq 2 ]
printf 'one\ntwo\n' | chat -n 80 --json-schema @"$tmp/schema.json" --output-format jsonl >"$tmp/out" 2>/dev/null
check "--chat jsonl: one record per answer, its text the schema's JSON" python3 -c '
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 2, lines
for line in lines:
    r = json.loads(line)
    v = json.loads(r["text"])
    assert list(v) == ["n"] and isinstance(v["n"], int), r
    assert r["stop"] == "eos" and r["generated_tokens"] > 0 and r["prompt_tokens"] > 0, r
' "$tmp/out"
# The commands in a pipe: a grammar for one turn, off for the next; a bad one is an error on stderr, the chat goes on.
printf '%s\n' '/grammar root ::= "yes" | "no"' 'one' '/grammar off' 'two' '/grammar root ::= (' 'three' |
  chat -n 10 >"$tmp/out" 2>"$tmp/err"
mapfile -t answers <"$tmp/out"
check "--chat /grammar: the answer follows it" grep -qxE '(yes|no)' <<<"${answers[0]:-}"
check "--chat /grammar off: free text again" [ "${#answers[1]}" -gt 3 ]
check "--chat: a bad /grammar is an error with line and column" grep -q 'error: gbnf: line 1, column' "$tmp/err"
check "--chat: the turn after a bad /grammar is answered" [ "${#answers[@]}" -eq 3 ]
# A reasoning template with thinking on: the reasoning stays free (the story model never closes it, so it is all
# reasoning, the same as without a grammar: stderr's lines but the turn summary with its timing) and the answer,
# which never comes, would follow the grammar.
printf 'one\n' | chat -n 10 --chat-template deepseek-r1 >/dev/null 2>"$tmp/free"
printf 'one\n' | chat -n 10 --chat-template deepseek-r1 --grammar 'root ::= "a"' >"$tmp/out" 2>"$tmp/err"
check_all "--chat: a reasoning template with thinking on keeps its reasoning free under a grammar" [ $? -eq 0 ] ::: \
  [ "$(grep -v '^\[' "$tmp/free")" = "$(grep -v '^\[' "$tmp/err")" ] ::: [ -n "$(grep -v '^\[' "$tmp/err")" ] ::: \
  [ -z "$(tr -d '\n' <"$tmp/out")" ]
printf 'one\n' | chat -n 10 --chat-template deepseek-r1 --think off --grammar 'root ::= "a" "b"?' >"$tmp/out" 2>/dev/null
check "--chat: with --think off the grammar applies" grep -qxE 'ab?' "$tmp/out"

echo "grammar: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
