#!/bin/bash
# gpu_check.sh — everything the CUDA backend promises, checked and timed in one run on the GPU
# machine (one H200, CUDA 13), from the binaries scripts/gpu_pack.sh packed into .gpu/pack.tar.xz:
#   env           device, driver, libraries; copy bandwidth and bf16 matmul rate (torch) = the floors
#   tests         tests/unit/test_cuda_ops (every op vs the CPU backend, determinism) and
#                 tests/golden/test_cuda_golden (tiny fixture goldens, packed == alone)
#   cpuref        starts (in the background, CPU only) the CPU f32 answers of the `small` preset to
#                 bench/parity/requests_200.jsonl (200 generated requests), unless
#                 bench/parity/cpu_answers_small_seed1.jsonl already holds them
#   parity        waits for cpuref, then `small` end to end on CUDA vs those answers: top-1
#                 each numerics mode (PARITY_NUMERICS, default "fast balanced precise") against its
#                 bar (fast/balanced: the reference's bf16, top-1 >= 87.1%, mean TV <= 0.0159;
#                 precise: >= 99.5%, <= 0.001), batches of 1/8/64 bitwise identical
#   bench         `clef bench --synthetic full --device cuda`: 1x300, 1x1000, 1x4000 tokens
#                 (p50/p95), 8x1k and 32x1k packed (tokens/s), GPU peak memory, per-op profile
#   transformers  bench/bench_transformers.py (the peer baseline on the same card; BENCH_IMPLS=grouped_mm
#                 skips its slow eager loop)
#   bench_modes   the same in the other numerics (BENCH_NUMERICS, default "precise balanced")
#   eval          `clef eval` over EVAL_ROWS (2,000) rows of 300 tokens on the full preset, and bench at that shape
#   cpu_bench     the CPU backend on this machine's cores: `small` and the full preset (CPU_BENCH_FULL, int4)
#   portable      bin-portable (gpu_pack.sh PORTABLE=80-virtual: sm_80 PTX only, JIT-compiled here): the
#                 CUDA suite, `small` parity + batch invariance and the full bench, as an sm_80 device runs them
#   quant_small   `small` with its experts quantized: CUDA vs the CPU's answers for the same weights
#                 (bench/parity/cpu_answers_small_seed1_<format>.jsonl), then BF16 vs each format
#   numerics_full `clef parity` on `full`: BF16 precise vs BF16 fast (the default) (how much the random 48-layer
#                 model amplifies a small perturbation)
#   towers        `clef bench --towers-only`: the full-width vision tower on a 1-MP image and the audio
#                 tower on 30 s, CUDA (tests/unit/test_cuda_towers checks them against the CPU)
#   quant_parity  the full preset's experts quantized in memory (QUANT_FORMATS, default int4,
#                 fp8-block, nvfp4): `clef parity` BF16 vs each over the 200 generated requests
#   stream        issue 17: test_cuda_stream, then `clef bench` on the full preset resident and under
#                 --gpu-memory budgets (STREAM_PLAN): streamed bytes, copy rate, peak
#   quant_bench   `clef bench` per format (QUANT_BENCH_FORMATS; bf16 = unquantized): 300 / 1k tokens, 32x1k (QUANT_BENCH_RUNS), GPU memory;
#                 QUANT_BENCH_EXTRA: more bench arguments (e.g. "--kernel CLEF_CUDA_V5_STAGES=4")
#   qtests        test_cuda_quant and test_cuda_ops alone
#   qab           issue 18: `clef bench --profile` per format (QAB_FORMATS) and packed kernel (QAB_KERNELS, "v5 v3")
#   qgemm_bench   per-layer expert GEMM times (test_cuda_quant, CLEF_QGEMM_BENCH=1) for each CLEF_CUDA_WGMMA
#                 value in WGMMA_MODES (default "1 0")
#   modes         `small` parity vs the CPU for each CLEF_CUDA_PRECISE part list in PARITY_MODES
#   ncu_time      every kernel's duration in one `clef bench` run (Nsight Compute), per kernel of the last forward
#   sass          cuobjdump -sass of SASS_KERNEL's kernels (default qgemm5) and their opcode histograms
#   ncu           Nsight Compute sections of NCU_KERNEL's launches in one `clef bench` run (NCU_RUN)
#   expert_gemm   bench/expert_gemm per "tokens split tile" in EXPERT_GEMM_RUNS: the BF16 expert GEMM
#                 kernels (mma.sync, TMA, wgmma) alone on one layer, times and bitwise agreement
# usage: scripts/gpu_check.sh [stage ...]        (default: cpuref env tests bench transformers parity)
# Logs go to $OUT (default /tmp/gpu_check): <stage>.log and summary.txt.  UNPACK (default
# /tmp/clefgpu) is where the pack is unpacked: two instances on two GPUs need two.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
STAGES=${*:-cpuref env tests bench transformers parity}
SUM=$OUT/summary.txt
: > "$SUM"
note() { echo "$*" | tee -a "$SUM"; }

# ---- binaries and libraries ----------------------------------------------------------------
PACK=${PACK:-.gpu}
if [ -f "$PACK/pack.tar.xz" ]; then
    UNPACK=${UNPACK:-/tmp/clefgpu}
    rm -rf "$UNPACK" && mkdir -p "$UNPACK" && tar -C "$UNPACK" -xJf "$PACK/pack.tar.xz"
    BIN=$UNPACK/bin
    LIBS=$UNPACK/lib
else
    echo "no $PACK/pack.tar.xz: run scripts/gpu_pack.sh on a build machine and carry .gpu" >&2
    exit 2
fi
CUBLAS_DIR=$(dirname "$( (ldconfig -p 2>/dev/null | awk '/libcublasLt\.so\.13/ {print $NF}';
    ls /usr/local/cuda*/lib64/libcublasLt.so.13 /usr/local/cuda*/targets/x86_64-linux/lib/libcublasLt.so.13 \
       /usr/lib/x86_64-linux-gnu/libcublasLt.so.13 2>/dev/null;
    python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib", "libcublasLt.so.13"))' \
       2>/dev/null) | head -1)")
export LD_LIBRARY_PATH=$LIBS:$CUBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# the test binaries read fixtures from the absolute path they were built with
FIX=$(strings "$BIN/test_cuda_golden" | grep -m1 '/tests/fixtures$' || true)
if [ -n "$FIX" ] && [ ! -e "$FIX" ]; then
    mkdir -p "$(dirname "$(dirname "$(dirname "$FIX")")")" && ln -s "$ROOT" "$(dirname "$(dirname "$FIX")")" 2>/dev/null
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}

run_stage() { # name timeout command...
    local name=$1 t=$2
    shift 2
    echo "=== $name: $*" | tee "$OUT/$name.log"
    local t0=$SECONDS
    timeout "$t" "$@" >> "$OUT/$name.log" 2>&1
    local rc=$?
    note "stage $name: exit $rc in $((SECONDS - t0)) s"
    return $rc
}

cuda_suite() { # bin-folder stage-prefix timeout log-name: the four CUDA test programs, one log
    : > "$OUT/$4.log"
    for t in test_cuda_ops test_cuda_golden test_cuda_quant test_cuda_towers; do
        [ -x "$1/$t" ] || continue
        run_stage "$2$t" "$3" "$1/$t"
        cat "$OUT/$2$t.log" >> "$OUT/$4.log" && rm -f "$OUT/$2$t.log"
    done
}

for st in $STAGES; do
    case $st in
    env)
        {
            date -u; uname -a; nproc; free -g | head -2
            nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
            echo "cublasLt from: $CUBLAS_DIR"; echo "pack commit: $(cat "$UNPACK/COMMIT")"
            ldd "$BIN/clef" | grep -E "not found|cublas" || true
            "$BIN/clef" --help > /dev/null && echo "clef runs" && "$BIN/clef" --version
        } > "$OUT/env.log" 2>&1
        timeout 120 python3 - >> "$OUT/env.log" 2>&1 <<'EOF'
import torch, time
torch.backends.cuda.matmul.allow_tf32 = False
def t(fn, n):
    for _ in range(3): fn()
    torch.cuda.synchronize(); s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(n):
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ms.append(s.elapsed_time(e))
    ms.sort(); return ms[len(ms) // 2]
a = torch.randn(2 * 1024**3 // 2, dtype=torch.bfloat16, device="cuda"); b = torch.empty_like(a)
ms = t(lambda: b.copy_(a), 20)
print(f"FLOOR copy bandwidth: {2 * a.numel() * 2 / ms / 1e6:.0f} GB/s (read+write, median of 20)")
del a, b
x = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda"); y = torch.randn_like(x)
ms = t(lambda: x @ y, 20)
print(f"FLOOR bf16 matmul: {2 * 8192**3 / ms / 1e9:.0f} TFLOP/s (8192^3, random data, median of 20)")
EOF
        grep FLOOR "$OUT/env.log" | tee -a "$SUM"
        ;;
    tests)
        cuda_suite "$BIN" "" 150 tests
        # the state cache's bitwise suite on the GPU (engine device automatic: CUDA here)
        [ -x "$BIN/test_state_cache" ] && CLEF_DEVICE=cuda run_stage test_state_cache 300 "$BIN/test_state_cache" &&
            cat "$OUT/test_state_cache.log" >> "$OUT/tests.log" && rm -f "$OUT/test_state_cache.log"
        grep -E "rel L2|bitwise|PASSED|FAILED|mode:|Error|error" "$OUT/tests.log" | tail -60 >> "$SUM"
        ;;
    cpuref)
        REF=bench/parity/cpu_answers_small_seed1.jsonl
        if [ ! -f "$REF" ]; then
            REF=$OUT/cpu_ref.jsonl
            (OMP_NUM_THREADS=${CPUREF_THREADS:-14} timeout "${CPUREF_TIMEOUT:-330}" "$BIN/clef" devcheck \
                --synthetic small --seed 1 --requests bench/parity/requests_200.jsonl --cpu-batch 25 \
                --save-reference "$REF" > "$OUT/cpuref.log" 2>&1
             echo "cpuref exit $?" >> "$OUT/cpuref.log") &
            CPUREF_PID=$!
            note "stage cpuref: started in the background (pid $CPUREF_PID)"
        fi
        ;;
    parity)
        REF=${REF:-bench/parity/cpu_answers_small_seed1.jsonl}
        if [ -n "${CPUREF_PID:-}" ]; then
            t0=$SECONDS
            wait "$CPUREF_PID"
            note "stage cpuref: waited $((SECONDS - t0)) s; $(tail -2 "$OUT/cpuref.log" | tr '\n' ' ')"
        fi
        REQ=bench/parity/requests_200.jsonl
        if [ -s "$REF" ] && [ "$(wc -l < "$REF")" -lt "$(wc -l < "$REQ")" ]; then
            head -n "$(wc -l < "$REF")" "$REQ" > /tmp/clef_req_partial.jsonl
            REQ=/tmp/clef_req_partial.jsonl
            note "stage parity: the CPU reference was cut short: the first $(wc -l < "$REF") requests only"
        fi
        if [ -s "$REF" ]; then
            # every mode against the CPU f32 answers, each with its own bar (src/backend/numerics.h) and
            # batches of 1 / 8 / 64 bitwise equal to the records alone
            : > "$OUT/parity.log"
            for m in ${PARITY_NUMERICS:-fast balanced precise}; do
                echo "=== --numerics $m" >> "$OUT/parity.log"
                timeout 150 "$BIN/clef" devcheck --synthetic small --seed 1 --device cuda --numerics "$m" \
                    --requests "$REQ" --reference "$REF" --batches 1,8,64 >> "$OUT/parity.log" 2>&1
                note "parity $m (exit $?): $(grep -E "^numerics|^parity top-1|^parity total|^batch invariance: batches|^devcheck" "$OUT/parity.log" | tail -5 | tr '\n' ' ')"
            done
        else
            note "stage parity: no CPU reference answers ($REF)"
        fi
        ;;
    bench)
        CLEF_CUDA_LT_LOG=1 run_stage bench 240 "$BIN/clef" bench --synthetic full --seed 1 --device cuda \
            --text-only --runs 1x300,1x1000,1x4000,8x1000,32x1000 --iters 10 --profile
        grep -v -E "^(clef|===)" "$OUT/bench.log" | grep -E "^[a-z_]+ |run " | head -80 >> "$SUM"
        ;;
    transformers)
        PYTHONUNBUFFERED=1 run_stage transformers 270 python3 bench/bench_transformers.py
        grep -E "ceiling|RESULT|peak|built" "$OUT/transformers.log" >> "$SUM"
        ;;
    portable) # issue 22: the code an Ampere / Ada device runs, on this GPU: bin-portable (gpu_pack.sh
        # PORTABLE=80-virtual) holds only sm_80 PTX, which the driver JIT-compiles (cached under
        # $UNPACK/jit), so the backend picks the mma.sync / cp.async kernels (no sm_90a code); the CUDA
        # suite, fidelity on `small` with batch invariance, and the speed beside the Hopper path
        PB=$UNPACK/bin-portable
        if [ ! -d "$PB" ]; then
            note "stage portable: no bin-portable in the pack (PORTABLE=80-virtual scripts/gpu_pack.sh)"
            continue
        fi
        export CUDA_CACHE_PATH=$UNPACK/jit CUDA_CACHE_MAXSIZE=4294967296
        "$PB/clef" --version >> "$SUM" 2>&1
        cuda_suite "$PB" portable_ 240 portable_tests
        grep -E "PASSED|FAILED|Error|error" "$OUT/portable_tests.log" | tail -20 >> "$SUM"
        REF=${REF:-bench/parity/cpu_answers_small_seed1.jsonl}
        if [ -s "$REF" ]; then
            run_stage portable_parity 200 "$PB/clef" devcheck --synthetic small --seed 1 --device cuda \
                --requests bench/parity/requests_200.jsonl --reference "$REF" --batches 1,8,64
            note "portable parity: $(grep -E "^numerics|^parity top-1|^parity total|^batch invariance: batches|^devcheck" "$OUT/portable_parity.log" | tail -5 | tr '\n' ' ')"
        fi
        run_stage portable_bench 240 "$PB/clef" bench --synthetic full --seed 1 --device cuda --text-only \
            --runs ${PORTABLE_RUNS:-1x300,1x1000,32x1000} --iters 5
        grep -v -E "^(clef|===)" "$OUT/portable_bench.log" | grep -E "^(run |latency_ms_p50|tokens_per_s|gpu_peak|device_detail)" >> "$SUM"
        ;;
    eval) # issue 19: `clef eval` over EVAL_ROWS (default 2,000) generated rows of exactly 300 tokens on the
        # full preset (bench/eval_rows.py: bench's request shape), then `clef bench` of the same records
        # packed as eval packs them (--max-batch-tokens 16384: 54 records a forward)
        python3 bench/eval_rows.py "${EVAL_ROWS:-2000}" 300 > "$UNPACK/eval_rows.jsonl"
        rm -rf "$OUT/eval"
        run_stage eval 400 "$BIN/clef" eval --synthetic full --seed 1 --device cuda --rows "$UNPACK/eval_rows.jsonl" \
            --out "$OUT/eval" --truncate-state --max-length 300 --text-only
        note "eval: $(tr -d '\n' < "$OUT/eval/status.json" | cut -c1-400)"
        run_stage eval_bench 200 "$BIN/clef" bench --synthetic full --seed 1 --device cuda --text-only \
            --runs 1x300,32x300,54x300 --iters 5
        grep -E "^(run |latency_ms_p50|tokens_per_s|records_per_s)" "$OUT/eval_bench.log" >> "$SUM"
        ;;
    cpu_bench) # issue 20: the CPU path on this machine's cores: `small` per CPU_BENCH_SMALL format and the
        # full preset per CPU_BENCH_FULL (default int4; "" = none) at 300 tokens (bf16 = no --quant)
        for f in ${CPU_BENCH_SMALL:-bf16}; do # `small` per format (CPU_BENCH_SMALL="bf16 int4 nvfp4 fp8-block")
            q=; [ "$f" != bf16 ] && q="--quant $f"
            OMP_NUM_THREADS=$(nproc) run_stage "cpu_bench_small_$f" 300 "$BIN/clef" bench --synthetic small --seed 1 \
                --device cpu --text-only --tokens 300 --iters 3 $q
            { echo "== small $f"; grep -E "^(run |latency_ms|cpu_ms|load_s)" "$OUT/cpu_bench_small_$f.log"; } >> "$SUM"
            rm -f "$OUT/cpu_bench_small_$f.log"
        done
        for f in ${CPU_BENCH_FULL-int4}; do
            q=; [ "$f" != bf16 ] && q="--quant $f"
            OMP_NUM_THREADS=$(nproc) run_stage "cpu_bench_full_$f" 500 "$BIN/clef" bench --synthetic full --seed 1 \
                --device cpu --text-only --tokens 300 --iters 2 $q
            grep -E "^(run |latency_ms|cpu_ms|load_s|peak_rss)" "$OUT/cpu_bench_full_$f.log" >> "$SUM"
        done
        ;;
    bench_modes) # the other numerics modes (BENCH_NUMERICS, default "precise balanced"), for what they cost
        for nm in ${BENCH_NUMERICS:-precise balanced}; do
        run_stage "bench_$nm" 150 "$BIN/clef" bench --synthetic full --seed 1 --device cuda --numerics "$nm" \
            --text-only --runs ${BENCH_FAST_RUNS:-1x300,1x1000,32x1000} --iters 5
        grep -v -E "^(clef|===)" "$OUT/bench_$nm.log" | grep -E "^[a-z_0-9]+ |run " | head -40 >> "$SUM"
        done
        ;;
    quant_small) # the quantized CUDA path end to end on `small` against the CPU's answers for the same
        # quantized weights (bench/parity/cpu_answers_small_seed1_<format>.jsonl), then BF16 vs each format
        for f in int4 fp8-block nvfp4; do
            R=bench/parity/cpu_answers_small_seed1_$f.jsonl
            [ -s "$R" ] || continue
            run_stage "devcheck_$f" 150 "$BIN/clef" devcheck --synthetic small --seed 1 --quant "$f" --device cuda \
                --requests bench/parity/requests_200.jsonl --reference "$R" --batches 1,8
            note "small $f cuda vs cpu: $(grep -E "^parity top-1|^parity total|^batch invariance: batches|^devcheck" "$OUT/devcheck_$f.log" | tr '\n' ' ')"
        done
        run_stage parity_small_quant 200 "$BIN/clef" parity --synthetic small --seed 1 --quant-b int4,fp8-block,nvfp4 \
            --device cuda --requests bench/parity/requests_200.jsonl
        grep -E "^(A |B |requests|top-1|total variation|flipped questions)" "$OUT/parity_small_quant.log" >> "$SUM"
        ;;
    numerics_full) # the full random model's sensitivity: BF16 precise vs BF16 fast over the 200 requests
        run_stage numerics_full 240 "$BIN/clef" parity --synthetic full --seed 1 --numerics-a precise --numerics-b fast --device cuda \
            --requests bench/parity/requests_200.jsonl
        grep -E "^(A |B |requests|top-1|total variation|flipped questions)" "$OUT/numerics_full.log" >> "$SUM"
        ;;
    towers)
        run_stage towers 120 "$BIN/clef" bench --synthetic full --seed 1 --device cuda --towers-only \
            --image-mp 1 --audio-s 30 --iters 5 --profile
        grep -v -E "^(clef|===)" "$OUT/towers.log" | grep -E "^[a-z_0-9]+ |towers" | head -40 >> "$SUM"
        ;;
    towers_cpu) # issue 17: the media towers on the CPU beside a CUDA thinker under a budget (--towers cpu):
        # the plan, the towers' times on the host, the thinker's runs and the driver's peak
        run_stage towers_cpu 300 "$BIN/clef" bench --synthetic full --seed 1 --quant int4 --device cuda --towers cpu \
            --gpu-memory 16GiB --runs 1x300 --iters 3 --image-mp 0.25 --audio-s 5
        grep -E "^(plan|towers|tower|streamed|run |latency_ms_p50|gpu_peak_mib|load_s|clef)" "$OUT/towers_cpu.log" | head -30 >> "$SUM"
        ;;
    quant_parity)
        run_stage quant_parity ${QUANT_PARITY_TIMEOUT:-300} "$BIN/clef" parity --synthetic full --seed 1 \
            --quant-b ${QUANT_FORMATS:-int4,fp8-block,nvfp4} --device cuda --requests bench/parity/requests_200.jsonl
        grep -E "^(A |B |requests|top-1|total variation|flipped questions|clef parity)" "$OUT/quant_parity.log" >> "$SUM"
        ;;
    stream) # issue 17: streamed experts bitwise the resident ones (test_cuda_stream), then the full preset per
        # STREAM_PLAN entry FORMAT:BUDGET,BUDGET,... (bf16 = no --quant; none = resident, no budget), e.g.
        # "int4:none,24GiB,16GiB nvfp4:16GiB bf16:32GiB", with the driver's peak (gpu_peak_mib) against the budget
        [ -x "$BIN/test_cuda_stream" ] && run_stage test_cuda_stream 240 "$BIN/test_cuda_stream"
        grep -E "streamed|budget|PASSED|FAILED|skipped" "$OUT/test_cuda_stream.log" >> "$SUM"
        for e in ${STREAM_PLAN:-int4:none,16GiB}; do
            f=${e%%:*}
            for b in $(echo "${e#*:}" | tr , ' '); do
                q=; [ "$f" != bf16 ] && q="--quant $f"
                g=; [ "$b" != none ] && g="--gpu-memory $b"
                run_stage "stream_${f}_$b" ${STREAM_TIMEOUT:-170} "$BIN/clef" bench --synthetic full --seed 1 $q \
                    --device cuda --text-only --runs ${STREAM_RUNS:-1x300,1x1000,8x1000} --iters ${STREAM_ITERS:-5} $g
                local_rc=$?
                { echo "== $f $b"; grep -E "^(plan|streamed|run |latency_ms_p50|tokens_per_s|gpu_peak_mib|pinned_copy|stream_floor|load_s)" \
                    "$OUT/stream_${f}_$b.log"; } >> "$SUM"
                [ $local_rc = 0 ] && rm -f "$OUT/stream_${f}_$b.log" # the summary keeps the figures (8 files come back)
            done
        done
        ;;
    state_cache) # issue 19: the state cache's two workloads on the full preset (answers_identical and the
        # speed-up) and the precise mode's variant choice on `small` (the bitwise suite runs in `tests`);
        # STATE_PLAN entries PRESET:WORKLOAD:NUMERICS (NUMERICS cpu = the CPU path)
        for w in ${STATE_PLAN:-full:questions:fast full:transcript:fast small:questions:precise}; do
            p=${w%%:*}; r=${w#*:}; k=${r%%:*}; nm=${r#*:}
            # NUMERICS cpu: the CPU path on this machine's cores (STATE_CPU_ARGS: fewer sets / steps)
            d="--device cuda --numerics $nm"; [ "$nm" = cpu ] && d="--device cpu ${STATE_CPU_ARGS:---sets 4 --steps 6}"
            run_stage "state_${p}_${k}_$nm" 300 "$BIN/clef" bench --synthetic "$p" --seed 1 --text-only $d \
                --state-workload "$k" --state-cache 8G ${STATE_ARGS:-}
            { echo "== $p $k $nm"; grep -E "^(workload|requests|tokens_|cache_|speedup|state_cache|answers_identical|load_s|device|cuda_graphs)" \
                "$OUT/state_${p}_${k}_$nm.log"; } >> "$SUM"
        done
        ;;
    qtests) # the packed-weight suite and the op suite alone (test_cuda_quant, test_cuda_ops)
        for t in test_cuda_quant test_cuda_ops; do run_stage "$t" 200 "$BIN/$t"; done
        grep -E "v5|bitwise|PASSED|FAILED|Error|error" "$OUT/test_cuda_quant.log" | tail -40 >> "$SUM"
        grep -E "PASSED|FAILED" "$OUT/test_cuda_ops.log" >> "$SUM"
        ;;
    qab) # issue 18: the packed expert kernels A/B per format (QAB_FORMATS, default "int4 nvfp4") and kernel in
        # QAB_KERNELS (default "v5 v3": `clef bench --kernel CLEF_CUDA_QGEMM_INT4=K --kernel CLEF_CUDA_QGEMM_NVFP4=K`,
        # plus QAB_EXTRA, e.g. "--kernel CLEF_CUDA_V5_ROWS=64") at QAB_RUNS, with the per-op profile
        for f in ${QAB_FORMATS:-int4 nvfp4}; do
            for kv in ${QAB_KERNELS:-v5 v3}; do
                run_stage "qab_${f}_$kv${QAB_TAG:-}" ${QAB_TIMEOUT:-200} "$BIN/clef" bench --synthetic full --seed 1 \
                    --quant "$f" --device cuda --text-only --runs "${QAB_RUNS:-1x300,1x1000,32x1000}" --iters 5 \
                    --profile --kernel "CLEF_CUDA_QGEMM_INT4=$kv" --kernel "CLEF_CUDA_QGEMM_NVFP4=$kv" ${QAB_EXTRA:-}
                note "qab $f $kv ${QAB_EXTRA:-}:"
                grep -E "^run |^device_detail|latency_ms_p50|tokens_per_s|peak|GEMM|attention \(tensor" \
                    "$OUT/qab_${f}_$kv${QAB_TAG:-}.log" | head -40 >> "$SUM"
            done
        done
        ;;
    quant_bench)
        for f in $(echo "${QUANT_BENCH_FORMATS:-int4,fp8-block,nvfp4}" | tr , ' '); do
            q="--quant $f"; [ "$f" = bf16 ] && q="" # bf16: the experts as the checkpoint has them
            run_stage "bench_$f" ${QUANT_BENCH_TIMEOUT:-150} "$BIN/clef" bench --synthetic full --seed 1 $q \
                --device cuda --text-only --runs ${QUANT_BENCH_RUNS:-1x300,1x1000,32x1000} --iters 5 ${QUANT_BENCH_EXTRA:-}
            grep -v -E "^(clef|===)" "$OUT/bench_$f.log" | grep -E "^[a-z_0-9]+ |run " | head -40 >> "$SUM"
        done
        ;;
    modes) # parity of each precise-mode part against the CPU reference (which part's bf16 rounding costs what)
        REF=${REF:-bench/parity/cpu_answers_small_seed1.jsonl}
        REQ=bench/parity/requests_200.jsonl
        head -n "$(wc -l < "$REF")" "$REQ" > /tmp/clef_req_modes.jsonl
        : > "$OUT/modes.log"
        for m in ${PARITY_MODES:-0 dense experts attention dense,experts}; do
            echo "=== CLEF_CUDA_PRECISE=$m" >> "$OUT/modes.log"
            CLEF_CUDA_PRECISE=$m timeout 90 "$BIN/clef" devcheck --synthetic small --seed 1 --device cuda \
                --requests /tmp/clef_req_modes.jsonl --reference "$REF" --batches 1 >> "$OUT/modes.log" 2>&1
            note "mode $m: $(grep -E "^parity top-1|^parity total" "$OUT/modes.log" | tail -2 | tr '\n' ' ')"
        done
        ;;
    qgemm_bench) # per-layer expert GEMM times at the full shapes (BF16 and every packed format), for each
        # CLEF_CUDA_WGMMA mode in WGMMA_MODES (default "1 0": the wgmma kernels (bf16 and packed), then mma.sync)
        for m in ${WGMMA_MODES:-1 0}; do
            CLEF_CUDA_WGMMA=$m CLEF_QGEMM_BENCH=1 run_stage "qgemm_bench_wgmma$m" 360 "$BIN/test_cuda_quant"
            note "qgemm bench, CLEF_CUDA_WGMMA=$m:"
            grep -E "ms|per layer|T *=" "$OUT/qgemm_bench_wgmma$m.log" | grep -v -E "^\[|rel L2" | head -60 >> "$SUM"
        done
        ;;
    expert_gemm) # the BF16 expert GEMM kernels alone on one layer (bench/expert_gemm.cu; pack it with
        # EXTRA_TARGETS=expert_gemm), compared bitwise: "tokens split tile" in EXPERT_GEMM_RUNS
        if [ ! -x "$BIN/expert_gemm" ]; then note "stage expert_gemm: not in the pack"; continue; fi
        : > "$OUT/expert_gemm.log"
        for r in ${EXPERT_GEMM_RUNS:-"300 2 32" "300 1 64" "1000 2 64" "1000 1 64" "4000 2 128"}; do
            set -- $r
            run_stage "expert_gemm_$1_$2_$3" 60 "$BIN/expert_gemm" --tokens "$1" --split "$2" --tile "$3"
            cat "$OUT/expert_gemm_$1_$2_$3.log" >> "$OUT/expert_gemm.log" && rm -f "$OUT/expert_gemm_$1_$2_$3.log"
        done
        grep -E "expert_gemm|gate\+up" "$OUT/expert_gemm.log" >> "$SUM"
        ;;
    ncu) # Nsight Compute on kernels of one `clef bench` run: NCU_KERNEL (regex, default qgemm3), NCU_SKIP
        # launches skipped (default 40: past the warm-up), NCU_COUNT profiled (default 2), NCU_RUN the bench
        # arguments (default the full preset INT4 at 1 x 300 tokens); clocks left alone (METHOD.md)
        if ! command -v ncu > /dev/null; then note "stage ncu: no ncu on this machine"; continue; fi
        run_stage ncu ${NCU_TIMEOUT:-300} ncu --clock-control none -k "regex:${NCU_KERNEL:-qgemm3}" \
            --launch-skip "${NCU_SKIP:-40}" --launch-count "${NCU_COUNT:-2}" \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
            --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
            --section InstructionStats \
            "$BIN/clef" bench ${NCU_RUN:---synthetic full --seed 1 --quant int4 --device cuda --text-only --runs 1x300 --iters 1}
        grep -E "^  [a-zA-Z_0-9<>, ]+\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issued Warp|No Eligible|Stall|Warp Cycles Per Issued|L2 Hit|L1/TEX Hit|Block Limit|Executed Ipc|Pipe|Executed Instructions" \
            "$OUT/ncu.log" | head -100 >> "$SUM"
        ;;
    ncu_time) # Nsight Compute's duration of every kernel of one `clef bench` run (NCU_RUN, as ncu; graphs replayed
        # node by node), summarised by bench/ncu_forward.py: the last forward's GPU time per kernel and one layer's
        # kernel sequence.  NCU_TIME_KERNELS: the kernels timed (regex on the function name; default every kernel
        # but the weight upload's reorders and cuBLASLt's, whose algorithm search in the first forward would fill
        # the count: the dense products' times are in the bench profile), NCU_TIME_COUNT at most (default 3000)
        if ! command -v ncu > /dev/null; then note "stage ncu_time: no ncu on this machine"; continue; fi
        run_stage ncu_time ${NCU_TIMEOUT:-300} ncu --clock-control none --csv --metrics gpu__time_duration.sum \
            -k "regex:${NCU_TIME_KERNELS:-^(?!.*(nvjet|splitKreduce|reorder|cublas))}" --launch-count "${NCU_TIME_COUNT:-3000}" \
            "$BIN/clef" bench ${NCU_RUN:---synthetic full --seed 1 --quant int4 --device cuda --text-only --runs 1x300 --iters 1}
        python3 bench/ncu_forward.py "$OUT/ncu_time.log" > "$OUT/ncu_forward.txt" 2>&1
        head -60 "$OUT/ncu_forward.txt" >> "$SUM"
        ;;
    sass) # the machine code of the kernels matching SASS_KERNEL (regex on the mangled name, default qgemm5) in
        # the clef binary (cuobjdump of this machine's CUDA), xz-compressed in $OUT/sass.txt.xz, and an opcode
        # histogram per kernel in the summary (the instructions a packed byte costs, counted statically)
        CUOBJ=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
        if [ -z "$CUOBJ" ]; then note "stage sass: no cuobjdump on this machine"; continue; fi
        "$CUOBJ" -sass "$BIN/clef" 2> "$OUT/sass.err" | awk -v re="${SASS_KERNEL:-qgemm5}" \
            '/Function :/ {keep = ($0 ~ re)} keep' > "$OUT/sass.txt"
        awk '/Function :/ {if (f) for (o in h) print f, h[o], o; delete h; f = $3; next}
             /\/\*[0-9a-f]+\*\// {for (i = 1; i <= NF; i++) if ($i ~ /^\/\*[0-9a-f]+\*\/$/) {o = $(i + 1); if (o ~ /^@/) o = $(i + 2);
             sub(/;$/, "", o); split(o, q, "."); h[q[1]]++; break}}
             END {if (f) for (o in h) print f, h[o], o}' "$OUT/sass.txt" | sort -k1,1 -k2,2nr > "$OUT/sass_hist.txt"
        head -c 20000 "$OUT/sass_hist.txt" >> "$SUM"
        xz -9 -f "$OUT/sass.txt"
        ;;
    *) echo "unknown stage $st" >&2 ;;
    esac
done
echo "==== summary"
cat "$SUM"
