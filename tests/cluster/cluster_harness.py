#!/usr/bin/env python3
"""What the emulated cluster's scenarios share (multinode_test.py runs them, one a process, for
ctest; relaunch_scenarios.py holds tutti-launch's): a cluster of its own per scenario (Cluster:
scripts/cluster.sh up, exec, down), a process's lines as they come (Lines), the checks, and
main(), which reads the command line into ARGS, skips where namespaces cannot be made (exit 77),
and runs one scenario."""
import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time

SKIP = 77
NODES, PER_NODE = 2, 2
ARGS = None  # the command line (main)


def carried():
    """What every node must see although each has a /tmp of its own: the build tree (--keep: the
    programs and the libraries they load), the programs' folders and the working folder.
    cluster.sh carries those that lie under /tmp into every node (a build anywhere works)."""
    paths = [os.environ.get("TUTTI_CLUSTER_KEEP", ""), *ARGS.keep, ARGS.workdir]
    paths += [os.path.dirname(os.path.abspath(p)) for p in (ARGS.gtest, ARGS.fault, ARGS.trainer) if p]
    return ":".join(p for p in paths if p)


class Cluster:
    """`with Cluster() as c:` a cluster of its own, removed at the end whatever happens."""

    def __init__(self, nodes=NODES, slots=PER_NODE, **up_args):
        self.name = "mt%d" % os.getpid()
        self.nodes, self.slots = nodes, slots
        self.up_args = up_args
        remove_orphans()

    def sh(self, *args, check=True, **kw):
        return subprocess.run(["bash", ARGS.cluster, *args], check=check, text=True, capture_output=True, **kw)

    def __enter__(self):
        extra = []
        for k, v in self.up_args.items():
            extra += ["--" + k.replace("_", "-"), str(v)]
        p = self.sh("up", "--name", self.name, "--nodes", str(self.nodes), "--slots", str(self.slots), *extra, check=False,
                    env={**os.environ, "TUTTI_CLUSTER_KEEP": carried()})
        if p.returncode != 0:
            raise AssertionError("cluster.sh up failed (%d): %s%s" % (p.returncode, p.stdout, p.stderr))
        return self

    def __exit__(self, *exc):
        self.sh("down", "--name", self.name, check=False)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        if "tutti-%s-" % self.name in left:
            raise AssertionError("cluster.sh down left namespaces behind:\n" + left)

    def popen(self, cmd, env_extra=None, node="node0"):
        env = dict(os.environ)
        env.pop("TUTTI_FAULT", None)
        env.update(env_extra or {})
        return subprocess.Popen(["bash", ARGS.cluster, "exec", "--name", self.name, "--node", node, "--", *cmd],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)

    def run(self, cmd, env_extra=None, timeout=120):
        p = self.popen(cmd, env_extra)
        out, err, timed_out = communicate(p, timeout)
        if timed_out:
            raise AssertionError("still running after %d s:\n%s\n%s" % (timeout, out, err))
        print("$ %s\n(exit %d)\n--- stdout\n%s--- stderr\n%s" % (" ".join(cmd), p.returncode, out, err))
        return p.returncode, out, err

    def pids(self, node, holder_too=False):
        """Processes in a node other than its holder (with holder_too: every one, the node's own too)."""
        ns = "tutti-%s-%s" % (self.name, node)
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        holder = open("/run/tutti-cluster/%s/%s.pid" % (self.name, node)).read().strip()
        return [int(p) for p in out if holder_too or p != holder]

    def kill(self, node, holder_too=False):
        """SIGKILL to every process of the node (pids()); returns how many it reached. A process
        that ended between the listing and its kill (a probe's shell, under load) is skipped:
        that once failed launcher_node_killed with ProcessLookupError (2026-12-07)."""
        reached = 0
        for pid in self.pids(node, holder_too):
            try:
                os.kill(pid, signal.SIGKILL)
                reached += 1
            except ProcessLookupError:
                pass
        return reached

    def hostfile(self):
        return "/run/tutti-cluster/%s/hostfile" % self.name

    def ranks_left(self, program):
        left = []
        for node in ("node%d" % i for i in range(self.nodes)):
            for pid in self.pids(node):
                try:  # the ranks themselves, not mpirun (whose command line names the program too)
                    if open("/proc/%d/comm" % pid).read().strip() == program[:15]:
                        left.append((node, pid))
                except OSError:
                    pass
        return left


def communicate(p, timeout):
    """(stdout, stderr, timed out) of a process started in a session of its own (Cluster.popen),
    its whole session killed with SIGKILL when it is still running after `timeout` seconds."""
    try:
        out, err = p.communicate(timeout=timeout)
        return out, err, False
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return out, err, True


def remove_orphans():
    """Clusters of earlier runs that were killed before they could clean up (a ctest timeout)."""
    try:
        names = os.listdir("/run/tutti-cluster")
    except OSError:
        return
    for name in names:
        m = re.fullmatch(r"mt(\d+)", name)
        if not m or int(m.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            subprocess.run(["bash", ARGS.cluster, "down", "--name", name], capture_output=True)
        except PermissionError:
            pass


def mpirun(np, *args):
    return [ARGS.mpiexec, "-n", str(np), "--oversubscribe", *args]


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def expect_in(pattern, text, what=""):
    if re.search(pattern, text) is None:
        raise AssertionError("expected /%s/ %s" % (pattern, what))


class Lines:
    """A process's stdout and stderr as (time, stream, line), read as they come."""

    def __init__(self, p):
        self.p, self.lines, self.lock = p, [], threading.Lock()
        self.threads = [threading.Thread(target=self.read, args=(p.stdout, "out"), daemon=True),
                        threading.Thread(target=self.read, args=(p.stderr, "err"), daemon=True)]
        for t in self.threads:
            t.start()

    def read(self, f, stream):
        for line in f:
            with self.lock:
                self.lines.append((time.time(), stream, line.rstrip("\n")))

    def first(self, pattern, after=0.0):
        """(time, match) of the first line matching pattern at or after `after`, or None."""
        with self.lock:
            for t, _, line in self.lines:
                m = re.search(pattern, line)
                if m and t >= after:
                    return t, m
        return None

    def wait(self, pattern, timeout, at_least=None):
        """The first line matching pattern (whose group 1 is at least at_least), waiting for it."""
        end = time.time() + timeout
        while time.time() < end:
            with self.lock:
                hits = [m for m in (re.search(pattern, line) for _, _, line in self.lines) if m]
            hits = [m for m in hits if at_least is None or int(m.group(1)) >= at_least]
            if hits:
                return hits[0]
            expect(self.p.poll() is None, "the launcher ended (exit %s) before /%s/" % (self.p.poll(), pattern))
            time.sleep(0.02)
        raise AssertionError("no /%s/ within %d s" % (pattern, timeout))

    def text(self, stream):
        for t in self.threads:
            t.join(timeout=5)
        return "\n".join(line for _, s, line in self.lines if s == stream)


def main(scenarios):
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(scenarios))
    parser.add_argument("--cluster", required=True, help="scripts/cluster.sh")
    parser.add_argument("--gtest", help="cluster_test")
    parser.add_argument("--fault", help="comm_fault_test")
    parser.add_argument("--trainer", help="train_fashion_mnist")
    parser.add_argument("--launcher", help="scripts/tutti-launch")
    parser.add_argument("--mpiexec", default="mpiexec")
    parser.add_argument("--workdir", default=os.getcwd(), help="for temporary files (seen by every node)")
    parser.add_argument("--keep", action="append", default=[],
                        help="a folder every node must see, such as the build tree (repeatable)")
    global ARGS
    ARGS = parser.parse_args()
    # ctest ends a test that runs too long with SIGTERM: unwind, so that the cluster is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("FAILED: terminated (SIGTERM)"))
    check = subprocess.run(["bash", ARGS.cluster, "check"], capture_output=True, text=True)
    if check.returncode == SKIP:
        print("SKIPPED: %s" % check.stderr.strip())
        sys.exit(SKIP)
    if check.returncode != 0:
        print("FAILED: cluster.sh check: %s%s" % (check.stdout, check.stderr))
        sys.exit(1)
    # The trainer takes the peak for MFU as given (no scenario looks at it): it would otherwise
    # measure the CPU's GEMM ceiling at its start and end, ~0.5 s of CPU a rank and a run.
    os.environ["TUTTI_PEAK_TFLOPS"] = "1"
    try:
        scenarios[ARGS.scenario]()
    except AssertionError as e:
        print("FAILED: %s" % e)
        sys.exit(1)
    print("PASSED")

