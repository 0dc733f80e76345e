#!/usr/bin/env python3
"""How long a job takes to end when one rank fails: the median, over several runs, of the time
from the fault to the moment every process of the job is gone (mpirun and every rank).

The fault is stamped with the wall-clock time by whoever causes it (the library's TUTTI_FAULT
hook, the test program's Job::abort, or this script when it sends a signal); "gone" is the
first moment no process carries the run's token. Runs tests/comm/fault_test.py's harness on
build/tests/comm/comm_fault_test and build/examples/train_fashion_mnist.

    python3 benchmarks/faults/time_to_exit.py --runs 5 --json docs/bench/time_to_exit.json
"""
import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "comm"))
import fault_test  # noqa: E402  (the harness: run(), processes_with())

DEADLINE = 2.0  # TUTTI_TIMEOUT_S of the scenarios that wait for a deadline


def fault_time(job, pattern):
    return job.stamp(pattern)


def scenario_runs(build):
    """(name, np, function returning seconds from fault to every process gone)."""
    prog = os.path.join(build, "tests", "comm", "comm_fault_test")
    trainer = os.path.join(build, "examples", "train_fashion_mnist")

    def thrown(rank, np):
        def f():
            fault = "%d:throw@collective=5" % rank
            job = fault_test.run(["idiom"], np, {"TUTTI_FAULT": fault}, program=prog)
            return job.gone_at - job.stamp("TUTTI_FAULT='%s': throwing" % re.escape(fault))
        return f

    def terminate(np):
        def f():
            fault = "1:throw@collective=5"
            job = fault_test.run(["terminate"], np, {"TUTTI_FAULT": fault}, program=prog)
            return job.gone_at - job.stamp("TUTTI_FAULT='%s': throwing" % re.escape(fault))
        return f

    def aborted(np):
        def f():
            job = fault_test.run(["abort"], np, program=prog)
            return job.gone_at - job.stamp("ABORT rank %d" % (np - 1))
        return f

    def crashed(np):
        def f():
            fault = "1:exit@collective=5"
            job = fault_test.run(["idiom"], np, {"TUTTI_FAULT": fault}, program=prog)
            return job.gone_at - job.stamp("TUTTI_FAULT='%s': exiting" % re.escape(fault))
        return f

    def stalled(np, point):
        def f():
            fault = "%d:stall@%s" % (np - 1, point)
            job = fault_test.run(["idiom"], np, {"TUTTI_FAULT": fault, "TUTTI_TIMEOUT_S": str(DEADLINE)}, program=prog)
            return job.gone_at - job.stamp("TUTTI_FAULT='%s': stopping" % re.escape(fault))
        return f

    def trainer_signal(np, target, sig):
        # From the signal to every process gone: the step in flight, the checkpoint, the exit.
        def f():
            work = tempfile.mkdtemp(prefix="tte-")
            try:
                ckpt = os.path.join(work, "checkpoint.tckp")
                cmd = [fault_test.ARGS.mpiexec, "-n", str(np), "--oversubscribe", trainer, "--train-subset", "4096",
                       "--test-subset", "1000", "--batch-size", "64", "--epochs", "40", "--max-steps", "2000",
                       "--checkpoint-dir", work, "--checkpoint-every", "10", "--quiet"]
                p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
                while not os.path.exists(ckpt) and p.poll() is None:
                    time.sleep(0.01)
                kids = [int(x) for x in subprocess.run(["ps", "-o", "pid=", "--ppid", str(p.pid)], capture_output=True,
                                                       text=True).stdout.split()]
                t = time.time()
                os.kill(kids[-1] if target == "rank" else p.pid, sig)
                while any(ranks_alive(kids)):
                    time.sleep(0.005)
                ranks_gone = time.time()
                out, err = p.communicate(timeout=60)
                gone = time.time()
                if "stopped at step" not in err:
                    raise AssertionError("no stop message:\n" + err)
                return gone - t, ranks_gone - t
            finally:
                shutil.rmtree(work, ignore_errors=True)
        return f

    def trainer_throw(np):
        def f():
            fault = "0:throw@collective=40"
            token = fault_test.new_token()  # in --checkpoint-dir's path, so that the job's processes show it
            work = os.path.join(tempfile.gettempdir(), token)
            try:
                job = fault_test.run(["--train-subset", "4096", "--test-subset", "1000", "--batch-size", "64",
                                      "--max-steps", "300", "--quiet", "--checkpoint-dir", work], np,
                                     {"TUTTI_FAULT": fault}, program=trainer, token=token)
                return job.gone_at - job.stamp("TUTTI_FAULT='%s': throwing" % re.escape(fault))
            finally:
                shutil.rmtree(work, ignore_errors=True)
        return f

    out = []
    for np in (2, 3, 4):
        out.append(("exception on rank 0, caught outside the Job", np, thrown(0, np)))
        out.append(("exception on the last rank, caught outside the Job", np, thrown(np - 1, np)))
    for np in (2, 4):
        out.append(("exception escaping main (std::terminate)", np, terminate(np)))
        out.append(("Job::abort on the last rank", np, aborted(np)))
        out.append(("a rank's process exits (crash)", np, crashed(np)))
        out.append(("a rank stopped (SIGSTOP) mid-run, deadline %.0f s" % DEADLINE, np, stalled(np, "collective=5")))
        out.append(("a rank stopped (SIGSTOP) before MPI_Init, deadline %.0f s" % DEADLINE, np, stalled(np, "start")))
    out.append(("trainer: exception on rank 0 at its 40th collective", 2, trainer_throw(2)))
    out.append(("trainer: SIGTERM to a rank -> checkpoint, exit 75", 2, trainer_signal(2, "rank", signal.SIGTERM)))
    out.append(("trainer: SIGUSR1 to mpirun (forwarded) -> checkpoint, exit 75", 2,
                trainer_signal(2, "mpirun", signal.SIGUSR1)))
    out.append(("trainer: SIGTERM to mpirun (SIGTERM to ranks 1 s later) -> checkpoint", 2,
                trainer_signal(2, "mpirun", signal.SIGTERM)))
    return out


def ranks_alive(pids):
    for pid in pids:
        try:
            os.kill(pid, 0)
            with open("/proc/%d/stat" % pid) as f:
                yield f.read().split(")")[-1].split()[0] != "Z"
        except (ProcessLookupError, FileNotFoundError):
            yield False


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--mpiexec", default="mpiexec")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json")
    parser.add_argument("--only", help="run the scenarios whose name contains this")
    args = parser.parse_args()
    fault_test.ARGS = argparse.Namespace(mpiexec=args.mpiexec, program=None, hello=None)
    env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1",
           "OPENBLAS_NUM_THREADS": "1"}
    os.environ.update(env)
    rows = []
    quiet = open(os.devnull, "w")
    for name, np, f in scenario_runs(args.build):
        if args.only and args.only not in name:
            continue
        times, ranks_done = [], []
        for _ in range(args.runs):
            stdout = sys.stdout
            sys.stdout = quiet  # the harness prints every job's output
            try:
                t = f()
            finally:
                sys.stdout = stdout
            if isinstance(t, tuple):  # (every process gone, the ranks alone gone)
                t, r = t
                ranks_done.append(r)
            times.append(t)
        row = {"scenario": name, "ranks": np, "median_s": statistics.median(times), "max_s": max(times),
               "runs_s": [round(t, 3) for t in times]}
        extra = ""
        if ranks_done:
            row["ranks_gone_median_s"] = statistics.median(ranks_done)
            extra = "  (the ranks alone: %.2f s)" % row["ranks_gone_median_s"]
        rows.append(row)
        print("%-72s np=%d  median %5.2f s  max %5.2f s%s" % (name, np, row["median_s"], row["max_s"], extra), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"deadline_s": DEADLINE, "runs": args.runs, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
