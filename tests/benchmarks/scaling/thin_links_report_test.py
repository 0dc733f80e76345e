#!/usr/bin/env python3
"""benchmarks/scaling/thin_links_report.py on made-up runs: each row is compared with DDP flat of
its own link and layout, losses only at equal tokens, modes in the documented order (a --tag'ed
row after its untagged twin), a broken
summary left out."""
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "..", "benchmarks", "scaling", "thin_links_report.py")


def summary(tokens_per_s, val, steps=20, tokens_per_step=512):
    return {"tokens_per_s": tokens_per_s * 0.9, "tokens_per_s_steady": tokens_per_s, "final_val_loss": val,
            "steps": steps, "tokens": steps * tokens_per_step, "train_s": steps * tokens_per_step / tokens_per_s,
            "wall_s": 30.0, "loss_curve": [[steps // 2, steps // 2 * tokens_per_step, 3.5, val + 0.2],
                                           [steps, steps * tokens_per_step, 3.1, val]]}


class Report(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="thin_links_report_test")
        os.makedirs(os.path.join(self.dir, "runs"))
        runs = {
            "1gbit_4x1_diloco-H50-int8-s4": summary(3000, 3.09),
            "1gbit_4x1_diloco-H50-int8": summary(2500, 3.06),
            "1gbit_4x1_diloco-H50-int8-ef": summary(2400, 3.05),  # thin_links.sh --tag ef
            "1gbit_4x1_diloco-H10-f32": summary(2000, 3.03),
            "1gbit_4x1_ddp-flat": summary(500, 3.0),
            "1gbit_4x2_ddp-hierarchical": summary(650, 2.9),
            "1gbit_4x2_ddp-flat": summary(520, 2.9),
            "100mbit_4x1_ddp-flat": summary(50, 3.0),
            "100mbit_4x1_diloco-H50-int8": summary(1000, 3.3, steps=40),  # more tokens: no loss ratio
        }
        for name, j in runs.items():
            with open(os.path.join(self.dir, "runs", name + ".json"), "w") as f:
                json.dump(j, f)
        with open(os.path.join(self.dir, "runs", "1gbit_4x1_diloco-H100-int4.json"), "w") as f:
            f.write("{\"tokens_per_s\": ")  # a run killed while writing

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_tables(self):
        p = subprocess.run([sys.executable, SCRIPT, self.dir], capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("diloco-H100-int4.json is not JSON", p.stdout)
        with open(os.path.join(self.dir, "results.csv")) as f:
            rows = list(csv.DictReader(f))
        order = [(r["link"], r["layout"], r["mode"]) for r in rows]
        self.assertEqual(order, [
            ("1gbit", "4x1", "ddp-flat"), ("1gbit", "4x1", "diloco-H10-f32"), ("1gbit", "4x1", "diloco-H50-int8"),
            ("1gbit", "4x1", "diloco-H50-int8-ef"), ("1gbit", "4x1", "diloco-H50-int8-s4"),
            ("1gbit", "4x2", "ddp-flat"), ("1gbit", "4x2", "ddp-hierarchical"),
            ("100mbit", "4x1", "ddp-flat"), ("100mbit", "4x1", "diloco-H50-int8")])
        by = {k: r for k, r in zip(order, rows)}
        self.assertEqual(by[("1gbit", "4x1", "diloco-H50-int8")]["tokens_per_s_vs_ddp_flat"], "5.00")
        self.assertEqual(by[("1gbit", "4x1", "diloco-H50-int8")]["val_loss_vs_ddp_flat"], "1.0200")
        self.assertEqual(by[("1gbit", "4x2", "ddp-hierarchical")]["tokens_per_s_vs_ddp_flat"], "1.25")
        self.assertEqual(by[("100mbit", "4x1", "diloco-H50-int8")]["tokens_per_s_vs_ddp_flat"], "20.00")
        self.assertEqual(by[("100mbit", "4x1", "diloco-H50-int8")]["val_loss_vs_ddp_flat"], "")
        with open(os.path.join(self.dir, "results.md")) as f:
            md = f.read()
        self.assertIn("**1gbit, 4x2**", md)
        self.assertIn("| diloco-H50-int8 | 2500 | 5.00 | 3.0600 | 1.0200 | 20 |", md)


if __name__ == "__main__":
    unittest.main()
