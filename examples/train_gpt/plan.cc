#include "plan.h"

#include <cstdio>

#include <tutti/tutti.h>

#include "../common/run_support.h"
#include "model.h"

namespace gpt {

int print_plan(Flags f) {
  namespace m = tutti::models;
  namespace t = tutti::train;
  const ModelConfig config = model_config(f, 0);  // the preset's vocabulary: --data is not read
  if (f.seq_len == 0) f.seq_len = std::min<std::int64_t>(context_of(config), 1024);
  const int world = f.world_size;
  TUTTI_CHECK_ARG(world % f.tp == 0, "--plan: --tp ", f.tp, " must divide --world-size ", world);
  TUTTI_CHECK_ARG(!f.sequence_parallel || f.tp > 1,
                  "--plan: --sequence-parallel splits the rows over the --tp "
                  "group: give --tp 2 or more");
  const int dp = world / f.tp;  // the batch is cut over the data-parallel ranks only
  f.accum_steps = example::accumulation_steps(f, f.batch_size, f.accum_steps, dp);  // checks the batch divides
  const tutti::amp::Policy policy = example::precision_policy(f.precision, f.grad_comm);
  t::PlanOptions o;
  o.world_size = world;
  o.tensor_parallel = f.tp;
  o.sequence_parallel = f.sequence_parallel;
  o.zero_stage = f.zero;
  o.compute = policy.compute;
  o.grad = policy.grad;
  o.grad_comm = policy.comm;
  o.recompute = m::Recompute::parse(f.recompute);
  o.micro_batch = f.batch_size / (static_cast<std::int64_t>(f.accum_steps) * dp);
  o.seq_len = f.seq_len;
  o.bucket_cap_mb = f.bucket_mb;
  o.deterministic = f.deterministic;
  o.gpu = f.device != "cpu";
  o.cpu = !o.gpu;       // host memory is the device's: the host copies below count
  o.evaluation = true;  // evaluate() in main.cc: a loss of its own, between steps
  o.state_dict = true;  // the final params_crc32 (with --tp gathered whole over the group)
  if (!f.checkpoint_dir.empty())
    o.checkpoint = f.checkpoint_mode == "sync" ? t::PlanOptions::Checkpoint::sync : t::PlanOptions::Checkpoint::async;
  const t::MemoryPlan plan = memory_plan(config, o);
  const std::string split = f.tp > 1
                                ? ", tp " + std::to_string(f.tp) + (f.sequence_parallel ? " sequence-parallel" : "") +
                                      " (data parallelism over " + std::to_string(dp) + ")"
                                : "";
  std::printf(
      "train_gpt --plan: %s (%s, %lld parameters), %d rank(s)%s, zero %d, %s, recompute %s, micro-batch %lld x "
      "%lld tokens per rank (batch %lld = %d rank(s) x %d accumulation step(s) x %lld)%s\n",
      f.model.c_str(), fingerprint_of(config).c_str(), static_cast<long long>(plan.parameters), world, split.c_str(),
      f.zero, f.precision.c_str(), o.recompute.str().c_str(), static_cast<long long>(o.micro_batch),
      static_cast<long long>(o.seq_len), static_cast<long long>(f.batch_size), dp, f.accum_steps,
      static_cast<long long>(o.micro_batch), o.gpu ? ", GPU kernel scratch counted" : "");
  std::printf("bytes per rank:\n%s", plan.str().c_str());
  if (f.device_memory.empty()) {
    std::printf("(--device-memory SIZE, e.g. 141GB, gives the largest micro-batch that fits)\n");
    return 0;
  }
  const std::int64_t memory = t::parse_bytes(f.device_memory);
  const std::int64_t largest = largest_micro_batch(config, o, memory);
  std::printf("largest micro-batch that fits %s per rank: %lld sequence(s) of %lld tokens\n", f.device_memory.c_str(),
              static_cast<long long>(largest), static_cast<long long>(o.seq_len));
  const std::string advice = fit_advice(config, o, memory);
  if (advice.empty()) {
    std::printf("fits: %.1f%% of %s\n", 100.0 * static_cast<double>(plan.total()) / static_cast<double>(memory),
                f.device_memory.c_str());
    return 0;
  }
  std::fprintf(stderr, "train_gpt --plan: %s", advice.c_str());
  return 1;
}

}  // namespace gpt
