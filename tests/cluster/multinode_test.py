#!/usr/bin/env python3
"""Multi-node tests on the emulated cluster (scripts/cluster.sh): one scenario per run, for ctest.

Each scenario brings up its own cluster of 2 nodes x 2 slots (network, UTS and mount namespaces;
TCP between the nodes, shared memory within), runs a job across it with mpirun, judges it, and
removes the cluster again, also when the scenario fails or is interrupted. Where namespaces
cannot be made, it says why and exits 77 (ctest: skipped).

    multinode_test.py job_and_ddp --cluster scripts/cluster.sh --gtest build/tests/cluster/cluster_test
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

SKIP = 77
NODES, PER_NODE = 2, 2
DEADLINE = 2.0   # TUTTI_TIMEOUT_S of the fault scenarios
BOUND = 5.0      # s after the deadline by which every rank must be gone (as tests/comm/fault_test.py)


def carried():
    """What every node must see although each has a /tmp of its own: the build tree (--keep: the
    programs and the libraries they load), the programs' folders and the working folder.
    cluster.sh carries those that lie under /tmp into every node (a build anywhere works)."""
    paths = [os.environ.get("TUTTI_CLUSTER_KEEP", ""), *ARGS.keep, ARGS.workdir]
    paths += [os.path.dirname(os.path.abspath(p)) for p in (ARGS.gtest, ARGS.fault, ARGS.trainer) if p]
    return ":".join(p for p in paths if p)


class Cluster:
    """`with Cluster() as c:` a cluster of its own, removed at the end whatever happens."""

    def __init__(self, **up_args):
        self.name = "mt%d" % os.getpid()
        self.up_args = up_args
        remove_orphans()

    def sh(self, *args, check=True, **kw):
        return subprocess.run(["bash", ARGS.cluster, *args], check=check, text=True, capture_output=True, **kw)

    def __enter__(self):
        extra = []
        for k, v in self.up_args.items():
            extra += ["--" + k.replace("_", "-"), str(v)]
        p = self.sh("up", "--name", self.name, "--nodes", str(NODES), "--slots", str(PER_NODE), *extra, check=False,
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
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            raise AssertionError("still running after %d s:\n%s\n%s" % (timeout, out, err))
        print("$ %s\n(exit %d)\n--- stdout\n%s--- stderr\n%s" % (" ".join(cmd), p.returncode, out, err))
        return p.returncode, out, err

    def pids(self, node):
        """Processes in a node other than its holder."""
        ns = "tutti-%s-%s" % (self.name, node)
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        holder = open("/run/tutti-cluster/%s/%s.pid" % (self.name, node)).read().strip()
        return [int(p) for p in out if p != holder]

    def ranks_left(self, program):
        left = []
        for node in ("node%d" % i for i in range(NODES)):
            for pid in self.pids(node):
                try:  # the ranks themselves, not mpirun (whose command line names the program too)
                    if open("/proc/%d/comm" % pid).read().strip() == program[:15]:
                        left.append((node, pid))
                except OSError:
                    pass
        return left


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


# ---- scenarios -----------------------------------------------------------------------------

def job_and_ddp():
    """Job's rank / local rank / local size / node count, exact collectives, DDP = one rank."""
    with Cluster() as c:
        rc, out, err = c.run(mpirun(NODES * PER_NODE, ARGS.gtest, "--gtest_color=no"),
                             {"CLUSTER_TEST_NODES": str(NODES), "CLUSTER_TEST_RANKS_PER_NODE": str(PER_NODE)})
    expect(rc == 0, "the gtest job failed (exit %d)" % rc)
    expect("SKIPPED" not in out, "no test may skip on the cluster")
    expect(len(re.findall(r"\[  PASSED  \] 3 tests", out)) == NODES * PER_NODE, "3 tests passed on each of the 4 ranks")


def trainer():
    """The trainer across 2 nodes: it trains, says 2 nodes, and ends bit-identical to the same
    run of 4 ranks on one host (same data order, same reduction algorithm)."""
    flags = ["--train-subset", "2048", "--test-subset", "500", "--batch-size", "64", "--epochs", "1", "--quiet",
             "--seed", "3"]
    with tempfile.TemporaryDirectory(dir=ARGS.workdir) as tmp:
        across, alone = os.path.join(tmp, "across.json"), os.path.join(tmp, "alone.json")
        with Cluster() as c:
            rc, out, err = c.run(mpirun(4, ARGS.trainer, *flags, "--json", across))
        expect(rc == 0, "the trainer failed across nodes (exit %d)" % rc)
        p = subprocess.run(mpirun(4, ARGS.trainer, *flags, "--json", alone), capture_output=True, text=True)
        expect(p.returncode == 0, "the trainer failed on one host: %s" % p.stderr)
        a, b = json.load(open(across)), json.load(open(alone))
    print("across nodes: %s\none host: %s" % (a, b))
    expect(a["nodes"] == 2 and b["nodes"] == 1, "node counts 2 and 1, got %s and %s" % (a["nodes"], b["nodes"]))
    expect(a["steps"] == 32, "2048 samples / 64 = 32 steps, got %s" % a["steps"])
    expect(a["final_train_loss"] < a["initial_train_loss"] * 0.7, "the loss went down")
    expect(a["test_accuracy"] > 0.5, "accuracy far above chance (0.1)")
    expect(a["params_crc32"] == b["params_crc32"],
           "the same parameters across nodes as on one host (crc %s vs %s)" % (a["params_crc32"], b["params_crc32"]))


def node_unreachable():
    """node1's link is cut mid-run (every packet lost, no connection reset): every rank must be
    gone within the deadline + BOUND, and node0's report must name node1 and its ranks."""
    with Cluster() as c:
        p = c.popen(mpirun(4, ARGS.fault, "idiom"), {"FAULT_TEST_STEPS": "100000", "TUTTI_TIMEOUT_S": str(DEADLINE)})
        # Cut once the job is running.
        line = ""
        while "STEP 20" not in line:
            line = p.stdout.readline()
            expect(line != "" or p.poll() is None, "the job ended before it ran")
        subprocess.run(["bash", ARGS.cluster, "link", "--name", c.name, "--node", "node1", "down"], check=True)
        cut = time.time()
        print("cut node1's link at %.3f" % cut)
        ranks_gone = None
        while time.time() - cut < 60:
            if ranks_gone is None and not c.ranks_left(os.path.basename(ARGS.fault)):
                ranks_gone = time.time() - cut
            if p.poll() is not None:
                break
            time.sleep(0.05)
        mpirun_took = time.time() - cut
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        if ranks_gone is None and not c.ranks_left(os.path.basename(ARGS.fault)):
            ranks_gone = time.time() - cut
    print("--- stderr\n%s" % err)
    print("cut -> every rank gone: %s s; mpirun returned after %.2f s with %s" % (ranks_gone, mpirun_took, p.returncode))
    expect(ranks_gone is not None and ranks_gone <= DEADLINE + BOUND,
           "every rank gone within %.1f s of the cut (took %s)" % (DEADLINE + BOUND, ranks_gone))
    expect_in(r"tutti \[rank 0\]: TIMEOUT: collective #\d+ allreduce\(sum\) 1000 x f32 .* Not reached by rank 2, "
              r"rank 3\. Host node1 \(ranks 2, 3\) did not answer", err, "in node0's report")
    expect_in(r"rank 2 \(node1\): no answer", err)
    expect_in(r"rank 0 \(node0\): in it for", err)
    expect_in(r"tutti \[rank 1\]: rank 0 is ending the job: TIMEOUT", err)
    # mpirun notices its daemon on node1 is gone once TCP gives up (cluster.sh: tcp_retries2=3).
    expect(p.returncode == 14, "mpirun returned the deadline's exit code 14, got %s" % p.returncode)
    expect(mpirun_took <= DEADLINE + 20, "mpirun returned within %.0f s of the cut (%.1f s)" % (DEADLINE + 20, mpirun_took))


def node_killed():
    """Every process of node1 is killed mid-run: the job ends within BOUND, and says which host."""
    with Cluster() as c:
        p = c.popen(mpirun(4, ARGS.fault, "idiom"), {"FAULT_TEST_STEPS": "100000", "TUTTI_TIMEOUT_S": str(DEADLINE)})
        line = ""
        while "STEP 20" not in line:
            line = p.stdout.readline()
            expect(line != "" or p.poll() is None, "the job ended before it ran")
        victims = c.pids("node1")
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        killed = time.time()
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
        took = time.time() - killed
        left = c.ranks_left(os.path.basename(ARGS.fault))
    print("--- stderr\n%s" % err)
    print("killed %d process(es) of node1; mpirun returned after %.2f s with %s" % (len(victims), took, p.returncode))
    expect(len(victims) >= 3, "orted and 2 ranks on node1")
    expect(not left, "no rank left: %s" % left)
    expect(p.returncode != 0, "the job failed")
    expect(took <= BOUND, "every process gone within %.1f s of the kill (%.2f s)" % (BOUND, took))
    # Open MPI ends the job (before tutti's deadline) and names node1 by its address.
    expect_in(r"10\.77\.0\.2|node1", err, "the lost host named")


SCENARIOS = {"job_and_ddp": job_and_ddp, "trainer": trainer, "node_unreachable": node_unreachable,
             "node_killed": node_killed}

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--cluster", required=True, help="scripts/cluster.sh")
    parser.add_argument("--gtest", help="cluster_test")
    parser.add_argument("--fault", help="comm_fault_test")
    parser.add_argument("--trainer", help="train_fashion_mnist")
    parser.add_argument("--mpiexec", default="mpiexec")
    parser.add_argument("--workdir", default=os.getcwd(), help="for temporary files (seen by every node)")
    parser.add_argument("--keep", action="append", default=[],
                        help="a folder every node must see, such as the build tree (repeatable)")
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
    try:
        SCENARIOS[ARGS.scenario]()
    except AssertionError as e:
        print("FAILED: %s" % e)
        sys.exit(1)
    print("PASSED")
