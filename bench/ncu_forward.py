#!/usr/bin/env python3
"""ncu_forward.py — per-kernel GPU time of one thinker forward, from an Nsight Compute CSV.

Input: `ncu --csv --metrics gpu__time_duration.sum ...` of a `clef bench` run (every kernel launch,
graphs replayed node by node).  A forward starts at its embedding gather (gather_kernel); the last
segment of the most launches
(the run's last complete thinker forward; the joint head has its own gather) is summarised: total GPU time, then per kernel name the
launches, total microseconds and share, largest first, and the kernel sequence of one middle layer
(from the `layer_start` kernel's occurrences: the layer's first op, add_rmsnorm by default).
usage: ncu_forward.py ncu.csv [layer_start_regex]
"""
import csv, re, sys, collections

def main():
    path = sys.argv[1]
    start_re = re.compile(sys.argv[2] if len(sys.argv) > 2 else r"add_rmsnorm")
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "ns")
        v = float(r["Metric Value"].replace(",", ""))
        us = v / 1000.0 if unit in ("nsecond", "ns") else v if unit in ("usecond", "us") else v * 1000.0
        n = r["Kernel Name"].replace("(anonymous namespace)::", "")
        n = re.sub(r"^void ", "", n)
        rows.append((re.sub(r"\(.*", "", n)[:120], us))
    if not rows:
        print("no kernel durations in", path)
        return 1
    starts = [i for i, (n, _) in enumerate(rows) if n.endswith("gather_kernel")]
    if not starts:
        print("no gather_kernel launch: summarising all", len(rows), "launches")
        fwd = rows
    else:
        # segments from one gather to the next: the thinker's forwards, the joint head's (its own gather)
        # and media; the thinker's are the longest: take the last segment of the most launches
        segs = [rows[a:b] for a, b in zip(starts, starts[1:] + [len(rows)])]
        most = max(len(s) for s in segs)
        fwd = [s for s in segs if len(s) == most][-1]
    total = sum(us for _, us in fwd)
    print(f"forward: {len(fwd)} launches, {total:.1f} us of GPU time ({len(starts)} forwards in the log)")
    agg = collections.defaultdict(lambda: [0, 0.0])
    for n, us in fwd:
        agg[n][0] += 1
        agg[n][1] += us
    for n, (c, us) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        print(f"  {us:9.1f} us {100 * us / total:5.1f}%  {c:5d} x {us / c:7.2f} us  {n}")
    ls = [i for i, (n, _) in enumerate(fwd) if start_re.search(n)]
    if len(ls) >= 4:
        a = ls[len(ls) // 2]
        # one layer: from one start to the second start after it (attention block + mlp block)
        later = [j for j in ls if j > a]
        b = later[1] if len(later) > 1 else None
        if b:
            print(f"one layer (launches {a}..{b - 1}): {sum(us for _, us in fwd[a:b]):.1f} us")
            for n, us in fwd[a:b]:
                print(f"  {us:8.2f} us  {n}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
