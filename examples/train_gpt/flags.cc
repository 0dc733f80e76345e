#include "flags.h"

#include <tutti/tutti.h>
#include <CLI/CLI.hpp>

#include "model.h"

namespace gpt {

int parse_flags(int argc, char** argv, Flags& f) {
  CLI::App app{
      "Data-parallel training of a GPT-2 or Llama language model with tutti. Run it under mpirun, e.g.\n"
      "  mpirun -np 2 train_gpt --model gpt-tiny\n"
      "  mpirun -np 2 train_gpt --model llama-tiny"};
  app.add_option("--model", f.model,
                 "gpt-tiny (4 layers, 4 heads, 128 wide, context 128), GPT-2 as llm.c builds it (gpt2-124m, "
                 "gpt2-350m, gpt2-774m, gpt2-1558m), llama-tiny (4 layers, 4 heads sharing 2 key/value heads, 128 "
                 "wide, context 256), or the shapes of Llama 3 (llama3.2-1b, llama3.1-8b)")
      ->check(CLI::IsMember(gpt::model_names()))
      ->capture_default_str();
  app.add_option("--attention", f.attention,
                 "flash (tiled, memory linear in the sequence) or materialized (keeps the T x T probabilities; GPT "
                 "and multi-head Llama only)")
      ->check(CLI::IsMember({"flash", "materialized"}))
      ->capture_default_str();
  app.add_option("--tp", f.tp,
                 "tensor parallelism: each model split over N ranks (each layer's heads and MLP features), data "
                 "parallelism over the world / N groups; N must divide the ranks, and the heads")
      ->check(example::positive(f.tp))
      ->capture_default_str();
  app.add_flag("--sequence-parallel", f.sequence_parallel,
               "with --tp N: the norms and the residual stream hold 1/N of the batch's rows too (Megatron's "
               "sequence parallelism: less activation memory, one more allgather per layer in backward)");
  app.add_option("--recompute", f.recompute,
                 "activation checkpointing: none, blocks (every residual block recomputes its forward in "
                 "backward: least memory, about one more forward), every:K (the blocks of layers 0, K, 2K, ...), "
                 "attn or mlp (only those blocks)")
      ->check(CLI::Validator(
          [](std::string& v) {
            try {
              tutti::models::Recompute::parse(v);
              return std::string();
            } catch (const tutti::InvalidArgument& e) {
              return std::string(e.what());
            }
          },
          "POLICY"))
      ->capture_default_str();
  app.add_option("--layers", f.layers, "override the preset's layers")->check(example::positive(f.layers));
  app.add_option("--heads", f.heads, "override the preset's heads")->check(example::positive(f.heads));
  app.add_option("--width", f.width, "override the preset's width")->check(example::positive(f.width));
  app.add_option("--context", f.context, "override the preset's context length")->check(example::positive(f.context));
  app.add_option("--init-from", f.init_from,
                 "start from a Hugging Face folder (config.json and safetensors of a GPT-2 or Llama, as transformers' "
                 "save_pretrained writes them): the model's shape and weights come from there (--model and the shape "
                 "flags are not used); the data's token ids must be below its vocabulary");
  app.add_option("--export", f.export_dir,
                 "at the end of a completed run, write the model as a Hugging Face folder (config.json and "
                 "safetensors, sharded above 5 GB) that transformers' from_pretrained loads");
  app.add_option("--export-dtype", f.export_dtype, "the exported weights' dtype: f32, bf16 or f16")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  app.add_option("--kv-heads", f.kv_heads, "override a Llama preset's key/value heads (they must divide --heads)")
      ->check(example::positive(f.kv_heads));
  app.add_option("--ffn", f.ffn, "override a Llama preset's MLP width (intermediate_size)")
      ->check(example::positive(f.ffn));
  app.add_option("--data", f.data,
                 "text files (byte-level, vocabulary 256) or llm.c .bin token shards; default: Debian's fortunes");
  app.add_option("--val-data", f.val_data, "validation files (default: the last --val-fraction of --data)");
  app.add_option("--val-fraction", f.val_fraction, "share of the data held out for validation")
      ->check(CLI::Range(0.001, 0.5))
      ->capture_default_str();
  app.add_option("--tokenizer", f.tokenizer, "llm.c's gpt2_tokenizer.bin, to print the sample of a token-shard run");
  app.add_option("--seq-len", f.seq_len, "tokens per sequence (default: the context, at most 1024)")
      ->check(example::positive(f.seq_len));
  app.add_option("--batch-size", f.batch_size, "GLOBAL sequences per optimizer step, split evenly across ranks")
      ->check(example::positive(f.batch_size))
      ->capture_default_str();
  app.add_option("--accum-steps", f.accum_steps, "micro-batches accumulated per optimizer step")
      ->check(example::positive(f.accum_steps))
      ->capture_default_str();
  app.add_option("--steps", f.steps, "optimizer steps (the cosine schedule ends there)")
      ->check(example::positive(f.steps))
      ->capture_default_str();
  app.add_option("--max-steps", f.max_steps,
                 "stop after this many steps in all (0: --steps); the schedule spans --steps")
      ->check(example::non_negative(f.max_steps))
      ->capture_default_str();
  app.add_option("--lr", f.lr, "peak learning rate")->check(example::positive(f.lr))->capture_default_str();
  app.add_option("--min-lr", f.min_lr, "learning rate at the end of the cosine (default lr / 10)")
      ->check(example::non_negative(f.min_lr));
  app.add_option("--warmup-steps", f.warmup_steps, "linear warm-up steps")
      ->check(example::non_negative(f.warmup_steps))
      ->capture_default_str();
  app.add_option("--weight-decay", f.weight_decay,
                 "AdamW weight decay of the weight matrices (not of LayerNorm, biases, embeddings)")
      ->check(example::non_negative(f.weight_decay))
      ->capture_default_str();
  app.add_option("--beta1", f.beta1, "AdamW beta1")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--beta2", f.beta2, "AdamW beta2")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--grad-clip", f.grad_clip, "global gradient-norm clipping (0: off)")
      ->check(example::non_negative(f.grad_clip))
      ->capture_default_str();
  app.add_option("--seed", f.seed, "seed of the initialization, the data order and the sample")->capture_default_str();
  app.add_option("--eval-every", f.eval_every, "validation loss every N steps (0: only at the end)")
      ->check(example::non_negative(f.eval_every))
      ->capture_default_str();
  app.add_option("--val-tokens", f.val_tokens, "validation tokens per evaluation (the first windows)")
      ->check(example::positive(f.val_tokens))
      ->capture_default_str();
  app.add_option("--sample-tokens", f.sample_tokens, "tokens of text to generate at the end (0: none)")
      ->check(example::non_negative(f.sample_tokens))
      ->capture_default_str();
  app.add_option("--temperature", f.temperature, "sampling temperature")
      ->check(example::positive(f.temperature))
      ->capture_default_str();
  app.add_option("--top-k", f.top_k, "sample among the k likeliest tokens (0: all)")
      ->check(example::non_negative(f.top_k))
      ->capture_default_str();
  app.add_option("--prompt", f.prompt, "text the sample continues (byte-level data)");
  app.add_flag("--plan", f.plan,
               "print each rank's memory plan (parameters, gradients, optimizer state, activations...) for these "
               "flags and the largest micro-batch that fits --device-memory, then exit without training");
  app.add_option("--world-size", f.world_size, "ranks that --plan plans for")
      ->check(example::positive(f.world_size))
      ->capture_default_str();
  app.add_option("--device-memory", f.device_memory, "memory of one device for --plan, e.g. 141GB or 80GiB");
  example::add_run_flags(app, f);
  return example::parse_command_line(app, argc, argv);
}

}  // namespace gpt
