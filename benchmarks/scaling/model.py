"""The alpha-beta scaling model of tutti's allreduce and of a DDP step (docs/multinode.md, "The model").

A message of b bytes over a link of class c takes alpha_c + b * beta_c (alpha: per-message
latency, beta = 1 / bandwidth). Two classes: "intra" (between two ranks of one node: shared
memory, NVLink) and "inter" (a node's network port, shared by every flow that leaves the node).
Ranks are placed by node (ranks 0..G-1 on node 0, ...), as mpirun's hostfile and srun place them.

Each algorithm is a sequence of steps in which every rank exchanges with one partner at once; a
step takes as long as its slowest flow, and a node's port carries the sum of the node's flows
across it:

  ring (p = N*G ranks)     2(p-1) steps of n/p bytes; one ring edge leaves each node, so a step
                           costs max(intra(n/p), inter(n/p)):  T = 2(p-1) * max(...)
  recursive doubling       log2 p steps of the whole n; step k pairs ranks 2^k apart: intra while
                           2^k < G, else inter with all G ranks of a node crossing its port at
                           once:  T = sum_k (alpha + G*n*beta_inter) or (alpha + n*beta_intra)
  rabenseifner             recursive halving then doubling: step k moves n/2^(k+1), intra steps
                           first; inter steps carry G flows:  T = 2 * sum_k (...)
  han                      in 64 KiB segments, pipelined: reduce within each node, allreduce
                           among the N leaders (recursive doubling per segment), broadcast
                           within each node: T = segments * rd(leaders, 64K) + the fill
  tree (NCCL)              chain within nodes, double binary trees across: latency
                           2(G-1) alpha_intra + 2 ceil(log2 N) alpha_inter; a node's port carries
                           ~n bytes per direction at N = 2, ~2n from N = 3 on
  nccl                     min(ring, tree), as NCCL's tuner picks per size

The reduction's own cost (reading and adding n bytes) is folded into beta: beta is fitted on
allreduce times, not on bare transfers. The emulated cluster adds one term a real cluster lacks:
all of its "nodes" share one machine's cores, so with R ranks on C cores the intra class (copies
and sums in shared memory: CPU work) runs max(1, R/C) times slower (`host_cores`; None for a
real cluster).

A DDP step (as tutti's Reducer does it): gradients are laid out in reverse order and cut into
buckets at parameter boundaries (first bucket <= 1 MiB, the others <= 25 MiB); backward writes
them in reverse order, at a rate proportional to their size; bucket b's allreduce starts when it
is ready and the previous one has finished (one communication thread / stream, in order):
  start_b = max(ready_b, end_(b-1)),  end_b = start_b + T_allreduce(size_b)
  exposed = max(0, end_last - end of backward);  step = forward + backward + exposed + optimizer
Scaling efficiency at a fixed per-rank batch = step(1 rank) / step(p ranks).
"""
import math
from dataclasses import dataclass, field, asdict
from typing import List, Optional


@dataclass
class Link:
    alpha: float      # s per message
    beta: float       # s per byte (1 / bandwidth in bytes/s), one direction, in an exchange: each
                      # rank sends to and receives from the same partner at once
    beta_stream: Optional[float] = None  # the same where a rank sends to one partner and receives
                      # from another (a ring of more than 2): None = beta. They differ over Open
                      # MPI's TCP transport, where an exchange shares one connection both ways.

    def stream(self):
        return self.beta if self.beta_stream is None else self.beta_stream


@dataclass
class Cluster:
    name: str
    nodes: int
    per_node: int                    # ranks (GPUs) per node
    intra: Link
    inter: Link                      # a node's port: inter.beta = 1 / (node's injection bandwidth)
    host_cores: Optional[int] = None  # the emulated cluster: every node shares these cores
    note: str = ""

    @property
    def ranks(self):
        return self.nodes * self.per_node

    def slowdown(self):
        if not self.host_cores:
            return 1.0
        return max(1.0, self.ranks / self.host_cores)


def _intra(c, nbytes):
    """A step between ranks of one node (all CPU work on the emulated cluster: it slows down when
    the machine's cores are shared)."""
    return (c.intra.alpha + nbytes * c.intra.beta) * c.slowdown()


def _inter(c, nbytes, flows=1, stream=False):
    """A step in which `flows` flows of nbytes each leave (and enter) every node through its port,
    which serializes them."""
    return c.inter.alpha + flows * nbytes * (c.inter.stream() if stream else c.inter.beta)


def ring(c: Cluster, n: float) -> float:
    p = c.ranks
    if p == 1:
        return 0.0
    chunk = n / p
    step = 0.0
    if c.per_node > 1 or c.nodes == 1:
        step = _intra(c, chunk)
    if c.nodes > 1:
        step = max(step, _inter(c, chunk, stream=p > 2))
    return 2 * (p - 1) * step


def recursive_doubling(c: Cluster, n: float) -> float:
    p = c.ranks
    t, d = 0.0, 1
    while d < p:
        t += _intra(c, n) if d < c.per_node else _inter(c, n, flows=c.per_node)
        d *= 2
    return t


def rabenseifner(c: Cluster, n: float) -> float:
    p = c.ranks
    t, d, part = 0.0, 1, n / 2
    while d < p:
        t += _intra(c, part) if d < c.per_node else _inter(c, part, flows=c.per_node)
        d *= 2
        part /= 2
    return 2 * t


HAN_SEGMENT = 64 * 1024  # Open MPI 4.1's coll_han_allreduce_segsize


def han(c: Cluster, n: float) -> float:
    """Open MPI's han (4.1): the buffer in 64 KiB segments, pipelined through reduce within the
    node, allreduce among the node leaders (libnbc: recursive doubling at this size), and
    broadcast within the node; the inter-node phase is the long pole, the others add one
    segment's worth (the pipeline's fill)."""
    segments = max(1, math.ceil(n / HAN_SEGMENT))
    seg = min(n, HAN_SEGMENT)
    leaders = Cluster(c.name, c.nodes, 1, c.intra, c.inter, c.host_cores)
    if c.host_cores:  # every rank is still a process on the shared machine
        leaders.host_cores = c.host_cores * leaders.ranks / c.ranks
    local = math.ceil(math.log2(c.per_node)) * _intra(c, seg) if c.per_node > 1 else 0.0
    inter = segments * recursive_doubling(leaders, seg) if c.nodes > 1 else 0.0
    if c.nodes == 1:
        return 2 * segments * local
    return inter + 2 * local


def tree(c: Cluster, n: float) -> float:
    """NCCL's tree (a chain within each node, double binary trees between the nodes, pipelined):
    log-depth latency; per direction a node's port carries about n bytes at 2 nodes (each node
    is the root of one tree and a leaf of the other) and about 2n from 3 nodes on."""
    if c.ranks == 1:
        return 0.0
    if c.nodes == 1:
        return ring(c, n)
    latency = 2 * (c.per_node - 1) * c.intra.alpha * c.slowdown() + 2 * math.ceil(math.log2(c.nodes)) * c.inter.alpha
    port = (1.0 if c.nodes == 2 else 2.0) * n * c.inter.stream()
    chain = 2.0 * n * c.intra.beta * c.slowdown() if c.per_node > 1 else 0.0
    return latency + max(port, chain)


def nccl(c: Cluster, n: float) -> float:
    """NCCL's tuner picks the faster of ring and tree for each size (NCCL_ALGO forces one)."""
    return min(ring(c, n), tree(c, n))


ALGORITHMS = {"ring": ring, "recursive_doubling": recursive_doubling, "rabenseifner": rabenseifner, "han": han}
GPU_ALGORITHMS = {"ring": ring, "tree": tree, "nccl": nccl}


def best(c: Cluster, n: float):
    """The fastest algorithm for this size and its time (what a tuned choice would pick)."""
    return min(((name, f(c, n)) for name, f in ALGORITHMS.items()), key=lambda x: x[1])


def busbw(c: Cluster, n: float, t: float) -> float:
    """nccl-tests' bus bandwidth, bytes/s: algbw * 2(p-1)/p."""
    p = c.ranks
    return n / t * 2 * (p - 1) / p if t > 0 and p > 1 else 0.0


# ---- DDP ---------------------------------------------------------------------------------------

@dataclass
class Model:
    name: str
    params_per_layer: List[int]      # in forward (registration) order
    grad_bytes: int = 4              # bytes per gradient element on the wire (4 f32, 2 bf16)
    forward_s: float = 0.0           # one rank's forward time per step
    backward_s: float = 0.0          # ... and backward time
    optimizer_s: float = 0.0
    note: str = ""

    @property
    def params(self):
        return sum(self.params_per_layer)


def buckets(model: Model, cap_mb=25.0, first_cap_mb=1.0):
    """Bucket sizes in bytes, in the order they are reduced (the Reducer's rule)."""
    out, current, cap = [], 0, first_cap_mb * 1024 * 1024
    for n in reversed(model.params_per_layer):
        b = n * model.grad_bytes
        if current > 0 and current + b > cap:
            out.append(current)
            current, cap = 0, cap_mb * 1024 * 1024
        current += b
    if current:
        out.append(current)
    return out


def ddp_step(c: Cluster, model: Model, algorithm="ring", cap_mb=25.0, first_cap_mb=1.0, overlap=True):
    """(step_s, exposed_s, comm_s): one step of DDP on cluster c, per-rank batch fixed. algorithm: a
    name of ALGORITHMS or GPU_ALGORITHMS, "best", or a function (cluster, bytes) -> seconds."""
    if callable(algorithm):
        allreduce = algorithm
    else:
        allreduce = {**ALGORITHMS, **GPU_ALGORITHMS}.get(algorithm) or (lambda cl, n: best(cl, n)[1])
    compute = model.forward_s + model.backward_s
    if c.ranks == 1:
        return compute + model.optimizer_s, 0.0, 0.0
    sizes = buckets(model, cap_mb, first_cap_mb)
    total = float(sum(sizes))
    end, done = model.forward_s, 0.0
    comm = 0.0
    for b in sizes:
        done += b
        ready = model.forward_s + model.backward_s * (done / total) if overlap else compute
        t = allreduce(c, b)
        comm += t
        end = max(ready, end) + t
    exposed = max(0.0, end - compute)
    return compute + exposed + model.optimizer_s, exposed, comm


BUCKET_CAPS_MB = (0.25, 0.5, 1, 2, 4, 8, 16, 25, 50, 100)


def plan_bucket_cap(c: Cluster, model: Model, algorithm="ring", caps=BUCKET_CAPS_MB, first_cap_mb=1.0):
    """The bucket cap (MiB) with the shortest predicted step (issue 15's item 6, offline): small
    buckets start communication early but pay alpha per bucket; large ones run nearer full
    bandwidth but wait for more of backward. Returns (best_cap, [(cap, step_s, exposed_s), ...])."""
    rows = []
    for cap in caps:
        step, exposed, _ = ddp_step(c, model, algorithm, cap, min(first_cap_mb, cap))
        rows.append((cap, step, exposed))
    return min(rows, key=lambda r: (round(r[1], 6), -r[0]))[0], rows


def efficiency(c: Cluster, model: Model, **kw):
    one = Cluster(c.name, 1, 1, c.intra, c.inter, c.host_cores)
    return ddp_step(one, model, **kw)[0] / ddp_step(c, model, **kw)[0]


# ---- calibration -------------------------------------------------------------------------------

def fit_alpha_beta(points, small=4 * 1024, large=1 << 20):
    """(alpha, beta) for T = steps*alpha + bytes*beta over (steps, bytes, T) points: beta from the
    messages >= `large` (the regime the targets are about), alpha from those <= `small` after
    their bytes' share. One straight line does not fit both ends on the emulated links: TCP's
    window and the shaper's burst let a message of ~100 KiB through faster than the rate."""
    big = [(s, b, t) for s, b, t in points if b >= large]
    little = [(s, b, t) for s, b, t in points if b <= small]
    # beta: least squares of relative error through the big points' slope, alpha fixed to 0 first.
    beta = sum(b / t for s, b, t in big) / sum((b / t) ** 2 for s, b, t in big) if big else 0.0
    alpha = sorted((t - b * beta) / s for s, b, t in little)[len(little) // 2] if little else 0.0
    alpha = max(alpha, 0.0)
    # Refit beta with alpha known.
    if big:
        beta = sum(b * (t - s * alpha) / t ** 2 for s, b, t in big) / sum((b / t) ** 2 for s, b, t in big)
    return alpha, beta


def fit_link(points):
    """Least squares of relative error for T = steps*alpha + bytes*beta over (steps, bytes, T)
    points: returns (alpha, beta). Relative error so that 8-byte and 8-MiB points weigh alike."""
    # Minimize sum ((s*a + b*B - T) / T)^2: normal equations of the scaled system.
    saa = sab = sbb = sat = sbt = 0.0
    for s, b, t in points:
        x, y = s / t, b / t
        saa += x * x
        sab += x * y
        sbb += y * y
        sat += x
        sbt += y
    det = saa * sbb - sab * sab
    alpha = (sat * sbb - sbt * sab) / det
    beta = (saa * sbt - sab * sat) / det
    return max(alpha, 0.0), max(beta, 0.0)


def as_dict(obj):
    return asdict(obj)
