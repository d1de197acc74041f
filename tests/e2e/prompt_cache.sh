#!/usr/bin/env bash
# End-to-end checks of the on-disk prompt cache (--prompt-cache, docs/prompt-cache.md) in the default configuration
# (Qwen2.5-Coder-1.5B with the 0.5B draft): a document of ~380 tokens asked two questions. A run saves its prompt; the
# same prompt again and another question about the same document load the saved prefix (--stats says so) and give
# byte-identical greedy output to --prompt-cache off (a repeat penalty and a seeded sampled run too; a drafting run
# saves and loads the draft's entry too); --chat's first
# turn likewise (/stats says what was loaded) and its second turn after it; gemma-3-270m's sliding-window rings
# likewise; a damaged entry gives one warning and the same output; an unwritable directory a warning; off (the flag
# or TANDEM_PROMPT_CACHE=off) writes nothing, and the default is under the cache root (--list-models says how much
# is there). Needs the default models and gemma-3-270m in the cache (scripts/fetch-models).
# Usage: prompt_cache.sh BUILD_DIR DATA_DIR
set -uo pipefail
build=$1 data=$2
tandem="$build/tandem"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.bash"
# The models and the repacked copies stay where they are; the cache root moves to $tmp (the default prompt cache's).
cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/tandem
export TANDEM_MODELS_DIR=${TANDEM_MODELS_DIR:-$cache_root/models}
export TANDEM_REPACK_CACHE=${TANDEM_REPACK_CACHE-$cache_root/repacked}
export XDG_CACHE_HOME="$tmp/xdg"
unset TANDEM_PROMPT_CACHE
pc="$tmp/pc"

doc="Read this license text. $(head -c 1500 "$data/gpl-3.txt" | tr '\n' ' ')"
q1="$doc Question: who may copy and distribute this document?"
q2="$doc Question: what is the license designed to take away?"
run() { "$tandem" -n 24 --temp 0 "$@"; }

if ! run -p "$q1" --prompt-cache off >"$tmp/q1.off" 2>"$tmp/err"; then
  bad "a plain run failed (are the default models fetched? scripts/fetch-models): $(tail -1 "$tmp/err")"
  echo "prompt_cache: $passed passed, $failed failed"
  exit 1
fi
run -p "$q2" --prompt-cache off >"$tmp/q2.off" 2>/dev/null
check "--prompt-cache off: nothing written under the cache root" [ ! -e "$XDG_CACHE_HOME/tandem/prompts" ]

# ---- one-shot: a miss saves, the same prompt and another question hit, the same bytes ------------------------
run -p "$q1" --prompt-cache "$pc" --stats >"$tmp/q1.miss" 2>"$tmp/err.miss"
check "first run: a miss, saved ($(grep '^prompt cache' "$tmp/err.miss"))" grep -q '^prompt cache: *miss.*saved' "$tmp/err.miss"
check "first run: the output of --prompt-cache off" cmp -s "$tmp/q1.miss" "$tmp/q1.off"
entries=$(ls "$pc"/*.kv 2>/dev/null | wc -l)
# The draft's entry too where it drafted (caught up on the prompt): the controller decides from timings.
check "first run: the target's entry, and the draft's if it drafted ($entries)" [ "$entries" -ge 1 ]
run -p "$q1" --prompt-cache "$pc" --stats >"$tmp/q1.hit" 2>"$tmp/err.hit"
check "the same prompt: a hit of all but its last token ($(grep '^prompt cache' "$tmp/err.hit"))" \
  grep -qE '^prompt cache: *hit, [0-9]+ of [0-9]+ tokens loaded.*, 1 prefilled' "$tmp/err.hit"
check "the same prompt: the same output" cmp -s "$tmp/q1.hit" "$tmp/q1.off"
# A draft that drafts (--draft-min 1) catches up on the prompt: its entry is saved, and a later hit loads it.
run -p "$q1" --draft-min 1 --prompt-cache "$pc" >"$tmp/q1.drafted" 2>/dev/null
check "a drafting run: the output of --prompt-cache off" cmp -s "$tmp/q1.drafted" "$tmp/q1.off"
check "a drafting run: the target's entry and the draft's" [ "$(ls "$pc"/*.kv | wc -l)" -eq 2 ]
run -p "$q1" --draft-min 1 --prompt-cache "$pc" --stats >"$tmp/q1.both" 2>"$tmp/err.both"
check "the draft's entry loaded too ($(grep '^prompt cache' "$tmp/err.both"))" \
  grep -qE '^prompt cache: *hit, [0-9]+ of [0-9]+ tokens loaded.*, 1 prefilled; draft [0-9]+' "$tmp/err.both"
check "the draft's entry loaded too: the output of --prompt-cache off" cmp -s "$tmp/q1.both" "$tmp/q1.off"
run -p "$q2" --prompt-cache "$pc" --stats >"$tmp/q2.hit" 2>"$tmp/err.q2"
loaded=$(sed -n 's/^prompt cache: *hit, \([0-9]*\) of.*/\1/p' "$tmp/err.q2")
check "another question: the document's tokens loaded (${loaded:-none})" [ "${loaded:-0}" -gt 300 ]
check "another question: the output of --prompt-cache off" cmp -s "$tmp/q2.hit" "$tmp/q2.off"
check "another question: not saved again (the entry serves it)" [ "$(ls "$pc"/*.kv | wc -l)" -eq 2 ]
check "nothing but the answer on stdout" [ "$(wc -l <"$tmp/q2.hit")" -le 3 ]

# A repeat penalty reads the prompt's last tokens, and a seeded sampled run its positions: the same with a hit.
run -p "$q2" --repeat-penalty 1.3 --prompt-cache off >"$tmp/pen.off" 2>/dev/null
run -p "$q2" --repeat-penalty 1.3 --prompt-cache "$pc" >"$tmp/pen.hit" 2>/dev/null
check "--repeat-penalty 1.3: the same output with a hit" cmp -s "$tmp/pen.hit" "$tmp/pen.off"
run -p "$q2" --temp 0.8 --seed 7 --prompt-cache off >"$tmp/seed.off" 2>/dev/null
run -p "$q2" --temp 0.8 --seed 7 --prompt-cache "$pc" >"$tmp/seed.hit" 2>/dev/null
check "--temp 0.8 --seed 7: the same output with a hit" cmp -s "$tmp/seed.hit" "$tmp/seed.off"

# ---- --chat: the first turn loads, then the conversation goes on as without ----------------------------------
chat_in=$(printf '%s\n%s\n/stats\n' "$q1" "And in one word?")
printf '%s\n' "$chat_in" | run --chat --prompt-cache off >"$tmp/chat.off" 2>/dev/null
printf '%s\n' "$chat_in" | run --chat --prompt-cache "$pc" >"$tmp/chat.hit" 2>"$tmp/err.chat"
check "--chat: both turns the output of --prompt-cache off" cmp -s "$tmp/chat.hit" "$tmp/chat.off"
printf '%s\n/stats\n' "$q2" | run --chat --prompt-cache "$pc" >"$tmp/chat2.hit" 2>"$tmp/err.chat2"
check "--chat: the first turn loaded the document ($(grep '^prompt tokens' "$tmp/err.chat2"))" \
  grep -qE '^prompt tokens: .*, [0-9]{3} loaded from the prompt cache' "$tmp/err.chat2"
printf '%s\n' "$q2" | run --chat --prompt-cache off >"$tmp/chat2.off" 2>/dev/null
check "--chat: its answer that of --prompt-cache off" cmp -s "$tmp/chat2.hit" "$tmp/chat2.off"

# ---- sliding-window rings: gemma-3-270m ------------------------------------------------------------------------
g() { "$tandem" -m gemma-3-270m-q4_k_m -n 24 --temp 0 "$@"; }
g -p "$q1" --prompt-cache "$pc" >"$tmp/g1" 2>/dev/null
g -p "$q2" --prompt-cache "$pc" --stats >"$tmp/g2.hit" 2>"$tmp/err.g2"
g -p "$q2" --prompt-cache off >"$tmp/g2.off" 2>/dev/null
check "gemma-3-270m: another question hits ($(grep '^prompt cache' "$tmp/err.g2"))" grep -q '^prompt cache: *hit' "$tmp/err.g2"
check "gemma-3-270m: the output of --prompt-cache off" cmp -s "$tmp/g2.hit" "$tmp/g2.off"

# ---- a damaged entry: a warning, removed, the same output --------------------------------------------------------
for f in "$pc"/*.kv; do
  size=$(stat -c %s "$f")
  printf '\x55\xaa' | dd of="$f" bs=1 seek=$((size / 2)) conv=notrunc status=none
done
run -p "$q2" --prompt-cache "$pc" --stats >"$tmp/q2.damaged" 2>"$tmp/err.damaged"
check "damaged entries: the run succeeds with the same output" cmp -s "$tmp/q2.damaged" "$tmp/q2.off"
check "damaged entries: a one-line warning each" grep -q '^tandem: warning: prompt cache: .*checksum is wrong; removed it$' "$tmp/err.damaged"
check "damaged entries: prefilled as a miss ($(grep '^prompt cache' "$tmp/err.damaged"))" grep -q '^prompt cache: *miss' "$tmp/err.damaged"

# ---- an unwritable directory: a warning, the same output ---------------------------------------------------------
touch "$tmp/file"
run -p "$q1" --prompt-cache "$tmp/file/pc" >"$tmp/q1.nowhere" 2>"$tmp/err.nowhere"
check "an unwritable directory: exit 0" [ $? -eq 0 ]
check "an unwritable directory: the same output" cmp -s "$tmp/q1.nowhere" "$tmp/q1.off"
check "an unwritable directory: a warning" grep -q '^tandem: warning: prompt cache: cannot create' "$tmp/err.nowhere"

# ---- off and the default -------------------------------------------------------------------------------------
TANDEM_PROMPT_CACHE=off run -p "$q1" >/dev/null 2>&1
check "TANDEM_PROMPT_CACHE=off: nothing written" [ ! -e "$XDG_CACHE_HOME/tandem/prompts" ]
run -p "$q1" >"$tmp/q1.default" 2>/dev/null
check "the default: entries under \$XDG_CACHE_HOME/tandem/prompts" [ "$(ls "$XDG_CACHE_HOME"/tandem/prompts/*.kv 2>/dev/null | wc -l)" -ge 1 ]
check "--list-models: the prompt cache's size and place" \
  bash -c "'$tandem' --list-models | grep -q 'prompt cache: [0-9]* entr.* in $XDG_CACHE_HOME/tandem/prompts'"
run -p "hello" --prompt-cache "$tmp/short" >/dev/null 2>&1
check "a short prompt is not saved" [ ! -e "$tmp/short" ]

echo "prompt_cache: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
