#!/usr/bin/env bash
# End-to-end checks of tandem-cuda-kernel-bench, the CUDA matvec benchmark that scripts/gpu-check runs on a lent
# GPU: on the emulation (the -emu build beside an nvcc build, or the tool itself without nvcc) it prints a row per
# type x shape x tokens x activations x loads (direct, staged, split, persistent), each but fp32-direct with its ratio to that; the GEMM table a row
# per type x shape x chunk x route, the int8 route's with its ratio to the fp16 route's; bad flags are errors;
# --acts picks the activations; and the nvcc build,
# here without a usable device, says so and fails instead of printing figures.
# Usage: cuda_kernel_bench.sh BUILD_DIR DATA_DIR
set -uo pipefail
build=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/lib/checks.bash"

emu="$build/tandem-cuda-kernel-bench-emu"
[[ -x "$emu" ]] || emu="$build/tandem-cuda-kernel-bench"
small=(--types q4_0,q6_k --shapes 8x256,5x512 --tokens 1,3 --launches 2 --reps 1 --rotate-mib 0 --copy-mib 1
       --gemm-tokens 0)
"$emu" "${small[@]}" >"$tmp/out" 2>"$tmp/err"
check "emulated run: exit 0" [ $? -eq 0 ]
check "emulated run: device line" grep -q '^device: CUDA emulation' "$tmp/out"
check "emulated run: copy bandwidth line" grep -q '^device-to-device copy: ' "$tmp/out"
check "emulated run: 2 types x 2 shapes x 2 token counts x 2 activations x 4 loads rows" [ "$(grep -c '^| q[46]_[0K] |' "$tmp/out")" -eq 64 ]
check "emulated run: rows other than fp32 direct carry a ratio to it" [ "$(grep -cE '^\| q[46]_[0K] \| .* \| (int8 \| direct|[a-z0-9]+ \| (staged|split|persistent)) \| .* \| [0-9.]+x \|$' "$tmp/out")" -eq 56 ]
check "emulated run: int8 rows" [ "$(grep -cE '^\| q[46]_[0K] \| .* \| int8 \| ' "$tmp/out")" -eq 32 ]
check "emulated run: split rows" [ "$(grep -cE '^\| q[46]_[0K] \| .* \| (f32|int8) \| split \| ' "$tmp/out")" -eq 16 ]
check "emulated run: persistent rows" [ "$(grep -cE '^\| q[46]_[0K] \| .* \| (f32|int8) \| persistent \| ' "$tmp/out")" -eq 16 ]
"$emu" "${small[@]}" --acts int8 --loads staged >"$tmp/out" 2>"$tmp/err"
check "--acts int8 --loads staged: 8 such rows" [ "$(grep -cE '^\| q[46]_[0K] \| .* \| int8 \| staged \| ' "$tmp/out")" -eq 8 ]
check "--acts int8 --loads staged: no others" [ "$(grep -c '^| q[46]_[0K] |' "$tmp/out")" -eq 8 ]

gemm=(--types q4_0,q6_k --shapes 8x256 --tokens 1 --acts f32 --loads direct --launches 1 --reps 1 --rotate-mib 0
      --copy-mib 0 --gemm-tokens 3,70)
"$emu" "${gemm[@]}" >"$tmp/out" 2>"$tmp/err"
check "gemm table: exit 0" [ $? -eq 0 ]
check "gemm table: 2 types x 2 chunks fp16-route rows" [ "$(grep -cE '^\| q[46]_[0K] \| 8 x 256 \| (3|70) \| fp16 SIMT \| [0-9.]+ \| [0-9.]+ \| - \|$' "$tmp/out")" -eq 4 ]
check "gemm table: as many int8 rows, with their ratio" [ "$(grep -cE '^\| q[46]_[0K] \| 8 x 256 \| (3|70) \| int8 tensor-core \| [0-9.]+ \| [0-9.]+ \| [0-9.]+x \|$' "$tmp/out")" -eq 4 ]
"$emu" --gemm-tokens 5,-1 >/dev/null 2>"$tmp/err"
check "a negative chunk is refused" [ $? -eq 2 ]

"$emu" --types f16 >/dev/null 2>"$tmp/err"
check "a float type is refused" [ $? -eq 2 ]
check "a float type is named" grep -q 'f16' "$tmp/err"
"$emu" --shapes 4096 >/dev/null 2>"$tmp/err"
check "a malformed shape is refused" [ $? -eq 2 ]
"$emu" --tokens 17 >/dev/null 2>"$tmp/err"
check "17 tokens are refused" [ $? -eq 2 ]
"$emu" --acts int4 >/dev/null 2>"$tmp/err"
check "unknown activations are refused" [ $? -eq 2 ]
"$emu" --loads direct,wide >/dev/null 2>"$tmp/err"
check_all "unknown loads are refused, named" [ $? -eq 2 ] ::: grep -q "'wide'" "$tmp/err"
"$emu" --types q4_0 --shapes 8x48 --tokens 1 --launches 1 --reps 1 --rotate-mib 0 --copy-mib 0 >"$tmp/out" 2>"$tmp/err"
check "columns that are not whole blocks: skipped with a note" grep -q 'not whole blocks' "$tmp/err"

if [[ "$emu" == *-emu && -x "$build/tandem-cuda-kernel-bench" ]]; then
    if "$build/tandem-cuda-kernel-bench" --shapes 8x256 --tokens 1 --copy-mib 1 --rotate-mib 0 >"$tmp/out" 2>"$tmp/err"; then
        ok  # a machine with a GPU: it ran
    else
        check "no device: named on stderr" grep -q 'no CUDA device' "$tmp/err"
        check "no device: no table on stdout" [ ! -s "$tmp/out" ]
    fi
fi

echo "cuda_kernel_bench.sh: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
