#!/usr/bin/env bash
# End-to-end checks of speculative decoding from the command line: --draft and --lookup give the same greedy text
# as plain decoding, and the same sampled text for a seed (at any draft length, threads, chunk), --stats reports the speculative figures, and a draft with another vocabulary is a clear error.
# Usage: speculative.sh BUILD_DIR DATA_DIR
set -uo pipefail
build=$1 data=$2
tandem="$build/tandem"
model="$data/stories260K.gguf"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.bash"

"$build/tandem-quantize" "$model" "$tmp/q4_0.gguf" q4_0 2>/dev/null
check "quantize a draft" [ -s "$tmp/q4_0.gguf" ]

for prompt in "Once upon a time" "Sam was sad because"; do
  plain=$("$tandem" -m "$model" -p "$prompt" -n 150 --temp 0 -t 1 2>/dev/null)
  spec=$("$tandem" -m "$model" -p "$prompt" -n 150 --temp 0 -t 1 --draft "$tmp/q4_0.gguf" --draft-min 2 2>/dev/null)
  look=$("$tandem" -m "$model" -p "$prompt" -n 150 --temp 0 -t 1 --lookup --draft-min 1 2>/dev/null)
  both=$("$tandem" -m "$model" -p "$prompt" -n 150 --temp 0 -t 1 --lookup --draft "$tmp/q4_0.gguf" 2>/dev/null)
  check "--draft equals plain ($prompt)" [ "$spec" = "$plain" ]
  check "--lookup equals plain ($prompt)" [ "$look" = "$plain" ]
  check "--lookup --draft equals plain ($prompt)" [ "$both" = "$plain" ]
done

# Sampled: a seed gives the text of plain decoding with any drafting (--spec-sampling coupled, the default), and
# --spec-sampling rejection is a choice the CLI takes (its text may differ from plain decoding's: not compared).
for seed in 5 77; do
  plain=$("$tandem" -m "$model" -p "Once upon a time" -n 80 --temp 0.8 --seed $seed -t 1 2>/dev/null)
  spec=$("$tandem" -m "$model" -p "Once upon a time" -n 80 --temp 0.8 --seed $seed -t 1 --draft "$tmp/q4_0.gguf" 2>/dev/null)
  fixed=$("$tandem" -m "$model" -p "Once upon a time" -n 80 --temp 0.8 --seed $seed -t 2 --draft "$tmp/q4_0.gguf" \
    --draft-min 7 --draft-max 7 --chunk 1 2>/dev/null)
  look=$("$tandem" -m "$model" -p "Once upon a time" -n 80 --temp 0.8 --seed $seed --lookup --draft-min 1 2>/dev/null)
  check "sampled, seed $seed: --draft equals plain" [ -n "$plain" -a "$spec" = "$plain" ]
  check "sampled, seed $seed: a fixed draft length, 2 threads, chunk 1 equal plain" [ "$fixed" = "$plain" ]
  check "sampled, seed $seed: --lookup equals plain" [ "$look" = "$plain" ]
done
rej1=$("$tandem" -m "$model" -p "Once upon a time" -n 40 --temp 0.8 --seed 5 --draft "$tmp/q4_0.gguf" \
  --draft-min 3 --draft-max 3 --spec-sampling rejection 2>"$tmp/err")
check "--spec-sampling rejection runs" [ $? -eq 0 -a -n "$rej1" ]
rej2=$("$tandem" -m "$model" -p "Once upon a time" -n 40 --temp 0.8 --seed 5 --draft "$tmp/q4_0.gguf" \
  --draft-min 3 --draft-max 3 --spec-sampling rejection 2>/dev/null)
check "--spec-sampling rejection at a fixed draft length reproduces its seed" [ "$rej1" = "$rej2" ]
"$tandem" -m "$model" -p hi --spec-sampling sometimes >/dev/null 2>"$tmp/err"
rc=$?
check_all "--spec-sampling: an unknown scheme is a usage error" [ $rc -ne 0 ] ::: grep -q "spec-sampling" "$tmp/err"

"$tandem" -m "$model" -p "Once upon a time" -n 100 --temp 0 --draft "$tmp/q4_0.gguf" --draft-min 2 --stats \
  >"$tmp/out" 2>"$tmp/err"
for key in "drafted" "accepted" "mean accepted" "accepted lengths" "time split" "effective decode"; do
  check "--stats reports '$key'" grep -q "$key" "$tmp/err"
done
check "--stats keeps stdout to text" bash -c "! grep -q drafted '$tmp/out'"

# A draft whose vocabulary differs (a synthetic model's made-up vocabulary) is refused before anything runs.
"$build/tandem-bench" --make-synthetic tiny --type q8_0 -o "$tmp/other-vocab.gguf" 2>/dev/null
"$tandem" -m "$model" -p "Once upon a time" -n 10 --draft "$tmp/other-vocab.gguf" >"$tmp/out" 2>"$tmp/err"
rc=$?
check_all "vocabulary mismatch: non-zero exit" [ $rc -ne 0 ] ::: [ $rc -lt 128 ]
check "vocabulary mismatch: nothing on stdout" [ ! -s "$tmp/out" ]
check "vocabulary mismatch: the error says why" grep -q "vocabulary" "$tmp/err"
"$tandem" -m "$model" -p hi --draft-min 5 --draft-max 2 >/dev/null 2>"$tmp/err"
check "draft-min > draft-max is a usage error" [ $? -ne 0 ]

echo "speculative: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
