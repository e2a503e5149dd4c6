#!/bin/bash
# gpu_pack.sh — build the GPU binaries on this machine (nvcc, sm_90a only: CLEF_CUDA_ARCHS, default
# 90a, keeps the pack small; CLEF_MEDIA=OFF so FFmpeg stays out) and pack them, with the shared libraries they need beyond glibc, libstdc++ and the CUDA
# toolkit's libcublasLt, into .gpu/pack.tar.xz for scripts/gpu_check.sh on a GPU machine that has
# the NVIDIA driver and CUDA 13 but none of clef's Debian libraries.
#   usage: scripts/gpu_pack.sh            (then carry .gpu with the device run)
#   GPU_BUILD=build-x PACK=.gpu-x scripts/gpu_pack.sh   another build folder and pack folder
#   PORTABLE=80-virtual scripts/gpu_pack.sh   also build clef and the CUDA tests with only that
#       architecture list (build folder $GPU_BUILD-portable) into bin-portable/: on an H200 the driver
#       JIT-compiles sm_80 PTX, so they run exactly the code an Ampere / Ada device runs
#       (gpu_check.sh stage `portable`)
# The pack folder must be ignored by git (echo '/.gpu*/' >> .git/info/exclude).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${GPU_BUILD:-build-gpu}
P=${PACK:-.gpu}
cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DCLEF_MEDIA=OFF -DCLEF_CUDA=ON \
    "-DCLEF_CUDA_ARCHS=${CLEF_CUDA_ARCHS:-90a}" "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed" >/dev/null
TARGETS="clef test_cuda_ops test_cuda_golden test_state_cache ${EXTRA_TARGETS:-}" # EXTRA_TARGETS: more test programs
cmake --build "$B" -j"${JOBS:-2}" --target $TARGETS
rm -rf "$P/stage" && mkdir -p "$P/stage/bin" "$P/stage/lib"
for t in $TARGETS; do cp "$B/$t" "$P/stage/bin/"; done
if [ -n "${PORTABLE:-}" ]; then
    PT="clef test_cuda_ops test_cuda_golden test_cuda_quant test_cuda_towers"
    cmake -S . -B "$B-portable" -DCMAKE_BUILD_TYPE=Release -DCLEF_MEDIA=OFF -DCLEF_CUDA=ON \
        "-DCLEF_CUDA_ARCHS=$PORTABLE" "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed" >/dev/null
    cmake --build "$B-portable" -j"${JOBS:-2}" --target $PT
    mkdir -p "$P/stage/bin-portable"
    for t in $PT; do cp "$B-portable/$t" "$P/stage/bin-portable/"; done
fi
# every non-system library the binaries load (the device image brings glibc, libstdc++ and CUDA)
ldd "$P"/stage/bin*/* | awk '/=>/ {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libcublas|libcublasLt|libcudart)\.so' |
    while read -r l; do cp -L "$l" "$P/stage/lib/"; done
git rev-parse HEAD > "$P/stage/COMMIT"
# the binaries share their kernels: a 192 MiB dictionary packs them to about half of xz -6 (64 MiB travel limit)
tar -C "$P/stage" -cf - . | xz -T0 --lzma2=preset=9,dict=192MiB > "$P/pack.tar.xz"
rm -rf "$P/stage"
ls -la "$P/pack.tar.xz"
