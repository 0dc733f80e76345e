"""What the trainers' end-to-end tests share: the data set (a smaller copy of Fashion-MNIST for
fast runs), the environment their runs get, and small file and process helpers. Imported by
train_fashion_mnist_test.py, train_gpt_test.py and train_on_emulated_gpu_test.py."""
import glob
import gzip
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import time


# For a launch that fails on purpose where no rank needs time after the first one exits (bad
# flags, refusals at the start, errors every rank raises alike). Once a rank exits with an error,
# mpirun gives the job's processes odls_base_sigkill_timeout (1 s) to end before each of its
# signals: `mpirun -n 1 train_fashion_mnist --no-such-flag` takes 2.2 s, 0.15 s with 0, which ends
# the other ranks at once. Not for a launch whose other ranks must still print or save (a stop
# signal, a failed save that every rank reports).
ENDS_AT_ONCE = {"OMPI_MCA_odls_base_sigkill_timeout": "0"}


def wait_for_file(p, path, timeout=120):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        if p.poll() is not None or time.time() > deadline:
            raise AssertionError("the run ended (or took too long) before writing %s" % path)
        time.sleep(0.01)


def kill_job(mpirun_pid, sig=signal.SIGKILL):
    """Sends `sig` to mpirun and to every rank at once: every process of mpirun's session (the test
    started it with start_new_session=True). Open MPI starts each rank in a process group of its
    own, so os.killpg(mpirun) reaches mpirun alone: the ranks went on training, and under load wrote
    the checkpoint of the step a killed run was never to reach (a flake of the memory-snapshot test
    on the emulated GPUs)."""
    out = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True).stdout
    for line in out.splitlines():
        pid, sid = (int(x) for x in line.split())
        if sid == mpirun_pid:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def kill_at_step(cmd, step, total, env=None):
    """Runs `cmd` (an mpirun of a trainer printing progress lines "step S/total") in a session of
    its own and kills it, mpirun and every rank, once a line says S >= `step`: no checkpoint file,
    no finish(). Returns the step it saw (0: the run ended first)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                         start_new_session=True)
    reached = 0
    try:
        for line in p.stdout:
            m = re.search(r"step (\d+)/%d" % total, line)
            if m and int(m.group(1)) >= step:
                reached = int(m.group(1))
                kill_job(p.pid)
                break
    finally:
        if p.poll() is None:
            kill_job(p.pid)
        p.wait()
        p.stdout.close()
    return reached


def ranks_of(mpirun_pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(mpirun_pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


FASHION_MNIST_DIR_ENV = "TUTTI_FASHION_MNIST_DIR"
# The runs take the peak for MFU as given (TUTTI_PEAK_TFLOPS, as --peak-tflops): on the CPU the
# trainers would otherwise measure the GEMM ceiling at their start and again at their end, ~0.5 s
# of CPU a rank and a run (20 steps on 2 ranks: 1.28 -> 0.66 s), for a figure that only the MFU
# tests look at; they clear it (MfuUnderKernelSets, train_gpt's test_summary_mfu_and_sample).
GIVEN_PEAK = {"TUTTI_PEAK_TFLOPS": "1"}
FULL_DATA_DIR = os.environ.get(FASHION_MNIST_DIR_ENV) or "/usr/share/datasets/fashion-mnist"


def data_dir():
    return os.environ.get(FASHION_MNIST_DIR_ENV) or FULL_DATA_DIR


def write_smaller_copy(dest, train_samples, test_samples=None, source=None):
    """A copy of Fashion-MNIST (from `source`, the data set the trainer reads by default) whose
    training set has only its first `train_samples` samples (a stale copy), and its test set the
    first `test_samples` (all when None)."""
    source = source or data_dir()
    os.makedirs(dest, exist_ok=True)
    for split, samples in (("train", train_samples), ("t10k", test_samples)):
        for kind, header in (("images-idx3-ubyte", 16), ("labels-idx1-ubyte", 8)):
            name = "%s-%s.gz" % (split, kind)
            if samples is None:
                shutil.copy(os.path.join(source, name), dest)
                continue
            with gzip.open(os.path.join(source, name), "rb") as f:
                data = f.read()
            row = (len(data) - header) // int.from_bytes(data[4:8], "big")
            with gzip.open(os.path.join(dest, name), "wb", compresslevel=1) as f:
                f.write(data[:4] + samples.to_bytes(4, "big") + data[8:header] + data[header:header + samples * row])


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)


def summary(path):
    with open(path) as f:
        return json.load(f)


class CrashCores:
    """A trainer that crashes (SIGSEGV, SIGABRT) while the tests run leaves a core file in the
    working directory (where kernel.core_pattern is the default "core"), and a failed run prints
    each one's backtraces, every thread's, with gdb: a crash seen once in CI (2026-12-07, a
    segfault in libgcc's unwinder on a thread of train_gpt, never reproduced) says where it was.
    The cores this run made are removed at the end."""

    LIMIT = 2 << 30  # bytes per core: enough for the test models' processes

    def __init__(self):
        self.started = time.time()
        self.before = set(self._cores())
        soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
        want = self.LIMIT if hard == resource.RLIM_INFINITY else min(self.LIMIT, hard)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_CORE, (want, hard))  # the trainers inherit it

    @staticmethod
    def _cores():
        return glob.glob(os.path.join(os.getcwd(), "core")) + glob.glob(os.path.join(os.getcwd(), "core.[0-9]*"))

    def finish(self, failed):
        for core in self._cores():
            if core in self.before and os.path.getmtime(core) < self.started:
                continue
            if failed:
                print(self.backtraces(core))
            os.remove(core)

    @staticmethod
    def backtraces(core):
        if shutil.which("gdb") is None:
            return "a core file, %s, and no gdb to read it (scripts/setup.sh installs it)" % core
        gdb = ["gdb", "-batch", "-iex", "set debuginfod enabled off"]
        head = subprocess.run([*gdb, "-c", core], capture_output=True, text=True).stdout
        m = re.search(r"Core was generated by `([^ ']+)", head)
        if m is None or not os.path.exists(m.group(1)):
            return "--- core %s (its program not found):\n%s" % (core, head)
        p = subprocess.run([*gdb, "-ex", "info threads", "-ex", "thread apply all bt 40", m.group(1), core],
                           capture_output=True, text=True, timeout=300)
        return "--- core %s of %s: every thread's backtrace\n%s" % (core, m.group(1), p.stdout)
