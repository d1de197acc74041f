# End-to-end test of tandem-inspect: a good file prints its tensor table; a missing or corrupt file fails with a
# message on stderr and nothing on stdout; a closed pipe is not an error.
# Usage: bash tests/e2e/inspect.sh BUILD_DIR DATA_DIR
set -euo pipefail

build_dir=${1:?usage: inspect.sh BUILD_DIR DATA_DIR}
data_dir=${2:?usage: inspect.sh BUILD_DIR DATA_DIR}
inspect="$build_dir/tandem-inspect"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() {
    echo "inspect.sh: FAIL: $*" >&2
    exit 1
}

[[ -x "$inspect" ]] || fail "$inspect is not built"

# A valid model: succeeds and shows metadata and tensors.
"$inspect" "$data_dir/stories260K.gguf" >"$tmp/out" 2>"$tmp/err" ||
    fail "inspecting stories260K.gguf failed: $(cat "$tmp/err")"
grep -q "blk.0.attn_q.weight" "$tmp/out" || fail "tensor table lacks blk.0.attn_q.weight"
grep -q "llama.embedding_length" "$tmp/out" || fail "metadata lacks llama.embedding_length"
grep -q "tensors: *48" "$tmp/out" || fail "tensor count 48 not shown"
[[ ! -s "$tmp/err" ]] || fail "stderr not empty for a valid file: $(cat "$tmp/err")"

# A vocabulary-only file (no tensors) is valid too.
"$inspect" "$data_dir/ggml-vocab-llama-spm.gguf" >"$tmp/out" 2>"$tmp/err" || fail "inspecting the vocab file failed"
grep -q "string × 32000" "$tmp/out" || fail "vocab array not abbreviated as [string × 32000]"

# Errors: non-zero exit, a message naming the file on stderr, nothing on stdout.
expect_failure() {
    local what=$1 file=$2 word=$3
    if "$inspect" "$file" >"$tmp/out" 2>"$tmp/err"; then fail "$what: exit status 0"; fi
    [[ ! -s "$tmp/out" ]] || fail "$what: stdout not empty"
    grep -qF "$file" "$tmp/err" || fail "$what: stderr does not name the file: $(cat "$tmp/err")"
    grep -q "$word" "$tmp/err" || fail "$what: stderr lacks '$word': $(cat "$tmp/err")"
}
expect_failure "missing file" "$tmp/does-not-exist.gguf" "cannot open"
head -c 100 "$data_dir/stories260K.gguf" >"$tmp/truncated.gguf"
expect_failure "truncated file" "$tmp/truncated.gguf" "truncated"
head -c -100 "$data_dir/stories260K.gguf" >"$tmp/short-data.gguf"
expect_failure "file missing its last bytes" "$tmp/short-data.gguf" "extends past the end"
expect_failure "not a GGUF file" "$data_dir/stories260K.bin" "magic"
: >"$tmp/empty.gguf"
expect_failure "empty file" "$tmp/empty.gguf" "empty"

# Usage errors fail too; --help succeeds.
if "$inspect" >/dev/null 2>&1; then fail "no arguments: exit status 0"; fi
"$inspect" --help | grep -q "GGUF" || fail "--help does not describe the tool"

# A reader that stops early (closed pipe) ends the program quietly and successfully. Listing every vocabulary
# entry makes ~700 KB of output, far more than a pipe buffers, so the writes really do hit the closed pipe.
status=0
"$inspect" --items 100000 "$data_dir/ggml-vocab-llama-spm.gguf" 2>"$tmp/err" | head -c 10 >/dev/null || status=$?
[[ $status -eq 0 ]] || fail "closed pipe: exit status $status"
[[ ! -s "$tmp/err" ]] || fail "closed pipe: stderr not empty: $(cat "$tmp/err")"

echo "inspect.sh: all checks passed"
