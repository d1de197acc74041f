#!/usr/bin/env bash
# End-to-end checks of scripts/gpu-check, the script that spends the rare minutes of a lent GPU: a mistake in it
# (a table that is never written, a variant run without its environment variable, a failed check that still exits
# 0) would be found only there, at the cost of that machine. Here it runs against stand-ins for the GPU side: the
# real tandem, tandem-bench (writing the tiny synthetic preset in place of 1b / 7b / qwen*) and the emulated kernel
# bench, with `--backend cuda` turned into `--backend cpu`; stubs for the device tests, llama-bench, nvidia-smi and
# ncu. Each stand-in logs how it was called, so the checks see which variants ran with which environment, and the
# tables are parsed as the real programs print them.
# Usage: gpu_check.sh BUILD_DIR DATA_DIR
set -uo pipefail
build=$(cd "$1" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.bash"

stubs="$tmp/bin" path="$tmp/path" llama="$tmp/llama" base="$tmp/base" calls="$tmp/calls"
mkdir -p "$stubs" "$path" "$llama" "$base" "$calls"

# tandem-bench: the real one on the CPU, one repetition, the tiny preset; every call logged as the routes it forces
# (--cuda-route NAME=VALUE, sorted), "|", then its other arguments.
bench_stub() {  # bench_stub FILE LOGNAME
    cat >"$1" <<EOF
#!/usr/bin/env bash
routes=() rest=()
for ((i = 1; i <= \$#; i++)); do
    if [[ \${!i} == --cuda-route ]]; then i=\$((i + 1)); routes+=("\${!i}"); else rest+=("\${!i}"); fi
done
echo "\$(printf '%s\n' "\${routes[@]}" | sort | grep . | tr '\n' ' ')| \${rest[*]}" >>"$calls/$2"
# STUB_PERSISTENT_HANGS=1: a persistent-step run never returns (a grid barrier that never opens).
[[ \${STUB_PERSISTENT_HANGS:-0} == 1 && " \${routes[*]}" == *" persistent-step="* ]] && exec sleep 600
args=()
while [[ \$# -gt 0 ]]; do
    case "\$1" in
        --make-synthetic) args+=(--make-synthetic tiny); shift 2 ;;
        --backend) args+=(--backend cpu); shift 2 ;;
        -r) args+=(-r 1); shift 2 ;;
        *) args+=("\$1"); shift ;;
    esac
done
exec "$build/tandem-bench" "\${args[@]}"
EOF
    chmod +x "$1"
}
bench_stub "$stubs/tandem-bench" tandem-bench
bench_stub "$base/tandem-bench" baseline
echo "abc1234" >"$base/REVISION"

# tandem: the real one on the CPU; STUB_GREEDY_DIFFERS=1 makes the "GPU" run say something else.
cat >"$stubs/tandem" <<EOF
#!/usr/bin/env bash
args=() cuda=0
while [[ \$# -gt 0 ]]; do
    case "\$1" in
        --backend) [[ \$2 == cuda ]] && cuda=1; args+=(--backend cpu); shift 2 ;;
        --draft-backend) args+=(--draft-backend cpu); shift 2 ;;
        *) args+=("\$1"); shift ;;
    esac
done
"$build/tandem" "\${args[@]}"
rc=\$?
[[ \$cuda -eq 1 && \${STUB_GREEDY_DIFFERS:-0} == 1 ]] && printf ' and then something else'
exit \$rc
EOF

# The device tests: doctest's summary lines; STUB_DEVICE_TESTS_FAIL=1 fails them.
cat >"$stubs/tandem_cuda_device_tests" <<EOF
#!/usr/bin/env bash
echo "\$*" >>"$calls/device-tests"
echo "fp16 route on NVIDIA Stub GPU"
if [[ \${STUB_DEVICE_TESTS_FAIL:-0} == 1 ]]; then
    echo "[doctest] test cases:  40 |  39 passed | 1 failed | 0 skipped"
    echo "[doctest] assertions: 900 | 899 passed | 1 failed |"
    exit 1
fi
echo "[doctest] test cases:  40 |  40 passed | 0 failed | 0 skipped"
echo "[doctest] assertions: 900 | 900 passed | 0 failed |"
EOF

# The kernel bench: the emulated one on small shapes (gpu-check calls it without arguments).
emu="$build/tandem-cuda-kernel-bench-emu"
[[ -x "$emu" ]] || emu="$build/tandem-cuda-kernel-bench"
cat >"$stubs/tandem-cuda-kernel-bench" <<EOF
#!/usr/bin/env bash
exec "$emu" --types q4_0 --shapes 8x256 --tokens 1 --launches 1 --reps 1 --rotate-mib 0 --copy-mib 1 --gemm-tokens 3
EOF

# llama-bench: llama-bench's JSON, 800 tokens/s for pp512 and 100 for tg128 (medians of its samples).
cat >"$llama/llama-bench" <<EOF
#!/usr/bin/env bash
echo "\$*" >>"$calls/llama-bench"
echo '[{"n_prompt": 512, "n_gen": 0, "samples_ts": [700.0, 800.0, 900.0]},'
echo ' {"n_prompt": 0, "n_gen": 128, "samples_ts": [100.0, 90.0, 110.0]}]'
EOF

cat >"$path/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
echo "NVIDIA Stub GPU, 81559 MiB, 999.99"
EOF
cat >"$path/ncu" <<EOF
#!/usr/bin/env bash
echo "\$*" >>"$calls/ncu"
for i in 1 2 3; do echo "    Duration                         us        12.34"; done
EOF
chmod +x "$stubs"/* "$llama"/* "$path"/*

run_check() {  # run_check OUT ARGS...: gpu-check with the stand-ins; its stdout in OUT.stdout
    local out=$1; shift
    PATH="$path:$PATH" TMPDIR="$tmp" TANDEM_MODELS_DIR="$tmp/no-models" \
        "$root/scripts/gpu-check" --bin "$stubs" --out "$out" "$@" >"$out.stdout" 2>"$out.stderr"
}
rows() { grep -cE -e "$1" "$2"; }  # rows REGEX FILE: matching lines

# 1. The first device call: checks, kernel bench, 1B models with llama.cpp and the baseline, ncu.
out="$tmp/out"
run_check "$out" --quick --profile --llamacpp "$llama" --baseline "$base"
check "full run: exit 0" [ $? -eq 0 ]
check "summary: the device" grep -q '^gpu-check: device: NVIDIA Stub GPU' "$out/summary.txt"
check "summary: device tests passed" grep -q 'tandem_cuda_device_tests: exit 0; \[doctest\] test cases: *40 | *40 passed' "$out/summary.txt"
check "device tests: real-model cases excluded without the fetched models" grep -q -- "--test-case-exclude=real:\*" "$calls/device-tests"
check "summary: fp16 route reported" grep -q 'fp16 route on NVIDIA Stub GPU' "$out/summary.txt"
check "summary: greedy text equal for both prompts" [ "$(rows "greedy stories260K '.*': cuda == cpu" "$out/summary.txt")" -eq 2 ]
check "summary: speculative greedy equal, draft on either backend" [ "$(rows 'speculative greedy stories260K, draft on (cuda|cpu): cuda == cpu' "$out/summary.txt")" -eq 2 ]
check "kernel-bench.md: the matvec table" grep -qE '^\| q4_0 \| 8 x 256 \| 1 \|' "$out/kernel-bench.md"
check "kernel-bench.md: the GEMM table" grep -qE '^\| q4_0 \| 8 x 256 \| 3 \| int8 tensor-core \|' "$out/kernel-bench.md"

b="$out/bench.md"
check "bench.md: one header" [ "$(rows '^\| model \|' "$b")" -eq 1 ]
# The pair's target (Q4_K) and draft (Q4_0) add 3 such rows to the 4 types' 8: all are the tiny preset here.
check "bench.md: pp512 and tg128 of the 4 types and the pair" [ "$(rows '^\| synthetic-tiny-[A-Za-z0-9_-]+ \| .* \| (pp512|tg128) \|' "$b")" -eq 11 ]
check "bench.md: F16 and Q8_0 pp512 and tg128" [ "$(rows '^\| synthetic-tiny-(f16|q8_0) \| .* \| (pp512|tg128) \|' "$b")" -eq 4 ]
check "bench.md: baseline rows named by its revision" [ "$(rows '\| (pp512|tg128), baseline abc1234 \|' "$b")" -eq 8 ]
check "bench.md: PDL-off rows, every type" [ "$(rows '\| tg128, no overlapping launches \(PDL off\) \|' "$b")" -eq 4 ]
check "bench.md: persistent decode step rows, every type" [ "$(rows '\| tg128, persistent decode step \|' "$b")" -eq 4 ]
check "bench.md: persistent decode step rows walked directly, quantized types" [ "$(rows '\| tg128, persistent decode step, rows walked directly \|' "$b")" -eq 3 ]
check_all "bench.md: persistent decode step rows with the other activations (Q4_0 fp32, Q4_K and Q8_0 8-bit)" \
    [ "$(rows '\| synthetic-tiny-q4_0 \| .*\| tg128, persistent decode step, fp32 activations \|' "$b")" -eq 1 ] ::: \
    [ "$(rows '\| synthetic-tiny-(q4_K|q8_0) \| .*\| tg128, persistent decode step, 8-bit activations \|' "$b")" -eq 2 ]
check "bench.md: fp32 rows, each loads, quantized types" [ "$(rows '\| tg128, fp32 activations, (direct|staged|split|persistent) matvec \|' "$b")" -eq 12 ]
check "bench.md: int8 activation rows, each loads" [ "$(rows '\| tg128, int8 activations, (direct|staged|split|persistent) matvec \|' "$b")" -eq 12 ]
check "bench.md: no-graphs row" [ "$(rows '\| tg128, no CUDA graphs \|' "$b")" -eq 1 ]
check "bench.md: SIMT GEMM row" [ "$(rows '\| pp512, SIMT GEMM \|' "$b")" -eq 1 ]
check "bench.md: int8 GEMM rows" [ "$(rows '\| pp512, int8 tensor-core GEMM \|' "$b")" -eq 3 ]
check "bench.md: unfused row" [ "$(rows '\| tg128, separate Q/K/V, gate/up and SwiGLU \|' "$b")" -eq 1 ]
check "bench.md: ffn_down quantize launch row" [ "$(rows '\| tg128, ffn_down quantize launch \|' "$b")" -eq 1 ]
check "bench.md: RoPE launch rows (Q4_0 and the pair's two models)" [ "$(rows '\| tg128, RoPE launch \|' "$b")" -eq 3 ]
check "bench.md: RMSNorm launch rows (Q4_0 and the pair's two models)" [ "$(rows '\| tg128, RMSNorm launches \|' "$b")" -eq 3 ]
check "bench.md: Q/K/V launch-per-type rows (the pair's two models)" [ "$(rows '\| tg128, Q/K/V launch per type \|' "$b")" -eq 2 ]

# Each variant ran with its environment (the rows' labels come from the script, so check the calls too).
c="$calls/tandem-bench"
check "calls: fp32 rows under int8=0, each loads" [ "$(rows '^int8=0 matvec=(direct|staged|split|persistent) \| ' "$c")" -eq 12 ]
check "calls: PDL off" [ "$(rows '^pdl=0 \| ' "$c")" -eq 4 ]
check "calls: the persistent decode step, every type" [ "$(rows '^persistent-step=all \| .* -p 0 -n 128' "$c")" -eq 4 ]
check "calls: the persistent decode step walked directly, quantized types" [ "$(rows '^matvec=direct persistent-step=all \| .* -p 0 -n 128' "$c")" -eq 3 ]
check_all "calls: the persistent decode step with the other activations" \
    [ "$(rows '^int8=0 persistent-step=all \| .*q4_0.* -p 0 -n 128' "$c")" -eq 1 ] ::: \
    [ "$(rows '^int8=1 persistent-step=all \| .*(q4_k|q8_0).* -p 0 -n 128' "$c")" -eq 2 ]
check "calls: int8 activations, each loads" [ "$(rows '^int8=1 matvec=(direct|staged|split|persistent) \| ' "$c")" -eq 12 ]
check "calls: graphs off" [ "$(rows '^graphs=0 \| ' "$c")" -eq 1 ]
check "calls: SIMT GEMM" [ "$(rows '^gemm=simt \| ' "$c")" -eq 1 ]
check "calls: int8 GEMM" [ "$(rows '^gemm=int8 \| ' "$c")" -eq 3 ]
check "calls: unfused" [ "$(rows '^fused-matvecs=0 \| ' "$c")" -eq 1 ]
check "calls: gate/up without its quantize" [ "$(rows '^gate-up-q8=0 \| ' "$c")" -eq 1 ]
check "calls: RoPE launched on its own" [ "$(rows '^qkv-rope=0 \| ' "$c")" -eq 3 ]
check "calls: RMSNorms launched on their own" [ "$(rows '^matvec-norm=0 \| ' "$c")" -eq 3 ]
check_all "calls: the pair's target and draft with Q/K/V in a launch per type" [ "$(rows "^qkv-pairs=0 \| .*qwen1.5b-q4_k_m-next.gguf --backend cuda -p 0 -n 128" "$c")" -eq 1 ] ::: [ "$(rows "^qkv-pairs=0 \| .*qwen0.5b-q4_k_m-next90.gguf --backend cuda -p 0 -n 128" "$c")" -eq 1 ]
check "calls: every benchmark on the GPU" [ "$(grep -v -- '--make-synthetic' "$c" | grep -vc -- '--backend cuda')" -eq 0 ]
check "calls: 1B models of 4 types and the pair made (three drafts)" [ "$(rows '--make-synthetic (1b|qwen1.5b|qwen0.5b) ' "$c")" -eq 8 ]
# (The 7B's name, made or read: a bare '7b' also matches a mktemp directory's random letters.)
check "calls: no 7B model in a --quick run" [ "$(rows '(--make-synthetic 7b |/7b-)' "$c")" -eq 0 ]

# The default pair's shapes (4c).
check_all "calls: the pair's target and draft benchmarked" [ "$(rows "qwen1.5b-q4_k_m-next.gguf --backend cuda -p 512 -n 128" "$c")" -eq 1 ] ::: [ "$(rows "^\| .*qwen0.5b-q4_k_m-next90.gguf --backend cuda -p 0 -n 128" "$c")" -eq 1 ]
check_all "calls: the pair's target and draft with RoPE launched on its own" [ "$(rows "^qkv-rope=0 \| .*qwen1.5b-q4_k_m-next.gguf --backend cuda -p 0 -n 128" "$c")" -eq 1 ] ::: [ "$(rows "^qkv-rope=0 \| .*qwen0.5b-q4_k_m-next90.gguf --backend cuda -p 0 -n 128" "$c")" -eq 1 ]
check_all "calls: the pair's target and draft with the RMSNorms launched on their own" [ "$(rows "^matvec-norm=0 \| .*qwen1.5b-q4_k_m-next.gguf --backend cuda -p 0 -n 128" "$c")" -eq 1 ] ::: [ "$(rows "^matvec-norm=0 \| .*qwen0.5b-q4_k_m-next90.gguf --backend cuda -p 0 -n 128" "$c")" -eq 1 ]
check_all "calls: the pair made as next-token models, drafts agreeing on 90% and 95%" [ "$(rows '--make-synthetic qwen1.5b --type q4_k_m --next-token 1 ' "$c")" -eq 1 ] ::: [ "$(rows '--make-synthetic qwen0.5b --type q4_k_m --next-token 0.90 ' "$c")" -eq 1 ] ::: [ "$(rows '--make-synthetic qwen0.5b --type q4_k_m --next-token 0.95 ' "$c")" -eq 1 ]
check "calls: the pair's speculative runs on the GPU, each draft, and 90% with separate picks, without drafting ahead, at the default stream priority and with the persistent draft step" [ "$(rows '--draft .*qwen0.5b-q4_k_m-next9[05].gguf --backend cuda -n 128' "$c")" -eq 6 ]
check_all "calls: the replaying draft made from the recorded pattern and run" [ "$(rows '--make-synthetic qwen0.5b --type q4_k_m --next-token-pattern .*scripts/pair-agreement.txt ' "$c")" -eq 1 ] ::: [ "$(rows '^\| .*--draft .*qwen0.5b-q4_k_m-next-replay.gguf --backend cuda -n 128' "$c")" -eq 1 ]
check "calls: the speculative run with the picks in separate launches" [ "$(rows '^one-launch-picks=0 \| .*--draft .*qwen0.5b-q4_k_m-next90.gguf --backend cuda -n 128' "$c")" -eq 1 ]
check "calls: the speculative run without drafting ahead" [ "$(rows '^\| .*--draft .*qwen0.5b-q4_k_m-next90.gguf --backend cuda -n 128 --draft-ahead 0' "$c")" -eq 1 ]
check "calls: the speculative run at the default stream priority" [ "$(rows '^stream-priority=0 \| .*--draft .*qwen0.5b-q4_k_m-next90.gguf --backend cuda -n 128' "$c")" -eq 1 ]
check "calls: the speculative run with the draft's steps in one persistent launch" [ "$(rows '^persistent-step=draft \| .*--draft .*qwen0.5b-q4_k_m-next90.gguf --backend cuda -n 128' "$c")" -eq 1 ]
check_all "pair-speculative.md: a row per built-in prompt and draft, with its speedup, the separate-picks run, the one without drafting ahead, the one at the default stream priority and the one with the persistent draft step" [ "$(rows '^\| [^|]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.]+x \| ' "$out/pair-speculative.md")" -eq 21 ] ::: [ "$(rows '^next-token pair .* replaying the real pair.s greedy agreement: [0-9]+ of [0-9]+ recorded steps agree' "$out/pair-speculative.md")" -eq 1 ] ::: [ "$(rows '^next-token pair .* (90|95)% of tokens' "$out/pair-speculative.md")" -eq 2 ] ::: [ "$(rows '^the same at 90%, picks in separate launches' "$out/pair-speculative.md")" -eq 1 ] ::: [ "$(rows '^the same at 90%, without drafting ahead' "$out/pair-speculative.md")" -eq 1 ] ::: [ "$(rows '^the same at 90%, the target.s stream at the default priority' "$out/pair-speculative.md")" -eq 1 ] ::: [ "$(rows '^the same at 90%, the draft.s steps in one persistent launch' "$out/pair-speculative.md")" -eq 1 ]
check "pair-verify.md: a row per token count, the current binary's and the baseline's" [ "$(rows '^\| (1|2|3|4|5|6|8|9|12|16) \| [0-9.]+ \|' "$out/pair-verify.md")" -eq 20 ]
check_all "pair-verify.md: the baseline's costs named by its revision, from its own binary" [ "$(rows '^the same, baseline abc1234:' "$out/pair-verify.md")" -eq 1 ] ::: [ "$(rows 'qwen1.5b-q4_k_m-next.gguf --backend cuda .*--verify' "$calls/baseline")" -eq 1 ]

# llama.cpp beside tandem (5): llama-bench on the same files, and the ratio of medians.
check "llama-bench: once per model, all layers on the GPU" [ "$(rows '-ngl 99 -fa 1' "$calls/llama-bench")" -eq 4 ]
s="$out/side-by-side.md"
check "side-by-side.md: one header" [ "$(rows '^\| model \| test \|' "$s")" -eq 1 ]
check "side-by-side.md: pp512 and tg128 per model" [ "$(rows '^\| 1b-(q4_0|q4_k|q8_0|f16) \| (pp512|tg128) \| [0-9,.]+ \| (800.0|100.0) \| [0-9.]+ \|$' "$s")" -eq 8 ]
# The ratio column is tandem's median over llama.cpp's, recomputed here from the row itself.
ratios_ok() {
    python3 - "$1" <<'EOF'
import sys
for line in open(sys.argv[1]):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 5 and cells[2][0].isdigit():
        t, l, r = float(cells[2].replace(",", "")), float(cells[3].replace(",", "")), float(cells[4])
        assert abs(t / l - r) <= 0.006, line
EOF
}
check "side-by-side.md: ratio = tandem / llama.cpp" ratios_ok "$s"
v="$out/variants.md"
check_all "variants.md: every variant row of bench.md beside its default" \
    [ "$(rows '^\| synthetic-.* \| (tg128|pp512), ' "$v")" -eq "$(rows '^\| synthetic-.* \| (tg128|pp512), ' "$b")" ] ::: \
    [ "$(rows '^\| synthetic-tiny-q4_0 \| tg128, fp32 activations, staged matvec \|' "$v")" -eq 1 ]
check "variants.md: ratio = variant / default" ratios_ok "$v"

# Nsight Compute (7): each loads, graphs off, past one decode step of the 1B model's 22 layers.
check "ncu: four runs" [ "$(wc -l <"$calls/ncu")" -eq 4 ]
check "ncu: graphs off, direct, split, staged and persistent" [ "$(rows 'tandem-bench --cuda-route graphs=0 --cuda-route matvec=(direct|split|staged|persistent) ' "$calls/ncu")" -eq 4 ]
check "ncu: skips the first step's launches" \
    [ "$(rows '--launch-skip 200 --launch-count 40 .*--cuda-route matvec=(direct|split) ' "$calls/ncu")" -eq 2 ]
check "ncu: skips the first step's launches (staged and persistent: 8 a layer)" \
    [ "$(rows '--launch-skip 178 --launch-count 40 .*--cuda-route matvec=(staged|persistent) ' "$calls/ncu")" -eq 2 ]
check "summary: profiled kernels counted" grep -q 'ncu: 3 kernels profiled' "$out/summary.txt"
check "stdout: the tables at the end" grep -q 'tg128, int8 activations, staged matvec' "$out.stdout"
# The seconds of every step, for planning the next device call.
steps_timed() {  # steps_timed SUMMARY STEP...: a "time: STEP: N s" line for each
    local summary=$1 step; shift
    for step in "$@"; do grep -qF "gpu-check: time: $step: " "$summary" || return 1; done
}
check "summary: every step timed" steps_timed "$out/summary.txt" "device and copy bandwidth" "device tests" \
    "greedy text" "kernel bench" \
    "synthetic models (1b)" "benchmarks per model" "graphs-off, SIMT and int8 GEMM rows" "default pair" "unfused rows" \
    "ncu" "total"
check "summary: times in whole seconds" [ "$(grep -c 'gpu-check: time: .*: [0-9][0-9]* s$' "$out/summary.txt")" -eq 11 ]

# 2. The second call: --bench-only --sizes 7b appends to the same tables, runs no checks and no pair.
device_test_runs=$(wc -l <"$calls/device-tests")
run_check "$out" --bench-only --sizes 7b --llamacpp "$llama"
check "bench-only run: exit 0" [ $? -eq 0 ]
check "bench-only run: no device tests" [ "$(wc -l <"$calls/device-tests")" -eq "$device_test_runs" ]
check_all "bench-only run: 7B models made, no pair (still the first call's four)" [ "$(rows '--make-synthetic 7b ' "$c")" -eq 4 ] ::: [ "$(rows '--make-synthetic qwen' "$c")" -eq 4 ]
check "bench-only run: bench.md still one header" [ "$(rows '^\| model \|' "$b")" -eq 1 ]
check "bench-only run: 7B rows appended" [ "$(rows '\| tg128, no overlapping launches \(PDL off\) \|' "$b")" -eq 8 ]
check_all "bench-only run: its own steps timed, no checks" steps_timed "$out/summary.txt" "synthetic models (7b)" ::: \
    [ "$(grep -c 'time: device tests' "$out/summary.txt")" -eq 1 ] ::: [ "$(grep -c 'time: default pair' "$out/summary.txt")" -eq 1 ]
check_all "bench-only run: side-by-side.md gains the 7B rows" [ "$(rows '^\| 7b-' "$s")" -eq 8 ] ::: [ "$(rows '^\| model \| test \|' "$s")" -eq 1 ]

# 2b. --types narrows a call to some weight types (a short follow-up call, say the 7B Q4_K and Q8_0 models), --loads
# the forced-route rows to some loads. Without
# Q4_0 the rows made from the Q4_0 model (graphs off, SIMT, unfused, ncu) are left out, even when an earlier call
# left that file behind.
before=$(wc -l <"$c")
ncu_before=$(wc -l <"$calls/ncu")
run_check "$tmp/typed" --bench-only --sizes 7b --types "q4_k q8_0" --loads persistent --profile
check "--types run: exit 0" [ $? -eq 0 ]
t="$tmp/typed/bench.md" new_calls=$(tail -n +$((before + 1)) "$c")
check_all "--types run: only those models benchmarked" [ "$(grep -c -- '-m .*/7b-\(q4_k\|q8_0\)\.gguf' <<<"$new_calls")" -gt 0 ] ::: \
    [ "$(grep -- ' -m ' <<<"$new_calls" | grep -vc -- '/7b-\(q4_k\|q8_0\)\.gguf')" -eq 0 ]
check "--types run: PDL-off rows for the two types" [ "$(rows '\| tg128, no overlapping launches \(PDL off\) \|' "$t")" -eq 2 ]
check "--types run: int8 GEMM rows for the two types" [ "$(rows '\| pp512, int8 tensor-core GEMM \|' "$t")" -eq 2 ]
check_all "--types run: no Q4_0 rows without Q4_0" [ "$(rows '\| tg128, (no CUDA graphs|separate Q/K/V, gate/up and SwiGLU|ffn_down quantize launch) \|' "$t")" -eq 0 ] ::: \
    [ "$(rows '\| pp512, SIMT GEMM \|' "$t")" -eq 0 ] ::: [ "$(wc -l <"$calls/ncu")" -eq "$ncu_before" ]
check_all "--loads persistent: only those forced rows, both activations" [ "$(rows '\| tg128, (fp32|int8) activations, persistent matvec \|' "$t")" -eq 4 ] ::: \
    [ "$(rows '\| tg128, (fp32|int8) activations, (direct|staged|split) matvec \|' "$t")" -eq 0 ]
run_check "$tmp/badloads" --loads "staged wide"
check_all "--loads: unknown loads are refused with exit 2" [ $? -eq 2 ] ::: grep -q "'wide' is not one of" "$tmp/badloads.stderr"
# A mixture (llama.cpp's Q5_K_M) is a --types name too: its model is written with that --type and gets the
# quantized types' rows.
before=$(wc -l <"$c")
run_check "$tmp/mixture" --bench-only --sizes 7b --types q5_k_m --loads ""
check "--types q5_k_m: exit 0" [ $? -eq 0 ]
new_calls=$(tail -n +$((before + 1)) "$c")
made=$(grep -c -- '--make-synthetic 7b --type q5_k_m' <<<"$new_calls")
check_all "--types q5_k_m: its model made and benchmarked (no 8-bit persistent row: no such kernel takes Q5_K)" [ "$made" -eq 1 ] ::: \
    [ "$(rows '\| tg128, persistent decode step, rows walked directly \|' "$tmp/mixture/bench.md")" -eq 1 ] ::: \
    [ "$(rows '\| tg128, persistent decode step, (8-bit|fp32) activations \|' "$tmp/mixture/bench.md")" -eq 0 ]
# --run-timeout bounds each run: a hung one costs its seconds, and the rows after it are still measured.
start=$SECONDS
STUB_PERSISTENT_HANGS=1 run_check "$tmp/hang" --bench-only --sizes 7b --types q8_0 --loads "" --run-timeout 5
check_all "--run-timeout: a hung run is cut and the call goes on" [ $? -eq 0 ] ::: [ $((SECONDS - start)) -lt 120 ] ::: \
    [ "$(rows '\| tg128, persistent decode step' "$tmp/hang/bench.md")" -eq 0 ] ::: \
    [ "$(rows '\| tg128, no overlapping launches \(PDL off\) \|' "$tmp/hang/bench.md")" -eq 1 ]
run_check "$tmp/badtimeout" --run-timeout 5s
check_all "--run-timeout: a value that is not whole seconds is refused with exit 2" [ $? -eq 2 ] ::: \
    grep -q "whole seconds" "$tmp/badtimeout.stderr"
run_check "$tmp/badtype" --types "q4_0 q7_k"
check_all "--types: an unknown type is refused with exit 2" [ $? -eq 2 ] ::: grep -q "'q7_k' is not one of" "$tmp/badtype.stderr"

# 3. Failed checks make the exit status non-zero; benchmarks never do.
STUB_DEVICE_TESTS_FAIL=1 run_check "$tmp/fail1" --quick
check "failed device tests: exit non-zero" [ $? -ne 0 ]
check "failed device tests: in the summary" grep -q 'tandem_cuda_device_tests: exit 1' "$tmp/fail1/summary.txt"
STUB_GREEDY_DIFFERS=1 run_check "$tmp/fail2" --quick
check "greedy mismatch: exit non-zero" [ $? -ne 0 ]
check "greedy mismatch: in the summary" grep -q "cuda differs from cpu" "$tmp/fail2/summary.txt"
check "greedy mismatch: the speculative runs too" [ "$(rows 'speculative .*: cuda differs from cpu' "$tmp/fail2/summary.txt")" -eq 2 ]
check_all "greedy mismatch: both texts in greedy.log" grep -q '^cpu: ' "$tmp/fail2/greedy.log" ::: \
    grep -q 'something else' "$tmp/fail2/greedy.log"
run_check "$tmp/bad" --sizez 1b
check "unknown argument: exit 2" [ $? -eq 2 ]
check "unknown argument: named" grep -q "sizez" "$tmp/bad.stderr"

echo "gpu_check.sh: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
