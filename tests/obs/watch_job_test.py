#!/usr/bin/env python3
"""Watching a running job from outside (docs/observability.md), end to end.

Runs train_fashion_mnist under mpirun with one rank slowed on purpose (--debug-slow) and every
way of watching it on: --metrics-port (each rank's /metrics is requested while the job runs),
--metrics-file (node_exporter's textfile, read while it runs and at the end), --trace and
--straggler-every. Checks that the metrics parse as Prometheus parses them (prometheus_client),
carry the labels and the names docs/observability.md lists, that counters only grow, that the
slowed rank is named (stderr and the metrics), that the timeline is a valid trace with both
ranks, and that scripts/trace_plot.py draws it.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time
import unittest
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

ARGS = None
SLOW_RANK = 1


def free_ports(n):
    """n consecutive free TCP ports (rank r serves on port + local rank)."""
    for _ in range(50):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
        s.close()
        ok = True
        for p in range(base, base + n):
            t = socket.socket()
            try:
                t.bind(("127.0.0.1", p))
            except OSError:
                ok = False
            finally:
                t.close()
        if ok and base + n < 65536:
            return base
    raise RuntimeError("no free ports")


def samples(text):
    """{(name, rank): value} of every sample, and the families, as Prometheus parses them."""
    out, families = {}, list(text_string_to_metric_families(text))
    for fam in families:
        for s in fam.samples:
            out[(s.name, s.labels.get("rank"))] = s.value
    return out, families


class WatchJob(unittest.TestCase):
    def test_metrics_trace_and_straggler(self):
        work = ARGS.workdir
        os.makedirs(work, exist_ok=True)
        for f in os.listdir(work):
            if f.endswith(".prom") or f.endswith(".json") or f.endswith(".png"):
                os.remove(os.path.join(work, f))
        port = free_ports(2)
        trace_dir = os.path.join(work, "trace")
        prom = os.path.join(work, "tutti.prom")
        summary = os.path.join(work, "run.json")
        cmd = [ARGS.mpiexec, "-n", "2", "--oversubscribe", ARGS.binary, "--train-subset", "4096", "--test-subset",
               "500", "--batch-size", "64", "--max-steps", "60", "--quiet", "--metrics-port", str(port),
               "--metrics-file", prom, "--metrics-interval", "0.1", "--trace", trace_dir, "--straggler-every", "10",
               "--debug-slow", "%d:12" % SLOW_RANK, "--json", summary]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        scraped = {}      # rank -> samples from /metrics during the run
        file_reads = []   # samples of rank 0's textfile, in time order
        deadline = time.time() + 120
        while p.poll() is None and time.time() < deadline:
            for rank in (0, 1):
                if rank in scraped:
                    continue
                try:
                    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % (port + rank), timeout=2) as r:
                        self.assertIn("text/plain", r.headers["Content-Type"])
                        got, _ = samples(r.read().decode())
                    if got.get(("tutti_steps_total", str(rank)), 0) > 0:
                        scraped[rank] = got
                except OSError:
                    pass  # not serving yet
            path = prom.replace(".prom", "-rank0.prom")
            if os.path.exists(path):
                with open(path) as f:
                    file_reads.append(samples(f.read())[0])
            time.sleep(0.05)
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 0, "the run failed:\n%s\n%s" % (out, err))

        # /metrics answered on both ranks while the job ran.
        self.assertEqual(sorted(scraped), [0, 1], "no /metrics answer with steps from every rank during the run")
        # Counters only grow: every read of the textfile, then the final file.
        with open(prom.replace(".prom", "-rank0.prom")) as f:
            final, families = samples(f.read())
        file_reads.append(final)
        self.assertGreater(len(file_reads), 2, "the textfile was never seen while the job ran")
        counters = [fam.name for fam in families if fam.type == "counter"]
        self.assertIn("tutti_steps", counters)  # prometheus_client drops _total from a counter family's name
        for earlier, later in zip(file_reads, file_reads[1:]):
            for fam in counters:
                key = (fam + "_total", "0")
                if key in earlier:
                    self.assertGreaterEqual(later.get(key, -1), earlier[key], fam)
        self.assertEqual(final[("tutti_steps_total", "0")], 60)
        self.assertEqual(final[("tutti_samples_total", "0")], 60 * 32)
        # Labels and names people chart; values in base units.
        for fam in families:
            for s in fam.samples:
                self.assertTrue(s.name.startswith("tutti_"), s.name)
                for label in ("job", "rank", "local_rank", "host"):
                    self.assertIn(label, s.labels, s.name)
        for name in ("tutti_step_seconds", "tutti_throughput_samples_per_second", "tutti_tflops", "tutti_mfu",
                     "tutti_loss", "tutti_bus_bandwidth_gbs", "tutti_bus_bandwidth_bytes_per_second",
                     "tutti_exposed_comm_seconds", "tutti_compute_before_comm_seconds", "tutti_memory_host_bytes",
                     "tutti_reduced_bytes_total", "tutti_straggler_rank"):
            self.assertIn((name, "0"), final, name)
        self.assertGreater(final[("tutti_mfu", "0")], 0)
        self.assertLess(final[("tutti_mfu", "0")], 1)
        self.assertLess(final[("tutti_step_seconds", "0")], 5, "seconds, not milliseconds")
        # The MLP's 535818 gradients in f32 bytes, plus the plan's alignment padding (8 elements per parameter).
        self.assertGreaterEqual(final[("tutti_step_reduced_bytes", "0")], 535818 * 4)
        self.assertLess(final[("tutti_step_reduced_bytes", "0")], 535818 * 4 + 6 * 32)
        # The straggler: named once on stderr by rank 0, and in the metrics.
        lines = [l for l in err.splitlines() if "straggler:" in l]
        self.assertEqual(len(lines), 1, err)
        self.assertIn("rank %d" % SLOW_RANK, lines[0])
        self.assertIn("compute before the first collective", lines[0])
        self.assertEqual(final[("tutti_straggler_rank", "0")], SLOW_RANK)
        with open(prom.replace(".prom", "-rank%d.prom" % SLOW_RANK)) as f:
            self.assertEqual(samples(f.read())[0][("tutti_is_straggler", str(SLOW_RANK))], 1)
        with open(summary) as f:
            s = json.load(f)
        self.assertGreater(s["mfu"], 0)
        # 6 N, less the first layer's input gradient, which backward does not compute.
        self.assertEqual(s["flops_per_sample"], 3 * 2 * (784 * 512 + 512 * 256 + 256 * 10) - 2 * 784 * 512)
        self.assertGreaterEqual(s["straggler_reports"], 1)
        # The timeline: both ranks, 60 steps, valid complete events.
        with open(os.path.join(trace_dir, "trace.json")) as f:
            trace = json.load(f)
        spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
        self.assertEqual({e["pid"] for e in spans}, {0, 1})
        self.assertEqual(len([e for e in spans if e["cat"] == "step" and e["pid"] == 0]), 60)
        self.assertTrue(any(e["cat"] == "eval" for e in spans))
        self.assertTrue(any(e["cat"] == "data" for e in spans))
        if ARGS.plot_python:
            png = os.path.join(work, "trace.png")
            r = subprocess.run([ARGS.plot_python, ARGS.plot_script, os.path.join(trace_dir, "trace.json"), "-o", png],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(png, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", required=True)
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--plot-script", required=True)
    ap.add_argument("--plot-python", default="")
    ARGS, rest = ap.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)
