#include "flags.h"

#include <CLI/CLI.hpp>

#include <sstream>

namespace fmnist {

int parse_flags(int argc, char** argv, Flags& f) {
  CLI::App app{
      "Data-parallel training of Fashion-MNIST with tutti. Run it under mpirun, e.g.\n"
      "  mpirun -np 2 train_fashion_mnist --model mlp --epochs 5"};
  app.add_option("--model", f.model, "mlp (784-512-256-10) or cnn (two conv blocks)")
      ->check(CLI::IsMember({"mlp", "cnn"}))
      ->capture_default_str();
  app.add_option("--epochs", f.epochs, "passes over the training set")
      ->check(example::positive(f.epochs))
      ->capture_default_str();
  app.add_option("--batch-size", f.batch_size, "GLOBAL batch per optimizer step, split evenly across ranks")
      ->check(example::positive(f.batch_size))
      ->capture_default_str();
  app.add_option("--accum-steps", f.accum_steps, "micro-batches accumulated per optimizer step")
      ->check(example::positive(f.accum_steps))
      ->capture_default_str();
  app.add_option("--lr", f.lr, "learning rate (default 0.05 for sgd, 1e-3 for adamw)")->check(example::positive(f.lr));
  app.add_option("--optimizer", f.optimizer, "sgd (momentum) or adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}))
      ->capture_default_str();
  app.add_option("--lr-schedule", f.lr_schedule, "constant, or cosine decay to 0 over the epochs")
      ->check(CLI::IsMember({"constant", "cosine"}))
      ->capture_default_str();
  app.add_option("--warmup-steps", f.warmup_steps, "linear learning-rate warm-up steps")
      ->check(example::non_negative(f.warmup_steps))
      ->capture_default_str();
  app.add_option("--momentum", f.momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--weight-decay", f.weight_decay, "weight decay (default 0 for sgd, 0.01 for adamw)")
      ->check(example::non_negative(f.weight_decay));
  app.add_option("--seed", f.seed, "seed of the initialization and the data order")->capture_default_str();
  app.add_option("--max-steps", f.max_steps, "stop after this many steps in total (0: all epochs)")
      ->check(example::non_negative(f.max_steps))
      ->capture_default_str();
  app.add_option("--data", f.data,
                 "directory with Fashion-MNIST's *-ubyte.gz files (default: $TUTTI_FASHION_MNIST_DIR if set, "
                 "else Debian's)")
      ->capture_default_str();
  app.add_option("--train-subset", f.train_subset, "use (and read) only the first N training samples (0: all)")
      ->check(example::non_negative(f.train_subset));
  app.add_option("--test-subset", f.test_subset, "use (and read) only the first N test samples (0: all)")
      ->check(example::non_negative(f.test_subset));
  app.add_option("--progress", f.progress, "bar (redrawn in place), lines, or auto (a bar on a terminal)")
      ->check(CLI::IsMember({"auto", "bar", "lines"}))
      ->capture_default_str();
  app.add_option("--trace", f.trace,
                 "write a timeline of every rank (Chrome trace JSON: DIR/trace.json and DIR/trace-rank<R>.json); "
                 "default: $TUTTI_TRACE; $TUTTI_TRACE_STEPS=FROM:TO limits it to those steps");
  app.add_option("--metrics-file", f.metrics_file,
                 "Prometheus textfile (node_exporter's textfile collector), rewritten atomically; %r is the rank, "
                 "else -rank<R> is added with several ranks");
  app.add_option("--metrics-interval", f.metrics_interval, "seconds between rewrites of --metrics-file")
      ->check(example::positive(f.metrics_interval))
      ->capture_default_str();
  app.add_option("--metrics-port", f.metrics_port, "serve Prometheus metrics at http://HOST:PORT+local_rank/metrics")
      ->check(CLI::Range(1, 65535));
  app.add_option("--straggler-every", f.straggler_every,
                 "compare the ranks' compute and data-loading times every N steps (0: never); rank 0 names a rank "
                 "that is slower than the others' median by more than --straggler-threshold and than the noise "
                 "between the ranks' steps, in two such windows in a row")
      ->check(example::non_negative(f.straggler_every))
      ->capture_default_str();
  app.add_option("--straggler-threshold", f.straggler_threshold,
                 "fraction slower than the median that makes a straggler")
      ->check(example::positive(f.straggler_threshold))
      ->capture_default_str();
  app.add_option("--debug-slow", f.debug_slow,
                 "RANK:MS or RANK:P%: that rank busy-waits MS ms in every step, or P% of its own compute before "
                 "the first collective in the step before (to see a straggler)");
  example::add_run_flags(app, f);
  return example::parse_command_line(app, argc, argv);
}

std::string shaping_flags(const Flags& f) {
  std::ostringstream s;
  s << "--model " << f.model << " --epochs " << f.epochs << " --batch-size " << f.batch_size << " --accum-steps "
    << f.accum_steps << " --lr " << f.lr << " --optimizer " << f.optimizer << " --lr-schedule " << f.lr_schedule
    << " --warmup-steps " << f.warmup_steps << " --momentum " << f.momentum << " --weight-decay " << f.weight_decay
    << " --precision " << f.precision << " --grad-comm " << f.grad_comm << " --bucket-mb " << f.bucket_mb << " --zero "
    << f.zero << " --seed " << f.seed << " --max-steps " << f.max_steps << " --train-subset " << f.train_subset
    << " --test-subset " << f.test_subset << " --checkpoint-every " << f.checkpoint_every << " --resume " << f.resume
    << (f.overwrite ? " --overwrite" : "");
  return s.str();
}

}  // namespace fmnist
