"""What the PyTorch peers (torch_gpt.py, torch_llama.py) share beside the data (gpt_data.py): the
learning-rate schedule, the optimizer at its fastest, and the end-of-run report."""
import json
import math

import torch
import torch.distributed as dist


def lr_at(step, a):
    """tutti::optim::LrSchedule::cosine at step (0-based): linear warm-up, then cosine to --min-lr."""
    if a.warmup_steps > 0 and step < a.warmup_steps:
        return a.lr * (step + 1) / a.warmup_steps
    span = a.steps - a.warmup_steps
    t = 1.0 if span <= 0 else min(1.0, (step - a.warmup_steps) / span)
    return a.min_lr + (a.lr - a.min_lr) * 0.5 * (1 + math.cos(math.pi * t))


def adamw(groups, **kw):
    """torch.optim.AdamW, fused where this torch has it (2.x; not 1.13's CPU): (optimizer, fused)."""
    try:
        return torch.optim.AdamW(groups, fused=True, **kw), True
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, **kw), False


def report(a, rank, out):
    """Rank 0: the "done" line compare.sh reads, the summary without the loss curve, and the whole
    JSON object to --json; then the process group ends (every rank)."""
    if rank == 0:
        mfu = out["mfu"]
        print(f"done: {a.steps} steps, train loss {out['final_train_loss']:.4f}, val loss {out['final_val_loss']:.4f}, "
              f"{out['tokens_per_s']:.0f} tokens/s" + (f", MFU {100 * mfu:.1f}%" if mfu else ""), flush=True)
        print(json.dumps({k: v for k, v in out.items() if k != "loss_curve"}))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=2)
    dist.destroy_process_group()
