#!/usr/bin/env python3
"""PyTorch peer of tutti's `examples/train_gpt --model llama-*`: the same Llama, data, data order,
optimizer and schedule, data-parallel under torch.nn.parallel.DistributedDataParallel (gloo on the
CPU), for a side-by-side comparison (benchmarks/peers/compare.sh --model llama-bench).

    python torch_llama.py --save-init INIT --layers 4 --width 256 ...  # a random Llama as an HF folder
    mpirun -np 2 python torch_llama.py --init-from INIT --steps 200 --compile --json torch.json

Same as train_gpt, flag for flag:
- model (transformers' LlamaForCausalLM, as include/tutti/models/llama.h builds it): a token
  embedding, L pre-norm blocks (RMSNorm; grouped-query causal self-attention, H query heads sharing
  G key/value heads, rotary embeddings "rotate half" with rope_theta on q and k; RMSNorm; SwiGLU
  MLP down(silu(gate) * up)), a final RMSNorm and an untied head; no biases; RMSNorm eps 1e-5.
  Written the way a PyTorch user who wants speed writes it: one Linear for q, k and v and one for
  gate and up (as tutti's, and gpt-fast's), torch.nn.RMSNorm, F.scaled_dot_product_attention
  (is_causal=True; grouped heads by enable_gqa or, --gqa repeat, k and v repeated per query head:
  the faster of the two on this machine is the default, see README.md), the loss inside the
  module so that torch.compile sees it.
- initialization: --init-from DIR loads a Hugging Face folder (config.json and model.safetensors
  under transformers' names) that train_gpt --init-from loads too, so both sides start from the
  same weights; --save-init DIR writes one (transformers' initialization, N(0, 0.02^2) for the
  embedding and every matrix, norms 1, from torch's generator seeded with --seed) and exits.
- data (gpt_data.py): the same corpus, split, windows of T + 1 tokens and order; each rank its
  slice of every global micro-batch. Validation: the first --val-tokens / T windows of the
  validation split, each rank a contiguous share, mean cross-entropy over all their tokens.
- AdamW(lr, betas (--beta1, --beta2), eps 1e-8, fused=True where this torch has it), --weight-decay
  on the 2-D weight matrices (the head's too) but not on the embedding or the norms (two groups, as
  tutti::optim::weight_decay_groups), linear warm-up then cosine to --min-lr
  (tutti::optim::LrSchedule::cosine), clip_grad_norm_(--grad-clip), fp32 throughout.
- --compile: torch.compile on the inner model (the module DDP wraps).

Output (rank 0): one JSON object (--json FILE) with the keys compare.sh reads: tokens_per_s,
tokens_per_s_steady, train_s, wall_s, final_train_loss, final_val_loss, initial_train_loss,
loss_curve [[step, tokens, train, val]], first_batch_crc32 (of rank 0's first micro-batch, as
train_gpt's), flops_per_token (counted as tutti's layers count them), mfu (with --peak-tflops).
"""
import argparse
import contextlib
import json
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

# tutti's presets (tutti::models::LlamaConfig::preset) that fit a CPU, and compare.sh's benchmark shape.
PRESETS = {"llama-tiny": dict(layers=4, heads=4, kv_heads=2, width=128, ffn=384, context=256, vocab=256),
           "llama-bench": dict(layers=4, heads=8, kv_heads=4, width=256, ffn=688, context=256, vocab=256)}


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, C, H, G, hs, gqa):
        super().__init__()
        self.H, self.G, self.hs, self.gqa = H, G, hs, gqa
        self.qkv = nn.Linear(C, (H + 2 * G) * hs, bias=False)  # rows: the H query, G key, G value heads
        self.o = nn.Linear(H * hs, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        H, G, hs = self.H, self.G, self.hs
        q, k, v = self.qkv(x).split([H * hs, G * hs, G * hs], dim=-1)
        q = q.view(B, T, H, hs).transpose(1, 2)
        k = k.view(B, T, G, hs).transpose(1, 2)
        v = v.view(B, T, G, hs).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if G == H:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.gqa == "enable_gqa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(B, T, H * hs))


class Mlp(nn.Module):
    def __init__(self, C, F_):
        super().__init__()
        self.gate_up = nn.Linear(C, 2 * F_, bias=False)  # rows: [gate | up]
        self.down = nn.Linear(F_, C, bias=False)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg, gqa):
        super().__init__()
        C, hs = cfg["width"], cfg["head_dim"]
        self.attn_norm = nn.RMSNorm(C, eps=cfg["eps"])
        self.attn = Attention(C, cfg["heads"], cfg["kv_heads"], hs, gqa)
        self.mlp_norm = nn.RMSNorm(C, eps=cfg["eps"])
        self.mlp = Mlp(C, cfg["ffn"])

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(self, cfg, gqa):
        super().__init__()
        self.cfg = cfg
        C, hs = cfg["width"], cfg["head_dim"]
        self.embed = nn.Embedding(cfg["vocab"], C)
        self.blocks = nn.ModuleList(Block(cfg, gqa) for _ in range(cfg["layers"]))
        self.norm = nn.RMSNorm(C, eps=cfg["eps"])
        self.head = nn.Linear(C, cfg["vocab"], bias=False)
        # transformers' LlamaRotaryEmbedding (default rope type): inv_freq in f32, angles t * inv_freq.
        inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hs, 2, dtype=torch.int64).float() / hs))
        angles = torch.outer(torch.arange(cfg["context"], dtype=torch.float32), inv_freq)
        emb = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        # transformers' _init_weights: N(0, 0.02^2) for the embedding and every matrix, norms 1.
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx, targets=None):
        T = idx.size(1)
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.embed(idx)
        for b in self.blocks:
            x = b(x, cos, sin)
        logits = self.head(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# ---- Hugging Face folders: config.json and model.safetensors under transformers' names ----------

def hf_config(cfg):
    """config.json of LlamaForCausalLM, with the keys tutti's hf::config_json writes."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": cfg["width"],
            "intermediate_size": cfg["ffn"], "num_hidden_layers": cfg["layers"],
            "num_attention_heads": cfg["heads"], "num_key_value_heads": cfg["kv_heads"],
            "head_dim": cfg["head_dim"], "vocab_size": cfg["vocab"], "max_position_embeddings": cfg["context"],
            "rms_norm_eps": cfg["eps"], "rope_theta": cfg["rope_theta"], "rope_scaling": None,
            "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
            "pretraining_tp": 1, "initializer_range": 0.02, "tie_word_embeddings": False, "use_cache": True,
            "torch_dtype": "float32"}


def config_from_hf(path):
    with open(os.path.join(path, "config.json")) as f:
        j = json.load(f)
    if j.get("model_type") != "llama" or j.get("tie_word_embeddings", False) or j.get("rope_scaling"):
        raise SystemExit(f"error: {path}: torch_llama.py reads untied Llamas without rope scaling")
    heads = j["num_attention_heads"]
    return dict(layers=j["num_hidden_layers"], heads=heads, kv_heads=j.get("num_key_value_heads", heads),
                width=j["hidden_size"], ffn=j["intermediate_size"], context=j["max_position_embeddings"],
                vocab=j["vocab_size"], head_dim=j.get("head_dim") or j["hidden_size"] // heads,
                eps=j.get("rms_norm_eps", 1e-6), rope_theta=j.get("rope_theta", 10000.0))


def hf_state(model):
    """transformers' tensors of `model`: the fused projections cut into q/k/v and gate/up."""
    cfg, out = model.cfg, {}
    H, G, hs = cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    out["model.embed_tokens.weight"] = model.embed.weight
    for i, b in enumerate(model.blocks):
        p = f"model.layers.{i}."
        q, k, v = b.attn.qkv.weight.split([H * hs, G * hs, G * hs], dim=0)
        gate, up = b.mlp.gate_up.weight.chunk(2, dim=0)
        out.update({p + "input_layernorm.weight": b.attn_norm.weight, p + "self_attn.q_proj.weight": q,
                    p + "self_attn.k_proj.weight": k, p + "self_attn.v_proj.weight": v,
                    p + "self_attn.o_proj.weight": b.attn.o.weight, p + "post_attention_layernorm.weight":
                    b.mlp_norm.weight, p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                    p + "mlp.down_proj.weight": b.mlp.down.weight})
    out["model.norm.weight"] = model.norm.weight
    out["lm_head.weight"] = model.head.weight
    return {k: v.detach().contiguous().cpu() for k, v in out.items()}


def save_hf(model, path):
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_config(model.cfg), f, indent=2)
    save_file(hf_state(model), os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def load_hf(model, path):
    from safetensors.torch import load_file
    tensors = load_file(os.path.join(path, "model.safetensors"))
    cfg = model.cfg
    with torch.no_grad():
        model.embed.weight.copy_(tensors.pop("model.embed_tokens.weight"))
        for i, b in enumerate(model.blocks):
            p = f"model.layers.{i}."
            t = {k[len(p):]: tensors.pop(k) for k in list(tensors) if k.startswith(p)}
            b.attn_norm.weight.copy_(t["input_layernorm.weight"])
            b.attn.qkv.weight.copy_(torch.cat([t["self_attn.q_proj.weight"], t["self_attn.k_proj.weight"],
                                               t["self_attn.v_proj.weight"]]))
            b.attn.o.weight.copy_(t["self_attn.o_proj.weight"])
            b.mlp_norm.weight.copy_(t["post_attention_layernorm.weight"])
            b.mlp.gate_up.weight.copy_(torch.cat([t["mlp.gate_proj.weight"], t["mlp.up_proj.weight"]]))
            b.mlp.down.weight.copy_(t["mlp.down_proj.weight"])
        model.norm.weight.copy_(tensors.pop("model.norm.weight"))
        model.head.weight.copy_(tensors.pop("lm_head.weight"))
    if tensors:
        raise SystemExit(f"error: {path}: tensors left unread: {sorted(tensors)[:5]}")
    assert cfg["vocab"] == model.embed.weight.size(0)


def fingerprint(cfg):
    """tutti::models::LlamaConfig::fingerprint (train_gpt's JSON "config") of an untied Llama."""
    hs = "" if cfg["head_dim"] * cfg["heads"] == cfg["width"] else f" hs{cfg['head_dim']}"
    theta = "" if cfg["rope_theta"] == 10000.0 else f" theta{cfg['rope_theta']:g}"
    return (f"Llama L{cfg['layers']} H{cfg['heads']}/{cfg['kv_heads']} C{cfg['width']} F{cfg['ffn']} "
            f"T{cfg['context']} V{cfg['vocab']}{hs}{theta}")


def flops_per_token(cfg, T):
    """Training FLOPs per token as tutti's layers count them (Module::flops): 6 per weight of every
    matrix but the embedding (forward 2, backward 4), plus attention's 12 T H hs a layer (q k^T and
    p v over all T keys, backward twice the forward); norms, rotary, SwiGLU and the loss count 0."""
    C, H, G, hs, F_, V = (cfg[k] for k in ("width", "heads", "kv_heads", "head_dim", "ffn", "vocab"))
    matrices = cfg["layers"] * (C * (H + 2 * G) * hs + H * hs * C + 3 * C * F_) + C * V
    return 6 * matrices + 12 * cfg["layers"] * T * H * hs


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llama-tiny", choices=sorted(PRESETS))
    for k in ("layers", "heads", "kv-heads", "width", "ffn", "context", "seq-len"):
        p.add_argument("--" + k, type=int, default=0)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--init-from", default="", help="a Hugging Face Llama folder to start from")
    p.add_argument("--save-init", default="", help="write the initial model as a Hugging Face folder and exit")
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
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--device", default="cpu", choices=["cpu"])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--val-tokens", type=int, default=65536)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--gqa", default="enable_gqa", choices=["enable_gqa", "repeat"],
                   help="grouped heads: sdpa's enable_gqa, or k and v repeated per query head")
    p.add_argument("--compile", action="store_true", help="torch.compile the inner model (the one DDP wraps)")
    p.add_argument("--peak-tflops", type=float, default=0, help="per rank, for MFU (train_gpt's peak_tflops)")
    p.add_argument("--json", default="")
    p.add_argument("--progress-interval", type=float, default=5.0)
    a = p.parse_args()

    if a.threads > 0:
        torch.set_num_threads(a.threads)
        torch.set_num_interop_threads(a.threads)
    if a.init_from:
        cfg = config_from_hf(a.init_from)
    else:
        cfg = dict(PRESETS[a.model])
        for k in ("layers", "heads", "kv_heads", "width", "ffn", "context"):
            if getattr(a, k) > 0:
                cfg[k] = getattr(a, k)
        cfg.update(head_dim=cfg["width"] // cfg["heads"], eps=1e-5, rope_theta=a.rope_theta)
    if a.save_init:
        torch.manual_seed(a.seed)
        save_hf(Llama(cfg, a.gqa), a.save_init)
        print(f"torch_llama: wrote {a.save_init} ({cfg})")
        return

    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", 0)))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    device = torch.device("cpu")

    T = a.seq_len or min(cfg["context"], 1024)
    if a.min_lr < 0:
        a.min_lr = a.lr / 10
    files = a.data or gpt_data.default_corpus_files()
    tokens, starts, vocab = gpt_data.read_corpus(files)
    if vocab > cfg["vocab"]:
        raise SystemExit(f"error: the data's vocabulary {vocab} exceeds the model's {cfg['vocab']}")
    if a.val_data:
        (train, train_starts) = (tokens, starts)
        val, val_starts, _ = gpt_data.read_corpus(a.val_data)
    else:
        (train, train_starts), (val, val_starts) = gpt_data.split_tail(tokens, starts, a.val_fraction)
    loader = gpt_data.TokenLoader(train, train_starts, T, a.batch_size // a.accum_steps, rank, world, a.seed)
    val_windows = gpt_data.windows(val, val_starts, T)[:max(world, a.val_tokens // T)]

    torch.manual_seed(a.seed)
    model = Llama(cfg, a.gqa).to(device)
    if a.init_from:
        load_hf(model, a.init_from)
    n_params = sum(p.numel() for p in model.parameters())
    fpt = flops_per_token(cfg, T)
    inner = torch.compile(model) if a.compile else model
    ddp = DDP(inner, gradient_as_bucket_view=True)  # gradients in the buckets: no copy in or out
    # Two groups, as tutti::optim::weight_decay_groups: the 2-D matrices (the head's too) decay; the
    # embedding and the norms do not.
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and not n.startswith("embed.")]
    no_decay = [p for n, p in model.named_parameters() if p.dim() != 2 or n.startswith("embed.")]
    groups = [{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    opt, fused = peer_common.adamw(groups, lr=a.lr, betas=(a.beta1, a.beta2), eps=1e-8)

    def as_tensors(rows):
        x = torch.tensor([r[0] for r in rows], dtype=torch.long)
        y = torch.tensor([r[1] for r in rows], dtype=torch.long)
        return x, y

    def evaluate():
        n = len(val_windows)
        mine = val_windows[n * rank // world:n * (rank + 1) // world]
        vl = gpt_data.TokenLoader(val, val_starts, T, world, 0, 1, 0)
        acc = torch.zeros(2, dtype=torch.float64)
        model.eval()
        with torch.no_grad():
            for i in range(0, len(mine), loader.local):
                x, y = as_tensors(vl.rows(mine[i:i + loader.local]))
                logits = model(x)  # eager: no recompilation for evaluation's batch shapes
                acc[0] += F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), reduction="sum")
                acc[1] += y.numel()
        model.train()
        dist.all_reduce(acc)
        return (acc[0] / acc[1]).item()

    if rank == 0:
        print(f"torch_llama: torch {torch.__version__}, {world} rank(s), {torch.get_num_threads()} thread(s) each, "
              f"{n_params} parameters ({cfg}), T {T}, gqa {a.gqa}, AdamW fused {fused}"
              f"{', compiled' if a.compile else ''}{', from ' + a.init_from if a.init_from else ''}", flush=True)
    tokens_per_step = a.batch_size * T
    train_s, curve, last_val, first_crc, first_loss = 0.0, [], None, None, None
    warm = min(10, a.steps // 5)  # steps left out of the steady rate, as train_gpt does
    steady_s = 0.0
    step_loss = torch.zeros(1)
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
            with (ddp.no_sync() if not sync else contextlib.nullcontext()):
                loss = ddp(x, y)
                (loss / a.accum_steps).backward()
            step_loss += loss.detach() / a.accum_steps
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.all_reduce(step_loss)  # the mean loss over ranks, read every step as train_gpt does
        last_loss = step_loss.item() / world
        if first_loss is None:
            first_loss = last_loss
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
    mfu = fpt * tokens_per_s / (world * peak * 1e12) if peak > 0 else None
    mfu_steady = fpt * steady / (world * peak * 1e12) if peak > 0 else None
    out = {"steps": a.steps, "tokens": a.steps * tokens_per_step, "initial_train_loss": first_loss,
           "final_train_loss": last_loss, "final_val_loss": last_val, "tokens_per_s": tokens_per_s,
           "train_s": train_s, "tokens_per_s_steady": steady, "mfu_steady": mfu_steady, "warm_steps": warm,
           "wall_s": time.perf_counter() - WALL_START, "ranks": world, "model": None if a.init_from else a.model,
           "fingerprint": fingerprint(cfg), "config": cfg,
           "init_from": a.init_from, "parameters": n_params, "flops_per_token": fpt, "peak_tflops": peak or None,
           "mfu": mfu, "gqa": a.gqa, "compiled": a.compile, "fused_adamw": fused, "torch": torch.__version__,
           "threads": torch.get_num_threads(), "seq_len": T, "global_batch_size": a.batch_size,
           "loss_curve": curve, "first_batch_crc32": first_crc}
    peer_common.report(a, rank, out)


if __name__ == "__main__":
    main()
