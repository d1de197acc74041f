#!/usr/bin/env bash
# End-to-end checks of --output-format jsonl on the tiny stories260K: stdout is exactly one JSON object per answer,
# with the documented fields (docs/usage.md, "Output contract") and the same text as the plain output; drafting adds
# its fields; under a grammar the text follows it; --chat over a pipe writes one record per answer with the answer
# lines' text; the interactive chat refuses it; a bad value is a usage error.
# Usage: output_format.sh BUILD_DIR DATA_DIR
set -uo pipefail
build=$1 data=$2
tandem="$build/tandem"
model="$data/stories260K.gguf"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export HOME="$tmp/home" XDG_STATE_HOME="$tmp/state"
source "$(dirname "$0")/lib/checks.bash"
run() { "$tandem" -m "$model" -p "Once upon a time" -n 24 --temp 0 "$@"; }

plain=$(run 2>/dev/null)
run --output-format jsonl >"$tmp/out" 2>"$tmp/err"
check "jsonl exits 0" [ $? -eq 0 ]
check "jsonl: one line on stdout" [ "$(wc -l <"$tmp/out")" -eq 1 ]
# shellcheck disable=SC2016
check "jsonl: the record's fields, and the plain run's text" python3 -c '
import json, sys
r = json.loads(open(sys.argv[1]).read())
assert r["text"] == sys.argv[2], (r["text"], sys.argv[2])
assert r["prompt_tokens"] == 5 and r["generated_tokens"] == 24 and r["stop"] == "length", r
for k in ("time_to_first_token_s", "prefill_tokens_per_s", "decode_tokens_per_s"):
    assert isinstance(r[k], (int, float)) and r[k] >= 0, k
assert "drafted" not in r and "reasoning" not in r
' "$tmp/out" "$plain"
run --output-format jsonl --draft "$model" >"$tmp/out" 2>/dev/null
check "jsonl with a draft: drafted, accepted, acceptance" python3 -c '
import json, sys
r = json.loads(open(sys.argv[1]).read())
assert r["drafted"] >= r["accepted"] > 0 and 0 < r["acceptance"] <= 1, r
' "$tmp/out"
run --output-format jsonl --grammar 'root ::= [a-z ]+ "."' >"$tmp/out" 2>/dev/null
check "jsonl under a grammar: the text follows it, and the stop is eos" python3 -c '
import json, re, sys
r = json.loads(open(sys.argv[1]).read())
assert re.fullmatch(r"[a-z ]+\.", r["text"]) and r["stop"] == "eos", r
' "$tmp/out"
# A text with a quote, a backslash, a tab, a newline and a control character, forced by a grammar.
run --output-format jsonl --grammar 'root ::= "say \"hi\" \\ \t\n\x01."' >"$tmp/out" 2>/dev/null
check "jsonl: quotes, backslashes and control characters are escaped" python3 -c '
import json, sys
r = json.loads(open(sys.argv[1]).read())
assert r["text"] == "say \"hi\" \\ \t\n\x01.", repr(r["text"])
' "$tmp/out"
printf 'one\ntwo\n' | "$tandem" -m "$model" --chat -n 12 --temp 0 >"$tmp/chat_text" 2>/dev/null
printf 'one\n/stats\ntwo\n' | "$tandem" -m "$model" --chat -n 12 --temp 0 --output-format jsonl >"$tmp/out" 2>"$tmp/err"
check "--chat jsonl exits 0" [ $? -eq 0 ]
check "--chat jsonl: a record per answer, with the text of the answer lines" python3 -c '
import json, sys
records = [json.loads(line) for line in open(sys.argv[1]).read().splitlines()]
texts = open(sys.argv[2]).read().split("\n")[:-1]
assert len(texts) == 2 and [r["text"] for r in records] == texts, (records, texts)
assert all(r["generated_tokens"] == 12 and r["stop"] == "length" for r in records), records
' "$tmp/out" "$tmp/chat_text"
check "--chat jsonl: a command's output still goes to stderr" grep -q 'prefilled this turn' "$tmp/err"
# The interactive chat (a terminal on stdin) writes text for a person: jsonl is refused before the model loads.
check "the interactive chat refuses jsonl" python3 - "$tandem" "$model" <<'EOF'
import os, pty, subprocess, sys
_, slave = pty.openpty()
p = subprocess.run([sys.argv[1], "-m", sys.argv[2], "--output-format", "jsonl"], stdin=slave, capture_output=True,
                   timeout=60)
assert p.returncode == 1 and p.stdout == b"" and b"--output-format jsonl is for scripts" in p.stderr, p
EOF
run --output-format xml >/dev/null 2>"$tmp/err"
check "--output-format xml is a usage error" [ $? -ne 0 ]

echo "output_format: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
