#!/usr/bin/env python3
"""Draws a tutti timeline (the merged Chrome trace, DIR/trace.json) as a PNG.

One row per rank, each with two lanes: compute (the layers' forward and backward, the optimizer,
data loading, and the waits for communication, hatched) and communication (every collective from
its start to its completion). Overlap and exposed communication show at a glance: a collective
under a backward layer is hidden; a collective under a hatched wait is not.

    python3 scripts/trace_plot.py DIR/trace.json -o step.png              # the last 3 steps
    python3 scripts/trace_plot.py DIR/trace.json --steps 10:12 -o step.png

Needs matplotlib (Debian: python3-matplotlib, which scripts/setup.sh installs).
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

COLORS = {
    "forward": "#4c72b0",
    "backward": "#55a868",
    "optimizer": "#c44e52",
    "data": "#8172b2",
    "scaler": "#ccb974",
    "wait": "#dddddd",
    "checkpoint": "#937860",
    "eval": "#da8bc3",
    "comm": "#dd8452",
}
COMPUTE_CATS = ("forward", "backward", "optimizer", "data", "scaler", "wait", "checkpoint", "eval")


def parse_steps(text):
    a, _, b = text.partition(":")
    return int(a), int(b or a)


def leaves(spans):
    """The spans no other span of the same lane contains (the layers, not the whole model)."""
    spans = sorted(spans, key=lambda e: (e["ts"], -e["dur"]))
    out = []
    for i, e in enumerate(spans):
        end = e["ts"] + e["dur"]
        inner = any(o is not e and o["ts"] >= e["ts"] and o["ts"] + o["dur"] <= end and o["dur"] < e["dur"]
                    and o["cat"] in COMPUTE_CATS for o in spans[i + 1:i + 64])
        if not inner:
            out.append(e)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="the merged trace (DIR/trace.json)")
    ap.add_argument("-o", "--output", default="trace.png")
    ap.add_argument("--steps", help="FROM:TO (default: the last 3 steps in the trace)")
    ap.add_argument("--title", default="")
    args = ap.parse_args()

    with open(args.trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    names = {}
    with open(args.trace) as f:
        for e in json.load(f)["traceEvents"]:
            if e.get("ph") == "M" and e.get("name") == "process_name":
                names[e["pid"]] = e["args"]["name"]
    steps = sorted({e["args"]["step"] for e in events if e["cat"] == "step"})
    if not steps:
        sys.exit("trace_plot: no steps in %s" % args.trace)
    first, last = parse_steps(args.steps) if args.steps else (steps[max(0, len(steps) - 3)], steps[-1])
    chosen = [e for e in events if first <= e["args"].get("step", -1) <= last]
    step_spans = [e for e in chosen if e["cat"] == "step"]
    if not step_spans:
        sys.exit("trace_plot: no step %d..%d in the trace (it has %d..%d)" % (first, last, steps[0], steps[-1]))
    t0 = min(e["ts"] for e in step_spans)
    t1 = max(e["ts"] + e["dur"] for e in step_spans)
    ranks = sorted({e["pid"] for e in chosen})

    fig, ax = plt.subplots(figsize=(13, 1.1 + 1.0 * len(ranks)))
    ms = lambda us: (us - t0) / 1000.0  # noqa: E731
    for row, rank in enumerate(ranks):
        y_compute = row * 3
        y_comm = row * 3 + 1.0
        mine = [e for e in chosen if e["pid"] == rank]
        compute = leaves([e for e in mine if e["cat"] in COMPUTE_CATS and e["tid"] in (0, 1)])
        for e in compute:
            ax.broken_barh([(ms(e["ts"]), e["dur"] / 1000.0)], (y_compute, 0.9), facecolors=COLORS.get(e["cat"], "#999999"),
                           hatch="////" if e["cat"] == "wait" else None, edgecolor="#666666" if e["cat"] == "wait" else "none",
                           linewidth=0.3)
        for e in mine:
            if e["cat"] == "comm":
                ax.broken_barh([(ms(e["ts"]), e["dur"] / 1000.0)], (y_comm, 0.9), facecolors=COLORS["comm"],
                               edgecolor="white", linewidth=0.5)
            if e["cat"] == "step":
                ax.axvline(ms(e["ts"]), ymin=0, ymax=1, color="#bbbbbb", linewidth=0.5, zorder=0)
    ticks, labels = [], []
    for row, rank in enumerate(ranks):
        ticks += [row * 3 + 0.45, row * 3 + 1.45]
        labels += ["%s compute" % names.get(rank, "rank %d" % rank), "%s comm" % names.get(rank, "rank %d" % rank)]
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()  # rank 0 on top
    ax.set_xlim(0, (t1 - t0) / 1000.0)
    ax.set_xlabel("ms (steps %d-%d, clocks aligned to rank 0)" % (first, last))
    ax.set_title(args.title or "tutti timeline: %s" % args.trace, fontsize=10)
    present = sorted({e["cat"] for e in chosen if e["cat"] in COLORS})
    ax.legend(handles=[Patch(facecolor=COLORS[c], hatch="////" if c == "wait" else None, label=c) for c in present],
              loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(ranks) < 3 else -0.2), ncol=len(present), fontsize=8)
    fig.tight_layout()
    fig.savefig(args.output, dpi=130)
    print("trace_plot: wrote %s (ranks %s, steps %d-%d)" % (args.output, ",".join(map(str, ranks)), first, last))


if __name__ == "__main__":
    main()
