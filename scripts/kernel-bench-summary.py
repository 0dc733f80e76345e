#!/usr/bin/env python3
"""Medians of kernel_bench's fractions over several runs.

The copy ceiling of one kernel_bench run moves by 10-30% on a shared machine, and every
memory-bound op's fraction moves with it. This reads the --json files of several runs and
prints, per op, the median fraction of its ceiling and the range across the runs.

  python3 scripts/kernel-bench-summary.py run1.json run2.json ...
"""
import json
import statistics
import sys


def main(paths):
    runs = [json.load(open(p)) for p in paths]
    if not runs:
        sys.exit("kernel-bench-summary.py: give the --json files of one or more kernel_bench runs")
    print(f"kernel_bench over {len(runs)} runs: fraction of the ceiling measured in the same run")
    print("  fraction: against the copy timed next to the op (memory-bound) or the GEMM;")
    print("  of_best: against the best copy of its run (memory-bound; the stricter figure)")
    print(f"{'op':24s} {'dtype':5s} {'median':>7s} {'min':>7s} {'max':>7s} {'of_best':>8s} {'min':>7s}  rate (median)")
    for first in runs[0]:
        key = (first["op"], first["dtype"])
        rows = [r for run in runs for r in run if (r["op"], r["dtype"]) == key]
        fractions = [r["fraction"] for r in rows]
        of_best = [r.get("fraction_of_run_best", r["fraction"]) for r in rows]
        unit = "GB/s" if "gbps" in first else "TF/s"
        rate = statistics.median(r.get("gbps", r.get("tflops", 0.0)) for r in rows)
        print(f"{key[0]:24s} {key[1]:5s} {100 * statistics.median(fractions):6.1f}% {100 * min(fractions):6.1f}% "
              f"{100 * max(fractions):6.1f}% {100 * statistics.median(of_best):7.1f}% {100 * min(of_best):6.1f}%  "
              f"{rate:.3f} {unit}")


if __name__ == "__main__":
    main(sys.argv[1:])
