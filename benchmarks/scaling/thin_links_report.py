#!/usr/bin/env python3
"""The tables and the plot of benchmarks/scaling/thin_links.sh from its runs' JSON summaries.

    python3 benchmarks/scaling/thin_links_report.py RESULTS

Reads RESULTS/runs/<link>_<N>x<L>_<mode>.json (train_gpt --json) and writes
  results.csv       one row per run: link, layout, mode, tokens/s (steady and whole run), final
                    validation loss, steps, tokens, wall s, and the ratios against DDP flat
  results.md        the same as a markdown table per link and node count
  loss_vs_time.png  validation loss against training time, one panel per link and node count
                    (needs matplotlib: skipped with a message without it)
Training time of an evaluation = its step / steps x the run's train_s (train_gpt's loss curve has
steps and tokens; train_s excludes evaluations and checkpoints), so the curves are at equal tokens
per point and differ in time by each mode's step rate. Runs of thin_links.sh --local (link
"local": no shaped link, so their time says nothing) are plotted against tokens instead.
"""
import csv
import glob
import json
import os
import re
import sys

LINKS = {"10gbit": 0, "2.5gbit": 1, "1gbit": 2, "250mbit": 3, "100mbit": 4}


def load(out):
    rows = []
    for f in sorted(glob.glob(os.path.join(out, "runs", "*.json"))):
        m = re.match(r"(.+?)_(\d+)x(\d+)_(.+)\.json$", os.path.basename(f))
        if not m:
            continue
        try:
            j = json.load(open(f))
        except ValueError:
            print("thin_links_report: %s is not JSON; left out" % f)
            continue
        link, n, l, mode = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        rows.append({"link": link, "nodes": n, "per_node": l, "mode": mode, "json": j})
    rows.sort(key=lambda r: (LINKS.get(r["link"], 9), r["nodes"], r["per_node"], order(r["mode"])))
    return rows


def order(mode):
    """ddp-flat, ddp-hierarchical, then diloco by H, dtype, streaming."""
    if mode.startswith("ddp"):
        return (0, 0 if mode == "ddp-flat" else 1, "", 0, "")
    m = re.match(r"diloco-H(\d+)-(\w+?)(?:-s(\d+))?(?:-(\w+))?$", mode)
    if not m:
        return (2, 0, mode, 0, "")
    dtypes = {"f32": "a", "bf16": "b", "int8": "c", "int4": "d"}
    return (1, int(m.group(1)), dtypes.get(m.group(2), m.group(2)), int(m.group(3) or 0), m.group(4) or "")


def table(rows):
    out = []
    for r in rows:
        j = r["json"]
        base = next((b for b in rows if b["link"] == r["link"] and b["nodes"] == r["nodes"]
                     and b["per_node"] == r["per_node"] and b["mode"] == "ddp-flat"), None)
        ratio = loss_ratio = ""
        if base:
            ratio = "%.2f" % (j["tokens_per_s_steady"] / base["json"]["tokens_per_s_steady"])
            if base["json"]["tokens"] == j["tokens"]:
                loss_ratio = "%.4f" % (j["final_val_loss"] / base["json"]["final_val_loss"])
        out.append({"link": r["link"], "layout": "%dx%d" % (r["nodes"], r["per_node"]), "mode": r["mode"],
                    "tokens_per_s_steady": round(j["tokens_per_s_steady"], 1), "tokens_per_s": round(j["tokens_per_s"], 1),
                    "final_val_loss": round(j["final_val_loss"], 5), "steps": j["steps"], "tokens": j["tokens"],
                    "train_s": round(j["train_s"], 2), "wall_s": round(j["wall_s"], 2),
                    "tokens_per_s_vs_ddp_flat": ratio, "val_loss_vs_ddp_flat": loss_ratio})
    return out


def write(out, rows):
    t = table(rows)
    if not t:
        print("thin_links_report: no runs in %s/runs" % out)
        return t
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(t[0]))
        w.writeheader()
        w.writerows(t)
    lines = []
    key = None
    for r in t:
        if (r["link"], r["layout"]) != key:
            key = (r["link"], r["layout"])
            lines += ["", "**%s, %s** (nodes x ranks per node)" % key, "",
                      "| mode | tokens/s (steady) | x DDP flat | val loss | / DDP flat | steps | train s |",
                      "|---|---|---|---|---|---|---|"]
        lines.append("| %s | %.0f | %s | %.4f | %s | %d | %.1f |" % (
            r["mode"], r["tokens_per_s_steady"], r["tokens_per_s_vs_ddp_flat"] or "-", r["final_val_loss"],
            r["val_loss_vs_ddp_flat"] or "-", r["steps"], r["train_s"]))
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(lines[1:]) + "\n")
    print("\n".join(lines[1:]))
    return t


def plot(out, rows):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("thin_links_report: no matplotlib (python3-matplotlib): loss_vs_time.png skipped")
        return
    panels = sorted({(r["link"], r["nodes"]) for r in rows}, key=lambda k: (LINKS.get(k[0], 9), k[1]))
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (link, n) in zip(axes[0], panels):
        for r in rows:
            if (r["link"], r["nodes"]) != (link, n):
                continue
            j = r["json"]
            curve = [p for p in j.get("loss_curve", []) if len(p) >= 4]
            if not curve or not j.get("steps"):
                continue
            t = [p[1] if link == "local" else p[0] / j["steps"] * j["train_s"] for p in curve]
            style = "-" if r["mode"].startswith("ddp") else ("--" if "-s" in r["mode"] else ":")
            ax.plot(t, [p[3] for p in curve], style, marker=".", label="%s (%dx%d)" % (r["mode"], n, r["per_node"]))
        ax.set_title("%s, %d nodes" % (link, n))
        ax.set_xlabel("tokens" if link == "local" else "training time (s)")
        ax.set_ylabel("validation loss")
        ax.set_xscale("linear" if link == "local" else "log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    path = os.path.join(out, "loss_vs_time.png")
    fig.savefig(path, dpi=110)
    print("thin_links_report: %s" % path)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rows = load(sys.argv[1])
    write(sys.argv[1], rows)
    plot(sys.argv[1], rows)


if __name__ == "__main__":
    main()
