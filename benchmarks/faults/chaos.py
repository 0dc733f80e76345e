#!/usr/bin/env python3
"""Chaos on the emulated cluster: a training job under scripts/tutti-launch on 4 nodes x 1 rank,
whose nodes are killed without warning at seeded times and come back later; measured side by
side with the same job run without failures, in the same invocation.

    flock /tmp/tutti-cpu.lock python3 benchmarks/faults/chaos.py --out build/bench/chaos
    # one failure per minute, recovery from the checkpoint file against memory snapshots:
    flock /tmp/tutti-cpu.lock python3 benchmarks/faults/chaos.py --every 60 --failures 2 --epochs 20 \
        --variant disk --variant "memory:--zero 1 --snapshot-every auto --checkpoint-every 500"

What a failure is here: every process of a random node (the rank, Open MPI's daemon) gets
SIGKILL, then the node's link is taken down (the machine is away: the launcher's probe gets no
answer) for --down-s seconds, then up again (the machine is back: the launcher, run with
--grow-every, stops the job cleanly at a checkpoint and relaunches it on every node). The
namespaces' holder process survives, which is what lets the node come back; node0 is never
killed, because the launcher and mpirun run there (a real setup would run them on a head node).
When: after a seeded random --gap-min..--gap-max seconds of running job, or with --every S at
fixed times, the k-th kill (k = 1, 2, ...) (k - 1/2) * S seconds after the launcher started, so
that a run of n * S seconds holds n failures: one every S seconds.

Each --variant LABEL[:FLAGS[|ARGS]] is one run with failures, the trainer's flags FLAGS added to
(or replacing) the baseline's (e.g. "memory:--zero 1 --snapshot-every auto"), and ARGS added to
tutti-launch's (e.g. "fast:|--probe-timeout 1"); without --variant, one run "chaos" with the
baseline's flags. The run without failures always has the baseline's
flags (recovery from the checkpoint file every --checkpoint-every steps), so a variant's goodput
counts what its own flags cost too (ZeRO, the snapshots).

Figures, all from lines stamped by this script as the launcher prints them:
  recovery   the kill -> mpirun returned ("job ended"), -> the next attempt started (the probe of
             the hosts in between: "relaunch"), -> the first step printed by the relaunched job
             ("first step"), -> the first step printed at or past the step reached before the
             kill ("caught up": the lost steps redone);
  resumed    the launcher's "the job resumed at step N from memory|the checkpoint file ...:
             K step(s) lost" line: where from, the step, K;
  grow       a node back -> the launcher notices -> the job stopped (exit 75) -> the relaunch ->
             its first step;
  goodput    the steps of the run / its wall time, against the same for the run without
             failures (launcher start -> exit, both); and the wall time a failure cost,
             (wall - steps / the run without failures' steps per second) / failures, with the
             goodput that cost gives at one failure every --every seconds (1 - cost / S); and
             "stalled", the seconds without progress (the failures' kill -> caught up, the
             grows' stop -> first step): what the rest of the cost is not (the steps' speed);
  loss       the final training loss (and accuracy, the parameters' crc) of every run, at the
             same global batch (the trainer splits --batch-size over the ranks it gets).
Writes OUT/<label>.log (every line, stamped), OUT/chaos.json, OUT/chaos.txt (the tables) and
OUT/chaos.svg (steps against time, the kills and returns marked). Needs root (namespaces,
scripts/cluster.sh check) and a build (build/examples/train_fashion_mnist).
"""
import argparse
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SKIP = 77
STEP = re.compile(r"\bstep (\d+)/(\d+)\b")
ATTEMPT = re.compile(r"attempt (\d+): (\d+) rank\(s\) on (\d+) of (\d+) host\(s\) \(([^)]*)\)")
FAILED = re.compile(r"attempt (\d+) failed \((.*?)\) after [\d.]+ s; (?:(\d+) step\(s\) lost)?")
GROW = re.compile(r"attempt (\d+) stopped to grow")
# A grow without a restart (tutti-launch's default): the attempt started ahead takes over.
TAKEOVER = re.compile(r"attempt (\d+), started ahead with (\d+) rank\(s\) on (\d+) host\(s\) \(([^)]*)\), goes on")
# The launcher stops the job to grow: plainly, or once the attempt started ahead is at its gate.
GROW_STOP = re.compile(r"answer again: stopping the job|at its start gate after [\d.]+ s: stopping attempt")
ENDING = re.compile(r"\]: attempt \d+ (failed|stopped)|answer again: stopping the job")
GROWN = re.compile(r"attempt \d+ stopped to grow")
# The launcher's line when the relaunched job starts (scripts/tutti-launch, run_job).
RESUMED = re.compile(r"the job resumed at step (\d+) from (memory|the checkpoint file)[^:]*(?:: (\d+) step\(s\) lost)?")


class Lines:
    """A process's stdout and stderr as (seconds since t0, stream, line), read as they come."""

    def __init__(self, p, t0):
        self.p, self.t0, self.lines, self.lock = p, t0, [], threading.Lock()
        self.threads = [threading.Thread(target=self.read, args=(f, s), daemon=True)
                        for f, s in ((p.stdout, "out"), (p.stderr, "err"))]
        for t in self.threads:
            t.start()

    def read(self, f, stream):
        for line in f:
            with self.lock:
                self.lines.append((time.monotonic() - self.t0, stream, line.rstrip("\n")))

    def snapshot(self):
        with self.lock:
            return list(self.lines)

    def join(self):
        for t in self.threads:
            t.join(timeout=10)


class Cluster:
    def __init__(self, args):
        self.args, self.name = args, "ch%d" % os.getpid()
        self.state = os.path.join(os.environ.get("TUTTI_CLUSTER_STATE", "/run/tutti-cluster"), self.name)

    def sh(self, *a, check=True):
        p = subprocess.run(["bash", self.args.cluster, *a], text=True, capture_output=True)
        if check and p.returncode != 0:
            raise RuntimeError("cluster.sh %s: exit %d: %s%s" % (" ".join(a), p.returncode, p.stdout, p.stderr))
        return p

    def __enter__(self):
        self.sh("up", "--name", self.name, "--nodes", str(self.args.nodes), "--slots", "1")
        return self

    def __exit__(self, *exc):
        self.sh("down", "--name", self.name, check=False)

    def popen(self, cmd, env):
        return subprocess.Popen(["bash", self.args.cluster, "exec", "--name", self.name, "--node", "node0", "--", *cmd],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True, cwd=ROOT)

    def kill_node(self, node):
        """SIGKILL to every process of the node but its namespaces' holder; how many."""
        holder = open(os.path.join(self.state, node + ".pid")).read().strip()
        out = subprocess.run(["ip", "netns", "pids", "tutti-%s-%s" % (self.name, node)],
                             capture_output=True, text=True).stdout.split()
        victims = [int(p) for p in out if p != holder]
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(victims)

    def link(self, node, state):
        self.sh("link", "--name", self.name, "--node", node, state)


def with_flags(base, extra):
    """`base` (the trainer's options, "--name value" or "--name") with those of `extra` replacing
    the same options, then the others of `extra` added (the trainers refuse an option twice)."""
    def options(flags):
        out, i = [], 0
        while i < len(flags):
            value = flags[i + 1:i + 2] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else []
            out.append((flags[i], value))
            i += 1 + len(value)
        return out

    extra_opts = options(extra)
    names = {n for n, _ in extra_opts}
    return [w for n, v in options(base) if n not in names for w in [n, *v]] + [w for n, v in extra_opts for w in [n, *v]]


def trainer_flags(args, ckpt, summary, extra=()):
    return with_flags(["--model", "mlp", "--train-subset", str(args.train_subset), "--test-subset", "1000",
                       "--batch-size", str(args.batch_size), "--epochs", str(args.epochs), "--seed", str(args.seed),
                       "--checkpoint-dir", ckpt, "--checkpoint-every", str(args.checkpoint_every),
                       "--progress", "lines", "--progress-interval", "0.1", "--json", summary], list(extra))


def launcher_cmd(args, ckpt, summary, hostfile, extra=(), launcher_extra=()):
    return [sys.executable, args.launcher, "--hostfile", hostfile, "--probe-timeout", str(args.probe_timeout),
            "--relaunch-probe-timeout", str(args.relaunch_probe_timeout), "--retry-delay", "0", "--max-failures", "100",
            "--grow-every", str(args.grow_every),
            "--divides", str(args.batch_size), *args.launcher_arg, *launcher_extra, "--",
            args.trainer, *trainer_flags(args, ckpt, summary, extra)]


def run(c, args, label, chaos, extra=(), launcher_extra=()):
    """One job under the launcher, the trainer's flags `extra` and the launcher's `launcher_extra`
    added; with chaos, kills as described above. Returns its record."""
    ckpt, summary = os.path.join(args.out, label + "_ckpt"), os.path.join(args.out, label + ".summary.json")
    subprocess.run(["rm", "-rf", ckpt, summary])
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OPENBLAS_NUM_THREADS="1")
    cmd = launcher_cmd(args, ckpt, summary, os.path.join(c.state, "hostfile"), extra, launcher_extra)
    t0 = time.monotonic()
    p = c.popen(cmd, env)
    out = Lines(p, t0)
    events, returns = [], []
    rng = random.Random(args.seed)

    def running(after):
        """(hosts of the current attempt, last step printed) once it printed a step after `after`
        (seconds since t0) and is not ending, else None."""
        hosts, step = None, None
        for t, _, line in out.snapshot():
            m = ATTEMPT.search(line)
            taken = TAKEOVER.search(line)
            if m:
                hosts, step = m.group(5).split(", "), None
            elif taken:
                hosts, step = taken.group(4).split(", "), None
            elif ENDING.search(line):
                hosts, step = None, None
            m = STEP.search(line)
            if m and hosts is not None and t > after:
                step = int(m.group(1))
        return (hosts, step) if step is not None else None

    def wait_running(after=0.0):
        while p.poll() is None:
            r = running(after)
            if r:
                return r
            time.sleep(0.05)
        return None

    def come_back(node, at):
        time.sleep(max(0.0, at - (time.monotonic() - t0)))
        c.link(node, "up")
        returns.append({"node": node, "t": time.monotonic() - t0})

    down = set()
    comebacks = []
    try:
        for k in range(args.failures if chaos else 0):
            last = events[-1]["t_kill"] if events else 0.0
            if args.every:  # the k-th kill at (k + 1/2) * S, once the job runs
                gap = (k + 0.5) * args.every
                end = t0 + gap
            else:  # a seeded random gap of running job
                gap = rng.uniform(args.gap_min, args.gap_max)
                if wait_running(last) is None:
                    break
                end = time.monotonic() + gap
            while p.poll() is None and time.monotonic() < end:
                time.sleep(0.05)
            r = wait_running(last)
            if r is None:
                break
            hosts, step = r
            if step >= args.last_kill_fraction * steps_total(args):
                break  # too near the end for a relaunch to matter
            candidates = sorted(h for h in hosts if h != "node0" and h not in down)
            if not candidates:
                break
            node = rng.choice(candidates)
            tk = time.monotonic() - t0
            n = c.kill_node(node)
            c.link(node, "down")
            down.add(node)
            back_at = tk + args.down_s
            events.append({"node": node, "t_kill": tk, "processes": n, "step_at_kill": step, "gap_s": gap,
                           "back_at": back_at})
            th = threading.Thread(target=come_back, args=(node, back_at), daemon=True)
            th.start()
            comebacks.append((node, th))
        try:
            p.wait(timeout=max(1.0, args.timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            print("chaos.py: %s: still running after %.0f s (--timeout): ended" % (label, args.timeout), file=sys.stderr)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for node, th in comebacks:
            th.join()
        out.join()
    t_end = time.monotonic() - t0
    lines = out.snapshot()
    with open(os.path.join(args.out, label + ".log"), "w") as f:
        f.write("$ %s\n" % " ".join(shlex.quote(a) for a in cmd))
        for t, s, line in lines:
            f.write("%8.3f %s %s\n" % (t, s, line))
    try:
        result = json.load(open(summary))
    except (OSError, ValueError):
        result = None
    steps = [(t, int(m.group(1))) for t, _, line in lines for m in [STEP.search(line)] if m]
    attempts = [(t, line) for t, _, line in lines if ATTEMPT.search(line)]
    takeovers = [t for t, _, line in lines if TAKEOVER.search(line)]
    for e in events:
        after = [(t, line) for t, line in attempts if t > e["t_kill"]]
        e["t_relaunch"] = after[0][0] - e["t_kill"] if after else None
        e["relaunch"] = ATTEMPT.search(after[0][1]).group(0) if after else None
        first = [(t, s) for t, s in steps if after and t > after[0][0]]
        e["recovery_first_step_s"] = first[0][0] - e["t_kill"] if first else None
        m = re.search(r"from the checkpoint at step (\d+)", after[0][1]) if after else None
        e["checkpoint_file_step"] = int(m.group(1)) if m else None
        r = next((RESUMED.search(line) for t, _, line in lines if after and t > after[0][0] and RESUMED.search(line)),
                 None)  # what the relaunched job says it resumed from
        e["resumed_step"] = int(r.group(1)) if r else e["checkpoint_file_step"]
        e["resumed_from"] = ("memory" if r.group(2) == "memory" else "file") if r else None
        e["steps_lost"] = int(r.group(3)) if r and r.group(3) else None
        caught = [t for t, s in first if s >= e["step_at_kill"]]
        e["recovery_caught_up_s"] = caught[0] - e["t_kill"] if caught else None
        fails = [FAILED.search(line) for t, _, line in lines if t > e["t_kill"] and FAILED.search(line)]
        e["launcher_steps_lost"] = int(fails[0].group(3)) if fails and fails[0].group(3) else None
        ended = next(((t, line) for t, _, line in lines if t > e["t_kill"] and FAILED.search(line)), None)
        e["launcher_says"] = ended[1] if ended else None
        e["t_ended"] = ended[0] - e["t_kill"] if ended else None  # mpirun returned
    grows = []
    for r in returns:  # the node back -> the launcher stops the job -> the grown job's first step
        stop = next((t for t, _, line in lines if t > r["t"] and GROW_STOP.search(line)), None)
        relaunch = min((t for t in [*(t for t, _ in attempts), *takeovers] if stop is not None and t > stop),
                       default=None)
        first = next((t for t, _ in steps if relaunch is not None and t > relaunch), None)
        # A kill while the job stops to grow: that attempt fails, and the grow is part of the relaunch.
        end = next(((t, line) for t, _, line in lines if stop is not None and t > stop and ENDING.search(line)),
                   (None, ""))
        merged = FAILED.search(end[1]) is not None
        ended = end[0] if GROWN.search(end[1]) else None

        def since_stop(t):
            return None if stop is None or t is None or merged else t - stop

        grows.append({"node": r["node"], "t_back": r["t"], "noticed_s": None if stop is None else stop - r["t"],
                      "ended_s": since_stop(ended), "relaunch_s": since_stop(relaunch),
                      "paused_s": since_stop(first), "merged_with_failure": merged})
    return {"label": label, "exit": p.returncode, "wall_s": t_end, "steps": steps[-1][1] if steps else 0,
            "summary": result, "failures": events, "returns": returns, "grow_restarts": grows,
            "attempts": len(attempts) + len(takeovers), "progress": steps, "command": " ".join(shlex.quote(a) for a in cmd)}


def steps_total(args):
    return args.train_subset // args.batch_size * args.epochs


COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"]


def svg_plot(base, variants, path):
    """Steps against time, every run; the kills (red, dashed) and returns (green, dotted) of each
    run with failures marked along its own line's colour band. Plain SVG."""
    W, H, L, B, R, T = 760, 380, 60, 40, 20, 30
    runs = [base, *variants]
    tmax = max(r["wall_s"] for r in runs) or 1
    smax = max([s for r in runs for _, s in r["progress"]] + [1])

    def x(t):
        return L + (W - L - R) * t / tmax

    def y(s):
        return H - B - (H - B - T) * s / smax

    o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">'
         % (W, H), '<rect width="100%" height="100%" fill="white"/>',
         '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (L, H - B, W - R, H - B),
         '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (L, T, L, H - B)]
    for i in range(6):
        t, s = tmax * i / 5, smax * i / 5
        o.append('<text x="%.1f" y="%d" text-anchor="middle">%.0f</text>' % (x(t), H - B + 14, t))
        o.append('<text x="%d" y="%.1f" text-anchor="end">%.0f</text>' % (L - 4, y(s) + 4, s))
    o.append('<text x="%d" y="%d" text-anchor="middle">seconds since the launcher started</text>' % ((W + L) // 2, H - 6))
    o.append('<text x="14" y="%d" transform="rotate(-90 14 %d)" text-anchor="middle">step</text>' % (H // 2, H // 2))
    for v, colour in zip(variants, COLOURS):
        for e in v["failures"]:
            o.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="red" stroke-dasharray="4,2"/>'
                     % (x(e["t_kill"]), T, x(e["t_kill"]), H - B))
            o.append('<circle cx="%.1f" cy="%.1f" r="3" fill="red" stroke="%s"/>'
                     % (x(e["t_kill"]), y(e["step_at_kill"]), colour))
        for r in v["returns"]:
            o.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="green" stroke-dasharray="2,3"/>'
                     % (x(r["t"]), T + 12, x(r["t"]), H - B))
    for run, colour in ((base, "#888888"), *zip(variants, COLOURS)):
        pts = " ".join("%.1f,%.1f" % (x(t), y(s)) for t, s in run["progress"])
        o.append('<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>' % (colour, pts))
    o.append('<text x="%d" y="%d" fill="#888888">no failures</text>' % (L + 10, T + 16))
    for i, (v, colour) in enumerate(zip(variants, COLOURS)):
        o.append('<text x="%d" y="%d" fill="%s">with failures: %s (%s)</text>' % (
            L + 10, T + 30 + 14 * i, colour, v["label"], " ".join(v["extra"]) or "the same flags"))
    o.append('<text x="%d" y="%d" fill="red">kills (dashed)</text>' % (W - R - 160, H - B - 20))
    o.append('<text x="%d" y="%d" fill="green">nodes back (dotted)</text>' % (W - R - 160, H - B - 6))
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")


def fmt(v, spec="%.1f"):
    return "-" if v is None else spec % v


def stalled(r):
    """Seconds without new progress: each failure's kill -> caught up, each grow's stop -> its
    first step (None when one is unknown)."""
    parts = [e["recovery_caught_up_s"] for e in r["failures"]]
    parts += [g["paused_s"] for g in r["grow_restarts"] if g["noticed_s"] is not None and not g["merged_with_failure"]]
    return None if any(p is None for p in parts) else sum(parts)


def goodput(base, r, every):
    """(steps/s, against the run without failures, wall s a failure cost, the goodput at one
    failure every `every` s from that cost)."""
    rate = r["steps"] / r["wall_s"] if r["wall_s"] else None
    rate_b = base["steps"] / base["wall_s"] if base["wall_s"] else None
    ratio = rate / rate_b if rate and rate_b else None
    n = len(r["failures"])
    cost = (r["wall_s"] - r["steps"] / rate_b) / n if n and rate_b else None
    at_every = 1 - cost / every if cost is not None and every else None
    return rate, ratio, cost, at_every


def table(base, variants, args):
    rows = []
    for v in variants:
        rows += ["%s: `%s`" % (v["label"], " ".join(v["extra"]) or "(the baseline's flags)"), "",
                 "| failure | node | at (s) | step at kill | job ended (s) | relaunch (s) | first step (s) | "
                 "caught up (s) | resumed at | from | steps lost |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for i, e in enumerate(v["failures"], 1):
            lost = e["steps_lost"] if e["steps_lost"] is not None else e["launcher_steps_lost"]
            rows.append("| %d | %s | %.1f | %d | %s | %s | %s | %s | %s | %s | %s |" % (
                i, e["node"], e["t_kill"], e["step_at_kill"], fmt(e["t_ended"]), fmt(e["t_relaunch"]),
                fmt(e["recovery_first_step_s"]), fmt(e["recovery_caught_up_s"]), fmt(e["resumed_step"], "%d"),
                e["resumed_from"] or "-", fmt(lost, "%d")))
        rows += ["", "| node back | at (s) | noticed (s) | job ended (s) | relaunch (s) | "
                 "training paused to grow (s) |", "|---|---|---|---|---|---|"]
        for g in v["grow_restarts"]:
            paused = "(a node killed meanwhile: one relaunch)" if g["merged_with_failure"] else fmt(g["paused_s"])
            if g["noticed_s"] is None:
                paused = "(back before a relaunch, or after the end: no stop of its own)"
            rows.append("| %s | %.1f | %s | %s | %s | %s |" % (g["node"], g["t_back"], fmt(g["noticed_s"]),
                                                             fmt(g["ended_s"]), fmt(g["relaunch_s"]), paused))
        rows.append("")
    rows += ["| run | exit | steps | wall (s) | steps/s | goodput | s lost per failure | goodput at 1 failure / %s s "
             "| stalled (s) | attempts | final train loss | test accuracy | params crc32 |" % fmt(args.every, "%.0f"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios = {}
    for r in (base, *variants):
        s = r["summary"] or {}
        rate, ratio, cost, at_every = goodput(base, r, args.every)
        ratios[r["label"]] = ratio
        rows.append("| %s | %s | %d | %.1f | %s | %s | %s | %s | %s | %d | %s | %s | %s |" % (
            r["label"], r["exit"], r["steps"], r["wall_s"], fmt(rate, "%.2f"),
            fmt(ratio * 100 if ratio else None, "%.0f%%"), fmt(cost), fmt(at_every * 100 if at_every else None, "%.0f%%"),
            fmt(stalled(r)), r["attempts"], fmt(s.get("final_train_loss"), "%.6f"), fmt(s.get("test_accuracy"), "%.4f"),
            s.get("params_crc32", "-")))
    return "\n".join(rows), ratios


def parse_variant(text):
    """LABEL[:TRAINER FLAGS[|LAUNCHER ARGS]] -> (label, [trainer flags], [launcher args])."""
    label, _, flags = text.partition(":")
    if not re.fullmatch(r"[A-Za-z0-9_-]+", label) or label == "baseline":
        raise argparse.ArgumentTypeError("--variant LABEL[:FLAGS]: LABEL of letters, digits, _ and -, not 'baseline'")
    trainer, _, launcher = flags.partition("|")
    return label, shlex.split(trainer), shlex.split(launcher)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench", "chaos"),
                    help="a folder every node sees (in the checkout: the nodes have their own /tmp)")
    ap.add_argument("--trainer", default=os.path.join(ROOT, "build", "examples", "train_fashion_mnist"))
    ap.add_argument("--launcher", default=os.path.join(ROOT, "scripts", "tutti-launch"))
    ap.add_argument("--launcher-arg", action="append", default=[], metavar="ARG",
                    help="an argument for tutti-launch (repeatable), e.g. --launcher-arg=--retry-delay=0")
    ap.add_argument("--cluster", default=os.path.join(ROOT, "scripts", "cluster.sh"))
    ap.add_argument("--variant", action="append", type=parse_variant, default=[], metavar="LABEL[:FLAGS[|ARGS]]",
                    help="a run with failures, the trainer's FLAGS and tutti-launch's ARGS added (repeatable; "
                    "default: one, 'chaos')")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1, help="the kills' times and nodes, and the training's seed")
    ap.add_argument("--failures", type=int, default=3)
    ap.add_argument("--every", type=float, default=0, metavar="S",
                    help="a kill every S seconds: the k-th at (k - 1/2) * S (0: the random gaps below)")
    ap.add_argument("--gap-min", type=float, default=10, help="seconds of running job before a kill: at least ...")
    ap.add_argument("--gap-max", type=float, default=20, help="... at most (uniform, seeded)")
    ap.add_argument("--down-s", type=float, default=15, help="seconds a killed node stays away (link down)")
    ap.add_argument("--grow-every", type=float, default=5, help="tutti-launch --grow-every")
    ap.add_argument("--probe-timeout", type=float, default=3, help="tutti-launch --probe-timeout (the probes while "
                    "the job runs: it loads the 2 cores)")
    ap.add_argument("--relaunch-probe-timeout", type=float, default=1, help="tutti-launch --relaunch-probe-timeout "
                    "(a host answers within 0.3 s when no job runs)")
    ap.add_argument("--last-kill-fraction", type=float, default=0.9, help="no kill past this fraction of the steps")
    ap.add_argument("--train-subset", type=int, default=57600)
    ap.add_argument("--batch-size", type=int, default=96, help="the global batch (divides by 4, 3 and 2)")
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--timeout", type=float, default=0, help="seconds a run may take (0: 240, or 3 * --every * "
                    "--failures if more)")
    ap.add_argument("--json", help="the summary (default OUT/chaos.json)")
    args = ap.parse_args()
    args.out = os.path.abspath(args.out)
    args.timeout = args.timeout or max(240.0, 3 * args.every * args.failures)
    variants = args.variant or [("chaos", [], [])]
    if len({v[0] for v in variants}) != len(variants):
        ap.error("two --variant with the same label")
    os.makedirs(args.out, exist_ok=True)
    check = subprocess.run(["bash", args.cluster, "check"], capture_output=True, text=True)
    if check.returncode != 0:
        print("chaos.py: no emulated cluster here: %s" % check.stderr.strip(), file=sys.stderr)
        return SKIP if check.returncode == SKIP else 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("chaos.py: terminated"))
    machine = "%d cores, load average %s before the runs" % (os.cpu_count(), " ".join(
        open("/proc/loadavg").read().split()[:3]))
    with Cluster(args) as c:
        base = run(c, args, "baseline", chaos=False)
        runs = [run(c, args, label, chaos=True, extra=flags, launcher_extra=largs) for label, flags, largs in variants]
    base["extra"] = []
    for r, (_, flags, largs) in zip(runs, variants):
        r["extra"] = flags + (["| tutti-launch", *largs] if largs else [])
    text, ratios = table(base, runs, args)
    invocation = "python3 benchmarks/faults/chaos.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    when = ("a kill every %.0f s (the k-th at (k - 1/2) * %.0f s)" % (args.every, args.every) if args.every else
            "a kill after %.0f-%.0f s of running job" % (args.gap_min, args.gap_max))
    header = ("# %s\n# %s\n# %d nodes x 1 rank, MLP, global batch %d, %d steps, checkpoint every %d steps; "
              "%s, at most %d; a node away %.0f s after its kill\n" % (
                  invocation, machine, args.nodes, args.batch_size, steps_total(args), args.checkpoint_every, when,
                  args.failures, args.down_s))
    with open(os.path.join(args.out, "chaos.txt"), "w") as f:
        f.write(header + text + "\n")
    summary = {"invocation": invocation, "machine": machine, "options": vars(args), "goodput_ratio": ratios,
               "final_loss_relative_difference": {}}
    b = base["summary"] or {}
    for r in runs:
        cs = r["summary"] or {}
        if b.get("final_train_loss") and cs.get("final_train_loss") is not None:
            summary["final_loss_relative_difference"][r["label"]] = (
                (cs["final_train_loss"] - b["final_train_loss"]) / b["final_train_loss"])
        _, _, cost, at_every = goodput(base, r, args.every)
        r["seconds_lost_per_failure"], r["goodput_at_every"], r["stalled_s"] = cost, at_every, stalled(r)
    for r in (base, *runs):
        summary[r["label"]] = {k: v for k, v in r.items() if k != "progress"}
    with open(args.json or os.path.join(args.out, "chaos.json"), "w") as f:
        json.dump(summary, f, indent=1)
    svg_plot(base, runs, os.path.join(args.out, "chaos.svg"))
    print(header + text)
    for r in runs:
        print("%s: goodput ratio %s; final train loss relative difference %s" % (
            r["label"], fmt(ratios[r["label"]], "%.3f"),
            fmt(summary["final_loss_relative_difference"].get(r["label"]), "%+.2e")))
    ok = base["exit"] == 0 and all(r["exit"] == 0 for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
