#!/usr/bin/env python3
"""Fault scenarios judged as whole jobs under mpiexec (one scenario per run, for ctest).

Each scenario starts comm_fault_test (or hello_ranks) under mpiexec with a fault, then checks
what a user relies on: the exit code, that every process of the job is gone within the bound
(measured from the fault, which the program or the library's TUTTI_FAULT hook stamps with the
wall-clock time on stderr), and that the messages name the cause (once, on the failing rank)
and the failing rank (on the others).

    fault_test.py throw_rank0.np2 --program build/tests/comm/comm_fault_test --mpiexec mpiexec
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import time
import uuid

# Bound on "fault -> last process gone", seconds (issue 12: <= 5 s at np 2-4 on the CPU).
BOUND = 5.0
# TUTTI_TIMEOUT_S of the stall scenarios. The start-up (MPI_Init) has it too: at 2 s, 4 ranks
# under ctest -j4 on 2 cores once spent all of it there (stall_group.np4, 2026-12-07, before its
# fault), as throw_alike_catch_hangs once spent 2.1 s (it has 6 s).
DEADLINE = 4.0


class Job:
    def __init__(self, out, err, rc, gone_at, started_at):
        self.out, self.err, self.rc = out, err, rc
        self.gone_at, self.started_at = gone_at, started_at
        self.all = out + "\n" + err

    def stamp(self, pattern):
        """Wall-clock time printed after `pattern` ("... at 1712345678.123")."""
        m = re.search(pattern + r".*? at (\d+\.\d+)", self.all)
        if not m:
            raise AssertionError("no '%s ... at <time>' in the output:\n%s" % (pattern, self.all))
        return float(m.group(1))


def processes_with(token):
    out = subprocess.run(["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if token in line and "ps -eo" not in line]


def new_token():
    return "fault-token-" + uuid.uuid4().hex[:12]


def mpirun_crashed_in_its_finalize(job):
    """Open MPI 4.1.4's mpirun now and then dies of SIGSEGV in its own PMIx server's finalize
    after a rank called MPI_Abort (backtrace: PMIx_server_finalize <- orte_finalize <- mpiexec's
    main): the job had ended as it should, but its exit code is lost. Seen in
    one_sided_summary.np3 in 1 of ~20 full test runs (2026-12-06 and -07)."""
    return job.rc == -signal.SIGSEGV and "PMIx_server_finalize" in job.err


# Seconds that mpirun may stay after the last of its ranks is gone (it exits within ~0.1 s).
MPIRUN_OUTLIVES = 10.0


class MpirunHung(AssertionError):
    """Open MPI 4.1.4's mpirun stayed after every rank of its job was gone: under ctest -j6 on 2
    cores, in 1 of 6 whole test runs (~140 fault-test jobs; one_sided_summary.np3, 2026-12-07:
    rank 0 had reported and called MPI_Abort, the ranks were gone, mpirun was still there 40 s
    later). Only mpirun waits then: the job ended as it should, but its exit code is lost."""


def run(args, np, env_extra=None, env_drop=(), program=None, timeout=40, token=None, tries=3):
    """Runs the job; `token` (a word no other process has in its command line) finds its
    processes: appended as a last argument, unless the caller put it into `args` itself. A job
    whose mpirun crashed in its own finalize (mpirun_crashed_in_its_finalize) or hung after its
    ranks were gone (MpirunHung) runs again, up to `tries` times in all."""
    for attempt in range(1, tries + 1):
        try:
            job = run_once(args, np, env_extra, env_drop, program, timeout, token)
        except MpirunHung as e:
            if attempt == tries:
                raise
            print("%s (an Open MPI fault, not the job's): attempt %d of %d, again" % (e, attempt, tries))
            continue
        if not mpirun_crashed_in_its_finalize(job) or attempt == tries:
            return job
        print("mpirun crashed in its finalize (an Open MPI fault, not the job's): attempt %d of %d, again" %
              (attempt, tries))


def run_once(args, np, env_extra, env_drop, program, timeout, token):
    append = token is None
    token = token or new_token()
    env = dict(os.environ)
    env.pop("TUTTI_FAULT", None)
    env.pop("TUTTI_DEBUG", None)
    for k in env_drop:
        env.pop(k, None)
    env.update(env_extra or {})
    cmd = [ARGS.mpiexec, "-n", str(np), "--oversubscribe", program or ARGS.program, *args, *([token] if append else [])]
    started = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    rank_program = program or ARGS.program
    ranks_seen, ranks_gone_at = False, None
    while True:
        try:
            out, err = p.communicate(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            pass
        alive = processes_with(token)
        # A rank's command line starts with its program; mpirun's with mpiexec.
        ranks = [line for line in alive if line.split(None, 2)[-1].startswith(rank_program)]
        ranks_seen = ranks_seen or bool(ranks)
        ranks_gone_at = (ranks_gone_at or time.time()) if ranks_seen and not ranks else None
        hung = ranks_gone_at is not None and time.time() - ranks_gone_at > MPIRUN_OUTLIVES
        if not hung and time.time() - started < timeout:
            continue
        # Which processes stayed (mpirun, ranks: pid, state, command line), for the report.
        os.killpg(p.pid, signal.SIGKILL)
        for line in processes_with(token):
            os.kill(int(line.split()[0]), signal.SIGKILL)
        out, err = p.communicate()
        if hung:
            print("$ %s\n--- stdout\n%s--- stderr\n%s" % (" ".join(cmd), out, err))
            raise MpirunHung("mpirun was still there %.0f s after the last rank of its job was gone" % MPIRUN_OUTLIVES)
        raise AssertionError("the job still ran after %d s; its processes then:\n%s\n%s\n%s" %
                             (timeout, "\n".join(alive) or "(none with its token: only mpirun's session)", out, err))
    # mpiexec is gone; every rank must be too.
    while processes_with(token) and time.time() - started < timeout:
        time.sleep(0.02)
    gone = time.time()
    left = processes_with(token)
    for line in left:
        os.kill(int(line.split()[0]), signal.SIGKILL)
    job = Job(out, err, p.returncode, gone, started)
    print("$ %s\n(exit %d after %.2f s)\n--- stdout\n%s--- stderr\n%s" % (" ".join(cmd), p.returncode, gone - started, out, err))
    if left:
        raise AssertionError("processes left after mpiexec ended: %s" % left)
    return job


def expect(cond, what, job):
    if not cond:
        raise AssertionError(what)


def expect_in(piece, text, what=""):
    if re.search(piece, text) is None:
        raise AssertionError("expected /%s/ %s" % (piece, what))


def expect_fast(job, t_fault, bound=BOUND):
    took = job.gone_at - t_fault
    print("fault -> every process gone: %.2f s (bound %.1f s)" % (took, bound))
    if took > bound:
        raise AssertionError("every process was gone %.2f s after the fault (bound %.1f s)" % (took, bound))
    return took


def no_memory_errors(job):
    for bad in ["AddressSanitizer", "malloc()", "Segmentation fault", "signal 11", "corrupted", "double free"]:
        if bad in job.all:
            raise AssertionError("a memory error: '%s' in the output" % bad)


# ---- scenarios -----------------------------------------------------------------------------

def throw_at(rank, np, point="collective=5"):
    fault = "%d:throw@%s" % (rank, point)
    job = run(["idiom"], np, {"TUTTI_FAULT": fault})
    t = job.stamp(r"TUTTI_FAULT='%s': throwing" % re.escape(fault))
    expect(job.rc != 0, "the job must fail", job)
    expect_fast(job, t)
    # The failing rank's own message, once, with its rank.
    caught = re.findall(r"CAUGHT rank (\d+).*?: (.*)", job.err)
    expect(len(caught) == 1 and caught[0][0] == str(rank), "exactly rank %d must catch the error: %s" % (rank, caught), job)
    expect_in(r"tutti \[rank %d\].*fault injected by TUTTI_FAULT" % rank, caught[0][1], "in the caught message")
    # The others say which rank failed and why, and never time out.
    for r in range(np):
        if r != rank:
            expect_in(r"tutti \[rank %d\]: rank %d failed: .*fault injected by TUTTI_FAULT" % (r, rank), job.err,
                      "from rank %d" % r)
    expect("TIMEOUT" not in job.all, "no timeout", job)
    expect(job.all.count("fault injected") == np, "the cause once per rank (caught once, told to the others)", job)


def run_alike(env):
    """Both ranks of an np-2 idiom job throw at collective 5. Where they reached it too far apart
    to see each other leave (a loaded machine), the end is the one-rank failure's: run it again,
    up to 3 tries."""
    for attempt in range(1, 4):
        job = run(["idiom"], 2, {"TUTTI_FAULT": "0:throw@collective=5;1:throw@collective=5", **env})
        if "failed:" not in job.err or attempt == 3:
            return job
        print("the ranks did not leave together (a rank was told the other failed): attempt %d of 3, again" % attempt)


def throw_alike():
    # Every rank raises the same error (a diverged loss, a refused argument) and leaves its Job:
    # they end in order, and rank 0's catch block, a second slower than rank 1's, still prints
    # (mpirun ends a job at its first non-zero exit, so no rank's process may end before every
    # rank's catch has run).
    # mpirun's SIGKILL right after its SIGTERM (the Job catches SIGTERM): a lost race shows.
    job = run_alike({"FAULT_TEST_SLOW_CATCH_RANK": "0", "OMPI_MCA_odls_base_sigkill_timeout": "0"})
    t = job.stamp(r"TUTTI_FAULT='0:throw@collective=5': throwing")
    expect("failed:" not in job.err, "an orderly end: no rank told that another failed", job)
    expect(job.rc == 1, "exit code 1 (the programs' own), got %d" % job.rc, job)
    caught = sorted(r for r, _ in re.findall(r"CAUGHT rank (\d+).*?: (.*)", job.err))
    expect(caught == ["0", "1"], "every rank's catch block printed, rank 0's too: %s" % caught, job)
    expect("TIMEOUT" not in job.all, "no timeout", job)
    expect_fast(job, t)


def throw_alike_catch_hangs():
    # As throw_alike, but rank 0's catch block outlasts the deadline: rank 1, waiting in
    # MPI_Finalize at its exit, ends the job with a report that says where rank 0 is.
    # A deadline of 6 s, not DEADLINE: the start-up (MPI_Init) has it too, and took 2.1 s once
    # on a loaded machine.
    job = run_alike({"TUTTI_TIMEOUT_S": "6", "FAULT_TEST_SLOW_CATCH_RANK": "0", "FAULT_TEST_SLOW_CATCH_S": "30"})
    t = job.stamp(r"TUTTI_FAULT='1:throw@collective=5': throwing")
    expect(job.rc == 14, "exit code 14 (a deadline), got %d" % job.rc, job)
    expect_in(r"CAUGHT rank 1", job.err)
    expect_in(r"tutti \[rank 1\]: TIMEOUT: MPI_Finalize at the process's exit \(every rank waits there for all the "
              r"others\) did not complete within its deadline of 6.0 s .*Not there: rank 0\.", job.err)
    expect_in(r"rank 0: past its Job \(an error every rank raised\), not yet at MPI_Finalize", job.err)
    expect_fast(job, t, 6 + 2 * BOUND)  # the deadline, its report, and the ending on a loaded machine


def throw_rank0():
    throw_at(0, 2)


def throw_last(np):
    throw_at(np - 1, np)


def throw_before_first():
    # After the communicators exist, before any collective.
    throw_at(1, 2, "ready")


def terminate():
    fault = "1:throw@collective=5"
    job = run(["terminate"], 3, {"TUTTI_FAULT": fault})
    t = job.stamp(r"TUTTI_FAULT='%s': throwing" % re.escape(fault))
    expect(job.rc == 134, "exit code 134 (an exception escaped main), got %d" % job.rc, job)
    expect_fast(job, t)
    expect_in(r"tutti \[rank 1\]: an exception escaped \(std::terminate\): tutti \[rank 1\].*fault injected", job.err)
    for r in (0, 2):
        expect_in(r"tutti \[rank %d\]: rank 1 is ending the job: an exception escaped" % r, job.err)


def abort():
    job = run(["abort"], 3)
    t = job.stamp(r"ABORT rank 2")
    expect(job.rc == 7, "exit code 7 (Job::abort's), got %d" % job.rc, job)
    expect_fast(job, t)
    expect_in(r"tutti \[rank 2\]: aborting the job: the test asked for it", job.err)
    for r in (0, 1):
        expect_in(r"tutti \[rank %d\]: rank 2 is ending the job: aborting the job: the test asked for it" % r, job.err)
    expect("DONE" not in job.out, "nobody finishes", job)


def stall_start():
    # Rank 1 stops before MPI_Init: the others wait in MPI_Init until the deadline.
    fault = "1:stall@start"
    job = run(["idiom"], 3, {"TUTTI_FAULT": fault, "TUTTI_TIMEOUT_S": str(DEADLINE)})
    t = job.stamp(r"TUTTI_FAULT='%s': stopping" % re.escape(fault))
    expect(job.rc == 14, "exit code 14 (a deadline), got %d" % job.rc, job)
    expect_fast(job, t, DEADLINE + BOUND)
    expect_in(r"TIMEOUT: the job's start-up \(MPI_Init", job.err)
    expect_in(r"Not there: rank 1\.", job.err)
    expect_in(r"rank 1: starting its Job \(before MPI_Init\) for [0-9.]+ s \[process \d+ is stopped", job.err)
    expect_in(r"rank 0: in MPI_Init", job.err)


def stall_init():
    # Rank 1 stops inside the start-up's deadline (in MPI_Init): the report names it as stopped,
    # and when mpirun's kill continues it (SIGCONT, then SIGTERM), its own expired deadline
    # does not blame rank 0, which is ending the job (was "Not there: rank 0").
    fault = "1:stall@init"
    job = run(["idiom"], 3, {"TUTTI_FAULT": fault, "TUTTI_TIMEOUT_S": str(DEADLINE)})
    t = job.stamp(r"TUTTI_FAULT='%s': stopping" % re.escape(fault))
    expect(job.rc == 14, "exit code 14 (a deadline), got %d" % job.rc, job)
    expect_fast(job, t, DEADLINE + BOUND)
    expect_in(r"tutti \[rank 0\]: TIMEOUT: the job's start-up \(MPI_Init.* Stopped: rank 1 \(SIGSTOP", job.err)
    expect_in(r"rank 1: in MPI_Init for [0-9.]+ s \[process \d+ is stopped", job.err)
    expect(re.search(r"Not there: rank 0", job.err) is None, "no rank blames rank 0, which reported", job)
    expect(len(re.findall(r"Where each rank is", job.err)) == 1, "one report", job)


def one_sided(what):
    # Rank 0 alone calls what every rank must (Job::summary, an allreduce); the others end their
    # Jobs. With the default deadline (300 s) the job ends within kAbandonedWait (5 s) + BOUND,
    # naming the ranks that left.
    job = run(["one_sided", what], 3, {}, env_drop=("TUTTI_TIMEOUT_S",))
    t = job.stamp(r"ALONE")
    expect(job.rc == 14, "exit code 14 (a wait that cannot end), got %d" % job.rc, job)
    expect_fast(job, t, 5.0 + BOUND)
    headline = r"Job::summary \(every rank waits there" if what == "summary" else r"collective #\d+ allreduce"
    expect_in(r"tutti \[rank 0\]: TIMEOUT: %s.* cannot complete\. Ranks 1, 2 have ended their Jobs \(in MPI_Finalize\) "
              r"without it: a call that every rank must make was made by some ranks only" % headline, job.err)
    expect_in(r"of its deadline of 300\.0 s", job.err)
    expect_in(r"rank 1: in MPI_Finalize", job.err)


def stall_collective(private_board=False):
    # Rank 2 stops before its 5th collective, after the communicators exist.
    fault = "2:stall@collective=5"
    env = {"TUTTI_FAULT": fault, "TUTTI_TIMEOUT_S": str(DEADLINE)}
    if private_board:
        env["TUTTI_PROGRESS_BOARD"] = "private"  # as if every rank had a host of its own
    job = run(["idiom"], 3, env)
    t = job.stamp(r"TUTTI_FAULT='%s': stopping" % re.escape(fault))
    expect(job.rc == 14, "exit code 14 (a deadline), got %d" % job.rc, job)
    expect_fast(job, t, DEADLINE + BOUND)
    reports = re.findall(r"tutti \[rank \d+\]: TIMEOUT: collective", job.err)
    expect(len(reports) == 1, "one timeout report, got %d" % len(reports), job)
    expect_in(r"tutti \[rank 0\]: TIMEOUT: collective #5 allreduce\(sum\) 1000 x f32 .* issued by 'step 4' on backend "
              r"mpi did not complete .* Not reached by rank 2\.", job.err)
    expect_in(r"rank 0: in it for", job.err)
    expect_in(r"rank 1: in it for", job.err)
    if private_board:
        expect_in(r"rank 2: no answer \(stopped, hung outside MPI", job.err)
    else:
        expect_in(r"rank 2: not there: last in #4 allreduce\(sum\) 1000 x f32 .* issued by 'step 3' \(completed\) "
                  r"\[process \d+ is stopped", job.err)
    expect_in(r"tutti \[rank 1\]: rank 0 is ending the job: TIMEOUT: collective #5", job.err)


def stall_group():
    # Nodes of 2 ranks, hierarchical allreduces: rank 3 stops before its 19th collective, the
    # step across nodes of step 4 (4 collectives per step). Its partners wait in the groups'
    # collectives (rank 1 across nodes, ranks 0 and 2 in their nodes) until the deadline; the
    # whole job ends.
    fault = "3:stall@collective=19"
    job = run(["groups"], 4, {"TUTTI_FAULT": fault, "TUTTI_TIMEOUT_S": str(DEADLINE)})
    t = job.stamp(r"TUTTI_FAULT='%s': stopping" % re.escape(fault))
    expect(job.rc == 14, "exit code 14 (a deadline), got %d" % job.rc, job)
    expect_fast(job, t, DEADLINE + BOUND)
    expect_in(r"tutti \[rank \d\]: TIMEOUT: collective #\d+ \w+(\(sum\))? 500 x f32 .* issued by 'step 4 \[", job.err)
    expect("DONE rank" not in job.out, "no rank may finish", job)


def exit_collective():
    fault = "1:exit@collective=5"
    job = run(["idiom"], 2, {"TUTTI_FAULT": fault})
    t = job.stamp(r"TUTTI_FAULT='%s': exiting" % re.escape(fault))
    expect(job.rc != 0, "the job must fail", job)
    expect_fast(job, t)


def mismatch_agreed():
    # Both sizes above the eager limit: the agreement before the data catches it on every
    # rank. With Open MPI's default single-copy mechanism (CMA), unagreed, this overflows.
    job = run(["mismatch", "16384", "100000"], 2, env_drop=["OMPI_MCA_btl_vader_single_copy_mechanism"])
    no_memory_errors(job)
    expect(job.rc == 0, "every rank goes on after the error", job)
    for r in (0, 1):
        expect_in(r"MISMATCH rank %d: .*collective mismatch: rank 0 issued #1 allreduce\(sum\) 16384 x f32 .* but "
                  r"rank 1 issued #1 allreduce\(sum\) 100000 x f32" % r, job.out)
        expect_in(r"GUARD rank %d: intact" % r, job.out)
        expect_in(r"DONE rank %d" % r, job.out)


def mismatch_small_large():
    # Rank 0's collective is small (no agreement), rank 1's large (agreement first): they wait
    # for each other, and the deadline ends the job. Nothing is written out of bounds.
    job = run(["mismatch", "100", "20000"], 2, {"TUTTI_TIMEOUT_S": str(DEADLINE)},
              env_drop=["OMPI_MCA_btl_vader_single_copy_mechanism"])
    no_memory_errors(job)
    expect(job.rc == 14, "exit code 14 (a deadline), got %d" % job.rc, job)
    expect(job.gone_at - job.started_at < DEADLINE + 10, "ended within the deadline", job)
    expect_in(r"TIMEOUT: collective #1 allreduce\(sum\) (100|20000) x f32", job.err)
    expect_in(r"run with TUTTI_DEBUG=1 to compare them", job.err)


def mismatch_debug():
    job = run(["mismatch", "100", "200"], 3, {"TUTTI_DEBUG": "1"}, env_drop=["OMPI_MCA_btl_vader_single_copy_mechanism"])
    no_memory_errors(job)
    expect(job.rc == 0, "every rank goes on after the error", job)
    for r in range(3):
        expect_in(r"MISMATCH rank %d: .*collective mismatch: rank 0 issued #1 allreduce\(sum\) 100 x f32 .* but rank 1 "
                  r"issued #1 allreduce\(sum\) 200 x f32" % r, job.out)
        expect_in(r"GUARD rank %d: intact" % r, job.out)


def nccl_throw_last():
    # The emulated device: rank 2 leaves by an exception; its NCCL comm is aborted, not destroyed.
    throw_at(2, 3)


def nccl_stall_collective():
    # The nccl backend's deadline, through the same watchdog: rank 2 stops before its 5th
    # collective; rank 0 reports, the NCCL comms are aborted, the job ends.
    fault = "2:stall@collective=5"
    job = run(["idiom"], 3, {"TUTTI_FAULT": fault, "TUTTI_TIMEOUT_S": str(DEADLINE)})
    t = job.stamp(r"TUTTI_FAULT='%s': stopping" % re.escape(fault))
    expect(job.rc == 14, "exit code 14 (a deadline), got %d" % job.rc, job)
    expect_fast(job, t, DEADLINE + BOUND)
    expect_in(r"tutti \[rank 0\]: TIMEOUT: collective #5 allreduce\(sum\) 1000 x f32 .* on backend nccl did not "
              r"complete .* Not reached by rank 2\.", job.err)
    expect_in(r"rank 2: not there: last in #4 .* \[process \d+ is stopped", job.err)


def hello_ranks():
    # The example's try/catch idiom prints the failing rank's message.
    fault = "1:throw@collective=1"
    job = run(["--device", "cpu"], 2, {"TUTTI_FAULT": fault}, program=ARGS.hello)
    t = job.stamp(r"TUTTI_FAULT='%s': throwing" % re.escape(fault))
    expect(job.rc == 1, "hello_ranks returns 1 on an error, got %d" % job.rc, job)
    expect_fast(job, t)
    expect_in(r"(?m)^tutti \[rank 1\] fault\.cc:\d+: fault injected by TUTTI_FAULT='1:throw@collective=1'", job.err)
    expect_in(r"tutti \[rank 0\]: rank 1 failed: .*fault injected", job.err)


SCENARIOS = {
    "throw_rank0.np2": throw_rank0,
    "throw_alike.np2": throw_alike,
    "throw_alike_catch_hangs.np2": throw_alike_catch_hangs,
    "stall_init.np3": stall_init,
    "one_sided_summary.np3": lambda: one_sided("summary"),
    "one_sided_collective.np3": lambda: one_sided("collective"),
    "throw_last.np3": lambda: throw_last(3),
    "throw_last.np4": lambda: throw_last(4),
    "throw_before_first.np2": throw_before_first,
    "terminate.np3": terminate,
    "abort.np3": abort,
    "stall_start.np3": stall_start,
    "stall_collective.np3": stall_collective,
    "stall_collective_remote.np3": lambda: stall_collective(private_board=True),
    "exit_collective.np2": exit_collective,
    "stall_group.np4": stall_group,
    "mismatch_agreed.np2": mismatch_agreed,
    "mismatch_small_large.np2": mismatch_small_large,
    "mismatch_debug.np3": mismatch_debug,
    "hello_ranks.np2": hello_ranks,
    "nccl_throw_last.np3": nccl_throw_last,
    "nccl_stall_collective.np3": nccl_stall_collective,
}

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--program", required=True)
    parser.add_argument("--hello")
    parser.add_argument("--mpiexec", default="mpiexec")
    ARGS = parser.parse_args()
    try:
        SCENARIOS[ARGS.scenario]()
    except AssertionError as e:
        print("FAILED: %s" % e)
        sys.exit(1)
    print("PASSED")
