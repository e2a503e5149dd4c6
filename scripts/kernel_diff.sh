#!/bin/bash
# kernel_diff.sh — what a change does to the CUDA kernels' code, without a GPU.
#
# Compiles every CUDA file (src/backend/cuda/*.cu, bench/*.cu) at git revision REV (default HEAD) and in
# the working tree, for sm_90a as CMake does, and reports per file:
#   - each kernel whose registers or spill bytes changed (ptxas -v): "regs a -> b, spills a -> b";
#   - how many PTX instructions differ once register numbers and labels are erased (0: the same
#     instruction stream, so ptxas makes the same machine code up to register naming), and the
#     opcodes behind the difference (added > / removed <), for reading what moved.
# A refactor that should not change what runs shows 0 or a reordering (the same opcodes on both sides);
# anything else is a change to measure on the GPU.
#
# usage: scripts/kernel_diff.sh [REV] [file.cu ...]   (needs nvcc: /usr/local/cuda/bin or PATH)
set -euo pipefail
rev=${1:-HEAD}
shift || true
root=$(git rev-parse --show-toplevel)
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$root" worktree add --detach -q "$work/base" "$rev"
cd "$root"
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(src/backend/cuda/*.cu bench/*.cu)

anon='s/_GLOBAL__N__[0-9a-f]+_[0-9]+_[A-Za-z0-9_]+_cu_[0-9a-f]+/ANON/g'
flags=(-O3 -std=c++17 -DCLEF_CUDA_WGMMA -DCLEF_HAVE_CUDA --generate-code=arch=compute_90a,code=[sm_90a])
# $1 tree, $2 file, $3 out prefix: $3.regs (kernel regs spills) and $3.ptx (register numbers erased)
build() {
    "$nvcc" "${flags[@]}" -I"$1/src" -I"$1/include" -x cu -cubin -o /dev/null "$1/$2" -Xptxas -v 2>&1 |
        awk -F"'" '/Compiling entry function/ {k = $2} /spill stores/ {split($0, a, " "); sp = a[5]}
                   /Used [0-9]+ registers/ {split($0, a, " "); print k, a[5], sp}' | sed -E "$anon" | sort >"$3.regs"
    "$nvcc" "${flags[@]/code=\[sm_90a\]/code=[compute_90a]}" -I"$1/src" -I"$1/include" -x cu -ptx -o "$3.ptx" "$1/$2"
    sed -E -i "$anon"'; /^\s*\/\//d; s/%(rd|rs|r|fd|f|p|h|b)[0-9]+/%\1/g; s/\$L__BB[0-9_]+/$L/g; s/\.reg \.\w+\s+%\w+<[0-9]+>;/.reg/' "$3.ptx"
}
for f in "${files[@]}"; do
    n=$(basename "$f" .cu)
    if [ ! -f "$work/base/$f" ]; then echo "$f: new file"; continue; fi
    build "$work/base" "$f" "$work/a_$n"
    build "$root" "$f" "$work/b_$n"
    join -a1 -a2 -e - -o 0,1.2,1.3,2.2,2.3 "$work/a_$n.regs" "$work/b_$n.regs" |
        awk -v f="$f" '$2 != $4 || $3 != $5 {print f ": " $1 ": regs " $2 " -> " $4 ", spills " $3 " -> " $5}'
    d=$(diff "$work/a_$n.ptx" "$work/b_$n.ptx" | grep -c '^[<>]' || true)
    echo "$f: $(wc -l <"$work/b_$n.regs") kernels, $d PTX instructions differ"
    if [ "$d" -gt 0 ]; then
        { diff "$work/a_$n.ptx" "$work/b_$n.ptx" || true; } | grep '^[<>]' | awk '{print $1, $2}' | sort | uniq -c |
            sort -rn | awk 'NR <= 8 {print "    " $0}'
    fi
done
