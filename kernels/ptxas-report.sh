#!/usr/bin/env bash
# nvcc launcher of tandem_cuda (kernels/CMakeLists.txt): runs the compile command it is handed with ptxas' resource
# report on (-Xptxas=-v) and keeps that report beside the object file (<object>.ptxas), so that resource-table.sh
# reads what the build itself compiled rather than compiling every kernel again per architecture (4 minutes of CI
# on 2 cores). The report's lines stay out of the build log; every other line of stderr (warnings, errors, spills)
# passes through, and the exit status is the compiler's.
set -uo pipefail
out= prev=
for arg in "$@"; do
  [ "$prev" = -o ] && out=$arg
  prev=$arg
done
[ -n "$out" ] || exec "$@"

report="$out.ptxas"
"$@" -Xptxas=-v 2>"$report.tmp"
rc=$?
grep -v -e '^ptxas info' -e '^ *[0-9]* bytes stack frame' "$report.tmp" >&2
if [ "$rc" -eq 0 ]; then mv "$report.tmp" "$report"; else rm -f "$report.tmp" "$report"; fi
exit "$rc"
