#!/usr/bin/env bash
# End-to-end checks of the interactive chat REPL, driving the real binary in a tmux terminal: turns with KV
# reuse (via /stats), Ctrl-C during an answer and at the prompt, history (up arrow, kept across runs), multi-line
# input, /undo /regen /reset, /save + /load, Ctrl-D exit status 0 and the terminal settings restored; Ctrl-C
# while writing the answer to a slow reader is blocked; and the grammar commands (/json-schema, /grammar, /grammar
# off, a multi-line grammar, a bad grammar that leaves the one in force).
# Usage: repl.sh BUILD_DIR DATA_DIR
set -uo pipefail
build=$1 data=$2
tandem="$build/tandem"
model="$data/stories260K.gguf"
if ! command -v tmux >/dev/null; then
  echo "repl: tmux is not installed (scripts/setup installs it)" >&2
  exit 1
fi
tmp=$(mktemp -d)
sock="$tmp/none.sock"  # one tmux server per session (a server being killed cannot be reused at once)
tm() { tmux -S "$sock" "$@"; }
trap 'for s in "$tmp"/*.sock; do tmux -S "$s" kill-server 2>/dev/null; done; rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.bash"

# Isolated home: the history file and any ~/.editrc are the test's own.
mkdir -p "$tmp/home"
export HOME="$tmp/home" XDG_STATE_HOME="$tmp/state"

screen() { tm capture-pane -p -J -t repl -S -2000; }
# Polls the screen until `pattern` (fixed string) occurs at least `n` times; fails after `timeout` seconds.
wait_count() {
  local pattern=$1 n=$2 timeout=${3:-20} end=$((SECONDS + ${3:-20}))
  while [ $SECONDS -lt $end ]; do
    [ "$(screen | grep -cF -- "$pattern")" -ge "$n" ] && return 0
    sleep 0.1
  done
  echo "--- timed out after ${timeout}s waiting for '$pattern' x$n; screen:" >&2
  screen | grep -v '^$' | tail -20 >&2
  return 1
}
# Prompt lines (tmux drops trailing blanks, so an empty prompt reads ">>>").
prompts() { screen | grep -c '^>>>'; }
# Polls until at least `n` lines start with the prompt.
wait_prompts() {
  local n=$1 end=$((SECONDS + ${2:-20}))
  while [ $SECONDS -lt $end ]; do [ "$(prompts)" -ge "$n" ] && return 0; sleep 0.1; done
  echo "--- timed out waiting for prompt #$n; screen:" >&2
  screen | grep -v '^$' | tail -20 >&2
  return 1
}
# Sends a line and waits for the next prompt.
say() {
  local before
  before=$(prompts)
  tm send-keys -t repl -l -- "$1"
  tm send-keys -t repl Enter
  wait_prompts $((before + 1)) "${2:-20}"
}
last_stats() { screen | grep 'prefilled this turn' | tail -1; }
wait_file() {
  local end=$((SECONDS + 20))
  while [ $SECONDS -lt $end ]; do [ -s "$1" ] && return 0; sleep 0.1; done
  return 1
}

# Runs tandem with `args` inside the tmux terminal, recording stty before/after and the exit status.
start() {
  local name=$1; shift
  cat >"$tmp/$name.sh" <<EOF
stty -a >"$tmp/$name.stty_before"
"$tandem" -m "$model" $*
echo "EXIT=\$?" >"$tmp/$name.exit"
stty -a >"$tmp/$name.stty_after"
EOF
  tm kill-server 2>/dev/null
  sock="$tmp/$name.sock"
  tm new-session -d -x 200 -y 50 -s repl "bash --norc --noprofile"
  tm send-keys -t repl "clear; bash $tmp/$name.sh" Enter
  wait_prompts 1 30
}

# ---- session 1: short greedy answers ---------------------------------------------------------------------
start s1 -n 20 --temp 0
check "banner names the commands" wait_count '/help' 1
say "Once upon a time"
check "first answer streams" wait_count ', there was a little girl named Lily' 1
say "She went to the park"
say "/stats"
stats=$(screen | grep 'prefilled this turn' | tail -1)
prefilled=$(sed -E 's/.* ([0-9]+) prefilled this turn.*/\1/' <<<"$stats")
whole=$(sed -E 's/.*conversation: ([0-9]+) tokens.*/\1/' <<<"$stats")
check "/stats reports the turn ($stats)" [ -n "$stats" ]
check "second turn prefilled only its new tokens ($prefilled of $whole)" \
  [ "${prefilled:-0}" -gt 0 -a "${prefilled:-0}" -lt "${whole:-0}" ]
check "one-line summary after each answer" [ "$(screen | grep -c 'tokens/s.*length limit')" -ge 2 ]

# Ctrl-C at the prompt clears the line and the REPL stays.
before=$(prompts)
tm send-keys -t repl -l "abandoned words"
tm send-keys -t repl C-c
check "Ctrl-C at the prompt shows ^C" wait_count 'abandoned words^C' 1
check "Ctrl-C at the prompt gives a new prompt" wait_prompts $((before + 1))

# History: up arrow twice recalls "She went to the park" (the abandoned line is not in the history, /stats is).
tm send-keys -t repl Up Up
check "up arrow recalls history" wait_count '>>> She went to the park' 1
before=$(prompts)
tm send-keys -t repl Enter
wait_prompts $((before + 1))
check "recalled line was sent again" [ "$(screen | grep -c '^>>> She went to the park')" -ge 2 ]
say "/help"
check "still running after Ctrl-C at the prompt" wait_count 'Keys: arrows' 1

# Multi-line input: a trailing backslash continues, and so does a """ block.
tm send-keys -t repl -l 'The cat\'
tm send-keys -t repl Enter
check "backslash continues the line" wait_count '... ' 1
say 'sat down'
tm send-keys -t repl -l '"""'
tm send-keys -t repl Enter
tm send-keys -t repl -l 'a block'
tm send-keys -t repl Enter
say 'of lines"""'
check "a \"\"\" block is read" wait_count '... of lines"""' 1

# /undo, /regen (same answer at temperature 0, one token re-prefilled), /reset.
say "/undo"
check "/undo drops the last exchange" wait_count 'dropped the last exchange' 1
say "/regen"
say "/stats"
check "/regen re-prefills one token ($(last_stats))" grep -q '^prompt tokens: *1 prefilled' <<<"$(last_stats)"
n_msgs_json="$tmp/before_load.json"
say "/save $n_msgs_json"
check "/save writes the conversation" wait_file "$n_msgs_json"
check "/save is JSON with messages" grep -q '"messages": \[' "$n_msgs_json"
say "/reset"
check "/reset clears" wait_count 'the conversation is cleared' 1
say "/load $n_msgs_json"
check "/load reads it back" wait_count 'loaded ' 1
say "/save $tmp/after_load.json"
wait_file "$tmp/after_load.json"
check "/save + /load round trip" cmp -s "$n_msgs_json" "$tmp/after_load.json"
say 'Tom said "hi" and \ left'
check "the conversation goes on after /load" [ "$(screen | grep -c 'tokens/s')" -ge 6 ]

# Ctrl-D on an empty line exits with status 0 and restores the terminal.
tm send-keys -t repl C-d
check "Ctrl-D exits" wait_file "$tmp/s1.exit"
check "exit status 0" grep -q '^EXIT=0$' "$tmp/s1.exit"
sleep 0.3
check "terminal settings restored" cmp -s "$tmp/s1.stty_before" "$tmp/s1.stty_after"
check "history file written" grep -q 'Once' "$XDG_STATE_HOME/tandem/history"

# ---- session 2: long answers interrupted with Ctrl-C ---------------------------------------------------------
# A large context and no length limit make an answer run for seconds, so Ctrl-C lands mid-answer.
start s2 -n 1000000 --ctx 60000 --temp 0
tm send-keys -t repl Up
check "history kept across runs" wait_count '>>> Tom said "hi"' 1
tm send-keys -t repl C-u
tm send-keys -t repl -l "Once upon a time"
tm send-keys -t repl Enter
check "long answer starts" wait_count 'there was a little girl named Lily' 1
sleep 0.5
tm send-keys -t repl C-c
check "Ctrl-C stops the answer and returns to the prompt" wait_count 'interrupted]' 1
check "the prompt is back" wait_prompts 2
say "/stats"
check "/stats says interrupted" wait_count 'stop: interrupted' 1
tm send-keys -t repl -l "The dog"
tm send-keys -t repl Enter
sleep 1
tm send-keys -t repl C-c
check "the program still answers after an interruption" wait_count 'interrupted]' 2
check "prompt back after the second interruption" wait_prompts 4
tm send-keys -t repl -l "/quit"
tm send-keys -t repl Enter
check "/quit exits" wait_file "$tmp/s2.exit"
check "/quit exit status 0" grep -q '^EXIT=0$' "$tmp/s2.exit"
sleep 0.3
check "terminal restored after interruptions" cmp -s "$tmp/s2.stty_before" "$tmp/s2.stty_after"

# ---- session 3: Ctrl-C while an answer's write is blocked ----------------------------------------------------
# A reader slower than the model (in CI: tmux drawing a busy terminal) leaves the REPL blocked in write(2) when
# Ctrl-C comes. The interrupted write must be finished, not taken for a closed stdout (which ended the program
# quietly). Driven from Python: a pty for the terminal on stdin, a 4 KB pipe nobody reads yet for stdout.
check "Ctrl-C during a blocked write stops the answer and the REPL stays" \
  python3 - "$tandem" "$model" "$tmp/s3.err" <<'EOF'
import fcntl, os, pty, signal, subprocess, sys, time
tandem, model, err_path = sys.argv[1:4]
master, slave = pty.openpty()
r, w = os.pipe()
fcntl.fcntl(w, 1031, 4096)  # F_SETPIPE_SZ
with open(err_path, "w") as err:
    p = subprocess.Popen([tandem, "-m", model, "-n", "1000000", "--ctx", "60000", "--temp", "0"],
                         stdin=slave, stdout=w, stderr=err, start_new_session=True)
os.close(w)
def fail(why):
    p.kill()
    sys.exit("repl s3: " + why + "; stderr: " + open(err_path).read()[-400:])
def in_write():  # /proc/PID/syscall starts with the number of the blocking call: 1 is write on x86-64
    try: return open("/proc/%d/syscall" % p.pid).read().split()[0] == "1"
    except OSError: return False
end = time.time() + 20
while "Ctrl-D" not in open(err_path).read():
    if time.time() > end: fail("no banner")
    time.sleep(0.05)
os.write(master, b"Once upon a time\r")
end = time.time() + 20
while not in_write():
    if time.time() > end or p.poll() is not None: fail("never blocked writing the answer")
    time.sleep(0.05)
p.send_signal(signal.SIGINT)
time.sleep(0.3)
out = b""
fcntl.fcntl(r, fcntl.F_SETFL, os.O_NONBLOCK)
end = time.time() + 20
while "interrupted]" not in open(err_path).read():
    if time.time() > end or p.poll() is not None: fail("the answer did not end as interrupted")
    try: out += os.read(r, 65536)
    except BlockingIOError: time.sleep(0.05)
os.write(master, b"/quit\r")
try: code = p.wait(timeout=20)
except subprocess.TimeoutExpired: fail("/quit did not end it")
while True:
    d = os.read(r, 65536)
    if not d: break
    out += d
if code != 0: fail("exit status %d" % code)
if not out.startswith(b", there was") or not out.endswith(b"\n"): fail("the answer was cut: %r" % out[-60:])
EOF

# ---- session 4: grammars --------------------------------------------------------------------------------------
# The answer after the line that asked it (tmux joins wrapped lines with -J).
answer_to() { screen | grep -A1 -xF ">>> $1" | tail -1; }
start s4 -n 80 --temp 0
say '/grammar'
check "/grammar alone: none in force" wait_count 'no grammar: answers are free text' 1
schema='{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": false}'
say "/json-schema $schema"
check "/json-schema is taken" wait_count 'answers now follow the JSON schema' 1
say '/grammar'
check "/grammar shows the schema in force" wait_count "JSON schema: $schema" 1
is_n_object() {
  python3 -c 'import json, sys; v = json.loads(sys.argv[1]); assert list(v) == ["n"] and type(v["n"]) is int' "$1"
}
say 'Once upon a time'
check "an answer under /json-schema is its JSON ($(answer_to 'Once upon a time'))" \
  is_n_object "$(answer_to 'Once upon a time')"
say 'The end'
check "the next answer is the schema's JSON from its start ($(answer_to 'The end'))" is_n_object "$(answer_to 'The end')"
say '/stats'
check "/stats counts the grammar's masks" wait_count 'grammar masks:' 1
say '/grammar off'
check "/grammar off" wait_count 'grammar off: answers are free text' 1
say 'She went to the park'
not_json() { ! python3 -c 'import json, sys; json.loads(sys.argv[1])' "$1" 2>/dev/null; }
check "after /grammar off the answer is free text" not_json "$(answer_to 'She went to the park')"
say '/grammar root ::= "a" | ('
check "a bad /grammar: the error has line and column" wait_count "error: gbnf: line 1, column 16: unclosed '('" 1
say '/grammar'
check "a bad /grammar: still none in force" wait_count 'no grammar: answers are free text' 2
# A grammar over two lines (a trailing backslash continues the input), then a bad schema while it is in force.
tm send-keys -t repl -l '/grammar root ::= "yes" | "no" | more\'
tm send-keys -t repl Enter
say 'more ::= "maybe"'
check "a two-line grammar is taken" wait_count 'answers now follow the grammar' 1
say '/json-schema {"type": '
check "a bad schema while a grammar is in force: the error, and the grammar stays" \
  wait_count 'error: JSON: line 1, column' 1
check "the error says the grammar in force stays" wait_count '(the grammar in force stays)' 1
say 'Is it?'
check "the grammar in force still applies ($(answer_to 'Is it?'))" grep -qxE 'yes|no|maybe' <<<"$(answer_to 'Is it?')"
say '/help'
check "/help lists the grammar commands" wait_count '/json-schema SCHEMA' 1
tm send-keys -t repl -l "/quit"
tm send-keys -t repl Enter
check "/quit after the grammar commands" wait_file "$tmp/s4.exit"
check "exit status 0 after the grammar commands" grep -q '^EXIT=0$' "$tmp/s4.exit"

echo "repl: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
