#!/usr/bin/env bash
# End-to-end checks of thinking control: --think's parsing and its errors, the note when a template has no thinking
# switch, and where a reasoning model's thinking goes (stderr by default, stdout with --show-thinking, dimmed only on
# a terminal, kept out of the chat's answers). No test model thinks, so the tiny stories260K stands in for one under
# a forced template: with deepseek-r1 (thinking on) the generation prompt opens the think block, so everything the
# model writes is reasoning that never closes; with qwen3 its text never starts with <think>, so all of it is answer.
# A grammar (--grammar) constrains only the answer after the reasoning. The splitter itself is unit-tested on
# synthetic token streams (tests/unit/test_reasoning_split.cpp), the grammar's free reasoning in test_grammar.cpp
# and test_constrained_generation.cpp.
# Usage: thinking.sh BUILD_DIR DATA_DIR
set -uo pipefail
build=$1 data=$2
tandem="$build/tandem"
model="$data/stories260K.gguf"
tmp=$(mktemp -d)
trap 'tmux -S "$tmp/tmux.sock" kill-server 2>/dev/null; rm -rf "$tmp"' EXIT
export HOME="$tmp/home" XDG_STATE_HOME="$tmp/state"
source "$(dirname "$0")/lib/checks.bash"
run() { "$tandem" -m "$model" -p "Once upon a time" -n 12 --temp 0 "$@"; }

# ---- parsing -----------------------------------------------------------------------------------------------
run --think maybe >"$tmp/out" 2>"$tmp/err"
status=$?
check "--think maybe is a usage error" [ "$status" -ne 0 ]
check "--think maybe: the error names the flag and its values" grep -q -- '--think: maybe not in {on,off}' "$tmp/err"
check "--think maybe: nothing on stdout" [ ! -s "$tmp/out" ]
run --think >"$tmp/out" 2>"$tmp/err"
check "--think without a value is a usage error" [ $? -ne 0 ]

# ---- a template without a thinking switch: accepted and ignored, with a note ------------------------------
plain=$(run 2>/dev/null)
for value in on off; do
  out=$(run --think "$value" 2>"$tmp/err")
  check "--think $value without a template exits 0" [ $? -eq 0 ]
  check "--think $value without a template: the same text" [ "$out" = "$plain" ]
  check "--think $value without a template: a note says it is ignored" \
    grep -q "note: --think $value is ignored: a run without a chat template has no thinking switch" "$tmp/err"
done
run --chat-template chatml --think off >/dev/null 2>"$tmp/err"
check "--think off with chatml: the note names the template" grep -q "the chat template chatml has no thinking switch" \
  "$tmp/err"
out=$(run --show-thinking 2>"$tmp/err")
check "--show-thinking without reasoning changes nothing" [ "$out" = "$plain" ]
check "--show-thinking without reasoning: nothing on stderr" [ ! -s "$tmp/err" ]

# ---- qwen3: text that does not open <think> is all answer, byte for byte ----------------------------------
# qwen3 and chatml (by name, no default system prompt) render the same prompt for one user turn, so the answers
# must be identical: the splitter passes text without a think block through untouched.
run --chat-template chatml >"$tmp/chatml" 2>/dev/null
run --chat-template qwen3 >"$tmp/qwen3" 2>"$tmp/err"
check "qwen3 without a think block: stdout equals chatml's" cmp -s "$tmp/chatml" "$tmp/qwen3"
check "qwen3 without a think block: nothing on stderr" [ ! -s "$tmp/err" ]
run --chat-template qwen3 --think on >"$tmp/on" 2>"$tmp/err"
check "qwen3 --think on is the default" cmp -s "$tmp/qwen3" "$tmp/on"
check "qwen3 --think on: no note" [ ! -s "$tmp/err" ]
run --chat-template qwen3 --think off >"$tmp/off" 2>"$tmp/err"
check "qwen3 --think off changes the prompt (the empty think block), so the text" bash -c "! cmp -s '$tmp/on' '$tmp/off'"
check "qwen3 --think off: no note" [ ! -s "$tmp/err" ]

# ---- deepseek-r1: the generation prompt opens the think block ---------------------------------------------
run --chat-template deepseek-r1 >"$tmp/out" 2>"$tmp/err"
check "deepseek-r1: exits 0" [ $? -eq 0 ]
check "deepseek-r1: stdout carries no reasoning (there is no answer)" [ ! -s "$tmp/out" ]
reasoning=$(grep -v '^tandem: ' "$tmp/err")
check "deepseek-r1: the reasoning is on stderr" [ -n "$reasoning" ]
check "deepseek-r1: a note says the model stopped while thinking" \
  grep -q "note: the model stopped while thinking, before any answer (raise -n)" "$tmp/err"
check "deepseek-r1: no terminal escapes in a redirected stderr" bash -c "! grep -q $'\x1b' '$tmp/err'"
run --chat-template deepseek-r1 --show-thinking >"$tmp/out" 2>"$tmp/err"
check "--show-thinking: the reasoning is on stdout in a <think> block, unclosed as the model left it" \
  [ "$(cat "$tmp/out")" = "$(printf '<think>\n%s' "$reasoning")" ]
check "--show-thinking: stderr has only the note" [ "$(grep -vc '^tandem: ' "$tmp/err")" -eq 0 ]
run --chat-template deepseek-r1 --think off >"$tmp/out" 2>"$tmp/err"
check "deepseek-r1 --think off: the block is closed in the prompt, so the text is answer on stdout" [ -s "$tmp/out" ]
check "deepseek-r1 --think off: nothing on stderr" [ ! -s "$tmp/err" ]

# ---- a grammar applies to the answer after the reasoning, never to the reasoning --------------------------------
# deepseek-r1: the story model's reasoning never closes, so under a grammar it is the reasoning of the run without
# one (the grammar does not touch it) and there is no answer. qwen3: with a grammar the prompt opens the think block
# itself (the grammar must know where the reasoning starts), so what was all answer above is now reasoning.
run --chat-template deepseek-r1 >/dev/null 2>"$tmp/free"
run --chat-template deepseek-r1 --grammar 'root ::= "yes" | "no"' >"$tmp/out" 2>"$tmp/err"
check "deepseek-r1 with a grammar: exits 0" [ $? -eq 0 ]
check "deepseek-r1 with a grammar: the reasoning is the unconstrained one" cmp -s "$tmp/free" "$tmp/err"
check "deepseek-r1 with a grammar: no answer on stdout" [ ! -s "$tmp/out" ]
run --chat-template qwen3 --grammar 'root ::= "yes" | "no"' >"$tmp/out" 2>"$tmp/err"
check "qwen3 with a grammar: exits 0" [ $? -eq 0 ]
check "qwen3 with a grammar: the think block is opened, so the text is reasoning on stderr" \
  [ -n "$(grep -v '^tandem: ' "$tmp/err")" ]
check "qwen3 with a grammar: no answer on stdout" [ ! -s "$tmp/out" ]
run --chat-template qwen3 --think off --grammar 'root ::= "yes" | "no"' >"$tmp/out" 2>"$tmp/err"
check "qwen3 --think off with a grammar: the answer follows it" grep -qxE 'yes|no' "$tmp/out"

# ---- the chat over a pipe: reasoning on stderr, empty answers kept as such ----------------------------------
printf 'one\ntwo\n' | "$tandem" -m "$model" --chat --chat-template deepseek-r1 -n 8 --temp 0 >"$tmp/out" 2>"$tmp/err"
check "--chat deepseek-r1: exits 0" [ $? -eq 0 ]
check_all "--chat deepseek-r1: one (empty) answer line per turn on stdout" [ "$(wc -l <"$tmp/out")" -eq 2 ] ::: \
  [ -z "$(tr -d '\n' <"$tmp/out")" ]
check "--chat deepseek-r1: each summary says the turn stopped while thinking" \
  [ "$(grep -c 'stopped while thinking' "$tmp/err")" -eq 2 ]
check "--chat deepseek-r1: the reasoning is on stderr" [ "$(grep -vc '^\[' "$tmp/err")" -ge 2 ]

# ---- the terminal: reasoning dimmed (ANSI faint), the answer not ------------------------------------------
if command -v tmux >/dev/null; then
  tm() { tmux -S "$tmp/tmux.sock" "$@"; }
  cat >"$tmp/term.sh" <<EOF
"$tandem" -m "$model" -p "Once upon a time" -n 6 --temp 0 --chat-template deepseek-r1
echo "EXIT=\$?"
EOF
  tm new-session -d -x 200 -y 20 -s t "bash --norc --noprofile"
  tm send-keys -t t "clear; bash $tmp/term.sh" Enter
  end=$((SECONDS + 20))
  until tm capture-pane -p -t t | grep -q 'EXIT=' || [ $SECONDS -ge $end ]; do sleep 0.1; done
  tm capture-pane -p -e -t t >"$tmp/screen"
  check "terminal: the reasoning is shown dimmed" grep -q $'\x1b\[2m' "$tmp/screen"
  check "terminal: the run exits 0" grep -q 'EXIT=0' "$tmp/screen"
else
  echo "thinking: tmux is not installed: the terminal check is skipped (scripts/setup installs it)" >&2
fi

echo "thinking: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
