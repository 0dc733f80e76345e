#!/usr/bin/env python3
"""The trainer's GPU path end to end, on the emulated CUDA device (unittest).

train_fashion_mnist_emu is the trainer linked against libtutti_emu: with --device cuda its
model, data, DDP (nccl with a GPU per rank; mpi staging through pinned memory where ranks
share one) and optimizer run the CUDA code of libtutti on the emulated device. Each run is
compared with the same flags on the CPU build: fp32 and bf16 follow the CPU run to the
printed digits; fp16 (loss scaling on the device) within a small tolerance. --deterministic
gives the same bits on one GPU and on two.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import unittest

from trainer_harness import FASHION_MNIST_DIR_ENV, GIVEN_PEAK, CrashCores, kill_at_step, write_smaller_copy

ARGS = None
SUBSET = ["--train-subset", "2048", "--test-subset", "512", "--batch-size", "64", "--max-steps", "12", "--quiet"]


def train(binary, ranks, workdir, name, *flags, env=None):
    out = os.path.join(workdir, name + ".json")
    cmd = [ARGS.mpiexec, "-n", str(ranks), "--oversubscribe", binary, *SUBSET, "--json", out, *flags]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    if p.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s\n%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
    with open(out) as f:
        return json.load(f)


class TrainOnEmulatedGpu(unittest.TestCase):
    def setUp(self):
        self.dir = os.path.join(ARGS.workdir, self.id().split(".")[-1])
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)

    def compare(self, flags, devices, tolerance):
        cpu = train(ARGS.cpu_binary, 2, self.dir, "cpu", "--device", "cpu", *flags)
        gpu = train(ARGS.emu_binary, 2, self.dir, "gpu", "--device", "cuda", *flags,
                    env={"TUTTI_EMU_DEVICES": str(devices)})
        self.assertEqual(cpu["device"], "cpu")
        self.assertEqual(gpu["device"], "cuda:0")
        # A GPU per rank: nccl; one GPU shared by both ranks: mpi, staging through the host.
        self.assertEqual(gpu["backend"], "nccl" if devices >= 2 else "mpi")
        self.assertEqual(gpu["steps"], cpu["steps"])
        self.assertNotEqual(gpu["initial_train_loss"], gpu["final_train_loss"])
        for key in ("initial_train_loss", "final_train_loss"):
            self.assertAlmostEqual(gpu[key], cpu[key], delta=tolerance * abs(cpu[key]), msg=key)
        self.assertAlmostEqual(gpu["test_accuracy"], cpu["test_accuracy"], delta=0.01)
        return cpu, gpu

    def test_fp32_on_nccl_follows_the_cpu(self):
        self.compare([], devices=2, tolerance=1e-5)

    def test_bf16_adamw_with_accumulation_on_mpi_staging_follows_the_cpu(self):
        # One emulated GPU for two ranks: the job's backend is mpi, staging through the host.
        self.compare(["--precision", "bf16", "--optimizer", "adamw", "--accum-steps", "2"], devices=1,
                     tolerance=1e-3)

    def test_fp16_with_loss_scaling_stays_close(self):
        cpu, gpu = self.compare(["--precision", "fp16"], devices=2, tolerance=5e-3)
        self.assertEqual(gpu["skipped_steps"], cpu["skipped_steps"])

    def test_deterministic_mode_gives_the_same_bits_on_one_and_two_gpus(self):
        # The GPU path of DdpOptions::deterministic (the fixed-point kernels on the model's stream,
        # the int64 allreduce on nccl): 1 GPU and 2 GPUs, slices of 8, the same parameters.
        flags = ["--device", "cuda", "--max-micro-batch", "8", "--deterministic"]
        one = train(ARGS.emu_binary, 1, self.dir, "one", *flags, env={"TUTTI_EMU_DEVICES": "1"})
        two = train(ARGS.emu_binary, 2, self.dir, "two", *flags, env={"TUTTI_EMU_DEVICES": "2"})
        self.assertEqual(two["backend"], "nccl")
        self.assertEqual((one["accum_steps"], two["accum_steps"]), (8, 4))
        self.assertEqual(one["params_crc32"], two["params_crc32"])
        self.assertEqual(one["final_train_loss"], two["final_train_loss"])

class SnapshotsOnEmulatedGpu(unittest.TestCase):
    def test_a_killed_run_resumes_from_a_memory_snapshot_bit_for_bit(self):
        """bf16 ZeRO-1 on 2 emulated GPUs (nccl) with --snapshot-every 5: the parts are views of the
        device's master shards, copied after the model's stream; killed with SIGKILL after step 12,
        the run resumes from memory and ends bit for bit as the uninterrupted one."""
        d = os.path.join(ARGS.workdir, "snap")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        flags = ["--train-subset", "2048", "--test-subset", "512", "--batch-size", "64", "--precision", "bf16",
                 "--zero", "1", "--max-steps", "40"]
        ckpt = os.path.join(d, "ckpt")
        cmd = [ARGS.mpiexec, "-n", "2", "--oversubscribe", ARGS.emu_binary, *flags, "--device", "cuda",
               "--checkpoint-dir", ckpt, "--snapshot-every", "5", "--progress", "lines", "--progress-interval", "0.01"]
        reached = kill_at_step(cmd, 12, 40, env={**os.environ, "TUTTI_EMU_DEVICES": "2"})
        self.assertGreaterEqual(reached, 12, "the emulated run never reached step 12")
        self.assertFalse(os.path.exists(os.path.join(ckpt, "checkpoint.tckp")))
        # Resumed on the emulated GPUs: bit for bit the uninterrupted run (same device, same ranks).
        out = os.path.join(d, "resumed.json")
        gpu_env = {**os.environ, "TUTTI_EMU_DEVICES": "2"}
        r = subprocess.run([ARGS.mpiexec, "-n", "2", "--oversubscribe", ARGS.emu_binary, *flags, "--device", "cuda",
                            "--checkpoint-dir", ckpt, "--snapshot-every", "5", "--resume", "auto", "--json", out],
                           capture_output=True, text=True, timeout=300, env=gpu_env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        m = re.search(r"resumed at step (\d+) from memory", r.stdout)
        self.assertIsNotNone(m, r.stdout)
        self.assertTrue(int(m.group(1)) % 5 == 0 and int(m.group(1)) >= 10, r.stdout)
        ref = os.path.join(d, "whole.json")
        r = subprocess.run([ARGS.mpiexec, "-n", "2", "--oversubscribe", ARGS.emu_binary, *flags, "--device", "cuda",
                            "--quiet", "--json", ref], capture_output=True, text=True, timeout=300, env=gpu_env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(out) as f:
            resumed = json.load(f)
        with open(ref) as f:
            whole = json.load(f)
        self.assertEqual(resumed["resumed_from"], "memory")
        self.assertEqual(resumed["params_crc32"], whole["params_crc32"])
        self.assertEqual(resumed["final_train_loss"], whole["final_train_loss"])


def main():
    global ARGS
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu-binary", required=True)
    parser.add_argument("--emu-binary", required=True)
    parser.add_argument("--mpiexec", required=True)
    parser.add_argument("--workdir", required=True)
    ARGS, rest = parser.parse_known_args()
    # The runs read a copy of Fashion-MNIST with only the samples they use (as
    # train_fashion_mnist_test.py does), not the whole set that each rank would decompress.
    small = os.path.join(ARGS.workdir, "data")
    write_smaller_copy(small, 2048, 512)
    os.environ[FASHION_MNIST_DIR_ENV] = small
    os.environ.update(GIVEN_PEAK)  # the CPU runs measure no GEMM ceiling (as train_fashion_mnist_test.py)
    cores = CrashCores()
    ok = unittest.main(argv=[sys.argv[0], *rest], verbosity=2, exit=False).result.wasSuccessful()
    cores.finish(failed=not ok)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
