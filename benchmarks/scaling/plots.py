#!/usr/bin/env python3
"""Plots of the emulated cluster's benchmarks (scripts/cluster-bench.sh) for docs/multinode.md.

    python3 benchmarks/scaling/plots.py docs/bench/cluster

  busbw_vs_size.png    bus bandwidth against message size, one line per layout (nodes x ranks
                       per node), one panel per link bandwidth (Open MPI's default algorithm)
  busbw_vs_nodes.png   bus bandwidth against node count at 8 MiB, per link bandwidth
  algorithms.png       Open MPI's algorithms side by side at 4 nodes x 2 ranks, per link
  model.png            the model's prediction against the measurement (>= 1 MiB), with +-15%
  ddp_scaling.png      DDP samples/s and efficiency against node count (ddp_bench)
Also runs fit.py and writes model_fit.json and model_fit.txt next to the data.
"""
import glob
import json
import os
import re
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SIZE = 8 << 20


def runs(d):
    out = {}
    for f in glob.glob(os.path.join(d, "allreduce_*_*x*_*.json")):
        m = re.match(r"allreduce_(.+?)_(\d+x\d+)_(.+)\.json", os.path.basename(f))
        try:
            out[m.groups()] = json.load(open(f))
        except (ValueError, AttributeError):
            pass
    return out


def speeds_of(r):
    key = lambda s: float(re.sub(r"[a-z]", "", s) or 0)
    return sorted({s for s, _, _ in r if s != "local"}, key=key)


def busbw_vs_size(d, r):
    speeds = speeds_of(r)
    fig, axes = plt.subplots(1, len(speeds), figsize=(5 * len(speeds), 4), sharey=True, squeeze=False)
    for ax, speed in zip(axes[0], speeds):
        for (s, layout, alg), rows in sorted(r.items(), key=lambda kv: kv[0][1]):
            if alg != "default" or s not in (speed, "local"):
                continue
            ax.plot([x["bytes"] for x in rows], [x["tutti_busbw_gbs"] for x in rows], "o-", ms=3,
                    label="%s nodes x %s" % tuple(layout.split("x")), ls="--" if s == "local" else "-")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title("links at %s" % speed)
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("busbw (GB/s)")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle("tutti allreduce across emulated nodes (Open MPI's default algorithm)")
    fig.tight_layout()
    fig.savefig(os.path.join(d, "busbw_vs_size.png"), dpi=100)


def at(rows, size):
    for x in rows:
        if x["bytes"] == size:
            return x
    return None


def busbw_vs_nodes(d, r):
    fig, ax = plt.subplots(figsize=(6, 4))
    for speed in speeds_of(r):
        for per in ("1", "2"):
            pts = []
            for n in ("1", "2", "4"):
                key = ("local" if n == "1" else speed, n + "x" + per, "default")
                if n == "1" and per == "1":
                    continue
                if key in r and at(r[key], SIZE):
                    pts.append((int(n), at(r[key], SIZE)["tutti_busbw_gbs"]))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-" if per == "2" else "s--",
                        label="%s, %s rank(s)/node" % (speed, per))
    ax.set_xlabel("nodes")
    ax.set_xticks([1, 2, 4])
    ax.set_yscale("log")
    ax.set_ylabel("busbw at 8 MiB (GB/s)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("busbw against node count (8 MiB, default algorithm)")
    fig.tight_layout()
    fig.savefig(os.path.join(d, "busbw_vs_nodes.png"), dpi=100)


def algorithms(d, r, layout="4x2"):
    speeds = speeds_of(r)
    fig, axes = plt.subplots(1, len(speeds), figsize=(5 * len(speeds), 4), sharey=True, squeeze=False)
    for ax, speed in zip(axes[0], speeds):
        for alg in ("default", "ring", "recursive_doubling", "rabenseifner", "han"):
            rows = r.get((speed, layout, alg))
            if rows:
                rows = [x for x in rows if x["bytes"] >= 2048]
                ax.plot([x["bytes"] for x in rows], [x["tutti_busbw_gbs"] for x in rows], "o-", ms=3, label=alg)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title("%s nodes x %s, links at %s" % (layout[0], layout[2], speed))
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("busbw (GB/s)")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(d, "algorithms.png"), dpi=100)


def model_plot(d):
    fit = os.path.join(d, "model_fit.json")
    with open(os.path.join(d, "model_fit.txt"), "w") as out:
        subprocess.run([sys.executable, os.path.join(HERE, "fit.py"), d, "--cores", "2", "--json", fit], stdout=out,
                       check=True)
    rows = [x for x in json.load(open(fit))["comparison"] if x["bytes"] >= (1 << 20)]
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for alg, marker in (("ring", "o"), ("recursive_doubling", "s"), ("rabenseifner", "^"), ("han", "D")):
        pts = [x for x in rows if x["algorithm"] == alg]
        ax.scatter([x["measured_s"] * 1e3 for x in pts], [x["predicted_s"] * 1e3 for x in pts], marker=marker,
                   label=alg, s=18)
    lo = min(min(x["measured_s"], x["predicted_s"]) for x in rows) * 1e3 * 0.8
    hi = max(max(x["measured_s"], x["predicted_s"]) for x in rows) * 1e3 * 1.2
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.plot([lo, hi], [lo * 1.15, hi * 1.15], "k:", lw=0.8)
    ax.plot([lo, hi], [lo * 0.85, hi * 0.85], "k:", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured (ms)")
    ax.set_ylabel("predicted (ms)")
    ax.set_title("alpha-beta model vs emulated cluster, >= 1 MiB")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(d, "model.png"), dpi=100)


def ddp(d):
    files = glob.glob(os.path.join(d, "ddp_*_*x*.json"))
    if not files:
        return
    by = {}
    for f in files:
        m = re.match(r"ddp_(.+?)_(\d+)x(\d+)\.json", os.path.basename(f))
        for row in json.load(open(f)):
            by.setdefault((m.group(1), row["mode"], m.group(3)), []).append((int(m.group(2)), row))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for (speed, mode, per), pts in sorted(by.items()):
        if mode == "local":
            continue
        pts.sort(key=lambda p: p[0])
        for p in list(pts):
            pass
        label = "%s, %s, %s rank(s)/node" % (speed, mode, per)
        axes[0].plot([p[0] for p in pts], [p[1]["samples_per_s"] for p in pts], "o-", label=label)
        axes[1].plot([p[0] for p in pts], [p[1]["scaling_efficiency"] for p in pts], "o-", label=label)
    for ax, what in zip(axes, ("samples/s (all ranks)", "scaling efficiency")):
        ax.set_xlabel("nodes")
        ax.set_ylabel(what)
        ax.set_xticks([1, 2, 4])
        ax.grid(True, alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.suptitle("DDP across emulated nodes (ddp_bench, MLP 2.9 M parameters, 128 samples per rank)")
    fig.tight_layout()
    fig.savefig(os.path.join(d, "ddp_scaling.png"), dpi=100)


if __name__ == "__main__":
    d = sys.argv[1] if len(sys.argv) > 1 else "docs/bench/cluster"
    r = runs(d)
    busbw_vs_size(d, r)
    busbw_vs_nodes(d, r)
    algorithms(d, r)
    model_plot(d)
    ddp(d)
