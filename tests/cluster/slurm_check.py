#!/usr/bin/env python3
"""Slurm on the emulated cluster, checked end to end (scripts/cluster-slurm.sh check; not part of
CI, which does not install Slurm). Needs a cluster with Slurm up:

    bash scripts/cluster.sh up --name sl --nodes 2 && bash scripts/cluster-slurm.sh up --name sl
    bash scripts/cluster-slurm.sh check --name sl [--build build] [--skip-signals]

Checks, each printing PASSED or FAILED with what it saw:
  srun_ranks      srun -N 2 --ntasks-per-node 2 --mpi=pmix hello_ranks: 4 ranks, 2 hosts, local ranks
  srun_trainer    srun ... train_fashion_mnist (a short DDP run): 2 nodes, the loss falls, and the
                  parameters are bit-identical to the same run under mpirun on one host
  sbatch_mpirun   sbatch -N 2 with mpirun inside the allocation (Open MPI reads it from Slurm)
  srun_signal     srun --time=1 --signal=USR1@45: Slurm's pre-kill signal reaches every rank, the
                  trainer checkpoints and exits 75; --resume auto then finishes the run
  sbatch_signal   sbatch --signal=B:USR1@45: the batch script forwards it to mpirun, which
                  forwards it to the ranks: the same checkpoint and exit 75
  sbatch_elastic  (only when named: it kills a node) scripts/slurm/tutti-elastic.sbatch on every
                  node; the last node's processes are killed with SIGKILL mid-run: the script
                  relaunches srun on the others with --resume auto and the run completes
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
SUBSET = ["--train-subset", "2048", "--test-subset", "500", "--batch-size", "64", "--quiet", "--seed", "5"]


def slurm(*cmd, timeout=180, check=False):
    p = subprocess.run(["bash", os.path.join(ROOT, "scripts/cluster-slurm.sh"), "exec", "--name", ARGS.name, "--", *cmd],
                       capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    print("$ %s\n(exit %d)\n%s%s" % (" ".join(cmd), p.returncode, p.stdout[-3000:], p.stderr[-3000:]))
    if check and p.returncode != 0:
        raise AssertionError("%s failed with %d" % (cmd[0], p.returncode))
    return p


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def trainer():
    return os.path.join(ROOT, ARGS.build, "examples/train_fashion_mnist")


def srun_ranks():
    p = slurm("srun", "-N", "2", "--ntasks-per-node", "2", "--mpi=pmix", os.path.join(ARGS.build, "examples/hello_ranks"),
              check=True)
    expect("4 rank(s) on 2 host(s)" in p.stdout, "4 ranks on 2 hosts")
    for r, host, local in ((0, "node0", 0), (1, "node0", 1), (2, "node1", 0), (3, "node1", 1)):
        expect(re.search(r"rank %d/4  host %s  local %d/2" % (r, host, local), p.stdout), "rank %d on %s, local %d" % (r, host, local))
    expect("allreduce over 4 rank(s): 10 (expected 10) ok" in p.stdout, "the allreduce is right")


def srun_trainer():
    with tempfile.TemporaryDirectory(dir=os.path.join(ROOT, ARGS.build)) as tmp:
        a, b = os.path.join(tmp, "srun.json"), os.path.join(tmp, "one_host.json")
        slurm("srun", "-N", "2", "--ntasks-per-node", "2", "--mpi=pmix", trainer(), *SUBSET, "--epochs", "1", "--json", a,
              check=True)
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        subprocess.run(["mpirun", "-np", "4", "--oversubscribe", trainer(), *SUBSET, "--epochs", "1", "--json", b],
                       check=True, capture_output=True, env=env)
        x, y = json.load(open(a)), json.load(open(b))
    print("srun: %s\none host: %s" % (x, y))
    expect(x["nodes"] == 2 and x["ranks"] == 4, "4 ranks on 2 nodes")
    expect(x["final_train_loss"] < 0.7 * x["initial_train_loss"], "the loss fell")
    expect(x["params_crc32"] == y["params_crc32"], "bit-identical to mpirun on one host")


def sbatch_mpirun():
    with tempfile.TemporaryDirectory(dir=os.path.join(ROOT, ARGS.build)) as tmp:
        script, out, js = os.path.join(tmp, "job.sh"), os.path.join(tmp, "job.out"), os.path.join(tmp, "job.json")
        open(script, "w").write("""#!/bin/bash
#SBATCH -N 2
#SBATCH --ntasks-per-node 2
#SBATCH -o %s
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "batch script on $(hostname), allocation $SLURM_JOB_NODELIST, $SLURM_NTASKS tasks"
mpirun %s %s --epochs 1 --json %s
""" % (out, trainer(), " ".join(SUBSET), js))
        slurm("sbatch", "--wait", script, check=True)
        text = open(out).read()
        print(text)
        x = json.load(open(js))
    expect("allocation node[0-1], 4 tasks" in text, "the allocation")
    expect(x["nodes"] == 2 and x["ranks"] == 4, "mpirun placed 4 ranks on 2 nodes from the allocation")


def signal_run(kind):
    """The trainer with far more epochs than a minute allows; Slurm signals it 45 s before the limit."""
    with tempfile.TemporaryDirectory(dir=os.path.join(ROOT, ARGS.build)) as tmp:
        ckpt = os.path.join(tmp, "ckpt")
        flags = [*SUBSET, "--epochs", "100000", "--checkpoint-dir", ckpt, "--progress", "lines", "--progress-interval", "5"]
        flags.remove("--quiet")
        started = time.time()
        if kind == "srun":
            p = slurm("srun", "-N", "2", "--ntasks-per-node", "2", "--mpi=pmix", "--time=1", "--signal=USR1@45",
                      trainer(), *flags)
            rc, text = p.returncode, p.stdout + p.stderr
        else:
            script, out = os.path.join(tmp, "job.sh"), os.path.join(tmp, "job.out")
            open(script, "w").write("""#!/bin/bash
#SBATCH -N 2
#SBATCH --ntasks-per-node 2
#SBATCH --time=1
#SBATCH --signal=B:USR1@45
#SBATCH -o %s
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Slurm signals this script only (B:); mpirun forwards SIGUSR1 to every rank.
mpirun %s %s &
pid=$!
trap 'echo "batch script: got SIGUSR1, forwarding to mpirun"; kill -USR1 $pid' USR1
wait $pid; rc=$?
[ $rc -gt 128 ] && { wait $pid; rc=$?; }  # wait returned for the trap: wait for mpirun itself
echo "mpirun exit $rc"
exit $rc
""" % (out, trainer(), " ".join(flags)))
            p = slurm("sbatch", "--wait", script)
            text = open(out).read()
            m = re.search(r"mpirun exit (\d+)", text)
            rc = int(m.group(1)) if m else -1
            print(text[-4000:])
        took = time.time() - started
        print("%s: exit %d after %.0f s" % (kind, rc, took))
        expect(rc == 75, "exit code 75 (stopped by a signal, resumable), got %d" % rc)
        expect(os.path.exists(os.path.join(ckpt, "checkpoint.tckp")), "a checkpoint was written")
        expect(re.search(r"signal|SIGUSR1", text), "the trainer says it stopped for a signal")
        expect(took < 60, "stopped before the time limit (%.0f s)" % took)
        if kind == "srun":
            # The scheduler's rerun: the same command with --resume auto continues from the checkpoint.
            flags2 = list(flags)
            flags2[flags2.index("--epochs") + 1] = "40"
            # 40 epochs of 32 steps: the stop came before their end; the rerun goes on from it.
            stopped = int(re.search(r"stopped at step (\d+)", text).group(1))
            js = os.path.join(tmp, "rerun.json")
            p = slurm("srun", "-N", "2", "--ntasks-per-node", "2", "--mpi=pmix", trainer(), *flags2, "--resume", "auto",
                      "--json", js)
            expect(p.returncode == 0, "the rerun with --resume auto succeeded")
            rerun = json.load(open(js))
            print("rerun: resumed from step %s, %s steps in all" % (rerun["resumed_from_step"], rerun["steps"]))
            expect(rerun["resumed_from_step"] == stopped and rerun["steps"] == 40 * 32,
                   "the rerun continued from step %d to the end" % stopped)


def sbatch_elastic():
    """scripts/slurm/tutti-elastic.sbatch on every node of the cluster (1 task each); every process
    of the last node (slurmd, the step, the task, the node's holder: the machine is gone) is killed
    with SIGKILL mid-run. The script must relaunch srun by itself on the other nodes with --resume
    auto, from a checkpoint, and the run must complete. Kills a node: run it last (not by default)."""
    nodes = int(slurm("sinfo", "-h", "-o", "%D", check=True).stdout.split()[0])
    expect(nodes >= 2, "needs 2 nodes or more (3: cluster.sh up --nodes 3)")
    victim = "node%d" % (nodes - 1)
    with tempfile.TemporaryDirectory(dir=os.path.join(ROOT, ARGS.build)) as tmp:
        out, js, ckpt = os.path.join(tmp, "job.out"), os.path.join(tmp, "run.json"), os.path.join(tmp, "ckpt")
        flags = ["--train-subset", "19200", "--test-subset", "500", "--batch-size", "96", "--epochs", "2", "--seed", "5",
                 "--checkpoint-dir", ckpt, "--checkpoint-every", "20", "--progress", "lines", "--progress-interval", "0.2",
                 "--json", js]
        cmd = ["bash", os.path.join(ROOT, "scripts/cluster-slurm.sh"), "exec", "--name", ARGS.name, "--", "sbatch", "--wait",
               "-N", str(nodes), "--ntasks-per-node", "1", "-o", out, os.path.join(ROOT, "scripts/slurm/tutti-elastic.sbatch"),
               trainer(), *flags]
        # Under srun no daemon ends the survivors of a lost node (mpirun's do): tutti's deadline does,
        # before Slurm declares the node down (SlurmdTimeout, 30 s here).
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env={**os.environ, "TUTTI_TIMEOUT_S": "5"})
        text = ""
        for _ in range(1200):
            text = open(out).read() if os.path.exists(out) else ""
            m = re.findall(r"step (\d+)/400", text)
            if m and int(m[-1]) >= 100:
                break
            time.sleep(0.1)
        ns = "tutti-%s-%s" % (ARGS.name, victim)
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        for pid in pids:
            subprocess.run(["kill", "-9", pid])
        killed = time.time()
        relaunched = None
        while p.poll() is None and time.time() - killed < 120:
            if relaunched is None and "attempt 2:" in (open(out).read() if os.path.exists(out) else ""):
                relaunched = time.time() - killed
            time.sleep(0.1)
        if p.poll() is None:
            p.kill()
        p.communicate()
        text = open(out).read()
        print("\n".join(l for l in text.splitlines() if not l.startswith("epoch"))[-4000:])
        print("killed %d process(es) of %s after step %s; attempt 2 seen %s s later" % (len(pids), victim, m[-1] if m else
                                                                                          "?", relaunched))
        x = json.load(open(js))
    survivors = ",".join("node%d" % i for i in range(nodes - 1))
    expect(re.search(r"attempt 1 failed \(exit \d+\); relaunching", text), "attempt 1 failed and was relaunched")
    expect(re.search(r"attempt 2: %d task\(s\) on %d node\(s\) \(%s\)" % (nodes - 1, nodes - 1, survivors), text),
           "attempt 2 on %s" % survivors)
    expect("done after 2 attempt(s)" in text, "done after 2 attempts")
    # tutti's deadline (5 s) and its 1 s for the answers, srun's wait for the lost node's step (KillWait 5 s
    # + 2 s), the probe of the lost node (5 s): 20 s measured.
    expect(relaunched is not None and relaunched < 30, "relaunched within 30 s of the kill (%s)" % relaunched)
    expect(x["status"] == "completed" and x["steps"] == 400 and x["ranks"] == nodes - 1, "completed on the survivors")
    expect(x["resumed_from_step"] >= 100 - 20 and x["resumed_from_step"] % 20 == 0, "resumed from a checkpoint")


CHECKS = {"srun_ranks": srun_ranks, "srun_trainer": srun_trainer, "sbatch_mpirun": sbatch_mpirun,
          "srun_signal": lambda: signal_run("srun"), "sbatch_signal": lambda: signal_run("sbatch")}
DEFAULT = list(CHECKS)
CHECKS["sbatch_elastic"] = sbatch_elastic  # kills a node: only when named

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="tc")
    ap.add_argument("--build", default="build")
    ap.add_argument("--skip-signals", action="store_true")
    ap.add_argument("checks", nargs="*")
    ARGS = ap.parse_args()
    failed = 0
    for name in ARGS.checks or DEFAULT:
        if ARGS.skip_signals and "signal" in name:
            continue
        try:
            CHECKS[name]()
            print("PASSED %s\n" % name)
        except (AssertionError, subprocess.SubprocessError) as e:
            print("FAILED %s: %s\n" % (name, e))
            failed += 1
    sys.exit(1 if failed else 0)
