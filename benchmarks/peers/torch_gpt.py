#!/usr/bin/python3
"""PyTorch peer of tutti's examples/train_gpt: the same GPT-2-style model, data, data order,
optimizer and schedule, data-parallel under torch.nn.parallel.DistributedDataParallel (gloo on
the CPU, nccl on a GPU), for a side-by-side comparison (benchmarks/peers/compare.sh --model
gpt-tiny; benchmarks/peers/gpt_gpu.sh on a GPU).

    mpirun -np 2 /usr/bin/python3 benchmarks/peers/torch_gpt.py --steps 200 --json torch.json

Same as train_gpt, flag for flag:
- model: token + position embedding, L pre-LayerNorm blocks (causal self-attention with one
  qkv Linear(C, 3C) and an output Linear(C, C); MLP Linear(C, 4C), GELU (tanh approximation),
  Linear(4C, C)), final LayerNorm, output head tied to the token embedding; init N(0, 0.02^2),
  the output projections N(0, (0.02 / sqrt(2L))^2), biases 0, LayerNorm 1 and 0; LayerNorm eps
  1e-5. The initial values come from torch's generator, not tutti's: the runs agree
  statistically, not bit for bit.
- data (gpt_data.py): the same corpus, split, windows of T + 1 tokens and order; each rank its
  slice of every global micro-batch. Validation: the first --val-tokens / T windows of the
  validation split, each rank a contiguous share, mean cross-entropy over all their tokens.
- AdamW(lr, betas (0.9, --beta2), eps 1e-8, --weight-decay on the blocks' weight matrices only,
  not on embeddings, LayerNorms or biases: two groups, as train_gpt), linear warm-up then cosine to --min-lr
  (tutti::optim::LrSchedule::cosine), clip_grad_norm_(--grad-clip), gradient accumulation.
- attention: on PyTorch 2.x, F.scaled_dot_product_attention(is_causal=True) (what a PyTorch
  user writes; flash attention on a GPU); on 1.x (Debian's 1.13), the explicit
  softmax(q k^T / sqrt(hs) + causal mask) v. --attention manual forces the latter.
- --precision bf16 / fp16: torch.autocast on the GPU (fp32 master weights, as tutti); fp16
  with a GradScaler. --compile: torch.compile (2.x) on the inner model (the module DDP wraps).
- AdamW fused (fused=True) where this torch has it.

Output (rank 0): one JSON object (--json FILE) with the keys compare.sh and gpt_gpu.sh read:
tokens_per_s, train_s, wall_s, final_train_loss, final_val_loss, loss_curve [[step, tokens,
train, val]], first_batch_crc32 (of rank 0's first micro-batch, as train_gpt's), mfu.
"""
import argparse
import contextlib
import math
import os
import sys
import time

WALL_START = time.perf_counter()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_data  # noqa: E402
import peer_common  # noqa: E402
from peer_common import lr_at  # noqa: E402

PRESETS = {"gpt-tiny": dict(layers=4, heads=4, width=128, context=128, vocab=256),
           "gpt2-124m": dict(layers=12, heads=12, width=768, context=1024, vocab=50257)}


class Block(nn.Module):
    def __init__(self, C, heads, attention):
        super().__init__()
        self.ln1, self.qkv, self.proj = nn.LayerNorm(C), nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.ln2, self.fc, self.fc_proj = nn.LayerNorm(C), nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.heads, self.attention = heads, attention

    def attend(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attend(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, heads, width, context, padded_vocab, attention):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(padded_vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, attention) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "fc_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for b in self.blocks:
            x = b(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied head


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="gpt-tiny", choices=sorted(PRESETS))
    for k in ("layers", "heads", "width", "context", "seq-len"):
        p.add_argument("--" + k, type=int, default=0)
    p.add_argument("--data", nargs="*", default=[])
    p.add_argument("--val-data", nargs="*", default=[])
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--accum-steps", type=int, default=1)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=-1)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--val-tokens", type=int, default=65536)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--attention", default="auto", choices=["auto", "manual", "sdpa"])
    p.add_argument("--compile", action="store_true")
    p.add_argument("--peak-tflops", type=float, default=0)
    p.add_argument("--json", default="")
    p.add_argument("--progress-interval", type=float, default=5.0)
    a = p.parse_args()

    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", 0)))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    local_rank = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("LOCAL_RANK", 0)))
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    cuda = torch.cuda.is_available() and a.device != "cpu"
    device = torch.device(f"cuda:{local_rank % max(1, torch.cuda.device_count())}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 stays fp32, as tutti's CUBLAS_COMPUTE_32F
        torch.backends.cudnn.allow_tf32 = False
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)

    cfg = dict(PRESETS[a.model])
    for k in ("layers", "heads", "width", "context"):
        if getattr(a, k) > 0:
            cfg[k] = getattr(a, k)
    T = a.seq_len or cfg["context"]
    if a.min_lr < 0:
        a.min_lr = a.lr / 10
    attention = a.attention
    if attention == "auto":
        attention = "sdpa" if hasattr(F, "scaled_dot_product_attention") else "manual"

    files = a.data or gpt_data.default_corpus_files()
    tokens, starts, vocab = gpt_data.read_corpus(files)
    if a.val_data:
        (train, train_starts) = (tokens, starts)
        val, val_starts, _ = gpt_data.read_corpus(a.val_data)
    else:
        (train, train_starts), (val, val_starts) = gpt_data.split_tail(tokens, starts, a.val_fraction)
    padded = vocab if vocab == 256 else (vocab + 127) // 128 * 128
    loader = gpt_data.TokenLoader(train, train_starts, T, a.batch_size // a.accum_steps, rank, world, a.seed)
    val_windows = gpt_data.windows(val, val_starts, T)[:max(world, a.val_tokens // T)]

    torch.manual_seed(a.seed)
    model = GPT(cfg["layers"], cfg["heads"], cfg["width"], cfg["context"], padded, attention).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    flop_params = n_params - model.wpe.weight.numel()
    flops_per_token = 6 * flop_params + 12 * cfg["layers"] * cfg["width"] * T
    # --compile: the inner model, the one DDP wraps (PyTorch's advice: DDP's hooks stay eager).
    inner = torch.compile(model) if a.compile else model
    ddp = DDP(inner, device_ids=[device.index] if cuda else None)
    run = ddp
    # Two groups, as train_gpt: the blocks' weight matrices decay; embeddings (the tied head
    # too), LayerNorms and biases do not.
    embeddings = {id(model.wte.weight), id(model.wpe.weight)}
    decay = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in embeddings]
    no_decay = [p for p in model.parameters() if p.dim() < 2 or id(p) in embeddings]
    groups = [{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt, fused = peer_common.adamw(groups, lr=a.lr, betas=(0.9, a.beta2), eps=1e-8)
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[a.precision]
    scaler = torch.cuda.amp.GradScaler(enabled=a.precision == "fp16" and cuda)

    def autocast():
        if dtype is None or not cuda:
            return torch.autocast("cpu", enabled=False)
        return torch.autocast("cuda", dtype=dtype)

    def as_tensors(rows):
        x = torch.tensor([r[0] for r in rows], dtype=torch.long)
        y = torch.tensor([r[1] for r in rows], dtype=torch.long)
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    def evaluate():
        n = len(val_windows)
        mine = val_windows[n * rank // world:n * (rank + 1) // world]
        vl = gpt_data.TokenLoader(val, val_starts, T, world, 0, 1, 0)
        acc = torch.zeros(2, dtype=torch.float64, device=device)
        model.eval()
        with torch.no_grad():
            for i in range(0, len(mine), loader.local):
                x, y = as_tensors(vl.rows(mine[i:i + loader.local]))
                with autocast():
                    logits = model(x)
                acc[0] += F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1), reduction="sum")
                acc[1] += y.numel()
        model.train()
        dist.all_reduce(acc)
        return (acc[0] / acc[1]).item()

    if rank == 0:
        print(f"torch_gpt: torch {torch.__version__}, {world} rank(s) on {device}, "
              f"{torch.get_num_threads()} thread(s) each, {n_params} parameters, attention {attention}, "
              f"precision {a.precision}{', compiled' if a.compile else ''}", flush=True)
    tokens_per_step = a.batch_size * T
    train_s, curve, last_val, first_crc = 0.0, [], None, None
    warm = min(10, a.steps // 5)  # steps left out of the steady rate, as train_gpt does
    steady_s = 0.0
    step_loss = torch.zeros(1, device=device)
    last_print = time.perf_counter()
    for step in range(1, a.steps + 1):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step - 1, a)
        step_loss.zero_()
        for micro in range(a.accum_steps):
            rows = loader.rows(loader.next_windows())
            if first_crc is None:
                first_crc = gpt_data.tokens_crc32(rows)
            x, y = as_tensors(rows)
            sync = micro == a.accum_steps - 1
            ctx = run.no_sync() if not sync and hasattr(run, "no_sync") else contextlib.nullcontext()
            with ctx:
                with autocast():
                    logits = run(x)
                    loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
                scaler.scale(loss / a.accum_steps).backward()
            step_loss += loss.detach() / a.accum_steps
        scaler.unscale_(opt)
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        dist.all_reduce(step_loss)  # the mean loss over ranks, read every step as train_gpt does
        last_loss = step_loss.item() / world
        train_s += time.perf_counter() - t0
        if step > warm:
            steady_s += time.perf_counter() - t0
        if (a.eval_every > 0 and step % a.eval_every == 0) or step == a.steps:
            last_val = evaluate()
            curve.append([step, step * tokens_per_step, last_loss, last_val])
        now = time.perf_counter()
        if rank == 0 and (now - last_print >= a.progress_interval or step == a.steps):
            last_print = now
            print(f"step {step}/{a.steps} | loss {last_loss:.4f}"
                  + (f" | val {last_val:.4f}" if curve and curve[-1][0] == step else "")
                  + f" | {step * tokens_per_step / train_s:.0f} tokens/s", flush=True)
    tokens_per_s = a.steps * tokens_per_step / train_s
    steady = (a.steps - warm) * tokens_per_step / steady_s if steady_s > 0 else tokens_per_s
    peak = a.peak_tflops
    mfu = flops_per_token * tokens_per_s / (world * peak * 1e12) if peak > 0 else None
    mfu_steady = flops_per_token * steady / (world * peak * 1e12) if peak > 0 else None
    out = {"steps": a.steps, "tokens": a.steps * tokens_per_step, "final_train_loss": last_loss,
           "final_val_loss": last_val, "tokens_per_s": tokens_per_s, "train_s": train_s,
           "tokens_per_s_steady": steady, "mfu_steady": mfu_steady, "warm_steps": warm,
           "wall_s": time.perf_counter() - WALL_START, "ranks": world, "precision": a.precision,
           "model": a.model, "parameters": n_params, "flops_per_token": flops_per_token, "mfu": mfu,
           "attention": attention, "compiled": a.compile, "fused_adamw": fused, "torch": torch.__version__,
           "threads": torch.get_num_threads(), "loss_curve": curve, "first_batch_crc32": first_crc}
    peer_common.report(a, rank, out)


if __name__ == "__main__":
    main()
