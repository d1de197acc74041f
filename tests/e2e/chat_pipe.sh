#!/usr/bin/env bash
# End-to-end checks of `tandem --chat` over a pipe: one answer line per input line on stdout (no decoration),
# answers equal to the same conversation computed turn by turn with one-shot prompts (so reusing the KV cache
# across turns changes nothing), commands in the pipe, and the piped one-shot prompt without --chat unchanged.
# Usage: chat_pipe.sh BUILD_DIR DATA_DIR
set -uo pipefail
build=$1 data=$2
tandem="$build/tandem"
model="$data/stories260K.gguf"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export HOME="$tmp/home" XDG_STATE_HOME="$tmp/state"
source "$(dirname "$0")/lib/checks.bash"

printf 'one\ntwo\nthree\n' | "$tandem" -m "$model" --chat -n 10 --temp 0 >"$tmp/out" 2>"$tmp/err"
check "--chat exits 0" [ $? -eq 0 ]
check "three answers, three lines" [ "$(wc -l <"$tmp/out")" -eq 3 ]
check "no prompt decoration on stdout" bash -c "! grep -q '>>>' '$tmp/out'"
check "a summary per answer on stderr" [ "$(grep -c 'tokens' "$tmp/err")" -eq 3 ]

# Turn by turn: a base model's chat is one running text (a user turn glued to a word gets one space), so each
# answer of the chat whose answers are in ANSWERS_FILE (turns one, two, three) must equal the one-shot
# continuation of the conversation so far, generated with the same FLAGS.
check_turn_by_turn() {
  local answers_file=$1 what=$2
  shift 2
  local answers convo="" i=0 turn expect
  mapfile -t answers <"$answers_file"
  for turn in one two three; do
    if [ -n "$convo" ] && [[ ! "$convo" =~ [[:space:]]$ ]]; then convo+=" "; fi
    convo+="$turn"
    expect=$("$tandem" -m "$model" -p "$convo" -n 10 "$@" 2>/dev/null)
    check "$what answer $((i + 1)) equals the one-shot continuation" [ "${answers[$i]}" = "$expect" ]
    convo+="$expect"
    i=$((i + 1))
  done
}
check_turn_by_turn "$tmp/out" "greedy" --temp 0

# The same with a draft model and with prompt lookup: speculation never changes a greedy answer.
printf 'one\ntwo\nthree\n' | "$tandem" -m "$model" --chat -n 10 --temp 0 --draft "$model" >"$tmp/draft" 2>"$tmp/err"
check "--chat --draft gives the same answers" cmp -s "$tmp/out" "$tmp/draft"
check "--draft: acceptance in the summary" grep -q "acceptance" "$tmp/err"
printf 'one\ntwo\nthree\n' | "$tandem" -m "$model" --chat -n 10 --temp 0 --lookup >"$tmp/lookup" 2>/dev/null
check "--chat --lookup gives the same answers" cmp -s "$tmp/out" "$tmp/lookup"

# Sampled: the noise is keyed by the position in the conversation, so with a seed each answer is again the one-shot
# continuation of the conversation so far with that seed, and a draft or prompt lookup changes no answer.
printf 'one\ntwo\nthree\n' | "$tandem" -m "$model" --chat -n 10 --temp 0.9 --seed 9 >"$tmp/sampled" 2>/dev/null
check_turn_by_turn "$tmp/sampled" "sampled (seed 9)" --temp 0.9 --seed 9
check "the sampled answers differ from the greedy ones" bash -c "! cmp -s '$tmp/out' '$tmp/sampled'"
"$build/tandem-quantize" "$model" "$tmp/q4_0.gguf" q4_0 2>/dev/null  # a draft that disagrees now and then
printf 'one\ntwo\nthree\n' | "$tandem" -m "$model" --chat -n 10 --temp 0.9 --seed 9 --draft "$tmp/q4_0.gguf" --draft-min 3 \
  >"$tmp/sampled_draft" 2>/dev/null
check "sampled --chat --draft gives the same answers" cmp -s "$tmp/sampled" "$tmp/sampled_draft"
printf 'one\ntwo\nthree\n' | "$tandem" -m "$model" --chat -n 10 --temp 0.9 --seed 9 --lookup --draft-min 1 \
  >"$tmp/sampled_lookup" 2>/dev/null
check "sampled --chat --lookup gives the same answers" cmp -s "$tmp/sampled" "$tmp/sampled_lookup"

# Commands work in a pipe too: /undo then the same turn again answers the same; /quit ends early.
printf 'one\ntwo\n/undo\ntwo\n/quit\nthree\n' | "$tandem" -m "$model" --chat -n 10 --temp 0 >"$tmp/cmd" 2>/dev/null
check "/undo in a pipe" [ "$(sed -n 2p "$tmp/cmd")" = "$(sed -n 3p "$tmp/cmd")" ]
check "/quit in a pipe stops reading" [ "$(wc -l <"$tmp/cmd")" -eq 3 ]
printf 'one\n/save %s\n' "$tmp/conv.json" | "$tandem" -m "$model" --chat -n 10 --temp 0 >/dev/null 2>&1
check "/save in a pipe writes JSON" grep -q '"messages"' "$tmp/conv.json"

# Without --chat a pipe is still one prompt.
one=$(printf 'one\ntwo\n' | "$tandem" -m "$model" -n 10 --temp 0 2>/dev/null)
two=$("$tandem" -m "$model" -p $'one\ntwo\n' -n 10 --temp 0 2>/dev/null)
check "a pipe without --chat is one prompt" [ "$one" = "$two" ]
"$tandem" -m "$model" --chat -p hi </dev/null >/dev/null 2>"$tmp/err"
check "--chat with -p is a usage error" [ $? -eq 2 ]

# A closed stdout ends the chat quietly.
yes 'Once upon a time' | head -50 | "$tandem" -m "$model" --chat -n 30 --temp 0 2>"$tmp/err" | head -c 10 >/dev/null
check "closed pipe: no error output" bash -c "! grep -q error '$tmp/err'"

echo "chat_pipe: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
