#!/usr/bin/env python3
"""Plots for docs/benchmarks.md from the JSON that scripts/benchmarks.sh writes.

    /usr/bin/python3 scripts/bench-plots.py docs/bench

allreduce.png: bus bandwidth against message size, tutti and raw MPI, for each world size.
ddp_scaling.png: samples/s against ranks for DDP with overlap on and off, and ideal scaling
(per-rank batch 256).
"""
import glob
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def allreduce(out):
    files = sorted(glob.glob(os.path.join(out, "allreduce_np*.json")))
    if not files:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for path in files:
        n = re.search(r"np(\d+)", path).group(1)
        rows = json.load(open(path))
        sizes = [r["bytes"] for r in rows]
        ax.plot(sizes, [r["tutti_busbw_gbs"] for r in rows], "o-", label="tutti, np=%s" % n)
        ax.plot(sizes, [r["raw_busbw_gbs"] for r in rows], "x--", label="MPI_Allreduce, np=%s" % n)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("AllReduce f32 on the CPU (MPI backend)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "allreduce.png"), dpi=110)


def ddp(out):
    files = sorted(glob.glob(os.path.join(out, "ddp_b256_np*.json")))
    if not files:
        return
    by_mode = {}
    local = {}
    for path in files:
        for r in json.load(open(path)):
            if r["mode"] == "local":
                local[r["ranks"]] = r["samples_per_s"]
            else:
                by_mode.setdefault(r["mode"], []).append((r["ranks"], r["samples_per_s"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, pts in by_mode.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=mode)
    ranks = sorted(local)
    ax.plot(ranks, [r * local[r] for r in ranks], "k:", label="ideal (ranks x one rank alone)")
    ax.set_xlabel("ranks")
    ax.set_ylabel("samples/s (all ranks)")
    ax.set_xticks(ranks)
    ax.set_title("DDP on the CPU: 2.9 M-parameter MLP, 256 samples per rank")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "ddp_scaling.png"), dpi=110)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "docs/bench"
    allreduce(out)
    ddp(out)
