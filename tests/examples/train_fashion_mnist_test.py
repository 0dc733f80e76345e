#!/usr/bin/env python3
"""End-to-end tests of examples/train_fashion_mnist under mpirun (unittest).

Runs the trainer on a subset of Fashion-MNIST and checks what a user relies on: the loss goes
down and the accuracy is far above chance, the JSON summary is complete, 1 and 2 ranks train
alike, a stopped run (even by kill -9) resumes to bit-identical parameters, bad checkpoints
are refused, and bad flags or a missing data set fail clearly.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import unittest

ARGS = None
SUBSET = ["--train-subset", "4096", "--test-subset", "1000", "--batch-size", "64", "--quiet"]


def run(ranks, *flags, check=True, timeout=300):
    cmd = [ARGS.mpiexec, "-n", str(ranks), "--oversubscribe", ARGS.binary, *flags]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s\n%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
    return p


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)


def summary(path):
    with open(path) as f:
        return json.load(f)


class TrainFashionMnist(unittest.TestCase):
    def setUp(self):
        self.dir = os.path.join(ARGS.workdir, self.id().split(".")[-1])
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_learns_and_writes_a_complete_summary(self):
        run(2, *SUBSET, "--epochs", "2", "--json", self.path("s.json"))
        s = summary(self.path("s.json"))
        for key in ["steps", "final_train_loss", "test_accuracy", "wall_s", "samples_per_s", "ranks",
                    "skipped_steps", "precision", "model"]:
            self.assertIn(key, s)
        self.assertEqual(s["steps"], 2 * (4096 // 64))
        self.assertEqual(s["ranks"], 2)
        self.assertEqual(s["model"], "mlp")
        self.assertEqual(s["precision"], "fp32")
        self.assertEqual(s["skipped_steps"], 0)
        self.assertLess(s["final_train_loss"], 0.7 * s["initial_train_loss"])
        self.assertGreater(s["test_accuracy"], 0.6)  # chance is 0.1
        self.assertLessEqual(s["test_accuracy"], 1.0)
        self.assertGreater(s["samples_per_s"], 0)

    def test_one_and_two_ranks_train_alike(self):
        for n in (1, 2):
            run(n, *SUBSET, "--max-steps", "20", "--json", self.path("np%d.json" % n))
        a, b = summary(self.path("np1.json")), summary(self.path("np2.json"))
        self.assertEqual(a["steps"], b["steps"])
        self.assertAlmostEqual(a["final_train_loss"], b["final_train_loss"], delta=1e-4 * abs(a["final_train_loss"]))
        self.assertNotEqual(a["initial_train_loss"], a["final_train_loss"])

    def test_accumulation_trains_like_the_whole_batch(self):
        run(2, *SUBSET, "--max-steps", "10", "--json", self.path("k1.json"))
        run(2, *SUBSET, "--max-steps", "10", "--accum-steps", "2", "--json", self.path("k2.json"))
        a, b = summary(self.path("k1.json")), summary(self.path("k2.json"))
        self.assertAlmostEqual(a["final_train_loss"], b["final_train_loss"], delta=1e-4 * abs(a["final_train_loss"]))

    def test_resume_is_bit_identical(self):
        whole = self.path("whole")
        run(2, *SUBSET, "--max-steps", "30", "--checkpoint-dir", whole, "--json", self.path("whole.json"))
        part = self.path("part")
        run(2, *SUBSET, "--max-steps", "13", "--checkpoint-dir", part)
        run(2, *SUBSET, "--max-steps", "30", "--checkpoint-dir", part, "--resume", "--json", self.path("resumed.json"))
        a, b = summary(self.path("whole.json")), summary(self.path("resumed.json"))
        self.assertEqual(b["resumed_from_step"], 13)
        self.assertEqual(a["params_crc32"], b["params_crc32"])
        self.assertEqual(a["final_train_loss"], b["final_train_loss"])

    def test_resume_after_kill_9_is_bit_identical(self):
        steps = "400"
        run(2, *SUBSET, "--max-steps", steps, "--json", self.path("whole.json"))
        ckpt_dir = self.path("killed")
        ckpt = os.path.join(ckpt_dir, "checkpoint.tckp")
        cmd = [ARGS.mpiexec, "-n", "2", "--oversubscribe", ARGS.binary, *SUBSET, "--max-steps", steps,
               "--checkpoint-dir", ckpt_dir, "--checkpoint-every", "7"]
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 120
        while not os.path.exists(ckpt) and time.time() < deadline and p.poll() is None:
            time.sleep(0.05)
        killed = p.poll() is None
        os.killpg(p.pid, signal.SIGKILL)  # mpirun and both ranks, at once
        p.wait()
        self.assertTrue(killed, "the run ended before it could be killed: make it longer")
        self.assertTrue(os.path.exists(ckpt))
        run(2, *SUBSET, "--max-steps", steps, "--checkpoint-dir", ckpt_dir, "--resume", "--json", self.path("r.json"))
        a, b = summary(self.path("whole.json")), summary(self.path("r.json"))
        self.assertGreater(b["resumed_from_step"], 0)
        self.assertLess(b["resumed_from_step"], int(steps))
        self.assertEqual(a["params_crc32"], b["params_crc32"])

    def test_bad_checkpoints_are_refused_and_the_good_one_stays(self):
        d = self.path("ckpt")
        run(1, *SUBSET, "--max-steps", "3", "--checkpoint-dir", d)
        ckpt = os.path.join(d, "checkpoint.tckp")
        good = read_bytes(ckpt)
        # A temporary file left by a killed writer is never read.
        write_bytes(ckpt + ".tmp.99999", b"garbage")
        run(1, *SUBSET, "--max-steps", "4", "--checkpoint-dir", d, "--resume")
        good = read_bytes(ckpt)
        # Another model.
        p = run(1, *SUBSET, "--model", "cnn", "--max-steps", "5", "--checkpoint-dir", d, "--resume", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("another model", p.stderr)
        # A flipped byte in the data.
        bad = bytearray(good)
        bad[len(bad) // 2] ^= 0x40
        write_bytes(ckpt, bytes(bad))
        p = run(1, *SUBSET, "--max-steps", "5", "--checkpoint-dir", d, "--resume", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("checksum", p.stderr)
        # Truncated.
        write_bytes(ckpt, good[: len(good) // 3])
        p = run(1, *SUBSET, "--max-steps", "5", "--checkpoint-dir", d, "--resume", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("truncated", p.stderr)
        # A refused resume writes nothing: the file is as it was.
        self.assertEqual(read_bytes(ckpt), good[: len(good) // 3])

    def test_bad_flags_and_missing_data_fail_clearly(self):
        p = run(1, "--optimizer", "rmsprop", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--optimizer", p.stdout + p.stderr)
        p = run(1, "--no-such-flag", check=False)
        self.assertNotEqual(p.returncode, 0)
        p = run(1, "--batch-size", "0", check=False)
        self.assertNotEqual(p.returncode, 0)
        p = run(2, *SUBSET[:4], "--batch-size", "65", "--max-steps", "1", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("divisible", p.stderr)
        p = run(1, "--data", self.path("nowhere"), check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("dataset-fashion-mnist", p.stderr)
        p = run(1, "--resume", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--checkpoint-dir", p.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", required=True)
    parser.add_argument("--mpiexec", default="mpiexec")
    parser.add_argument("--workdir", required=True)
    ARGS, rest = parser.parse_known_args()
    os.makedirs(ARGS.workdir, exist_ok=True)
    unittest.main(argv=[sys.argv[0], "-v", *rest])
