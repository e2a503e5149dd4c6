"""torch._grouped_mm at Clef-Omni's expert shapes on the routing sizes of bench/expert_gemm.

The peer of bench/expert_gemm.cu's per-layer kernel times: one layer's gate+up ([rows, 2048] x 128 experts of
[2048, 1536], gate and up as one product, no SwiGLU) and down ([rows, 768] x 128 experts of [768, 2048], bf16
out), rows already grouped by expert (torch does no gather), with the per-expert row counts that
`expert_gemm --counts FILE` wrote for its routing plan.  Both weight layouts are timed: [E, K, N] row-major
("kn") and [E, N, K] viewed transposed ("nk", the nn.Linear / clef layout); the faster is the peer.

Times: CUDA events around each call, median of --reps after --warm calls; TFLOP/s = 2 rows K N over the
median.  First the card's ceilings: a 4 GiB device copy (bytes read + written) and an 8192^3 bf16 matmul.

usage: python3 bench/grouped_mm.py [--reps R] [--warm W] counts_T.txt ...   (T = tokens, from the file name)
prints one KERNEL line per file and layout.
"""

import argparse
import os
import re
import statistics

import torch

E, H, I = 128, 2048, 768


def events(fn, warm, reps):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts), min(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("counts", nargs="+")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_grad_enabled(False)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}", flush=True)

    a = torch.empty(4 * 1024**3 // 2, dtype=torch.bfloat16, device=dev).normal_()
    b = torch.empty_like(a)
    ms, _ = events(lambda: b.copy_(a), 3, 10)
    print(f"ceiling copy: {2 * a.numel() * 2 / ms / 1e6:.0f} GB/s (read + write)", flush=True)
    del a, b
    x = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    y = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    ms, _ = events(lambda: x @ y, 3, 10)
    print(f"ceiling bf16 matmul 8192^3: {2 * 8192**3 / ms / 1e9:.0f} TFLOP/s", flush=True)
    del x, y

    w13_kn = torch.randn(E, H, 2 * I, device=dev, dtype=torch.bfloat16) * 0.02
    w2_kn = torch.randn(E, I, H, device=dev, dtype=torch.bfloat16) * 0.02
    w13_nk = (torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16) * 0.02).transpose(1, 2)
    w2_nk = (torch.randn(E, H, I, device=dev, dtype=torch.bfloat16) * 0.02).transpose(1, 2)
    wbytes_gu, wbytes_dn = E * H * 2 * I * 2, E * I * H * 2
    for path in args.counts:
        counts = [int(v) for v in open(path).read().split()]
        assert len(counts) == E, f"{path}: {len(counts)} counts, want {E}"
        m = re.search(r"(\d+)", os.path.basename(path))
        T = int(m.group(1)) if m else -1
        rows = sum(counts)
        offs = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32).to(dev)
        xa = torch.randn(rows, H, device=dev, dtype=torch.bfloat16)
        ya = torch.randn(rows, I, device=dev, dtype=torch.bfloat16)
        for name, w13, w2 in (("kn", w13_kn, w2_kn), ("nk", w13_nk, w2_nk)):
            try:
                m1, b1 = events(lambda: torch._grouped_mm(xa, w13, offs=offs), args.warm, args.reps)
                m2, b2 = events(lambda: torch._grouped_mm(ya, w2, offs=offs), args.warm, args.reps)
                print(f"KERNEL grouped_mm layout={name} tokens={T} rows={rows} "
                      f"gate_up_ms={m1:.3f} (best {b1:.3f}, {2 * rows * H * 2 * I / m1 / 1e9:.0f} TFLOP/s, "
                      f"{wbytes_gu / m1 / 1e9:.2f} TB/s of weights) "
                      f"down_ms={m2:.3f} (best {b2:.3f}, {2 * rows * I * H / m2 / 1e9:.0f} TFLOP/s, "
                      f"{wbytes_dn / m2 / 1e9:.2f} TB/s)", flush=True)
            except Exception as ex:  # noqa: BLE001
                print(f"KERNEL grouped_mm layout={name} tokens={T} FAILED {type(ex).__name__}: {str(ex)[:200]}",
                      flush=True)
        del xa, ya


if __name__ == "__main__":
    main()
