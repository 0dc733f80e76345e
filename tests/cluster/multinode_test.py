#!/usr/bin/env python3
"""Multi-node tests on the emulated cluster (scripts/cluster.sh): one scenario per run, for ctest.

Each scenario brings up its own cluster of 2 nodes x 2 slots (network, UTS and mount namespaces;
TCP between the nodes, shared memory within), runs a job across it with mpirun, judges it, and
removes the cluster again, also when the scenario fails or is interrupted. Where namespaces
cannot be made, it says why and exits 77 (ctest: skipped).

    multinode_test.py job_and_ddp --cluster scripts/cluster.sh --gtest build/tests/cluster/cluster_test

The scenarios of tutti-launch are in relaunch_scenarios.py; what every scenario shares (the
cluster, the command line, the checks) in cluster_harness.py.
"""
import json
import os
import re
import signal
import subprocess
import tempfile
import time

import cluster_harness as h
import relaunch_scenarios
from cluster_harness import NODES, PER_NODE, Cluster, communicate, expect, expect_in, mpirun

DEADLINE = 2.0   # TUTTI_TIMEOUT_S of the fault scenarios
BOUND = 5.0      # s after the deadline by which every rank must be gone (as tests/comm/fault_test.py)


def fault_job_running(c, step=20, tries=3):
    """Starts the fault program's training loop across the cluster (4 ranks, tutti's deadline
    DEADLINE) and returns it once rank 0 has said "STEP <step>". The deadline is short on
    purpose, so on a loaded machine the start-up alone can miss it (the job then ends with
    tutti's TIMEOUT before any cut): such a start is tried again, up to `tries` times in all. A
    job that ends early for any other reason fails the scenario with everything it printed."""
    for attempt in range(1, tries + 1):
        p = c.popen(mpirun(4, h.ARGS.fault, "idiom"), {"FAULT_TEST_STEPS": "100000", "TUTTI_TIMEOUT_S": str(DEADLINE)})
        said = []
        while True:
            line = p.stdout.readline()
            said.append(line)
            if re.search(r"\bSTEP %d\b" % step, line):
                return p
            if line == "" and p.poll() is not None:
                break
            if line == "":
                time.sleep(0.01)
        out, err = p.communicate()
        report = "the job ended (exit %s) before step %d\n--- stdout\n%s%s--- stderr\n%s" % (
            p.returncode, step, "".join(said), out, err)
        if "TIMEOUT" not in err or attempt == tries:
            raise AssertionError(report)
        print("attempt %d of %d missed the %g s deadline before the cut; starting again:\n%s" % (
            attempt, tries, DEADLINE, report))


# ---- scenarios -----------------------------------------------------------------------------

def job_and_ddp():
    """Job's rank / local rank / local size / node count, exact collectives, DDP = one rank."""
    with Cluster() as c:
        rc, out, err = c.run(mpirun(NODES * PER_NODE, h.ARGS.gtest, "--gtest_color=no"),
                             {"CLUSTER_TEST_NODES": str(NODES), "CLUSTER_TEST_RANKS_PER_NODE": str(PER_NODE)})
    expect(rc == 0, "the gtest job failed (exit %d)" % rc)
    expect("SKIPPED" not in out, "no test may skip on the cluster")
    expect(len(re.findall(r"\[  PASSED  \] 3 tests", out)) == NODES * PER_NODE, "3 tests passed on each of the 4 ranks")


def trainer():
    """The trainer across 2 nodes: it trains, says 2 nodes, and ends bit-identical to the same
    run of 4 ranks on one host (same data order, same reduction algorithm)."""
    flags = ["--train-subset", "2048", "--test-subset", "500", "--batch-size", "64", "--epochs", "1", "--quiet",
             "--seed", "3"]
    with tempfile.TemporaryDirectory(dir=h.ARGS.workdir) as tmp:
        across, alone = os.path.join(tmp, "across.json"), os.path.join(tmp, "alone.json")
        with Cluster() as c:
            rc, out, err = c.run(mpirun(4, h.ARGS.trainer, *flags, "--json", across))
        expect(rc == 0, "the trainer failed across nodes (exit %d)" % rc)
        p = subprocess.run(mpirun(4, h.ARGS.trainer, *flags, "--json", alone), capture_output=True, text=True)
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
        p = fault_job_running(c)  # cut once the job is running
        subprocess.run(["bash", h.ARGS.cluster, "link", "--name", c.name, "--node", "node1", "down"], check=True)
        cut = time.time()
        print("cut node1's link at %.3f" % cut)
        ranks_gone = None
        while time.time() - cut < 60:
            if ranks_gone is None and not c.ranks_left(os.path.basename(h.ARGS.fault)):
                ranks_gone = time.time() - cut
            if p.poll() is not None:
                break
            time.sleep(0.05)
        mpirun_took = time.time() - cut
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        if ranks_gone is None and not c.ranks_left(os.path.basename(h.ARGS.fault)):
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
        p = fault_job_running(c)
        victims = c.kill("node1")
        killed = time.time()
        out, err, _ = communicate(p, 60)
        took = time.time() - killed
        # A rank on node0 may still be exiting when mpirun returns (under load, a few ms): every
        # process must be gone within BOUND of the kill, not at the instant mpirun returns.
        left = c.ranks_left(os.path.basename(h.ARGS.fault))
        while left and time.time() - killed < BOUND:
            time.sleep(0.05)
            left = c.ranks_left(os.path.basename(h.ARGS.fault))
        gone = time.time() - killed
    print("--- stderr\n%s" % err)
    print("killed %d process(es) of node1; mpirun returned after %.2f s with %s, every rank gone after %.2f s" % (
        victims, took, p.returncode, gone))
    expect(victims >= 3, "orted and 2 ranks on node1")
    expect(not left, "no rank left %.1f s after the kill: %s" % (BOUND, left))
    expect(p.returncode != 0, "the job failed")
    expect(took <= BOUND and gone <= BOUND + 0.1,
           "every process gone within %.1f s of the kill (mpirun %.2f s, ranks %.2f s)" % (BOUND, took, gone))
    # Open MPI ends the job (before tutti's deadline) with its message for a lost daemon. It names
    # node1 by its address only when a process of node0 tried to connect to node1 before the end
    # ("connect() to 10.77.0.2:... failed"), which under load it sometimes does not.
    expect_in(r"ORTE was unable to reliably start one or more daemons|ORTE has lost communication", err,
              "Open MPI's report of the lost daemon")
    print("the lost host named by Open MPI: %s" % bool(re.search(r"10\.77\.0\.2|node1", err)))


# ---- tutti-launch: relaunching on the survivors --------------------------------------------


SCENARIOS = {"job_and_ddp": job_and_ddp, "trainer": trainer, "node_unreachable": node_unreachable,
             "node_killed": node_killed, **relaunch_scenarios.SCENARIOS}

if __name__ == "__main__":
    h.main(SCENARIOS)
