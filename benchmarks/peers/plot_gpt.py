#!/usr/bin/python3
"""The loss-curve plot of docs/gpt.md: validation loss against tokens trained, tutti's
train_gpt and its PyTorch peer, every run of a compare.sh --model gpt-* output folder
(tutti.N.json, torch.N.json: their "loss_curve" [[step, tokens, train, val], ...]).

    /usr/bin/python3 benchmarks/peers/plot_gpt.py OUT_DIR docs/bench/gpt_loss.png

Needs matplotlib (Debian: apt-get install python3-matplotlib; the system interpreter)."""
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def runs(folder, name):
    out = []
    for path in sorted(glob.glob(os.path.join(folder, name + ".*.json"))):
        with open(path) as f:
            out.append(json.load(f))
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    folder, png = sys.argv[1], sys.argv[2]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for name, label, color in (("tutti", "tutti (train_gpt)", "tab:blue"), ("torch", "PyTorch DDP (torch_gpt.py)", "tab:orange")):
        rs = runs(folder, name)
        for i, r in enumerate(rs):
            curve = r["loss_curve"]
            ax.plot([c[1] / 1e6 for c in curve], [c[3] for c in curve], color=color, alpha=0.85, marker="o",
                    markersize=3, linewidth=1.2, linestyle="-" if name == "tutti" else "--",
                    label=f"{label}, {len(rs)} runs" if i == 0 else None)
    first = (runs(folder, "tutti") or runs(folder, "torch"))[0]
    ax.set_xlabel("tokens trained (millions)")
    ax.set_ylabel("validation loss (nats per byte)")
    ax.set_title(f"{first['model']} ({first.get('config', '')}), {first['ranks']} ranks, "
                 f"batch {first.get('global_batch_size', '')} x {first.get('seq_len', '')}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png)
    print(f"wrote {png}")


if __name__ == "__main__":
    main()
