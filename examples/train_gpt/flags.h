// train_gpt's command line: the flags and their parsing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "../common/run_flags.h"

namespace gpt {

// The flags both trainers share (device, precision, ZeRO, checkpoints, --json...) are
// example::RunFlags's.
struct Flags : example::RunFlags {
  Flags() { progress_interval = 5.0; }
  std::string model = "gpt-tiny";
  std::int64_t layers = 0, heads = 0, width = 0, context = 0;  // 0: the preset's
  std::int64_t kv_heads = 0, ffn = 0;                          // a Llama's; 0: the preset's
  std::string attention = "flash";                             // nn::parse_attention_kernel's spelling
  std::string init_from;             // --init-from: a Hugging Face folder (models/hf.h) to start from
  std::string export_dir;            // --export: a Hugging Face folder written at the end
  std::string export_dtype = "f32";  // --export-dtype: f32, bf16 or f16
  std::string recompute = "none";    // models::Recompute::parse's spelling
  int tp = 1;                        // --tp: tensor-parallel ranks per model (models::Gpt(config, group))
  bool sequence_parallel = false;    // --sequence-parallel: TensorParallelOptions::sequence_parallel
  std::vector<std::string> data, val_data;
  double val_fraction = 0.1;
  std::string tokenizer;
  std::int64_t seq_len = 0;  // 0: the context, at most 1024
  std::int64_t batch_size = 32;
  int accum_steps = 1;
  std::int64_t steps = 300;
  std::int64_t max_steps = 0;  // stop after this many (0: --steps); the schedule still spans --steps
  double lr = 1e-3;
  double min_lr = -1;  // lr / 10 when not given
  std::int64_t warmup_steps = 50;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.99;
  double grad_clip = 1.0;
  std::uint64_t seed = 1;
  std::int64_t eval_every = 100;
  std::int64_t val_tokens = 65536;
  std::int64_t sample_tokens = 300;
  double temperature = 0.8;
  std::int64_t top_k = 40;
  std::string prompt = "\n";
  bool plan = false;          // --plan: print the memory plan (plan.h) and exit
  int world_size = 1;         // --world-size: the ranks --plan plans for
  std::string device_memory;  // --device-memory: bytes per device for --plan ("141GB")
};

// Parses the command line into `f`. Returns -1 to go on, else the exit code: 0 after --help,
// 2 for a bad command line (CLI11 has printed why).
int parse_flags(int argc, char** argv, Flags& f);

}  // namespace gpt
