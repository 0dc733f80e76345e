// train_fashion_mnist's command line: the flags, their parsing, and the ones that shape the run.
#pragma once

#include <cstdint>
#include <string>

#include <tutti/tutti.h>

#include "../common/run_flags.h"

namespace fmnist {

// The flags both trainers share (device, precision, ZeRO, checkpoints, --json...) are
// example::RunFlags's.
struct Flags : example::RunFlags {
  std::string model = "mlp";
  int epochs = 5;
  std::int64_t batch_size = 128;
  int accum_steps = 1;
  double lr = -1;  // per optimizer when not given
  std::string optimizer = "sgd";
  std::string lr_schedule = "cosine";
  std::int64_t warmup_steps = 0;
  double momentum = 0.9;
  double weight_decay = -1;  // per optimizer when not given
  std::uint64_t seed = 1;
  std::int64_t max_steps = 0;
  std::string data = tutti::data::fashion_mnist_dir();
  std::int64_t train_subset = 0;
  std::int64_t test_subset = 0;
  std::string progress = "auto";
  // Watching the job (docs/observability.md).
  std::string trace;         // TUTTI_TRACE when empty
  std::string metrics_file;  // Prometheus textfile; "%r" is the rank
  double metrics_interval = 10;
  int metrics_port = 0;      // /metrics on port + local rank
  int straggler_every = 50;  // 0: off
  double straggler_threshold = 0.2;
  std::string debug_slow;  // "R:MS" or "R:P%": rank R busy-waits in every step's compute (tests)
};

// Parses the command line into `f`. Returns -1 to go on, else the exit code: 0 after --help,
// 2 for a bad command line (CLI11 has printed why).
int parse_flags(int argc, char** argv, Flags& f);

// The flags that shape the run: every rank must have the same (an MPMD launch could differ).
std::string shaping_flags(const Flags& f);

}  // namespace fmnist
