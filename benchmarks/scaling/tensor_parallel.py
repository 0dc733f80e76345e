"""Tensor parallelism inside a node, data parallelism across (train_gpt --tp, models::Gpt(config,
group)): the step time and the state per rank of a GPT at tp = 1, 2, 4, 8, with the alpha-beta
links of model.py (docs/user-guide.md, "GPT split over a group"). predict --tensor-parallel prints it.

The global batch is fixed: each of the N*L/tp data-parallel groups processes tp x t tokens a step
(t: tokens per GPU), so at any tp every rank multiplies the same share of the layers. Per rank and
step, for L layers of width C, vocabulary V, context T, a bytes per activation and gradient:

  compute  (F_layers + F_head) t / (peak x mfu): F_layers = 6 x 12 L C^2 + 12 L C T per token,
           F_head = 6 V C (the tied head); both split over the group (the head by the vocabulary,
           parallel/vocab_parallel.h).
  tp comm  4 L + 2 allreduces of tp t C elements among the tp ranks of one node (2 a layer in
           forward, after the row-parallel projections; 2 in backward, of the column-parallel
           layers' input gradients; the embedding's output and the head's input gradient), a
           ring over the intra link: 2(tp-1) (alpha + t C a beta) each; and the loss's two of
           3 tp t f32 (the rows' maxima, then their sums). On the critical path (not overlapped).
  sp comm  with sequence parallelism (train_gpt --sequence-parallel) each allreduce becomes a
           reduce-scatter and an allgather (the same ring cost), and backward gathers the
           column-parallel layers' and the head's inputs again: 2 L + 1 allgathers of tp t C more,
           (tp-1)(alpha + t C a beta) each; and the norms' parameter gradients, 2 L + 1 allreduces of
           2 C f32. Its gain is activation memory (not modelled here: train_gpt --plan
           --sequence-parallel counts it).
  dp comm  DDP's bucketed allreduce of this rank's gradients (model.ddp_step, overlapped with
           backward): the layers' share 12 L C^2 / tp and the embeddings (V / tp + T) C, among the
           N x L/tp ranks with the same tp coordinate (L/tp per node).
  state    16 bytes per parameter held (bf16 weights and gradients, the f32 master, Adam's two
           moments; ZeRO 0): 12 L C^2 / tp + (V / tp + T) C parameters.

TP pays in speed where the data-parallel allreduce is exposed (thin links between nodes) and the
intra link is fast (NVLink): it divides the gradient bytes by tp and moves activations over the
fast link instead. Over PCIe its allreduces cost more than they save. It pays in memory wherever
the state does not fit one GPU. Not modelled: activation memory (also divided by tp for the
layers, and the rest with sequence parallelism), overlap of TP's allreduces with compute.
"""
from dataclasses import dataclass

import model as M

STATE_BYTES = 16  # per parameter held: bf16 weights and gradients, f32 master, Adam's moments


@dataclass
class Gpt:
    layers: int
    width: int
    vocab: int
    context: int
    tokens_per_gpu: float
    peak_tflops: float
    mfu: float
    act_bytes: int = 2    # bytes per activation element on TP's wire (bf16)
    grad_bytes: int = 2   # bytes per gradient element on DDP's wire


@dataclass
class TpPrediction:
    tp: int
    step_s: float
    compute_s: float
    tp_comm_s: float      # TP's allreduces of one step
    dp_exposed_s: float   # DDP's allreduce not hidden by backward
    tokens_per_s: float   # of the whole cluster
    state_bytes: float    # per rank
    params_held: float    # per rank


def layer_params(g: Gpt) -> float:
    return 12.0 * g.width * g.width  # the four weight matrices of one layer (biases left out)


def ring_allreduce(link: M.Link, ranks: int, nbytes: float) -> float:
    return 0.0 if ranks == 1 else 2 * (ranks - 1) * (link.alpha + nbytes / ranks * link.beta)


def ring_allgather(link: M.Link, ranks: int, nbytes: float) -> float:
    """nbytes gathered in all: each rank's nbytes / ranks sent on around the ring."""
    return 0.0 if ranks == 1 else (ranks - 1) * (link.alpha + nbytes / ranks * link.beta)


def predict(c: M.Cluster, g: Gpt, tp: int, algorithm="nccl", bucket_mb=25.0,
            sequence_parallel=False) -> TpPrediction:
    """One step of dp x tp on cluster c (tp divides its ranks per node), with sequence parallelism
    when asked."""
    if tp < 1 or c.per_node % tp:
        raise ValueError("tp %d must divide the %d ranks per node (TP stays inside a node)" % (tp, c.per_node))
    per_token_layers = 6 * g.layers * layer_params(g) + 12 * g.layers * g.width * g.context
    per_token_head = 6.0 * g.vocab * g.width
    compute = (per_token_layers + per_token_head) * g.tokens_per_gpu / (g.peak_tflops * 1e12 * g.mfu)
    activation_bytes = tp * g.tokens_per_gpu * g.width * g.act_bytes
    loss_bytes = 3 * tp * g.tokens_per_gpu * 4  # the rows' maxima, then their sums of exp and labels' logits
    tp_comm = (4 * g.layers + 2) * ring_allreduce(c.intra, tp, activation_bytes) + (
        ring_allreduce(c.intra, tp, loss_bytes / 3) + ring_allreduce(c.intra, tp, 2 * loss_bytes / 3))
    if sequence_parallel:
        norms = 2 * g.layers + 1  # two LayerNorms a layer and the final one: gamma and beta, 2 C f32
        tp_comm += norms * (ring_allgather(c.intra, tp, activation_bytes) + ring_allreduce(c.intra, tp, 8 * g.width))
    embeddings = (g.vocab / tp + g.context) * g.width
    per_layer = layer_params(g) / tp
    dp_model = M.Model("gpt tp%d" % tp, [int(embeddings)] + [int(per_layer)] * g.layers, g.grad_bytes,
                       compute / 3, 2 * compute / 3, 0.0)
    dp_cluster = M.Cluster(c.name, c.nodes, c.per_node // tp, c.intra, c.inter, c.host_cores, c.note)
    step, exposed, _ = M.ddp_step(dp_cluster, dp_model, algorithm, bucket_mb)
    step += tp_comm
    held = embeddings + g.layers * per_layer
    return TpPrediction(tp, step, compute, tp_comm, exposed, c.ranks * g.tokens_per_gpu / step, STATE_BYTES * held,
                        held)


def sizes(per_node: int):
    """The tp sizes that divide a node: 1, 2, 4, 8, ..."""
    out, tp = [], 1
    while tp <= per_node:
        if per_node % tp == 0:
            out.append(tp)
        tp *= 2
    return out


def advise(rows, memory_bytes=None):
    """(text): the fastest tp and, given a GPU's memory, the smallest tp whose state fits."""
    fastest = max(rows, key=lambda r: r.tokens_per_s)
    base = rows[0]
    text = "fastest: tp %d, %.2fx tp 1's tokens/s" % (fastest.tp, fastest.tokens_per_s / base.tokens_per_s)
    text += " (TP pays in speed here)" if fastest.tp > 1 else " (TP does not pay in speed here)"
    if memory_bytes:
        fits = [r for r in rows if r.state_bytes <= memory_bytes]
        if not fits:
            text += "; no tp fits the state in %.0f GB: add ZeRO (--zero)" % (memory_bytes / 1e9)
        elif fits[0].tp > 1:
            text += "; tp 1's state (%.1f GB) does not fit %.0f GB: tp %d is the smallest that does (%.1f GB)" % (
                base.state_bytes / 1e9, memory_bytes / 1e9, fits[0].tp, fits[0].state_bytes / 1e9)
        else:
            text += "; tp 1's state fits %.0f GB (%.1f GB)" % (memory_bytes / 1e9, base.state_bytes / 1e9)
    return text
