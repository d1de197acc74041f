#!/usr/bin/env bash
# End-to-end checks of tandem --batch on the tiny stories260K: one record per non-blank line, with the line's id (or
# its number), in finishing order (lines run together by continuous batching; in input order with --parallel 1);
# every record the same with 2, 3 or 16 lines in flight as one after another; the command line's flags as defaults
# and the line's fields over them; a greedy answer byte-identical to `tandem -p`'s, a seeded one identical to
# `-p --seed`'s (also with a draft, and with --seed as the default); a json_schema line's text valid against it; a stop string; bad lines as error records while the others
# run, and exit 1; stdin with -; a closed pipe; progress on a terminal only; the flags --batch refuses.
# Usage: batch.sh BUILD_DIR DATA_DIR
set -uo pipefail
build=$1 data=$2
tandem="$build/tandem"
model="$data/stories260K.gguf"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export HOME="$tmp/home" XDG_STATE_HOME="$tmp/state"
source "$(dirname "$0")/lib/checks.bash"
# batch ARGS: the tandem run, which notes its --batch input for records.py (lines run by continuous batching finish
# in any order: the checks read the records put back in input order).
batch() {
  local prev=""
  for a in "$@"; do [ "$prev" = "--batch" ] && echo "$a" >"$tmp/last_input"; prev=$a; done
  "$tandem" -m "$model" -n 12 --temp 0 "$@"
}
one_shot() { "$tandem" -m "$model" "$@"; }

# records.py RECORDS CHECKS: runs the Python CHECKS with `r` the list of records (each parsed, its line kept as
# r[i]["_line"]) in the order of the last batch's input lines (each id once), the order they came in as
# `finished`, and the helper text(path) that reads a one-shot run's stdout exactly.
cat >"$tmp/records.py" <<'EOF'
import json, os, sys
def text(path):
    return open(path, encoding="utf-8").read()
r = []
for line in open(sys.argv[1], encoding="utf-8").read().splitlines():
    rec = json.loads(line)
    assert next(iter(rec)) == "id", line  # the id comes first
    rec["_line"] = line
    r.append(rec)
finished = [x["id"] for x in r]
last = os.path.join(os.path.dirname(sys.argv[0]), "last_input")
source = open(last).read().strip() if os.path.exists(last) else "-"
if source != "-":
    ids = []
    for number, line in enumerate(open(source, encoding="utf-8").read().splitlines(), 1):
        if not line.strip():
            continue
        try:
            v = json.loads(line)
        except ValueError:
            v = None
        ids.append(v["id"] if isinstance(v, dict) and "id" in v else number)
    assert sorted(map(repr, finished)) == sorted(map(repr, ids[: len(r)])) or len(r) < len(ids), (finished, ids)
    r.sort(key=lambda x: ids.index(x["id"]))
exec(sys.argv[2])
EOF
records() { python3 "$tmp/records.py" "$@"; }

# ---- good lines: ids, defaults and overrides, the one-shot texts ------------------------------------------------
cat >"$tmp/good.jsonl" <<'EOF'
{"prompt": "Once upon a time"}

{"id": "lily", "prompt": "Lily", "temp": 1, "seed": 42, "n_predict": 30}
{"id": 17, "prompt": "Once upon a time", "n_predict": 5}
{"id": 1.50, "prompt": "The dog", "n_predict": 40, "stop": ["."]}
{"prompt": "Tom", "n_predict": 60, "json_schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": false}}
{"prompt": "Once upon a time", "system": "Be brief.", "n_predict": 8, "stop": []}
EOF
one_shot -p "Once upon a time" -n 12 --temp 0 >"$tmp/greedy" 2>/dev/null
one_shot -p "Lily" -n 30 --temp 1 --seed 42 >"$tmp/seeded" 2>/dev/null
one_shot -p "The dog" -n 40 --temp 0 --stop "." >"$tmp/stopped" 2>/dev/null
batch --batch "$tmp/good.jsonl" >"$tmp/out" 2>"$tmp/err"
check "good lines: exit 0" [ $? -eq 0 ]
check "good lines: nothing on stderr" [ ! -s "$tmp/err" ]
check "good lines: a record per non-blank line, in order, with the given id or the line number" records "$tmp/out" '
assert [x["id"] for x in r] == [1, "lily", 17, 1.5, 6, 7], [x["id"] for x in r]
assert "\"id\": 1.50," in r[3]["_line"], r[3]["_line"]  # a number id as it was written
for x in r:
    assert "error" not in x, x
    for k in ("text", "prompt_tokens", "generated_tokens", "stop", "time_to_first_token_s", "prefill_tokens_per_s",
              "decode_tokens_per_s"):
        assert k in x, (k, x)
'
check "defaults and overrides: -n for a line without n_predict, the line's n_predict otherwise" records "$tmp/out" '
assert r[0]["generated_tokens"] == 12 and r[0]["stop"] == "length", r[0]
assert r[2]["generated_tokens"] == 5 and r[2]["stop"] == "length", r[2]
assert r[5]["generated_tokens"] == 8, r[5]
'
check "a greedy line is byte-identical to the one-shot run" records "$tmp/out" '
assert r[0]["text"] == text(sys.argv[3]), (r[0]["text"], text(sys.argv[3]))
assert text(sys.argv[3]).startswith(r[2]["text"]) and len(r[2]["text"]) < len(r[0]["text"])
' "$tmp/greedy"
check "a seeded line (temp 1, seed 42) is identical to the one-shot run with that seed" records "$tmp/out" '
assert r[1]["text"] == text(sys.argv[3]) and r[1]["generated_tokens"] == 30, (r[1], text(sys.argv[3]))
' "$tmp/seeded"
check "a stop string cuts the line's text as --stop does" records "$tmp/out" '
assert r[3]["stop"] == "stop_string" and r[3]["text"] == text(sys.argv[3]), (r[3], text(sys.argv[3]))
' "$tmp/stopped"
check "a json_schema line: its text is JSON valid against the schema" records "$tmp/out" '
v = json.loads(r[4]["text"])
assert r[4]["stop"] == "eos" and isinstance(v, dict) and list(v) == ["n"] and isinstance(v["n"], int), r[4]
'

# The command line's seed is every line's default; with a draft the seeded text is the same.
echo '{"prompt": "Lily", "temp": 1, "n_predict": 30}' >"$tmp/noseed.jsonl"
one_shot -p "Lily" -n 30 --temp 1 --seed 7 >"$tmp/seed7" 2>/dev/null
batch --batch "$tmp/noseed.jsonl" --seed 7 >"$tmp/out" 2>/dev/null
check "--seed is the default seed of a line without one" records "$tmp/out" '
assert r[0]["text"] == text(sys.argv[3]), (r[0], text(sys.argv[3]))' "$tmp/seed7"
# Without --seed each line draws its own, as separate runs would: the same sampled prompt twice, two texts.
printf '%s\n%s\n' "$(cat "$tmp/noseed.jsonl")" "$(cat "$tmp/noseed.jsonl")" >"$tmp/twice.jsonl"
batch --batch "$tmp/twice.jsonl" >"$tmp/out" 2>/dev/null
check "without --seed, each line its own seed" records "$tmp/out" 'assert r[0]["text"] != r[1]["text"], r'
# A sampled line's record says the seed it ran with, drawn or given; a greedy line's has none.
seed=$(python3 -c 'import json, sys; print(json.loads(open(sys.argv[1]).readline())["seed"])' "$tmp/out")
one_shot -p "Lily" -n 30 --temp 1 --seed "$seed" >"$tmp/reseeded" 2>/dev/null
check "a drawn seed is in the record, and reproduces the line's text" records "$tmp/out" '
x = [y for y in r if y["seed"] == int(sys.argv[4])][0]
assert x["text"] == text(sys.argv[3]), (x, text(sys.argv[3]))
assert r[0]["seed"] != r[1]["seed"], r
' "$tmp/reseeded" "$seed"
batch --batch "$tmp/good.jsonl" >"$tmp/out" 2>/dev/null
check "seed in the record: the given seed for a sampled line, none for a greedy one" records "$tmp/out" '
assert r[1]["seed"] == 42 and "seed" not in r[0], (r[0], r[1])'
batch --batch "$tmp/good.jsonl" --draft "$model" >"$tmp/out" 2>/dev/null
check "with a draft, lines in flight together (plain decoding): the same greedy and seeded texts" records "$tmp/out" '
assert r[0]["text"] == text(sys.argv[3]) and r[1]["text"] == text(sys.argv[4]), (r[0], r[1])
' "$tmp/greedy" "$tmp/seeded"
batch --batch "$tmp/good.jsonl" --draft "$model" --parallel 1 >"$tmp/out" 2>/dev/null
check "with a draft and --parallel 1: the same greedy and seeded texts, and drafting fields" records "$tmp/out" '
assert r[0]["text"] == text(sys.argv[3]) and r[1]["text"] == text(sys.argv[4]), (r[0], r[1])
assert r[0]["drafted"] >= r[0]["accepted"] > 0, r[0]
' "$tmp/greedy" "$tmp/seeded"

# ---- continuous batching: several lines in flight, the same records as one after another ------------------------
batch --batch "$tmp/good.jsonl" --parallel 1 >"$tmp/serial" 2>/dev/null
check "--parallel 1: the records in input order" records "$tmp/serial" 'assert finished == [1, "lily", 17, 1.5, 6, 7], finished'
for n in 2 3 16; do
  batch --batch "$tmp/good.jsonl" --parallel $n >"$tmp/out" 2>/dev/null
  check "--parallel $n: every record's text, tokens and stop as one after another" records "$tmp/out" '
s = [json.loads(l) for l in open(sys.argv[3]).read().splitlines()]
for a, b in zip(r, s):
    assert (a["id"], a["text"], a["generated_tokens"], a["stop"]) == (b["id"], b["text"], b["generated_tokens"], b["stop"]), (a, b)
' "$tmp/serial"
done
# Records are written as lines finish: a short line after a long one comes first.
printf '%s\n' '{"id": "long", "prompt": "Once upon a time", "n_predict": 120}' \
  '{"id": "short", "prompt": "Once upon a time", "n_predict": 3}' >"$tmp/order.jsonl"
batch --batch "$tmp/order.jsonl" >"$tmp/out" 2>/dev/null
check "by default lines run together: a short line after a long one finishes first" records "$tmp/out" '
assert finished == ["short", "long"], finished
assert r[1]["generated_tokens"] == 3 and r[0]["generated_tokens"] > 3, r'
"$tandem" -m "$model" --batch "$tmp/order.jsonl" --parallel 0 >"$tmp/out" 2>"$tmp/err"
check_all "--parallel 0 is refused" [ $? -ne 0 ] ::: grep -q -- "--parallel" "$tmp/err"

# Lines in flight and the on-disk prompt cache: a long shared start is saved by the first run's batch and loaded by
# the second's; the records are those of a run without the cache.
doc="Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine with her dog."
long="$doc $doc $doc $doc $doc $doc $doc $doc $doc $doc $doc $doc"
python3 - "$long" >"$tmp/cached.jsonl" <<'EOF'
import json, sys
for i, q in enumerate([" Lily", " The dog", " One day", " She"]):
    print(json.dumps({"id": i, "prompt": sys.argv[1] + q, "n_predict": 10}))
EOF
batch --batch "$tmp/cached.jsonl" --prompt-cache off >"$tmp/nocache" 2>/dev/null
batch --batch "$tmp/cached.jsonl" --prompt-cache "$tmp/pc" --stats >"$tmp/first" 2>"$tmp/err1"
batch --batch "$tmp/cached.jsonl" --prompt-cache "$tmp/pc" --stats >"$tmp/second" 2>"$tmp/err2"
check "prompt cache: the first batch saves, the second loads ($(grep -o '([0-9]* of them from the prompt cache)' "$tmp/err2"))" \
  grep -qE '\(([1-9][0-9]*) of them from the prompt cache\)' "$tmp/err2"
check "prompt cache: the first batch loaded nothing" grep -q '(0 of them from the prompt cache)' "$tmp/err1"
for run in first second; do
  check "prompt cache: the $run batch's records are those without the cache" records "$tmp/$run" '
s = {repr(x["id"]): x["text"] for x in map(json.loads, open(sys.argv[3]).read().splitlines())}
assert {repr(x["id"]): x["text"] for x in r} == s, (r, s)
' "$tmp/nocache"
done

# The command line's grammar applies to the lines without a schema of their own.
printf '%s\n' '{"prompt": "Once upon a time", "n_predict": 40}' \
  '{"prompt": "Tom", "n_predict": 40, "json_schema": {"enum": ["red", "green"]}}' >"$tmp/grammar.jsonl"
batch --batch "$tmp/grammar.jsonl" --grammar 'root ::= [a-z ]+ "."' >"$tmp/out" 2>/dev/null
check "--grammar for the lines without json_schema, the line's schema for the others" records "$tmp/out" '
import re
assert re.fullmatch(r"[a-z ]+\.", r[0]["text"]), r[0]
assert json.loads(r[1]["text"]) in ("red", "green"), r[1]
'

# ---- bad lines: error records, the other lines still run, exit 1 ------------------------------------------------
cat >"$tmp/bad.jsonl" <<'EOF'
{"prompt": "Once upon a time"}
not json
{"id": "no-prompt", "system": "x"}
{"id": "typo", "prompt": "Once upon a time", "temprature": 0.5}
{"prompt": "Tom", "json_schema": {"type": "frob"}}
{"prompt": "Once upon a time there was a little dog who lived in a big house with a garden"}
[1, 2]
{"prompt": "Lily", "n_predict": "ten"}
{"prompt": "Lily"}
EOF
batch --batch "$tmp/bad.jsonl" --ctx 16 >"$tmp/out" 2>"$tmp/err"
check "bad lines: exit 1" [ $? -eq 1 ]
check "bad lines: nothing on stderr" [ ! -s "$tmp/err" ]
check "bad lines: an error record each, naming what is wrong; the good lines answered" records "$tmp/out" '
assert [x["id"] for x in r] == [1, 2, "no-prompt", "typo", 5, 6, 7, 8, 9], [x["id"] for x in r]
errors = {x["id"]: x["error"] for x in r if "error" in x}
assert set(errors) == {2, "no-prompt", "typo", 5, 6, 7, 8}, errors
assert errors[2].startswith("JSON: line 1, column 1"), errors[2]
assert errors["no-prompt"] == "\"prompt\" is missing", errors
assert errors["typo"].startswith("unknown key \"temprature\""), errors
assert errors[5].startswith("\"json_schema\": ") and "frob" in errors[5], errors
assert "tokens but the context holds 16" in errors[6], errors
assert errors[7] == "a line must be a JSON object, got an array", errors
assert errors[8].startswith("\"n_predict\" must be an integer"), errors
assert "text" in r[0] and "text" in r[8], r
assert all(list(x) == ["id", "error", "_line"] for x in r if "error" in x), r
'

# ---- stdin, a closed pipe ---------------------------------------------------------------------------------------
batch --batch "$tmp/good.jsonl" >"$tmp/file_out" 2>/dev/null
echo - >"$tmp/last_input"
"$tandem" -m "$model" -n 12 --temp 0 --batch - <"$tmp/good.jsonl" >"$tmp/out" 2>"$tmp/err"
check_all "stdin (-): exit 0 and nothing on stderr" [ $? -eq 0 ] ::: [ ! -s "$tmp/err" ]
check "stdin (-): the file's records (ids and texts)" records "$tmp/out" '
f = [json.loads(l) for l in open(sys.argv[3]).read().splitlines()]
key = lambda x: repr(x["id"])
assert sorted([(key(x), x["text"]) for x in r]) == sorted([(key(x), x["text"]) for x in f]), (r, f)
' "$tmp/file_out"
yes '{"prompt": "Once upon a time", "n_predict": 100}' | head -n 200 >"$tmp/many.jsonl"
batch --batch "$tmp/many.jsonl" 2>"$tmp/err" | head -n 1 >"$tmp/out"
check "a closed pipe ends the run quietly with exit 0" [ "${PIPESTATUS[0]}" -eq 0 ]
check "a closed pipe: nothing on stderr" [ ! -s "$tmp/err" ]
check "a closed pipe: the record before it was whole" records "$tmp/out" 'assert len(r) == 1 and "text" in r[0]'

# ---- progress on stderr, on a terminal only ---------------------------------------------------------------------
check "progress: done/total, tokens/s and ETA on a terminal's stderr, stdout the records alone" python3 - "$tandem" \
  "$model" "$tmp/good.jsonl" <<'EOF'
import os, pty, subprocess, sys
master, slave = pty.openpty()
p = subprocess.run([sys.argv[1], "-m", sys.argv[2], "-n", "4", "--temp", "0", "--batch", sys.argv[3]],
                   stdout=subprocess.PIPE, stderr=slave, timeout=60)
os.close(slave)
err = b""
while True:
    try:
        chunk = os.read(master, 4096)
    except OSError:
        break
    if not chunk:
        break
    err += chunk
assert p.returncode == 0 and len(p.stdout.splitlines()) == 6, p
assert b"batch: 1/6 lines" in err and b"batch: 6/6 lines" in err and b"tokens/s" in err and b"ETA" in err, err
EOF

# ---- flags --batch refuses, and a missing file --------------------------------------------------------------------
expect_usage_error() {
  local what=$1; shift
  "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
  local rc=$?
  if [ $rc -ne 0 ] && [ $rc -lt 128 ] && [ ! -s "$tmp/out" ] && grep -q -- "--batch" "$tmp/err"; then ok; else
    bad "$what (rc=$rc, stderr: $(head -c 300 "$tmp/err"))"; fi
}
echo hi >"$tmp/prompt.txt"
expect_usage_error "--batch with -p" batch --batch "$tmp/good.jsonl" -p hi
expect_usage_error "--batch with -f" batch --batch "$tmp/good.jsonl" -f "$tmp/prompt.txt"
expect_usage_error "--batch with --chat" batch --batch "$tmp/good.jsonl" --chat
expect_usage_error "--batch with --output-format text" batch --batch "$tmp/good.jsonl" --output-format text
expect_usage_error "--batch with an empty name" batch --batch ""
batch --batch "$tmp/good.jsonl" --output-format jsonl >"$tmp/out" 2>/dev/null
check "--batch with --output-format jsonl: accepted (batch output is jsonl)" [ $? -eq 0 ]
"$tandem" -m "$tmp/no-model.gguf" --batch "$tmp/missing.jsonl" >"$tmp/out" 2>"$tmp/err"
check_all "a missing batch file: exit 1, named before any model loads" [ $? -eq 1 ] ::: \
  grep -q "missing.jsonl: cannot open the batch file" "$tmp/err" ::: [ ! -s "$tmp/out" ]

echo "batch: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
