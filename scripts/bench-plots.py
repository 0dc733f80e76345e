#!/usr/bin/env python3
"""Plots for docs/benchmarks.md from the JSON that scripts/benchmarks.sh writes.

    /usr/bin/python3 scripts/bench-plots.py docs/bench

allreduce.png: bus bandwidth against message size, tutti and raw MPI, for each world size.
ddp_scaling.png: samples/s against ranks for DDP with overlap on and off, and ideal scaling
(per-rank batch 256).
zero_memory.png: bytes per parameter on a rank against ranks, ZeRO stages 0/1/2, measured
(points, without communication buffers; the pool of stage 2 as open points) against the
formulas (lines).
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


def zero_memory(out):
    files = sorted(glob.glob(os.path.join(out, "zero_memory_np*.json")))
    if not files:
        return
    measured, with_buffers, formula = {}, {}, {}
    for path in files:
        for r in json.load(open(path)):
            m, p, n = r["memory"], r["parameters"], r["ranks"]
            measured.setdefault(r["zero"], []).append((n, (m["total"] - m["communication"]) / p))
            with_buffers.setdefault(r["zero"], []).append((n, m["total"] / p))
            formula.setdefault(r["zero"], []).append((n, m["formula_bytes_per_parameter"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    colors = {0: "tab:blue", 1: "tab:orange", 2: "tab:green"}
    for stage in sorted(measured):
        pts = sorted(measured[stage])
        f = sorted(formula[stage])
        ax.plot([x[0] for x in f], [x[1] for x in f], "-", color=colors[stage], alpha=0.5,
                label="stage %d formula" % stage)
        ax.plot([x[0] for x in pts], [x[1] for x in pts], "o", color=colors[stage], label="stage %d measured" % stage)
        if stage == 2:
            b = sorted(with_buffers[stage])
            ax.plot([x[0] for x in b], [x[1] for x in b], "o", mfc="none", color=colors[stage],
                    label="stage 2 with its gradient pool")
    ax.set_xlabel("ranks (N)")
    ax.set_ylabel("bytes per parameter on a rank")
    ax.set_xticks(sorted({x[0] for v in measured.values() for x in v}))
    ax.set_ylim(bottom=0)
    ax.set_title("ZeRO memory: AdamW, bf16 parameters and gradients")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "zero_memory.png"), dpi=110)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "docs/bench"
    allreduce(out)
    ddp(out)
    zero_memory(out)
