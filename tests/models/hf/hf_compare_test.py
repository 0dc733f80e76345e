#!/usr/bin/env python3
"""tutti's models against an implementation tutti did not write: Hugging Face transformers'
GPT2LMHeadModel and LlamaForCausalLM (the Python reference environment, scripts/setup.sh).

Small random models are built and saved with transformers (save_pretrained, safetensors), loaded
by tutti (models/hf.h, through tests/models/hf/hf_tool), and compared on one batch:
  - f32: logits within 1e-4 relative (max |tutti - hf| / max |hf|), the loss within 1e-5, every
    parameter's gradient within 1e-4 relative;
  - bf16 (tutti computing in bf16 from f32 masters, transformers in f32): within the bound derived
    in bf16_bound() below;
  - tutti's export (hf::save, f32 and bf16 in shards) loaded back by transformers;
  - GPT-2 as OpenAI's release names its tensors (no "transformer." prefix, the attention's mask
    buffers kept);
  - train_gpt --init-from a transformers folder, 20 steps at ZeRO-3 on 2 ranks, at ZeRO-0 on 1 and
    split over 2 ranks (--tp 2),
    --export: transformers loads the result and gives tutti's logits within 1e-4, and the three runs
    agree; export_hf turns the run's checkpoint into the same folder.

  hf_compare_test.py HF_TOOL TRAIN_GPT EXPORT_HF     (ctest: models_hf_compare_test)
"""
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import safetensors.numpy
import safetensors.torch
import torch
import torch.nn.functional as F
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

transformers.utils.logging.disable_progress_bar()

HF_TOOL = TRAIN_GPT = EXPORT_HF = None
B, T, VOCAB = 2, 16, 96


def relative(a, b):
    """max |a - b| / max |b|: the error of a against the reference b, relative to b's scale."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def randomize(model, seed):
    """Weights far from transformers' small initialization, so that every path carries a signal:
    matrices N(0, 0.2^2), norm weights U(0.5, 1.5), biases N(0, 0.1^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
            elif "ln" in name or "norm" in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5) if name.endswith("weight") else p.copy_(
                    torch.randn(p.shape, generator=g) * 0.1)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model.eval()


def gpt2():
    c = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=32, vocab_size=VOCAB, resid_pdrop=0.0,
                   embd_pdrop=0.0, attn_pdrop=0.0)
    return randomize(GPT2LMHeadModel(c), 1)


def llama(tied=False, llama3=False):
    kwargs = dict(hidden_size=32, intermediate_size=80, num_attention_heads=4, num_key_value_heads=2,
                  num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=tied,
                  rms_norm_eps=1e-5)
    if llama3:  # heads of 16: frequencies in each of llama3's three bands over an original context of 16
        kwargs.update(hidden_size=64, rope_theta=500000.0,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    return randomize(LlamaForCausalLM(LlamaConfig(**kwargs)), 2 + tied + 2 * llama3)


def reference(model, tokens, targets):
    """transformers' logits, loss (mean cross-entropy against targets) and gradients by name."""
    model.zero_grad()
    logits = model(input_ids=torch.from_numpy(tokens).long()).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(targets).long().reshape(-1))
    loss.backward()
    grads = {n: p.grad.detach().numpy().copy() for n, p in model.named_parameters()}
    return logits.detach().numpy(), loss.item(), grads


def batch(seed):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, VOCAB, (B, T)).astype(np.int32), rng.integers(0, VOCAB, (B, T)).astype(np.int32))


def run(*args):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s\n%s" % (" ".join(map(str, args)), r.returncode, r.stdout,
                                                         r.stderr))
    return r.stdout


def bf16_bound(layers):
    """The bound for tutti in bf16 against transformers in f32, on max |difference| / max |logit|.

    bf16 keeps 8 significant bits: rounding a value costs at most u = 2^-8 of it. tutti rounds to
    bf16 each activation a layer hands to the next (every matrix product accumulates in f32 and
    rounds its output once): the embedding's output, then per transformer layer about 8 tensors
    (norm, projection, attention, output projection; norm, up projection, activation, down
    projection), then the final norm and the logits, and every weight once (8 L + 3 roundings of
    activations plus the weights'). With these random weights each product of the network is
    about as large as its inputs, so every relative rounding passes through to the logits about
    unchanged; in the worst case they add up: (8 L + 3 + 2) u, 2 for the weights of a product
    and the input it meets. Independent roundings give typically the square root of that many,
    so the measured errors sit well under the bound (the figures are printed).
    """
    return (8 * layers + 5) * 2.0 ** -8


class HfComparison(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tutti-hf-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def save(self, model, name):
        d = os.path.join(self.dir, name)
        model.save_pretrained(d, safe_serialization=True)
        return d

    def tutti(self, model_dir, tokens, targets, dtype="f32", tag="out"):
        """tutti's logits, loss and gradients (by transformers' names) on the batch."""
        batch_file = os.path.join(self.dir, tag + "-batch.safetensors")
        safetensors.numpy.save_file({"tokens": tokens, "targets": targets}, batch_file)
        out = os.path.join(self.dir, tag)
        run(HF_TOOL, "forward", model_dir, batch_file, out, dtype)
        o = safetensors.numpy.load_file(os.path.join(out, "outputs.safetensors"))
        grads = {}
        for f in os.listdir(os.path.join(out, "grads")):
            if f.endswith(".safetensors"):
                grads.update(safetensors.numpy.load_file(os.path.join(out, "grads", f)))
        return o["logits"], float(o["loss"][0]), grads

    def compare_f32(self, model, name):
        d = self.save(model, name)
        tokens, targets = batch(7)
        logits, loss, grads = reference(model, tokens, targets)
        t_logits, t_loss, t_grads = self.tutti(d, tokens, targets, tag=name)
        self.assertLess(relative(t_logits, logits), 1e-4, name + ": logits")
        self.assertLess(abs(t_loss - loss) / abs(loss), 1e-5, name + ": loss %g vs %g" % (t_loss, loss))
        self.assertEqual(sorted(t_grads), sorted(grads), name + ": the gradients' names")
        worst = max((relative(t_grads[n], g), n) for n, g in grads.items())
        self.assertLess(worst[0], 1e-4, name + ": gradient of " + worst[1])
        print("%s f32: logits %.2e, loss %.2e, worst gradient %.2e (%s)" % (
            name, relative(t_logits, logits), abs(t_loss - loss) / abs(loss), worst[0], worst[1]))
        return d, tokens, targets, logits

    def test_gpt2_f32(self):
        self.compare_f32(gpt2(), "gpt2")

    def test_llama_gqa_untied_f32(self):
        d, tokens, targets, logits = self.compare_f32(llama(), "llama")
        # The same model as transformers shards it (several files and model.safetensors.index.json).
        model = llama()
        sharded = os.path.join(self.dir, "llama-sharded")
        model.save_pretrained(sharded, safe_serialization=True, max_shard_size="20KB")
        self.assertIn("model.safetensors.index.json", os.listdir(sharded))
        t_logits, _, _ = self.tutti(sharded, tokens, targets, tag="sharded")
        self.assertLess(relative(t_logits, logits), 1e-4, "sharded")

    def test_llama_tied_llama3_rope_f32(self):
        self.compare_f32(llama(tied=True, llama3=True), "llama3")

    def test_bf16_within_the_derived_bound(self):
        for name, model in (("gpt2", gpt2()), ("llama", llama()), ("llama3", llama(tied=True, llama3=True))):
            d = self.save(model, name)
            tokens, targets = batch(8)
            logits, loss, _ = reference(model, tokens, targets)
            t_logits, t_loss, _ = self.tutti(d, tokens, targets, "bf16", tag=name + "-bf16")
            bound = bf16_bound(2)
            err = relative(t_logits, logits)
            print("%s bf16: logits %.2e, loss %.2e (bound %.2e)" % (name, err, abs(t_loss - loss) / abs(loss), bound))
            self.assertLess(err, bound, name)
            self.assertLess(abs(t_loss - loss) / abs(loss), bound, name)
            self.assertGreater(err, 0.0, name + ": bf16 that equals f32 exactly was not bf16")

    def test_export_loads_in_transformers(self):
        for name, model, cls in (("gpt2", gpt2(), GPT2LMHeadModel), ("llama", llama(), LlamaForCausalLM),
                                 ("llama3", llama(tied=True, llama3=True), LlamaForCausalLM)):
            d = self.save(model, name)
            tokens, _ = batch(9)
            with torch.no_grad():
                want = model(input_ids=torch.from_numpy(tokens).long()).logits.numpy()
            for dtype, shard in (("f32", 0), ("bf16", 20000)):
                out = os.path.join(self.dir, name + "-export-" + dtype)
                run(HF_TOOL, "save", d, out, dtype, shard)
                files = sorted(os.listdir(out))
                if shard:  # several shards and their index, as save_pretrained writes them
                    self.assertIn("model.safetensors.index.json", files)
                    self.assertGreater(sum(f.startswith("model-0") for f in files), 1, files)
                back = cls.from_pretrained(out, torch_dtype=torch.float32).eval()
                with torch.no_grad():
                    got = back(input_ids=torch.from_numpy(tokens).long()).logits.numpy()
                err = relative(got, want)
                print("%s export %s: logits %.2e" % (name, dtype, err))
                self.assertLess(err, 1e-6 if dtype == "f32" else bf16_bound(2), name + " " + dtype)

    def test_gpt2_with_openais_names(self):
        model = gpt2()
        d = self.save(model, "gpt2-openai")
        path = os.path.join(d, "model.safetensors")
        tensors = safetensors.torch.load_file(path)
        renamed = {n[len("transformer."):] if n.startswith("transformer.") else n: t for n, t in tensors.items()}
        for l in range(2):  # the causal-mask buffers the original release keeps
            renamed["h.%d.attn.bias" % l] = torch.tril(torch.ones(1, 1, 32, 32))
        safetensors.torch.save_file(renamed, path, metadata={"format": "pt"})
        tokens, targets = batch(10)
        logits, _, _ = reference(model, tokens, targets)
        t_logits, _, _ = self.tutti(d, tokens, targets, tag="openai")
        self.assertLess(relative(t_logits, logits), 1e-4)

    def test_train_gpt_fine_tunes_and_exports(self):
        """train_gpt --init-from, 20 steps, --export: transformers gives tutti's logits."""
        start = self.save(llama(), "llama-start")
        # Token data for the model's vocabulary, in llm.c's GPT-2 shard format (uint16 ids).
        rng = np.random.default_rng(3)
        shard = os.path.join(self.dir, "tokens.bin")
        ids = rng.integers(0, VOCAB, 20000).astype(np.uint16)
        header = np.zeros(256, np.int32)
        header[:3] = (20240520, 1, len(ids))
        with open(shard, "wb") as f:
            f.write(header.tobytes() + ids.tobytes())
        exports = {}
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_mpi_yield_when_idle="1")
        # (ranks, ZeRO stage, tensor-parallel size): the last splits the model over both ranks.
        for ranks, zero, tp in ((1, 0, 1), (2, 3, 1), (2, 0, 2)):
            out = os.path.join(self.dir, "tuned-np%d-zero%d-tp%d" % (ranks, zero, tp))
            cmd = ["mpirun", "-np", str(ranks), TRAIN_GPT, "--init-from", start, "--export", out, "--data", shard,
                   "--steps", "20", "--batch-size", "8", "--seq-len", "32", "--lr", "3e-3", "--warmup-steps", "2",
                   "--zero", str(zero), "--tp", str(tp), "--eval-every", "0", "--sample-tokens", "0", "--device", "cpu",
                   "--checkpoint-dir", out + "-ckpt"]
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            exports[(ranks, zero, tp)] = out
        tokens, targets = batch(11)
        for key, out in exports.items():
            back = LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
            hf_logits, _, _ = reference(back, tokens, targets)
            t_logits, _, _ = self.tutti(out, tokens, targets, tag="tuned-%d-%d-%d" % key)
            self.assertLess(relative(t_logits, hf_logits), 1e-4, str(key))
            start_logits, _, _ = reference(LlamaForCausalLM.from_pretrained(start).eval(), tokens, targets)
            self.assertGreater(relative(hf_logits, start_logits), 1e-3, "the 20 steps changed the model")
        a = safetensors.numpy.load_file(os.path.join(exports[(1, 0, 1)], "model.safetensors"))
        for key in ((2, 3, 1), (2, 0, 2)):
            b = safetensors.numpy.load_file(os.path.join(exports[key], "model.safetensors"))
            worst = max(relative(b[n], a[n]) for n in a)
            print("train_gpt: np %d ZeRO-%d tp %d against np 1 ZeRO-0 after 20 steps: %.2e" % (*key, worst))
            self.assertLess(worst, 1e-4, str(key))
        # The checkpoint of the same run, converted: the same weights.
        converted = os.path.join(self.dir, "converted")
        run(EXPORT_HF, exports[(1, 0, 1)] + "-ckpt/checkpoint.tckp", converted)
        c = safetensors.numpy.load_file(os.path.join(converted, "model.safetensors"))
        self.assertEqual(sorted(c), sorted(a))
        for n in a:
            np.testing.assert_array_equal(c[n], a[n], n)


if __name__ == "__main__":
    HF_TOOL, TRAIN_GPT, EXPORT_HF = sys.argv[1], sys.argv[2], sys.argv[3]
    torch.set_num_threads(1)
    unittest.main(argv=sys.argv[:1], verbosity=2)
