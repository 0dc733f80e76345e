#!/usr/bin/env python3
"""scripts/tutti-launch's decisions, with a stand-in for mpirun (no cluster, no MPI: seconds).

The stand-in answers the launcher's probes (`-H HOST -np 1 true`) from a file of hosts that are
down or hang, and plays one scripted attempt per job launch: it records the hosts, ranks and
environment it was given, writes a checkpoint whose "train.step" is the scripted one (tutti's
checkpoint format) and the status file that train::Run would ($TUTTI_STATUS_FILE: the steps
done, where it resumed, the checkpoint), prints a line of output, changes which hosts answer,
and exits with the scripted code (or 75 on SIGUSR1, as a trainer stopped by a signal). Each case
asserts the launcher's exit code, the attempts it made (hosts, ranks, arguments, environment) and
what it said.

    launch_test.py --launcher scripts/tutti-launch [CASE...]
    launch_test.py --list      (ctest runs each case as a test of its own: cluster_test.launch_logic.CASE)
"""
import argparse
import json
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time

FAKE_MPIRUN = r'''#!/usr/bin/env python3
import json, os, signal, struct, sys, time
state = os.environ["FAKE_STATE"]
args = sys.argv[1:]
def down():
    try:
        return dict(l.split() for l in open(os.path.join(state, "down")) if l.strip())
    except FileNotFoundError:
        return {}
def set_down(host, how):
    d = down()
    if how is None:
        d.pop(host, None)
    else:
        d[host] = how
    with open(os.path.join(state, "down"), "w") as f:
        f.writelines("%s %s\n" % kv for kv in d.items())
if args == ["--version"]:
    print("mpirun (Open MPI) 4.1.4")
    sys.exit(0)
if "-H" in args:  # a probe: -H HOST -np 1 true
    how = down().get(args[args.index("-H") + 1])
    if how == "orphan":  # a daemon started elsewhere (in its own session) keeps the output open
        import subprocess
        subprocess.Popen(["sleep", "8"], start_new_session=True)
        time.sleep(60)
    if how == "hang":
        time.sleep(60)
    if how:
        print("ORTE was unable to reliably start one or more daemons.")
        sys.exit(1)
    sys.exit(0)
hostfile = args[args.index("--hostfile") + 1]
np_ = int(args[args.index("-np") + 1])
program = args[args.index("-np") + 2:]
log = os.path.join(state, "log")
attempt = sum(1 for _ in open(log)) if os.path.exists(log) else 0
env = {k: os.environ.get(k) for k in ("TUTTI_RESUME", "TUTTI_STATUS_FILE", "TUTTI_ATTEMPT_ID", "TUTTI_START_GATE")}
with open(log, "a") as f:
    f.write(json.dumps({"hosts": [l.split()[0] for l in open(hostfile)], "np": np_, "args": program,
                        "mpirun_args": args[:args.index("--hostfile")], "env": env, "started": time.time()}) + "\n")
script = json.load(open(os.path.join(state, "script.json")))
a = script[min(attempt, len(script) - 1)]
import atexit
atexit.register(lambda: open(os.path.join(state, "ends"), "a").write("%d %f\n" % (attempt, time.time())))
signal.signal(signal.SIGUSR1, lambda *_: sys.exit(75))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # as mpirun, after ending its ranks and daemons
gate = env["TUTTI_START_GATE"]
if gate:  # started ahead: set up, then wait at the gate (src/comm/job.cc)
    if a.get("no_ready"):
        sys.exit(1)
    time.sleep(a.get("ready_after", 0))
    open(gate + ".ready", "w").write("ready\n")
    while not os.path.exists(gate):
        time.sleep(0.01)
ckpt_file = os.path.join(state, "ckpt", "checkpoint.tckp")
status = {"format": "tutti-status 1", "state": a.get("state", "running"), "attempt_id": env["TUTTI_ATTEMPT_ID"],
          "first_step": a.get("from", 1) - 1, "resumed_from": "checkpoint" if a.get("from", 1) > 1 else None,
          "checkpoint": ckpt_file, "first_step_done_unix": time.time() if a.get("steps") else None,
          "accounting": {"attempts": attempt + 1, "goodput": 0.5, "rank_hours": 0.25, "lost_seconds": 3.0},
          "preempted_hosts": a.get("preempted", [])}
if a.get("steps"):
    status["step"] = a["steps"]
if env["TUTTI_STATUS_FILE"]:
    with open(env["TUTTI_STATUS_FILE"] + ".tmp", "w") as f:
        json.dump(status, f)
    os.rename(env["TUTTI_STATUS_FILE"] + ".tmp", env["TUTTI_STATUS_FILE"])
print("the program's own output, attempt %d" % (attempt + 1), flush=True)
if "ckpt" in a:  # a checkpoint with train.step (src/io/checkpoint.cc's layout)
    name, meta_k, meta_v = b"train.step", b"program", b"fake"
    entries = struct.pack("<I", len(name)) + name + struct.pack("<BBHQQ", 4, 0, 0, 256, 8)
    meta = struct.pack("<I", len(meta_k)) + meta_k + struct.pack("<I", len(meta_v)) + meta_v
    header = b"TUTTICKP" + struct.pack("<IIII", 1, 1, 1, 0) + struct.pack("<QQII", 256, 268, 0, 0) + meta + entries
    with open(os.path.join(state, "ckpt", "checkpoint.tckp"), "wb") as f:
        f.write(header.ljust(256, b"\0") + struct.pack("<q", a["ckpt"]) + b"\0" * 4)
for h in a.get("down", []):
    set_down(h, "down")
for h in a.get("hang", []):
    set_down(h, "hang")
for h in a.get("up", []):
    set_down(h, None)
if "up_after" in a:
    time.sleep(a["up_after"])
    set_down(a["up_host"], None)
time.sleep(a.get("sleep", 0))
sys.exit(a.get("rc", 0))
'''


class Case:
    def __init__(self, hosts, script, down=None):
        self.dir = tempfile.TemporaryDirectory(prefix="launch_test-")
        d = self.dir.name
        os.mkdir(os.path.join(d, "ckpt"))
        with open(os.path.join(d, "hosts"), "w") as f:
            f.write("# a comment\n" + "".join("%s\n" % h for h in hosts))
        with open(os.path.join(d, "script.json"), "w") as f:
            json.dump(script, f)
        with open(os.path.join(d, "down"), "w") as f:
            f.writelines("%s %s\n" % kv for kv in (down or {}).items())
        self.ckpt = os.path.join(d, "ckpt")
        self.mpirun = os.path.join(d, "mpirun")
        with open(self.mpirun, "w") as f:
            f.write(FAKE_MPIRUN)
        os.chmod(self.mpirun, 0o755)

    def launch(self, *opts, program_args=(), timeout=30, signal_after=None):
        # --relaunch-probe-timeout 4: the probe cut then waits 1 s at least (a quarter of it), so
        # that a live stand-in host whose probe (a Python process) starts slowly on a loaded
        # machine is not cut; a CI rehearsal once cut one at 0.30 s with the 2 s default.
        d = self.dir.name
        cmd = [sys.executable, ARGS.launcher, "--hostfile", os.path.join(d, "hosts"), "--mpirun", self.mpirun,
               "--retry-delay", "0.05", "--probe-timeout", "2", "--relaunch-probe-timeout", "4", *opts, "--", "prog",
               "--checkpoint-dir",
               os.path.join(d, "ckpt"), *program_args]
        t = time.monotonic()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "FAKE_STATE": d})
        if signal_after is not None:  # once the job runs (its attempt is logged), and signal_after s more
            while not os.path.exists(os.path.join(d, "log")) and p.poll() is None:
                time.sleep(0.02)
            time.sleep(signal_after)
            p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=timeout)
        self.seconds = time.monotonic() - t
        self.rc, self.out, self.err = p.returncode, out, err
        try:
            self.attempts = [json.loads(l) for l in open(os.path.join(d, "log"))]
        except FileNotFoundError:
            self.attempts = []
        print("$ %s\n(exit %d, %.1f s)\n%s" % (" ".join(opts), p.returncode, self.seconds, err))
        return self

    def hosts(self):
        return ["".join(a["hosts"]) for a in self.attempts]


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def expect_said(c, text):
    expect(text in c.err, "the launcher said %r" % text)


# ---- cases -----------------------------------------------------------------------------------

def relaunch_on_survivors():
    """A failure (exit 137) that takes host b away: relaunched on a, c, d with --resume auto,
    saying that b does not answer and how many steps were lost."""
    c = Case("abcd", [{"steps": 25, "ckpt": 20, "rc": 137, "down": ["b"]}, {"from": 21, "steps": 30}]).launch()
    expect(c.rc == 0, "exit 0 once the job completes, got %d" % c.rc)
    expect(c.hosts() == ["abcd", "acd"], "attempts on abcd, then acd: %s" % c.hosts())
    expect([a["np"] for a in c.attempts] == [4, 3], "4 ranks, then 3")
    expect(all(a["args"] == ["prog", "--checkpoint-dir", c.ckpt] for a in c.attempts), "the command as given")
    expect(all(a["env"]["TUTTI_RESUME"] == "auto" for a in c.attempts), "TUTTI_RESUME=auto set")
    expect(all(a["env"]["TUTTI_STATUS_FILE"] == os.path.join(c.ckpt, "status.json") for a in c.attempts),
           "the status file in the program's --checkpoint-dir: %s" % [a["env"] for a in c.attempts])
    expect(len({a["env"]["TUTTI_ATTEMPT_ID"] for a in c.attempts}) == 2, "an id per attempt")
    expect(all(a["mpirun_args"][-6:] == ["-x", "TUTTI_STATUS_FILE", "-x", "TUTTI_RESUME", "-x", "TUTTI_ATTEMPT_ID"]
               for a in c.attempts), "exported to every rank with Open MPI's -x: %s" % c.attempts[0]["mpirun_args"])
    expect_said(c, "host b does not answer (exit 1: ORTE was unable")
    expect_said(c, "attempt 1 failed (exit 137)")
    expect_said(c, "5 step(s) lost (last step done 25, checkpoint at step 20)")
    expect_said(c, "attempt 2: 3 rank(s) on 3 of 4 host(s) (a, c, d), from the checkpoint at step 20")
    expect_said(c, "the job resumed at step 20 from the checkpoint file: 5 step(s) lost (last step done before 25)")
    expect_said(c, "done: exit 0 after 2 attempt(s)")
    expect_said(c, "goodput 50.0%, 0.25 rank-hour(s) over 2 attempt(s), 3.0 s lost to failures")
    expect("the program's own output, attempt 2" in c.out, "the program's output passed through")


def host_comes_back():
    """b is lost at the first failure and answers again at the second: it rejoins."""
    c = Case(["a slots=2", "b slots=2"],
             [{"rc": 1, "down": ["b"]}, {"rc": 1, "up": ["b"]}, {"rc": 0}]).launch()
    expect(c.rc == 0 and c.hosts() == ["ab", "a", "ab"], "ab, a, ab: %s (exit %d)" % (c.hosts(), c.rc))
    expect([a["np"] for a in c.attempts] == [4, 2, 4], "ranks from the slots: 4, 2, 4")
    expect_said(c, "host b answers again: it joins this attempt")


def not_relaunched():
    """Exit 3 (diverged) and 2 (bad command line) end the launcher with the same code, at once;
    --resume named by the command is left alone."""
    for code, said in ((3, "the run diverged (exit 3)"), (2, "refused its command line (exit 2)")):
        c = Case("ab", [{"rc": code}, {"rc": 0}]).launch(program_args=["--resume", "yes"])
        expect(c.rc == code and len(c.attempts) == 1, "exit %d after one attempt, got %d after %d" % (
            code, c.rc, len(c.attempts)))
        expect(c.attempts[0]["args"][-2:] == ["--resume", "yes"] and c.attempts[0]["env"]["TUTTI_RESUME"] is None,
               "the command's own --resume kept, no TUTTI_RESUME: %s" % c.attempts[0])
        expect_said(c, said)


def gives_up():
    """Failures every time: after --max-failures within --window it gives up with exit 1; with
    failures further apart than the window it keeps going; the same failure before any step 3
    times in a row gives up whatever --max-failures says."""
    c = Case("ab", [{"rc": 1, "steps": 2}]).launch("--max-failures", "3", "--window", "10")
    expect(c.rc == 1 and len(c.attempts) == 3, "exit 1 after 3 attempts, got %d after %d" % (c.rc, len(c.attempts)))
    expect_said(c, "giving up: 3 failure(s) within 10 minute(s) (--max-failures 3 --window 10): failed (exit 1)")
    # 0.3 s apart, a window of 0.1 s (0.00167 min): never 2 in the window.
    c = Case("ab", [{"rc": 1, "sleep": 0.3, "steps": 2}] * 4 + [{"rc": 0}]).launch("--max-failures", "2", "--window",
                                                                                     "0.00167")
    expect(c.rc == 0 and len(c.attempts) == 5, "5 attempts, then done: exit %d after %d" % (c.rc, len(c.attempts)))
    # The same failure before any step, on the same hosts, 3 times in a row: the program's start-up
    # fails (an unwritable --json, say); a relaunch would repeat it, whatever --max-failures allows.
    c = Case("ab", [{"rc": 1}]).launch("--max-failures", "100")
    expect(c.rc == 1 and len(c.attempts) == 3, "exit 1 after 3 attempts, got %d after %d" % (c.rc, len(c.attempts)))
    expect_said(c, "giving up: attempts 1, 2, 3 all failed before their first step, alike (exit 1) on the same hosts")
    # Interrupted by a step done, or by other hosts: no such giving up.
    c = Case("ab", [{"rc": 1}, {"rc": 1}, {"rc": 1, "steps": 1}, {"rc": 1}, {"rc": 1}, {"rc": 0}]).launch(
        "--max-failures", "100")
    expect(c.rc == 0 and len(c.attempts) == 6, "6 attempts, then done: exit %d after %d" % (c.rc, len(c.attempts)))


def stop_signal():
    """Exit 75: relaunched by default; --on-stop exit ends with 75; a stop asked of the launcher
    (SIGTERM) reaches the job as SIGUSR1 and ends the launcher with 75, with no relaunch."""
    c = Case("ab", [{"rc": 75, "steps": 7, "ckpt": 7}, {"rc": 0}]).launch()
    expect(c.rc == 0 and len(c.attempts) == 2, "75 relaunched: exit %d after %d" % (c.rc, len(c.attempts)))
    expect_said(c, "stopped by a signal with a checkpoint (exit 75)")
    expect_said(c, "0 step(s) lost (last step done 7, checkpoint at step 7)")
    c = Case("ab", [{"rc": 75}, {"rc": 0}]).launch("--on-stop", "exit")
    expect(c.rc == 75 and len(c.attempts) == 1, "--on-stop exit: 75 after one attempt")
    c = Case("ab", [{"sleep": 30, "rc": 1}, {"rc": 0}]).launch(signal_after=0.5)
    expect(c.rc == 75 and len(c.attempts) == 1, "stopped by SIGTERM: exit %d after %d attempt(s)" % (
        c.rc, len(c.attempts)))
    expect(c.seconds < 10, "the job stopped at once (SIGUSR1), not after its 30 s")
    expect_said(c, "SIGTERM: asking the job to stop")


def unreachable_host():
    """A host that never answers (the probe hangs) is skipped after --probe-timeout, with a
    message, and the job runs on the others."""
    c = Case("abc", [{"rc": 0}], down={"b": "hang"}).launch()
    expect(c.rc == 0 and c.hosts() == ["ac"], "ran on a, c: %s (exit %d)" % (c.hosts(), c.rc))
    expect_said(c, "host b does not answer (no answer within 2 s): skipped")
    expect(c.seconds < 8, "the hanging probe was cut at 2 s (took %.1f s)" % c.seconds)
    c = Case("ab", [{"rc": 0}], down={"a": "down", "b": "down"}).launch("--max-failures", "2")
    expect(c.rc == 1 and not c.attempts, "no host answers: gave up without launching")
    expect_said(c, "giving up: 2 failure(s)")
    expect_said(c, "no host answers")


def probe_cut():
    """A probe whose host left a process holding its output (Open MPI's daemon, started there in
    a session of its own) still ends at --probe-timeout, not when that process does (8 s)."""
    c = Case("ab", [{"rc": 0}], down={"b": "orphan"}).launch()
    expect(c.rc == 0 and c.hosts() == ["a"], "ran on a: %s (exit %d)" % (c.hosts(), c.rc))
    expect_said(c, "host b does not answer (no answer within 2 s): skipped")
    expect(c.seconds < 5, "the probe was cut at 2 s, not at the orphan's end (took %.1f s)" % c.seconds)


def relaunch_probe_timeout():
    """Before a relaunch, a host lost in the failure (its probe hangs) is given up once the others
    have answered and twice as long again has passed, and a quarter of --relaunch-probe-timeout
    (5 s here): well before that timeout. With two hosts silent, one silent and one that said no, or
    none answering, the probes get the whole timeout: the answers so far may be only the
    launcher's own host's, or a lost host's no, which come back sooner than a live remote host's
    on a loaded machine. The first probe gets --probe-timeout 10: it is not what is tested, and
    under ctest -j4 on 2 cores the fake hosts' first answers once took more than the default 2 s."""
    c = Case("abc", [{"steps": 5, "rc": 137, "hang": ["b"]}, {"rc": 0}]).launch("--probe-timeout", "10", "--relaunch-probe-timeout", "5")
    expect(c.rc == 0 and c.hosts() == ["abc", "ac"], "abc, then ac: %s (exit %d)" % (c.hosts(), c.rc))
    said = re.search(r"host b does not answer \(no answer within ([0-9.]+) s; the others answered within "
                     r"([0-9.]+) s\): skipped", c.err)
    expect(said is not None, "the launcher said why b was given up so soon")
    cut, others = float(said.group(1)), float(said.group(2))
    expect(abs(cut - max(2 * others, others + 0.2, 5 / 4)) < 0.011 and cut < 2.5,
           "cut at %s s, the others in %s s" % (cut, others))
    ended = float(open(os.path.join(c.dir.name, "ends")).readline().split()[1])
    expect(c.attempts[1]["started"] - ended < 3, "relaunched %.2f s after the failure (not 5 s)" % (
        c.attempts[1]["started"] - ended))
    c = Case("abcd", [{"steps": 5, "rc": 137, "hang": ["b", "c"], "down": ["d"]}, {"rc": 0}]).launch(
        "--probe-timeout", "10", "--relaunch-probe-timeout", "0.6")
    expect(c.rc == 0 and c.hosts() == ["abcd", "a"], "abcd, then a: %s (exit %d)" % (c.hosts(), c.rc))
    expect_said(c, "host b does not answer (no answer within 0.6 s): skipped")
    expect_said(c, "host c does not answer (no answer within 0.6 s): skipped")
    c = Case("abc", [{"steps": 5, "rc": 137, "hang": ["b"], "down": ["c"]}, {"rc": 0}]).launch(
        "--probe-timeout", "10", "--relaunch-probe-timeout", "0.6")
    expect(c.rc == 0 and c.hosts() == ["abc", "a"], "abc, then a: %s (exit %d)" % (c.hosts(), c.rc))
    expect_said(c, "host b does not answer (no answer within 0.6 s): skipped")
    c = Case("a", [{"steps": 5, "rc": 137}, {"rc": 0}]).launch("--probe-timeout", "10", "--relaunch-probe-timeout", "0.6")
    expect(c.rc == 0 and c.hosts() == ["a", "a"], "one host: relaunched on it: %s (exit %d)" % (c.hosts(), c.rc))
    c = Case("ab", [{"steps": 5, "rc": 137, "hang": ["a", "b"]}, {"rc": 0}]).launch(
        "--probe-timeout", "10", "--relaunch-probe-timeout", "0.4", "--max-failures", "2")
    expect(c.rc == 1 and c.hosts() == ["ab"], "no host answers after the failure: gave up (exit %d)" % c.rc)
    expect_said(c, "host a does not answer (no answer within 0.4 s): skipped")


def kill_grace():
    """Open MPI's odls_base_sigkill_timeout for the job: --kill-grace (0 by default), none with
    --kill-grace -1 or when --mpirun-arg sets it, and never for the probes."""
    def grace(*opts):
        c = Case("ab", [{"rc": 0}]).launch(*opts)
        expect(c.rc == 0 and len(c.attempts) == 1, "ran once (exit %d)" % c.rc)

        return c.attempts[0]["mpirun_args"][:-6]  # the last six: -x for the environment (relaunch_on_survivors)

    expect(grace() == ["--mca", "odls_base_sigkill_timeout", "0"], "0 by default: %s" % grace())
    expect(grace("--kill-grace", "1.5") == ["--mca", "odls_base_sigkill_timeout", "1.5"], "--kill-grace 1.5")
    expect(grace("--kill-grace", "-1") == [], "none with --kill-grace -1")
    own = ["--mpirun-arg=--mca", "--mpirun-arg=odls_base_sigkill_timeout", "--mpirun-arg=2"]
    expect(grace(*own) == ["--mca", "odls_base_sigkill_timeout", "2"], "the caller's own: %s" % grace(*own))


def grows_ahead():
    """--grow-every (prestart, the default): when b answers again, attempt 2 is started ahead on a,
    b, c, with a start gate, while attempt 1 trains; once it is at the gate, attempt 1 is stopped
    (SIGUSR1, exit 75) and the gate opened: no relaunch, no failure counted. A job started ahead
    that never gets to its gate is ended, and the launcher grows the plain way."""
    c = Case("abc", [{"up_after": 0.3, "up_host": "b", "sleep": 30, "rc": 1, "steps": 5, "ckpt": 5},
                     {"from": 6, "steps": 9}], down={"b": "down"})
    c.launch("--grow-every", "0.2", "--max-failures", "1")
    expect(c.rc == 0 and c.hosts() == ["ac", "abc"], "ac, then abc: %s (exit %d)" % (c.hosts(), c.rc))
    ahead = c.attempts[1]
    expect((ahead["env"]["TUTTI_START_GATE"] or "").endswith("status.json.gate-%s" % ahead["env"]["TUTTI_ATTEMPT_ID"]),
           "a start gate beside the status file: %s" % ahead["env"])
    expect(ahead["mpirun_args"][-4:] == ["-x", "TUTTI_START_GATE", "-x", "TUTTI_START_GATE_AT"],
           "exported: %s" % ahead["mpirun_args"])
    ends = dict(l.split() for l in open(os.path.join(c.dir.name, "ends")))
    expect(ahead["started"] < float(ends["0"]), "attempt 2 started before attempt 1 ended")
    expect_said(c, "starting attempt 2 ahead with 3 rank(s) on 3 host(s) (a, b, c)")
    expect_said(c, "attempt 2 is at its start gate after")
    expect_said(c, "attempt 1 stopped to grow (exit 75, last step done 5); attempt 2, started ahead")
    expect_said(c, "attempt 2 did its first step")
    expect_said(c, "done: exit 0 after 2 attempt(s)")
    expect(not [f for f in os.listdir(c.ckpt) if ".gate-" in f], "the gate files removed: %s" % os.listdir(c.ckpt))
    c = Case("abc", [{"up_after": 0.3, "up_host": "b", "sleep": 30, "rc": 1}, {"no_ready": True}, {"rc": 0}],
             down={"b": "down"})
    c.launch("--grow-every", "0.2", "--max-failures", "1")
    expect(c.rc == 0 and c.hosts() == ["ac", "abc", "abc"], "ac, abc (ahead, failed), abc: %s (exit %d)" % (
        c.hosts(), c.rc))
    expect_said(c, "attempt 2 did not reach its start gate (it exited): ended")
    expect_said(c, "stopping the job at its next step (SIGUSR1, with a checkpoint) to relaunch on more hosts")
    expect_said(c, "attempt 3: 3 rank(s) on 3 of 3 host(s)")


def ends_the_attempt_ahead():
    """The job completes while the attempt started ahead is still setting up: the launcher ends
    that attempt (SIGTERM to its mpirun, which takes its daemons down) before it exits, at once,
    and removes its gate files. (It used to exit and leave it running: on the emulated cluster
    its daemons held the launcher's output open for 20 s more.) The job runs 2.8 s: under the
    whole test suite the attempt ahead once had not started its stand-in by the end of a 1.3 s
    job, and in a CI rehearsal (2026-12-07) the launcher had started no attempt ahead by the end
    of the 2.8 s one: such a case runs once more."""
    for attempt in (1, 2):
        c = Case("abc", [{"up_after": 0.3, "up_host": "b", "sleep": 2.5, "rc": 0, "steps": 5},
                         {"ready_after": 30}], down={"b": "down"})
        c.launch("--grow-every", "0.2")
        if attempt == 1 and c.rc == 0 and c.hosts() == ["ac"]:
            print("the job ended before the launcher started the attempt ahead (a loaded machine): once more")
            continue
        break
    expect(c.rc == 0 and c.hosts() == ["ac", "abc"], "ac, then abc started ahead: %s (exit %d)" % (c.hosts(), c.rc))
    expect_said(c, "starting attempt 2 ahead")
    expect_said(c, "done: exit 0 after 1 attempt(s)")
    # Said by the watcher, or on the way out when the job ended first (a race either may win).
    expect_said(c, "did not reach its start gate (the job it was to replace ended): ended")
    ends = dict(l.split() for l in open(os.path.join(c.dir.name, "ends")))
    expect("1" in ends, "attempt 2 was ended (SIGTERM) rather than left running: %s" % ends)
    expect(c.seconds < 8, "the launcher exited at once, not after the attempt ahead (30 s): %.1f s" % c.seconds)
    expect(not [f for f in os.listdir(c.ckpt) if ".gate-" in f], "the gate files removed: %s" % os.listdir(c.ckpt))


def status_decides():
    """A job whose status file says the run completed (or diverged) but that exits otherwise (a
    rank lost in MPI_Finalize) is done (diverged): not relaunched. --status-file names the file;
    without it or a --checkpoint-dir the launcher says where the file is."""
    for state, rc in (("completed", 0), ("diverged", 3)):
        c = Case("ab", [{"steps": 9, "state": state, "rc": 1}, {"rc": 0}])
        status = os.path.join(c.dir.name, "elsewhere", "run-status.json")
        os.mkdir(os.path.dirname(status))
        c.launch("--status-file", status)
        expect(c.rc == rc and len(c.attempts) == 1, "%s: exit %d after one attempt, got %d after %d" % (
            state, rc, c.rc, len(c.attempts)))
        expect(c.attempts[0]["env"]["TUTTI_STATUS_FILE"] == status, "--status-file given to the job")
        expect_said(c, "attempt 1 ended with exit 1 after its run %s (status file)" % state)


def preemption_notice():
    """A job stopped by a preemption notice for host b (exit 75, the status names b): relaunched at
    once on a, c without counting a failure (--max-failures 1 would end at the first), b left out
    while --notice-holdoff lasts, and back after it (the attempt that failed took longer)."""
    c = Case("abc", [{"steps": 7, "ckpt": 7, "rc": 75, "preempted": ["b"]}, {"rc": 1, "sleep": 0.6},
                     {"rc": 1}, {"rc": 0}])
    c.launch("--max-failures", "3", "--notice-holdoff", "0.5", "--on-stop", "exit")
    expect(c.rc == 0 and c.hosts() == ["abc", "ac", "abc", "abc"], "abc, ac, abc, abc: %s (exit %d)" % (
        c.hosts(), c.rc))
    expect_said(c, "attempt 1 stopped with a checkpoint after a preemption notice for b (exit 75)")
    expect_said(c, "0 step(s) lost (last step done 7, checkpoint at step 7)")
    expect_said(c, "host b had a preemption notice: left out for")
    expect("relaunching (failure 1;" in c.err and "(failure 3;" not in c.err,
           "the notice counted no failure: %s" % c.err)


def help_is_documented():
    """Every option of --help has its row in docs/launcher.md, and so has every exit code the
    launcher names (its EXIT_* constants)."""
    docs = open(ARGS.docs).read()
    out = subprocess.run([sys.executable, ARGS.launcher, "--help"], capture_output=True, text=True, check=True).stdout
    table = out[out.index("\noptions:"):]  # argparse's list, after the description
    options = sorted(set(re.findall(r"^  (--[a-z][a-z-]*)", table, re.M)) - {"--help"})
    expect(len(options) >= 15, "the options of --help: %s" % options)
    missing = [o for o in options if not re.search(r"^\| `%s[ `]" % re.escape(o), docs, re.M)]
    expect(not missing, "options of --help without a row in %s: %s" % (ARGS.docs, missing))
    source = open(ARGS.launcher).read()
    names, values = re.search(r"^(EXIT_\w+(?:, EXIT_\w+)*) = ([\d, ]+)$", source, re.M).groups()
    codes = [int(v) for v in values.split(",")]
    expect(len(codes) == len(names.split(",")) == 5, "the EXIT_* constants: %s" % names)
    missing = [c for c in codes if not re.search(r"^\| %d \|" % c, docs, re.M)]
    expect(not missing, "exit codes without a row in %s: %s" % (ARGS.docs, missing))


def divides():
    """--divides B: the most ranks that divide B: 8 of 8 slots, then 4 of 6 for B = 16."""
    c = Case(["a slots=2", "b slots=2", "c slots=2", "d slots=2"], [{"rc": 1, "down": ["d"]}, {"rc": 0}]).launch(
        "--divides", "16")
    expect([a["np"] for a in c.attempts] == [8, 4], "8 ranks, then 4: %s" % [a["np"] for a in c.attempts])


def grows():
    """--grow-every --no-prestart: a host that answers again while the job runs stops it cleanly
    (SIGUSR1, exit 75) and the job is relaunched on every host, without counting a failure."""
    c = Case("abc", [{"up_after": 0.3, "up_host": "b", "sleep": 30, "rc": 1}, {"rc": 0}], down={"b": "down"}).launch(
        "--grow-every", "0.2", "--max-failures", "1", "--no-prestart")
    expect(c.rc == 0 and c.hosts() == ["ac", "abc"], "ac, then abc: %s (exit %d)" % (c.hosts(), c.rc))
    expect_said(c, "host(s) b answer again: stopping the job")
    expect(c.seconds < 10, "grew within seconds (%.1f s)" % c.seconds)


CASES = {f.__name__: f for f in (relaunch_on_survivors, host_comes_back, not_relaunched, gives_up, stop_signal,
                                 unreachable_host, probe_cut, relaunch_probe_timeout, kill_grace,
                                 status_decides, preemption_notice, help_is_documented, divides, grows,
                                 grows_ahead, ends_the_attempt_ahead)}

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--launcher", help="scripts/tutti-launch (needed unless --list)")
    parser.add_argument("--list", action="store_true", help="print the cases' names, one per line, and exit "
                        "(CMake makes a ctest test of each)")
    parser.add_argument("--docs", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs",
                                                       "launcher.md"), help="docs/launcher.md")
    parser.add_argument("cases", nargs="*", choices=[[]] + sorted(CASES), default=[])
    ARGS = parser.parse_args()
    if ARGS.list:
        print("\n".join(sorted(CASES)))
        sys.exit(0)
    if not ARGS.launcher:
        parser.error("--launcher is needed")
    failed = []
    for name in ARGS.cases or sorted(CASES):
        print("=== %s" % name)
        try:
            CASES[name]()
            print("--- %s: PASSED" % name)
        except AssertionError as e:
            print("--- %s: FAILED: %s" % (name, e))
            failed.append(name)
    if failed:
        print("FAILED: %s" % ", ".join(failed))
        sys.exit(1)
    print("PASSED")
