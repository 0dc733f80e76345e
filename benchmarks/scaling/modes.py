"""Training over thin links: the step time of each synchronization mode on N nodes x L ranks, with
the alpha-beta links of model.py (docs/thin-links.md, "Choosing a mode: the model").

n parameters; e bytes per gradient element on DDP's wire (2: bf16, 4: f32); a node's port is the
inter link (alpha_x, beta_x; every flow that leaves the node shares it), the links inside a node
the intra link; inner = one step of DDP inside a node (forward, backward, its allreduce overlapped
as model.ddp_step does, optimizer). "Port bytes" are what one node's port carries per direction.

DDP, flat           model.ddp_step over all N*L ranks (buckets overlapped with backward), with the
                    ring, or NCCL's choice per bucket of ring and tree (model.nccl). Port bytes
                    per step: ring 2(NL-1)/(NL) n e (one ring edge leaves each node); tree n e
                    at N = 2, 2 n e from N = 3.
DDP, hierarchical   per bucket of s bytes: reduce-scatter in the node ((L-1) intra steps of s/L),
                    allreduce of the s/L shard among the N nodes by each of the L local ranks at
                    once (ring: 2(N-1) steps of s/(LN); the L flows share the port, so a step costs
                    alpha_x + (s/N) beta_x: the time of one rank per node allreducing all of s,
                    and so with "nccl" the faster of that ring and a tree), all-gather in the node
                    ((L-1) intra steps of s/L); buckets overlapped with backward as flat. Port
                    bytes (ring across): 2(N-1)/N n e. Against
                    flat the port carries (NL-1)N / (NL(N-1)) times fewer bytes (1.5x at 2 x 2,
                    1.06x at 16 x 8) and crosses nodes in 2(N-1) steps instead of 2(NL-1); each
                    rank's share of the inter-node traffic is 1/L of its node's.
DiLoCo, period H    inner steps are DDP inside each node (no port). Every H steps the pseudo-
                    gradient (n f32 values, the same on every rank of a node) crosses the nodes,
                    local rank j taking the j-th n/L slice (its flows share the port with the
                    other L-1):
                      f32, bf16 (d = 4, 2 bytes): a ring allreduce of the slice among N nodes:
                        2(N-1) steps of alpha_x + (n d / N) beta_x; port bytes 2(N-1)/N n d.
                      int8, int4 (d = 1, 1/2 byte, and one f32 scale per block of B values, 64 as
                        tutti's DiLoCo: Q = n (d + 4/B) bytes per node) cannot be summed in flight:
                        "allgather" (the default, what tutti's DiLoCo does): every node's
                          quantized slice to every node,
                          (N-1) steps of alpha_x + Q beta_x; port bytes (N-1) Q, which grows with
                          N: from N = 8 int8 puts more bytes through the port than an f32 ring
                          allreduce (15.9 n against 7.5 n at N = 16, B = 64), int4 from N = 15;
                        "reduce_scatter": the quantized shards to their owners ((N-1) steps of
                          Q/N), summed there in f32, requantized and all-gathered ((N-1) steps of
                          Q/N): port bytes 2(N-1)/N Q, (d + 4/B)/4 of f32's.
                    Then every rank's updated slice (f32) is all-gathered in the node ((L-1) intra
                    steps of 4n/L). E = the whole exchange; step = inner + E / H.
Streaming, F        the model in F fragments of n/F, fragment k exchanged at step kH/F of each
fragments           period and overlapped with the `overlap` inner steps that follow (default
                    H/F: until the next fragment's turn): exposed per fragment
                    max(0, E_F/F - overlap x inner); step = inner + F x exposed / H, which is
                    max(inner, E_F / H) at the default, where E_F = F x exchange(n/F) pays each
                    fragment's latencies. Same port bytes per step as without streaming, spread
                    over the period instead of a burst.

DDP, PowerSGD r     DDP flat whose buckets carry PowerSGD's factors instead of the gradients: each
                    weight matrix [n, m] with n m > r (n + m) sends r (n + m) values, the rest
                    whole (fraction f of DDP's bytes, powersgd_fraction; needs the model's
                    matrices), in two allreduces per bucket (P, then Q), each modelled as an
                    allreduce of f s / 2 of the flat algorithm; buckets overlapped with backward as
                    flat. Not modelled: that Q's allreduce waits for backward's end, the GEMMs
                    (3 n m r flops per matrix) and the host orthonormalization. Port bytes: f x
                    flat's.

Not modelled: what a mode costs in convergence (DiLoCo's validation loss at equal tokens is a
measurement, docs/thin-links.md), the outer optimizer's own time (a few vector operations on n
values every H steps), contention between the exchange and inner compute for the GPU's SMs or,
on the emulated cluster, for the shared cores.
"""
import math
from dataclasses import dataclass
from typing import Optional

import model as M

OUTER_BYTES = {"f32": 4.0, "bf16": 2.0, "int8": 1.0, "int4": 0.5}
QUANTIZED = ("int8", "int4")
SCALE_BYTES = 4  # one f32 scale per block (include/tutti/kernels/compress.h)
QUANT_BLOCK = 64  # values per scale: DiLoCoOptions::block's default (include/tutti/ddp/diloco.h)


@dataclass
class Mode:
    sync: str = "ddp"                 # "ddp" or "diloco"
    allreduce: str = "flat"           # ddp: "flat" or "hierarchical"
    period: int = 1                   # diloco: H
    outer_dtype: str = "f32"          # diloco: f32, bf16, int8, int4
    fragments: int = 0                # diloco: streaming with F fragments (0: off)
    overlap_steps: Optional[float] = None  # streaming: inner steps a fragment's exchange overlaps (None: H/F)
    exchange: str = "allgather"       # quantized dtypes: "allgather" or "reduce_scatter"
    powersgd_rank: int = 4            # ddp "powersgd": r

    def label(self):
        if self.sync == "ddp":
            return "ddp %s" % self.allreduce + (" r=%d" % self.powersgd_rank if self.allreduce == "powersgd" else "")
        s = "diloco H=%d %s" % (self.period, self.outer_dtype)
        if self.outer_dtype in QUANTIZED and self.exchange != "allgather":
            s += " (rs)"
        return s + (" streaming F=%d" % self.fragments if self.fragments else "")


@dataclass
class Prediction:
    mode: Mode
    step_s: float          # average time of one (inner) step
    compute_s: float       # forward + backward + optimizer of one rank, nothing else
    tokens_per_s: float    # of the whole cluster
    ideal_fraction: float  # compute_s / step_s: tokens/s over N*L ranks that never communicate
    port_bytes: float      # per node and direction, per step (averaged over a period)
    exchange_s: float = 0.0  # diloco: one whole exchange (E or E_F); ddp: the allreduce of all buckets alone


def node_cluster(c: M.Cluster) -> M.Cluster:
    """One node of c, its cores shared as in the whole job (the emulated cluster)."""
    cores = c.host_cores * c.per_node / c.ranks if c.host_cores else None
    return M.Cluster(c.name, 1, c.per_node, c.intra, c.inter, cores, c.note)


def _intra_steps(c, steps, nbytes):
    return steps * M._intra(c, nbytes) if steps > 0 else 0.0


def leaders(c: M.Cluster) -> M.Cluster:
    """The nodes of c with one rank each: the L local ranks of a node, each allreducing its 1/L
    shard with its peers on the other nodes through the shared port, take as long as one rank
    allreducing the whole buffer (the ring's L flows of s/(LN) per step cost alpha + s/N beta)."""
    cores = c.host_cores * c.nodes / c.ranks if c.host_cores else None
    return M.Cluster(c.name, c.nodes, 1, c.intra, c.inter, cores, c.note)


def _across(c: M.Cluster, s: float, algorithm: str) -> float:
    if algorithm in ("tree", "nccl"):
        return getattr(M, algorithm)(leaders(c), s)
    return M.ring(leaders(c), s)


def hierarchical(c: M.Cluster, s: float, algorithm="ring") -> float:
    """Time of the hierarchical allreduce of s bytes: reduce-scatter in the node, allreduce across
    the nodes (ring, or with "nccl" NCCL's pick of ring and tree), all-gather in the node."""
    N, L = c.nodes, c.per_node
    if c.ranks == 1:
        return 0.0
    t = 2 * _intra_steps(c, L - 1, s / L)
    if N > 1:
        t += _across(c, s, algorithm)
    return t


def ring_port_bytes(c: M.Cluster, nbytes: float) -> float:
    p = c.ranks
    return 2 * (p - 1) / p * nbytes if c.nodes > 1 else 0.0


def tree_port_bytes(c: M.Cluster, nbytes: float) -> float:
    return 0.0 if c.nodes == 1 else nbytes * (1.0 if c.nodes == 2 else 2.0)


def flat_port_bytes(c: M.Cluster, sizes, algorithm="ring") -> float:
    """Port bytes of the flat allreduce of buckets `sizes`: ring's, or with "nccl" per bucket those of
    whichever of ring and tree model.nccl picks (others are counted as ring)."""
    total = 0.0
    for s in sizes:
        tree = algorithm == "tree" or (algorithm == "nccl" and M.tree(c, s) < M.ring(c, s))
        total += tree_port_bytes(c, s) if tree else ring_port_bytes(c, s)
    return total


def hierarchical_port_bytes(c: M.Cluster, nbytes: float) -> float:
    """A ring across the nodes; hierarchical_port_bytes(c, n) == ring_port_bytes(leaders(c), n)."""
    N = c.nodes
    return 2 * (N - 1) / N * nbytes if N > 1 else 0.0


def quantized_bytes(n: float, dtype: str, block: int = QUANT_BLOCK) -> float:
    """Bytes of n values in `dtype` as the exchange sends them (quantized ones with their scales)."""
    if dtype in QUANTIZED:
        return n * OUTER_BYTES[dtype] + SCALE_BYTES * math.ceil(n / block)
    return n * OUTER_BYTES[dtype]


def outer_exchange(c: M.Cluster, n: float, dtype: str, exchange="allgather", block=QUANT_BLOCK):
    """(seconds, port bytes per direction) of one exchange of n pseudo-gradient values across the
    nodes and the all-gather of the updated f32 slices inside each node."""
    N, L = c.nodes, c.per_node
    t_in = _intra_steps(c, L - 1, 4.0 * n / L)
    if N == 1:
        return t_in, 0.0
    stream = N > 2
    if dtype not in QUANTIZED:
        nbytes = n * OUTER_BYTES[dtype]
        t = 2 * (N - 1) * M._inter(c, nbytes / (L * N), flows=L, stream=stream)
        return t + t_in, 2 * (N - 1) / N * nbytes
    q = quantized_bytes(n, dtype, block)
    if exchange == "allgather":
        t = (N - 1) * M._inter(c, q / L, flows=L, stream=stream)
        return t + t_in, (N - 1) * q
    if exchange == "reduce_scatter":
        t = 2 * (N - 1) * M._inter(c, q / (L * N), flows=L, stream=stream)
        return t + t_in, 2 * (N - 1) / N * q
    raise ValueError("exchange: allgather or reduce_scatter, not %r" % exchange)


def powersgd_fraction(matrices, params: float, rank: int) -> float:
    """PowerSGD's values on the wire per step over DDP's: each matrix (n, m) of `matrices` with
    n m > r (n + m) (r = min(rank, n, m)) sends r (n + m) values, the other parameters whole."""
    sent = float(params)
    for n, m in matrices:
        r = min(rank, n, m)
        if n * m > r * (n + m):
            sent -= n * m - r * (n + m)
    return sent / params


def predict(c: M.Cluster, model: M.Model, mode: Mode, tokens_per_rank: float, algorithm="ring",
            bucket_mb=25.0, block=QUANT_BLOCK) -> Prediction:
    """Step time, tokens/s and port bytes of `mode` on cluster c (per-rank batch fixed)."""
    compute = model.forward_s + model.backward_s + model.optimizer_s
    n = float(model.params)
    if mode.sync == "ddp":
        if mode.allreduce == "flat":
            step, _, comm = M.ddp_step(c, model, algorithm, bucket_mb)
            port = flat_port_bytes(c, M.buckets(model, bucket_mb), algorithm)
        elif mode.allreduce == "hierarchical":
            step, _, comm = M.ddp_step(c, model, lambda cl, b: hierarchical(cl, b, algorithm), bucket_mb)
            port = flat_port_bytes(leaders(c), M.buckets(model, bucket_mb), algorithm)
        elif mode.allreduce == "powersgd":
            matrices = getattr(model, "matrices", None)
            if not matrices:
                raise ValueError("powersgd: the model's weight matrices are not known (model.matrices)")
            f = powersgd_fraction(matrices, n, mode.powersgd_rank)
            base = {**M.ALGORITHMS, **M.GPU_ALGORITHMS}.get(algorithm) or (lambda cl, b: M.best(cl, b)[1])
            step, _, comm = M.ddp_step(c, model, lambda cl, b: 2 * base(cl, f * b / 2), bucket_mb)
            port = f * flat_port_bytes(c, M.buckets(model, bucket_mb), algorithm)
        else:
            raise ValueError("allreduce: flat, hierarchical or powersgd, not %r" % mode.allreduce)
        exchange = comm
    elif mode.sync == "diloco":
        H = mode.period
        if H < 1:
            raise ValueError("diloco: the period H must be >= 1, not %r" % H)
        inner = M.ddp_step(node_cluster(c), model, algorithm, bucket_mb)[0]
        if mode.fragments:
            F = mode.fragments
            t_frag, port_frag = outer_exchange(c, n / F, mode.outer_dtype, mode.exchange, block)
            exchange, port_total = F * t_frag, F * port_frag
            overlap = H / F if mode.overlap_steps is None else mode.overlap_steps
            step = inner + F * max(0.0, t_frag - overlap * inner) / H
        else:
            exchange, port_total = outer_exchange(c, n, mode.outer_dtype, mode.exchange, block)
            step = inner + exchange / H
        port = port_total / H
    else:
        raise ValueError("sync: ddp or diloco, not %r" % mode.sync)
    return Prediction(mode, step, compute, c.ranks * tokens_per_rank / step, compute / step, port, exchange)


def modes(periods=(10, 50, 100), dtypes=("f32", "bf16", "int8", "int4"), fragments=4, exchange="allgather"):
    """Every mode of the thin-links table, in the order of preference of `recommend`."""
    out = [Mode("ddp", "flat"), Mode("ddp", "hierarchical")]
    for H in periods:
        for d in dtypes:
            out.append(Mode("diloco", period=H, outer_dtype=d, exchange=exchange))
            if fragments:
                out.append(Mode("diloco", period=H, outer_dtype=d, fragments=fragments, exchange=exchange))
    return out


def recommend(rows, target=0.9, token_cost=1.0):
    """(prediction, reason): the first row (modes' order: DDP, then DiLoCo by growing H, widest
    dtype first, streaming off before on: the fewest departures from DDP) that reaches `target` of
    the ideal tokens/s; else the fastest. token_cost: the tokens DiLoCo needs to reach the loss DDP
    reaches with one (>= 1; docs/thin-links.md, "Where DiLoCo pays"): a DiLoCo row counts at its
    tokens/s over token_cost, the rate at which it makes DDP's progress."""
    def useful(r):
        return r.ideal_fraction / (token_cost if r.mode.sync == "diloco" else 1.0)

    for r in rows:
        if useful(r) >= target:
            return r, "the first mode, in order of departure from DDP, within %.0f%% of ideal%s" % (
                100 * target, "" if token_cost == 1 else " at DiLoCo's token cost %gx" % token_cost)
    best = max(rows, key=useful)
    return best, "no mode reaches %.0f%% of ideal%s: the fastest" % (
        100 * target, "" if token_cost == 1 else " at DiLoCo's token cost %gx" % token_cost)


def diloco_break_even(rows):
    """The fastest DiLoCo row and its tokens/s over the faster DDP row's: DiLoCo reaches a loss
    sooner than DDP only where this exceeds its token cost."""
    ddp = max((r for r in rows if r.mode.sync == "ddp" and r.mode.allreduce != "powersgd"),
              key=lambda r: r.tokens_per_s)
    diloco = max((r for r in rows if r.mode.sync == "diloco"), key=lambda r: r.tokens_per_s, default=None)
    return (diloco, diloco.tokens_per_s / ddp.tokens_per_s) if diloco else (None, 0.0)
