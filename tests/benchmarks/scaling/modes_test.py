#!/usr/bin/env python3
"""The thin-links model (benchmarks/scaling/modes.py) and predict --thin-links, and the
tensor-parallel model (tensor_parallel.py) and predict --tensor-parallel: properties that a wrong
formula breaks, checked against the closed forms of the docstrings and each other."""
import json
import math
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCALING = os.path.join(HERE, "..", "..", "..", "benchmarks", "scaling")
sys.path.insert(0, SCALING)
import model as M  # noqa: E402
import modes as MD  # noqa: E402
import tensor_parallel as TP  # noqa: E402

NVLINK = M.Link(2e-6, 1 / 450e9)


def ethernet(gbit, latency_us=20.0):
    return M.Link(latency_us * 1e-6, 8.0 / (gbit * 1e9))


def gpu_cluster(nodes, per_node, gbit=100.0):
    return M.Cluster("test", nodes, per_node, NVLINK, ethernet(gbit))


def emulated_cluster(nodes, per_node, gbit=1.0):
    fit = json.load(open(os.path.join(SCALING, "..", "..", "docs", "bench", "cluster", "model_fit.json")))["fit"]
    i = fit["inter"]["1gbit"]
    inter = M.Link(i["alpha"], i["beta"] / gbit, i["beta_stream"] / gbit)
    return M.Cluster("emulated", nodes, per_node, M.Link(**fit["intra"]), inter, fit["host_cores"])


def gpt(params_m=100.0, layers=12, grad_bytes=2, compute_ms=200.0):
    """A model of `layers` equal layers (the Reducer's buckets cut at their boundaries)."""
    per = int(params_m * 1e6 / layers)
    return M.Model("test", [per] * layers, grad_bytes, compute_ms / 3e3, 2 * compute_ms / 3e3, 0.0)


CLUSTERS = [gpu_cluster(n, l, g) for n in (2, 3, 4, 16) for l in (1, 2, 8) for g in (1, 100, 400)] + \
           [emulated_cluster(n, l, g) for n in (2, 4) for l in (1, 2) for g in (0.1, 1)]
DTYPES = ("f32", "bf16", "int8", "int4")


class Hierarchical(unittest.TestCase):
    def test_port_bytes_against_a_flat_ring(self):
        n = 1e9
        for c in CLUSTERS:
            N, L = c.nodes, c.per_node
            flat, hier = MD.ring_port_bytes(c, n), MD.hierarchical_port_bytes(c, n)
            self.assertAlmostEqual(hier, 2 * (N - 1) / N * n, delta=1)
            self.assertAlmostEqual(flat / hier, (N * L - 1) * N / (N * L * (N - 1)), places=9, msg=c)
            if L == 1:
                self.assertAlmostEqual(flat, hier, delta=1)
            else:
                self.assertLess(hier, flat)

    def test_each_local_rank_carries_one_Lth(self):
        # The L ranks of a node split the inter-node allreduce: with free links inside the node its
        # time is that of one rank per node moving the whole buffer (the port is shared, not
        # multiplied), and each rank's flow is 1/L of it.
        s = 64 << 20
        for N in (2, 4, 16):
            one = M.Cluster("one", N, 1, M.Link(0, 0), ethernet(10))
            self.assertAlmostEqual(MD.hierarchical(one, s), M.ring(one, s), delta=1e-12)
            for L in (2, 4, 8):
                c = M.Cluster("c", N, L, M.Link(0, 0), ethernet(10))
                self.assertAlmostEqual(MD.hierarchical(c, s), M.ring(one, s), delta=1e-9)
                self.assertAlmostEqual(M._inter(c, s / (L * N), flows=1) - c.inter.alpha,
                                       (M._inter(one, s / N) - one.inter.alpha) / L, delta=1e-12)

    def test_beats_the_flat_ring_where_the_port_is_the_bottleneck(self):
        m = gpt(params_m=25, grad_bytes=4, compute_ms=1.0)
        c = gpu_cluster(2, 2, gbit=1)
        flat = MD.predict(c, m, MD.Mode("ddp", "flat"), 1024)
        hier = MD.predict(c, m, MD.Mode("ddp", "hierarchical"), 1024)
        # 1.5x fewer port bytes at 2 x 2, and the port sets the time: close to 1.5x the step rate.
        self.assertAlmostEqual(flat.port_bytes / hier.port_bytes, 1.5, places=6)
        self.assertGreater(flat.step_s / hier.step_s, 1.4)


class DiLoCo(unittest.TestCase):
    def test_per_step_bytes_are_one_Hth_of_a_ddp_sync(self):
        for c in CLUSTERS:
            if c.nodes == 1:
                continue
            for dtype, grad_bytes in (("f32", 4), ("bf16", 2)):
                m = gpt(grad_bytes=grad_bytes)
                ddp = MD.predict(c, m, MD.Mode("ddp", "hierarchical"), 1024)
                for H in (1, 10, 50, 100):
                    d = MD.predict(c, m, MD.Mode("diloco", period=H, outer_dtype=dtype), 1024)
                    self.assertAlmostEqual(d.port_bytes * H / ddp.port_bytes, 1.0, places=9, msg=(c, dtype, H))

    def test_quantized_bytes(self):
        n = 1 << 20
        f32 = MD.quantized_bytes(n, "f32")
        self.assertEqual(MD.QUANT_BLOCK, 64)  # DiLoCoOptions::block
        self.assertEqual(MD.quantized_bytes(n, "int8"), n + 4 * n // 64)
        self.assertEqual(MD.quantized_bytes(n, "int4"), n // 2 + 4 * n // 64)
        self.assertAlmostEqual(MD.quantized_bytes(n, "int8") / f32, (1 + 4 / 64) / 4)
        self.assertEqual(MD.quantized_bytes(n + 1, "int8", block=256), n + 1 + 4 * (n // 256 + 1))

    def test_int8_is_a_quarter_of_f32_when_reduced_and_grows_with_nodes_when_gathered(self):
        n = 1e9
        for c in CLUSTERS:
            if c.nodes == 1:
                continue
            N = c.nodes
            f32 = MD.outer_exchange(c, n, "f32")[1]
            for dtype, d in (("int8", 1.0), ("int4", 0.5)):
                rs = MD.outer_exchange(c, n, dtype, "reduce_scatter")[1]
                self.assertAlmostEqual(rs / f32, (d + 4 / 64) / 4, places=6, msg=(c, dtype))
                ag = MD.outer_exchange(c, n, dtype, "allgather")[1]
                self.assertAlmostEqual(ag, (N - 1) * n * (d + 4 / 64), delta=8)
        # The all-gather's bytes pass an f32 ring allreduce's from 8 nodes (int8) and 15 (int4).
        for N, int8_more, int4_more in ((7, False, False), (8, True, False), (14, True, False), (15, True, True)):
            c = gpu_cluster(N, 8)
            f32 = MD.outer_exchange(c, n, "f32")[1]
            self.assertEqual(MD.outer_exchange(c, n, "int8")[1] > f32, int8_more, N)
            self.assertEqual(MD.outer_exchange(c, n, "int4")[1] > f32, int4_more, N)
        # ... and a bf16 allreduce's from 4 nodes (int8) and 8 (int4).
        for N, int8_more, int4_more in ((3, False, False), (4, True, False), (7, True, False), (8, True, True)):
            c = gpu_cluster(N, 8)
            bf16 = MD.outer_exchange(c, n, "bf16")[1]
            self.assertEqual(MD.outer_exchange(c, n, "int8")[1] > bf16, int8_more, N)
            self.assertEqual(MD.outer_exchange(c, n, "int4")[1] > bf16, int4_more, N)

    def test_streaming_is_never_slower_and_hides_what_fits(self):
        m = gpt(params_m=300, compute_ms=150)
        for c in CLUSTERS:
            inner = M.ddp_step(MD.node_cluster(c), m, "ring")[0]
            for H in (1, 10, 50, 100):
                for dtype in DTYPES:
                    plain = MD.predict(c, m, MD.Mode("diloco", period=H, outer_dtype=dtype), 1024)
                    self.assertGreaterEqual(plain.step_s, inner)
                    for F in (1, 2, 4, 8):
                        s = MD.predict(c, m, MD.Mode("diloco", period=H, outer_dtype=dtype, fragments=F), 1024)
                        self.assertLessEqual(s.step_s, plain.step_s * (1 + 1e-12), msg=(c, H, dtype, F))
                        self.assertAlmostEqual(s.port_bytes, plain.port_bytes, delta=1e-6 * plain.port_bytes + 1)
                        # At the default overlap (H/F inner steps) the step is max(inner, E_F / H).
                        self.assertAlmostEqual(s.step_s, max(inner, s.exchange_s / H), delta=1e-12)

    def test_the_period_must_be_positive(self):
        with self.assertRaises(ValueError):
            MD.predict(gpu_cluster(2, 8), gpt(), MD.Mode("diloco", period=0), 1024)


class Limits(unittest.TestCase):
    def test_infinitely_fast_links_give_the_compute_time(self):
        m = gpt(compute_ms=123.0)
        for N in (1, 2, 4, 16):
            for L in (1, 2, 8):
                c = M.Cluster("free", N, L, M.Link(0, 0), M.Link(0, 0))
                for mode in MD.modes(periods=(1, 10, 100), fragments=4):
                    p = MD.predict(c, m, mode, 1000)
                    self.assertAlmostEqual(p.step_s, 0.123, delta=1e-12, msg=mode.label())
                    self.assertAlmostEqual(p.ideal_fraction, 1.0, delta=1e-12)
                    self.assertAlmostEqual(p.tokens_per_s, N * L * 1000 / 0.123, delta=1e-6)

    def test_a_free_link_between_nodes_leaves_diloco_its_inner_step(self):
        m = gpt(compute_ms=50.0)
        for L in (2, 8):
            c = M.Cluster("free inter", 4, L, NVLINK, M.Link(0, 0))
            inner = M.ddp_step(MD.node_cluster(c), m, "ring")[0]
            self.assertGreater(inner, 0.050)  # the allreduce inside the node shows
            # The pseudo-gradient still goes around the node once (the all-gather of the slices).
            gather = (L - 1) * M._intra(c, 4.0 * m.params / L)
            for dtype in DTYPES:
                d = MD.predict(c, m, MD.Mode("diloco", period=10, outer_dtype=dtype), 1)
                self.assertAlmostEqual(d.step_s, inner + gather / 10, delta=1e-12)


class Recommendation(unittest.TestCase):
    def test_ddp_on_a_fast_fabric_diloco_on_a_thin_link(self):
        m = gpt(params_m=1500, compute_ms=213)
        fast = [MD.predict(M.Cluster("ib", 16, 8, NVLINK, M.Link(5e-6, 1 / 400e9)), m, mode, 8192)
                for mode in MD.modes()]
        best, _ = MD.recommend(fast)
        self.assertEqual(best.mode.sync, "ddp")
        thin = [MD.predict(gpu_cluster(16, 8, gbit=10), m, mode, 8192) for mode in MD.modes()]
        best, _ = MD.recommend(thin)
        self.assertEqual(best.mode.sync, "diloco")
        self.assertGreaterEqual(best.ideal_fraction, 0.9)
        self.assertGreater(best.tokens_per_s, 3 * max(r.tokens_per_s for r in thin[:2]))

    def test_a_token_cost_above_dilocos_speedup_recommends_ddp(self):
        # DiLoCo pays only where its rate over DDP's beats the tokens it needs per token of DDP's.
        m = gpt(params_m=1500, compute_ms=213)
        rows = [MD.predict(gpu_cluster(16, 8, gbit=100), m, mode, 8192) for mode in MD.modes()]
        fastest, ratio = MD.diloco_break_even(rows)
        self.assertEqual(fastest.mode.sync, "diloco")
        self.assertAlmostEqual(ratio, fastest.tokens_per_s / max(r.tokens_per_s for r in rows[:2]))
        self.assertGreater(ratio, 1.5)
        self.assertEqual(MD.recommend(rows)[0].mode.sync, "diloco")
        self.assertEqual(MD.recommend(rows, token_cost=ratio * 0.9)[0].mode.sync, "diloco")
        best, why = MD.recommend(rows, token_cost=ratio * 1.1)
        self.assertEqual(best.mode.sync, "ddp")
        self.assertIn("token cost", why)

    def test_predict_prints_the_table(self):
        p = subprocess.run([sys.executable, os.path.join(SCALING, "predict"), "--thin-links", "--nodes", "16",
                            "--gpus-per-node", "8", "--gpu", "h100", "--inter-gbit", "100", "--model", "gpt2-1558m"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = {}
        for line in p.stdout.splitlines():
            parts = line.rsplit(None, 5)
            if line.startswith(("ddp ", "diloco ")) and len(parts) == 6:
                rows[parts[0].strip()] = [float(x) for x in parts[1:]]
        self.assertEqual(len(rows), 2 + 3 * 4 * 2)
        for label, (step_ms, tokens_per_s, ideal, _, _) in rows.items():
            self.assertAlmostEqual(tokens_per_s, 128 * 8192 / (step_ms / 1e3), delta=1e-3 * tokens_per_s, msg=label)
            self.assertLessEqual(ideal, 1.0)
        self.assertIn("recommendation: diloco", p.stdout)
        self.assertRegex(p.stdout, r"loss: DiLoCo \(fastest: diloco [^)]*\) runs [\d.]+x the faster DDP's tokens/s")
        self.assertLess(rows["ddp flat"][2], 0.5)  # 3.1 GB of bf16 gradients at 12.5 GB/s per node

    def test_emulated_needs_the_measured_compute(self):
        p = subprocess.run([sys.executable, os.path.join(SCALING, "predict"), "--thin-links", "--gpu", "emulated",
                            "--nodes", "4", "--inter-gbit", "1", "--model", "train-gpt-bench"],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--compute-ms", p.stderr)


class PowerSgd(unittest.TestCase):
    def model(self, layers=12, side=1024):
        m = M.Model("test", [side * side] * layers, 4, 0.05, 0.1, 0.0)
        m.matrices = [(side, side)] * layers
        return m

    def test_fraction_closed_form(self):
        self.assertAlmostEqual(MD.powersgd_fraction([(1024, 1024)], 1024 * 1024, 4), 4 * 2048 / 1024 ** 2)
        # A matrix whose factors are no smaller is sent whole; the other parameters are sent whole.
        self.assertEqual(MD.powersgd_fraction([(4, 4)], 16, 4), 1.0)
        self.assertAlmostEqual(MD.powersgd_fraction([(100, 50)], 5000 + 700, 2), (2 * 150 + 700) / 5700)

    def test_port_bytes_are_the_fraction_of_flat(self):
        m = self.model()
        f = MD.powersgd_fraction(m.matrices, m.params, 4)
        for c in CLUSTERS:
            flat = MD.predict(c, m, MD.Mode("ddp", "flat"), 1000)
            psgd = MD.predict(c, m, MD.Mode("ddp", "powersgd", powersgd_rank=4), 1000)
            self.assertAlmostEqual(psgd.port_bytes, f * flat.port_bytes, delta=1e-6 * flat.port_bytes + 1)

    def test_faster_than_ddp_where_bandwidth_binds_and_not_when_nothing_is_saved(self):
        m = self.model()
        c = emulated_cluster(4, 1, 1.0)
        flat = MD.predict(c, m, MD.Mode("ddp", "flat"), 1000, "ring")
        psgd = MD.predict(c, m, MD.Mode("ddp", "powersgd", powersgd_rank=4), 1000, "ring")
        self.assertGreater(psgd.tokens_per_s, 3 * flat.tokens_per_s)
        whole = MD.predict(c, m, MD.Mode("ddp", "powersgd", powersgd_rank=1024), 1000, "ring")  # f = 1
        self.assertGreaterEqual(whole.step_s, flat.step_s)  # the same bytes in twice the collectives

    def test_needs_the_matrices(self):
        with self.assertRaises(ValueError):
            MD.predict(gpu_cluster(2, 1), gpt(), MD.Mode("ddp", "powersgd"), 1000)


PCIE = M.Link(5e-6, 1 / 25e9)
GPT2_XL = TP.Gpt(layers=48, width=1600, vocab=50257, context=1024, tokens_per_gpu=8192, peak_tflops=989, mfu=0.4)


class TensorParallel(unittest.TestCase):
    def test_tp_one_is_a_plain_ddp_step(self):
        c = gpu_cluster(4, 8, 100.0)
        r = TP.predict(c, GPT2_XL, 1)
        g = GPT2_XL
        flops = 6 * (48 * 12 * g.width ** 2 + g.vocab * g.width) + 12 * 48 * g.width * g.context
        compute = flops * g.tokens_per_gpu / (g.peak_tflops * 1e12 * g.mfu)
        self.assertAlmostEqual(r.compute_s, compute, delta=1e-9)
        layers = [(g.vocab + g.context) * g.width] + [12 * g.width ** 2] * 48
        step = M.ddp_step(c, M.Model("x", layers, 2, compute / 3, 2 * compute / 3, 0.0), "nccl")[0]
        self.assertAlmostEqual(r.step_s, step, delta=1e-9)
        self.assertEqual(r.tp_comm_s, 0.0)

    def test_state_per_rank_is_the_closed_form(self):
        g = GPT2_XL
        for tp in (1, 2, 4, 8):
            r = TP.predict(gpu_cluster(1, 8), g, tp)
            held = (g.vocab / tp + g.context) * g.width + 48 * 12 * g.width ** 2 / tp
            self.assertAlmostEqual(r.state_bytes, 16 * held, delta=1)
            # TP's allreduces: 4 per layer and 2 for the embedding and the head of the activations,
            # 2 of the loss's row statistics (t and 2t floats), each a ring of tp over the intra link.
            def ring(nbytes):
                return 0 if tp == 1 else 2 * (tp - 1) * (NVLINK.alpha + nbytes * NVLINK.beta)
            rows = g.tokens_per_gpu
            want = (4 * 48 + 2) * ring(rows * g.width * 2) + ring(rows * 4) + ring(rows * 8)
            self.assertAlmostEqual(r.tp_comm_s, want, delta=1e-12)
            # Sequence parallelism: 2 L + 1 allgathers more (the column-parallel layers' and the
            # head's inputs, again in backward) and as many allreduces of the norms' 2 C floats.
            def allgather(nbytes):
                return 0 if tp == 1 else (tp - 1) * (NVLINK.alpha + nbytes / tp * NVLINK.beta)
            sp = TP.predict(gpu_cluster(1, 8), g, tp, sequence_parallel=True)
            extra = (2 * 48 + 1) * (allgather(tp * rows * g.width * 2) + ring(8 * g.width / tp))
            self.assertAlmostEqual(sp.tp_comm_s, want + extra, delta=1e-12)
            self.assertEqual(sp.state_bytes, r.state_bytes)
            # The compute per rank is the same at every tp: the head is split too.
            self.assertAlmostEqual(r.compute_s, TP.predict(gpu_cluster(1, 8), g, 1).compute_s, delta=1e-12)

    def test_tp_pays_over_thin_links_on_nvlink_and_not_over_pcie_in_one_node(self):
        thin = [TP.predict(gpu_cluster(16, 8, 10.0), GPT2_XL, tp) for tp in TP.sizes(8)]
        self.assertGreater(max(thin, key=lambda r: r.tokens_per_s).tp, 1)
        self.assertIn("TP pays in speed", TP.advise(thin))
        pcie = M.Cluster("pcie", 1, 8, PCIE, ethernet(100.0))
        rows = [TP.predict(pcie, GPT2_XL, tp) for tp in TP.sizes(8)]
        self.assertEqual(max(rows, key=lambda r: r.tokens_per_s).tp, 1)
        self.assertTrue(all(a.tokens_per_s > b.tokens_per_s for a, b in zip(rows, rows[1:])))
        # The memory advice: 24.9 GB at tp 1 does not fit 16 GB; tp 2's 13.1 GB does.
        self.assertIn("tp 2 is the smallest that does", TP.advise(rows, 16e9))

    def test_refusals_and_the_cli(self):
        with self.assertRaises(ValueError):
            TP.predict(gpu_cluster(1, 6), GPT2_XL, 4)
        self.assertEqual(TP.sizes(8), [1, 2, 4, 8])
        p = subprocess.run([sys.executable, os.path.join(SCALING, "predict"), "--tensor-parallel", "--gpu", "l40s",
                            "--model", "gpt2-1558m", "--nodes", "1", "--inter-gbit", "100"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("advice: fastest: tp 1", p.stdout)
        self.assertEqual(len([x for x in p.stdout.splitlines() if x.strip()[:1].isdigit()]), 4)


if __name__ == "__main__":
    unittest.main()
