#!/usr/bin/env bash
# The README's seed promise in the default configuration: `tandem -p ... --temp 0.8 --seed S` with the default
# speculative pair (Qwen2.5-Coder-1.5B with the 0.5B draft, draft lengths chosen from timings) gives, run after run,
# the text `--no-draft` gives for that seed. Needs the default models in the cache (scripts/fetch-models; scripts/test
# fetches them). Usage: seed_default_pair.sh BUILD_DIR DATA_DIR
set -uo pipefail
build=$1
tandem="$build/tandem"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.bash"

prompt="Write a C function that parses a hexadecimal string into an unsigned integer."
drafted_total=0
for seed in 5 11; do
  plain=$("$tandem" -p "$prompt" -n 32 --temp 0.8 --seed "$seed" --no-draft 2>"$tmp/err")
  rc=$?
  if [ $rc -ne 0 ]; then
    bad "seed $seed: plain run failed (are the default models fetched? scripts/fetch-models): $(tail -1 "$tmp/err")"
    continue
  fi
  check "seed $seed: plain decoding gives text" [ -n "$plain" ]
  for run in 1 2 3; do
    spec=$("$tandem" -p "$prompt" -n 32 --temp 0.8 --seed "$seed" --stats 2>"$tmp/err")
    check "seed $seed, run $run: with the default draft, the text of --no-draft" [ "$spec" = "$plain" ]
    drafted=$(sed -n 's/.* \([0-9]*\) drafted,.*/\1/p' "$tmp/err")
    drafted_total=$((drafted_total + ${drafted:-0}))
  done
done
# The draft really proposed (the controller drafts on this pair wherever it pays: see docs/benchmarks-sampling.md).
check "the draft proposed tokens ($drafted_total in all)" [ "$drafted_total" -gt 0 ]

echo "seed_default_pair: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
