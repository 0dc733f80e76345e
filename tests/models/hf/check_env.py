#!/usr/bin/env python3
"""Checks the Python reference environment (.venv-ref/, scripts/setup.sh) and reports its
versions: what the tests that compare tutti's models with Hugging Face transformers need of it.
Builds small random models (no download: HF_HUB_OFFLINE=1), runs forward and backward in fp32 on
the CPU and saves them as safetensors:
  - LlamaForCausalLM with grouped-query attention (2 key/value heads for 4 query heads), untied
    head, and again with Llama 3's rope scaling (rope_type "llama3");
  - GPT2LMHeadModel.
Run it with the environment's python: .venv-ref/bin/python tests/models/hf/check_env.py
"""
import os
import platform
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy  # noqa: E402
import safetensors  # noqa: E402
import safetensors.torch  # noqa: E402
import tokenizers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM  # noqa: E402


def forward_backward(model, vocab):
    """Loss and the gradient of every parameter, fp32, on the CPU."""
    tokens = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(1))
    out = model(input_ids=tokens, labels=tokens)
    out.loss.backward()
    assert out.logits.dtype == torch.float32 and out.logits.shape == (2, 16, vocab), out.logits.shape
    assert torch.isfinite(out.loss), out.loss
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, "no gradient for " + ", ".join(missing)
    return out.loss.item()


def saved(model, config):
    """save_pretrained(safe_serialization=True) writes config.json and model.safetensors, whose
    tensors are the model's (the tied head of GPT-2 once)."""
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d, safe_serialization=True)
        files = sorted(os.listdir(d))
        assert "config.json" in files and "model.safetensors" in files, files
        tensors = safetensors.torch.load_file(os.path.join(d, "model.safetensors"))
        params = dict(model.named_parameters())
        for name, t in tensors.items():
            assert t.dtype == torch.float32, (name, t.dtype)
            assert torch.equal(t, params[name].detach()), name
        reloaded = type(model).from_pretrained(d)
        assert reloaded.config.to_dict()["vocab_size"] == config.vocab_size
        return files, len(tensors)


def main():
    torch.manual_seed(0)
    print("python %s (%s), torch %s, transformers %s, tokenizers %s, safetensors %s, numpy %s"
          % (platform.python_version(), sys.executable, torch.__version__, transformers.__version__,
             tokenizers.__version__, safetensors.__version__, numpy.__version__))
    print("torch from %s" % os.path.dirname(torch.__file__))

    llama = dict(hidden_size=64, intermediate_size=176, num_attention_heads=4, num_key_value_heads=2,
                 num_hidden_layers=2, vocab_size=300, tie_word_embeddings=False)
    config = LlamaConfig(**llama)
    model = LlamaForCausalLM(config).float()
    k = model.model.layers[0].self_attn.k_proj.weight
    assert k.shape == (2 * 16, 64), k.shape  # 2 key/value heads of 16: grouped-query attention
    loss = forward_backward(model, 300)
    files, n = saved(model, config)
    print("LlamaForCausalLM (GQA 4/2, untied, attention %s): loss %.4f, fp32 forward+backward; saved %s (%d tensors)"
          % (model.config._attn_implementation, loss, " ".join(files), n))

    scaled = LlamaConfig(**llama, rope_theta=500000.0, max_position_embeddings=131072,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    model = LlamaForCausalLM(scaled).float()
    assert model.model.rotary_emb.rope_type == "llama3", model.model.rotary_emb.rope_type
    print("LlamaForCausalLM with rope_scaling llama3: loss %.4f" % forward_backward(model, 300))

    config = GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=300)
    model = GPT2LMHeadModel(config).float()
    loss = forward_backward(model, 300)
    files, n = saved(model, config)
    print("GPT2LMHeadModel: loss %.4f, fp32 forward+backward; saved %s (%d tensors)" % (loss, " ".join(files), n))
    print("reference environment: OK")


if __name__ == "__main__":
    main()
