#!/usr/bin/env bash
# End-to-end checks of tandem-bench's machine-readable modes, which scripts/compare-llamacpp drives: --json lines,
# the --serve request loops (pp/tg and speculative), --bandwidth, --unescape'd prompts; and that the comparison script refuses a missing
# model with the fetch-models hint before it installs or runs anything (scripts/bench-structured too). (The
# comparison itself is a benchmark and needs llama-cpp-python; it is not run here.)
# Usage: bench.sh BUILD_DIR DATA_DIR
set -uo pipefail
build=$1 data=$2
bench="$build/tandem-bench"
model="$data/stories260K.gguf"
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.bash"
json_ok() { python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1]) if l.strip()]' "$1"; }

"$bench" -m "$model" -p 32 -n 8 -r 1 -t 1 --json >"$tmp/json" 2>/dev/null
check "--json: exit 0" [ $? -eq 0 ]
check "--json: valid JSON lines" json_ok "$tmp/json"
check "--json: a pp and a tg line" [ "$(grep -c '"test":"[pt][pg]"' "$tmp/json")" -eq 2 ]

printf 'pp\ntg\nxx\ntg\nquit\n' | "$bench" -m "$model" --serve -p 32 -n 8 -t 1 >"$tmp/serve" 2>/dev/null
check "--serve: exit 0" [ $? -eq 0 ]
check "--serve: valid JSON lines" json_ok "$tmp/serve"
check "--serve: ready line first" bash -c "head -1 '$tmp/serve' | grep -q '\"ready\":true'"
check "--serve: one line per request" [ "$(wc -l <"$tmp/serve")" -eq 5 ]
check "--serve: unknown request is an error line" grep -q '"error"' "$tmp/serve"
check "--serve: tokens/s reported" [ "$(grep -c '"tokens_per_s"' "$tmp/serve")" -eq 3 ]
printf 'pp\n' | "$bench" -m "$model" --serve -p 16 -n 4 -t 1 >"$tmp/eof" 2>/dev/null
check_all "--serve: ends at EOF" [ $? -eq 0 ] ::: [ "$(wc -l <"$tmp/eof")" -eq 2 ]

"$bench" --bandwidth --bandwidth-mib 32 -r 2 -t 2 --json >"$tmp/bw" 2>/dev/null
check "--bandwidth: exit 0" [ $? -eq 0 ]
check "--bandwidth: a positive GB/s" python3 -c \
  'import json,sys; assert json.load(open(sys.argv[1]))["gb_per_s"] > 0' "$tmp/bw"

printf 'Once upon a time\\nthere was\nSam said \\"hi\\" and\\tleft\n' >"$tmp/prompts"
"$bench" -m "$model" --lookup --prompts "$tmp/prompts" --unescape -n 16 -r 1 -t 1 --json >"$tmp/spec" 2>/dev/null
check "--lookup --json: exit 0" [ $? -eq 0 ]
check "--lookup --json: valid JSON lines" json_ok "$tmp/spec"
# (The prompt is written by json_quote: a newline as \n, a tab as \t, a backslash as \\.)
check "--unescape: the newline reaches the prompt" grep -q 'Once upon a time\\nthere was' "$tmp/spec"
check "--unescape: other escapes stay, tabs become tabs" grep -q 'Sam said \\\\\\"hi\\\\\\" and\\tleft' "$tmp/spec"
# Sampled (--temp), through the sampler's candidates; and with every row whole (--whole-rows).
"$bench" -m "$model" --lookup --temp 0.8 --prompts "$tmp/prompts" --unescape -n 16 -r 1 -t 1 --json >"$tmp/spec_t" 2>/dev/null
check "--lookup --temp 0.8: exit 0" [ $? -eq 0 ]
check "--lookup --temp 0.8: valid JSON lines" json_ok "$tmp/spec_t"
"$bench" -m "$model" --lookup --temp 0.8 --whole-rows --prompts "$tmp/prompts" --unescape -n 16 -r 1 -t 1 --json \
    >"$tmp/spec_w" 2>/dev/null
check "--temp 0.8 --whole-rows: exit 0" [ $? -eq 0 ]
check "--temp 0.8 --whole-rows: valid JSON lines" json_ok "$tmp/spec_w"

printf 'plain 0\nspec 1\nspec 7\nquit\n' | "$bench" -m "$model" --lookup --prompts "$tmp/prompts" --unescape --serve \
  -n 16 -t 1 >"$tmp/specserve" 2>/dev/null
check "--lookup --serve: exit 0" [ $? -eq 0 ]
check "--lookup --serve: valid JSON lines" json_ok "$tmp/specserve"
check "--lookup --serve: ready, two runs, one error" bash -c "[ \$(grep -c '\"ready\":true' '$tmp/specserve') -eq 1 ] &&
  [ \$(grep -c '\"tokens_per_s\"' '$tmp/specserve') -eq 2 ] && [ \$(grep -c '\"error\"' '$tmp/specserve') -eq 1 ]"

# --record-agreement: a pair's greedy agreement along the target's output, a line of A:P steps a prompt; a model as
# its own draft agrees everywhere, sure of the token it then generates. --next-token-pattern replays such a file.
"$bench" -m "$model" --draft "$model" --prompts "$tmp/prompts" --unescape -n 12 -t 1 \
    --record-agreement "$tmp/agreement" >"$tmp/out" 2>"$tmp/err"
check_all "--record-agreement: exit 0, nothing on stdout" [ $? -eq 0 ] ::: [ ! -s "$tmp/out" ]
check_all "--record-agreement: a comment, then a line of 12 agreeing steps a prompt" \
    [ "$(grep -c '^#' "$tmp/agreement")" -eq 1 ] ::: [ "$(grep -vc '^#' "$tmp/agreement")" -eq 2 ] ::: \
    [ "$(grep -v '^#' "$tmp/agreement" | tr ' ' '\n' | grep -c '^1:[01]\.[0-9][0-9][0-9]$')" -eq 24 ]
"$bench" --make-synthetic tiny --type q4_0 --next-token-pattern "$tmp/agreement" -o "$tmp/replay.gguf" 2>"$tmp/err"
check_all "--next-token-pattern: the replaying model written" [ $? -eq 0 ] ::: [ -s "$tmp/replay.gguf" ]
"$bench" -m "$model" --record-agreement "$tmp/agreement2" -n 4 -t 1 >"$tmp/out" 2>"$tmp/err"
check_all "--record-agreement without --draft: exit 1, an error naming --draft" [ $? -eq 1 ] ::: grep -q -- "--draft" "$tmp/err"
echo "1:0.5 2:0.5" >"$tmp/bad-pattern"
"$bench" --make-synthetic tiny --next-token-pattern "$tmp/bad-pattern" -o "$tmp/bad.gguf" 2>"$tmp/err"
check_all "--next-token-pattern: a bad step is an error naming the file" [ $? -eq 1 ] ::: grep -q "bad-pattern:1" "$tmp/err"

# The comparison script: a missing model is a clear error naming scripts/fetch-models, before anything else.
TANDEM_MODELS_DIR="$tmp/none" python3 "$root/scripts/compare-llamacpp" --models smollm2 >"$tmp/out" 2>"$tmp/err"
rc=$?
check "compare-llamacpp: missing model exits 1" [ $rc -eq 1 ]
check "compare-llamacpp: the error names fetch-models" grep -q "scripts/fetch-models" "$tmp/err"
check "compare-llamacpp: nothing on stdout" [ ! -s "$tmp/out" ]
TANDEM_MODELS_DIR="$tmp/none" python3 "$root/scripts/compare-llamacpp" --spec-only --drafting both-and-more >"$tmp/out" 2>"$tmp/err"
rc=$?
check "compare-llamacpp: an unknown --drafting exits 2" [ $rc -eq 2 ]
check "compare-llamacpp: the error names the choices" grep -q "choose from 'both', 'draft', 'lookup'" "$tmp/err"
# scripts/bench-structured: the same refusal of a missing model (before the venv), and a --schema that is not JSON.
TANDEM_MODELS_DIR="$tmp/none" python3 "$root/scripts/bench-structured" --tandem "$build/tandem" >"$tmp/out" 2>"$tmp/err"
check_all "bench-structured: missing model exits 1 naming fetch-models" [ $? -eq 1 ] ::: \
  grep -q "scripts/fetch-models" "$tmp/err" ::: [ ! -s "$tmp/out" ]
python3 "$root/scripts/bench-structured" --schema '{"type": ' >"$tmp/out" 2>"$tmp/err"
check_all "bench-structured: a --schema that is not JSON exits 2" [ $? -eq 2 ] ::: grep -q "not JSON" "$tmp/err"

# --cuda-route: a route that does not exist is an error naming it; a retired TANDEM_CUDA_* variable is refused (it
# would measure the default under the name of the route it meant to force); on the CPU a valid route changes nothing.
"$bench" -m "$model" -p 8 -n 2 -r 1 -t 1 --cuda-route matvec=splt >/dev/null 2>"$tmp/err"
check_all "--cuda-route: an unknown value exits 1 naming the item" [ $? -eq 1 ] ::: \
  grep -q -- "--cuda-route matvec=splt: expected matvec=auto, direct, staged, split or persistent" "$tmp/err"
TANDEM_CUDA_MATVEC=split "$bench" -m "$model" -p 8 -n 2 -r 1 -t 1 >/dev/null 2>"$tmp/err"
check_all "a retired TANDEM_CUDA_* variable is refused with its replacement" [ $? -eq 1 ] ::: \
  grep -q -- "TANDEM_CUDA_MATVEC is no longer read: tandem-bench --cuda-route matvec=VALUE" "$tmp/err"
"$bench" -m "$model" -p 8 -n 2 -r 1 -t 1 --json --cuda-route matvec=split --cuda-route graphs=0 >"$tmp/routed" \
  2>/dev/null
check_all "--cuda-route on the CPU: runs" [ $? -eq 0 ] ::: [ "$(grep -c '"test":"[pt][pg]"' "$tmp/routed")" -eq 2 ]

echo "bench: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
