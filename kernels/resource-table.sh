#!/usr/bin/env bash
# Prints a per-kernel resource table (registers, shared memory, stack frame, spill bytes) for every architecture.
#   kernels/resource-table.sh [library.a | build dir]      ARCHS="80 86 89 90" NVCC=nvcc
# Its sources, best first: the ptxas reports the build kept beside the library's objects (<object>.ptxas, written by
# ptxas-report.sh, the build's nvcc launcher); cuobjdump on the library (full CUDA toolkit); or, with neither, a
# recompile of each kernels/*.cu to a cubin per architecture with ptxas' report, which takes as long as the build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
nvcc=${NVCC:-nvcc}
archs=${ARCHS:-80 86 89 90}
lib=${1:-}
# A build directory names its library (searching the directory's parent would take other builds' reports too).
if [ -n "$lib" ] && [ -d "$lib" ]; then lib="$lib/kernels/libtandem_cuda.a"; fi
demangle() { if command -v c++filt >/dev/null; then c++filt; else cat; fi; }

# ptxas -v / --resource-usage lines -> normalised records (below).
parse_ptxas() {
  awk '
    /Compiling entry function/ { fn = $0; sub(/.*function \047/, "", fn); sub(/\047.*/, "", fn)
                                 arch = $0; sub(/.* for \047sm_/, "", arch); sub(/\047.*/, "", arch) }
    /bytes stack frame/ { st = $1; ss = $5; sl = $9 }
    /Used [0-9]+ registers/ { r = $5; s = 0
                              for (i = 1; i <= NF; i++) if ($(i+2) ~ /^smem/) s = $i
                              printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", arch, r, s, st, ss, sl, fn }'
}

# Normalised records: arch<TAB>regs<TAB>smem<TAB>stack<TAB>spill_st<TAB>spill_ld<TAB>mangled name
records() {
  if [ -n "$lib" ]; then
    local reports sources
    reports=$(find "$(dirname "$lib")" -name '*.cu.o.ptxas' | sort)
    sources=$(find "$here" -maxdepth 1 -name '*.cu' | wc -l)
    if [ -n "$reports" ] && [ "$(printf '%s\n' "$reports" | wc -l)" -eq "$sources" ]; then
      # shellcheck disable=SC2086  # one path per line, no spaces in build paths
      cat $reports | parse_ptxas
      return
    fi
  fi
  if [ -n "$lib" ] && command -v cuobjdump >/dev/null; then
    cuobjdump --dump-resource-usage "$lib" | awk '
      /arch = sm_/ { sub(/.*arch = sm_/, ""); arch = $1 }
      /Function [^ ]+:/ { fn = $2; sub(/:$/, "", fn) }
      /REG:/ { r = s = st = l = 0
               for (i = 1; i <= NF; i++) { split($i, kv, ":")
                 if (kv[1] == "REG") r = kv[2]; else if (kv[1] == "SHARED") s = kv[2]
                 else if (kv[1] == "STACK") st = kv[2]; else if (kv[1] == "LOCAL") l = kv[2] }
               # cuobjdump has no spill counts; local memory (where spills go) stands in for them.
               printf "%s\t%s\t%s\t%s\tlocal:%s\t-\t%s\n", arch, r, s, st, l, fn }'
    return
  fi
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  for arch in $archs; do
    for cu in "$here"/*.cu; do
      "$nvcc" -std=c++17 -O3 -I"$here" -I"$here/../src" -cubin -arch=sm_"$arch" --resource-usage "$cu" \
        -o "$tmp/k.cubin" 2>&1
    done | parse_ptxas
  done
}

printf '%-5s %5s %7s %6s %9s  %s\n' arch regs smem stack spill-st/ld kernel
records | while IFS=$'\t' read -r arch regs smem stack sst sld fn; do
  printf '%-5s %5s %7s %6s %9s  %s\n' "sm_$arch" "$regs" "$smem" "$stack" "$sst/$sld" "$(printf '%s' "$fn" | demangle)"
done | sed -E 's/\(anonymous namespace\)|_GLOBAL__N__[0-9a-f_]+[a-z_]+cu_[0-9a-f]+//g; s/tandem::cuda:::*//g'
