// predict_memory (ddp/memory.h): the frame's part of the prediction. The plan is made as the
// constructor makes it; each strategy, the reducer and the exact sum state their own bytes.
#include "tutti/ddp/memory.h"

#include "core/format_bytes.h"
#include "ddp/exact_sum.h"
#include "ddp/sharded_state.h"
#include "ddp/strategy.h"
#include "tutti/core/error.h"

namespace tutti::ddp {

using tutti::detail::format_count;

MemoryPrediction predict_memory(const DdpOptions& options, const MemoryInputs& in) {
  TUTTI_CHECK_ARG(in.world_size >= 1 && in.optimizer_states >= 0, "predict_memory: world_size ", in.world_size,
                  " (>= 1) and optimizer_states ", in.optimizer_states, " (>= 0)");
  MemoryPrediction p;
  std::vector<std::string> groups;
  p.plan = nn::make_flat_plan(in.params, flat_plan_options(options, in.params, in.world_size, in.grad, groups));
  p.lines.resize(6);
  const PlannedModel m{in, p.plan, groups};
  GradientSharding gradients = GradientSharding::none;
  if (const auto* s = std::get_if<ShardParameters>(&options.sharding)) {
    gradients = predict_sharded_parameters(m, *s, p);
  } else if (std::holds_alternative<Replicate>(options.sharding)) {
    gradients = predict_replicate(m, p);
  } else {
    gradients = predict_sharded_optimizer(m, std::holds_alternative<ShardGradients>(options.sharding), p);
  }
  p.sharded = !std::holds_alternative<Replicate>(options.sharding);
  p.gathers_optimizer_state = p.sharded && in.world_size > 1;

  const DType wire = options.reducer.grad_comm_dtype.value_or(in.grad_comm);
  const bool pooled = gradients == GradientSharding::shard_only;
  const int pool = pooled ? Reducer::pool_buffers(p.plan, in.backward_order) : 0;
  const Reducer::Bytes reducer = Reducer::predicted_bytes(p.plan, in.grad, wire, gradients, pool);
  p.lines[3] = {"gradients", reducer.gradients,
                std::string(name_of(in.grad)) + (pooled ? shard_of(p.plan) : ", the reducer's flat buffer")};
  std::int64_t largest = 0;
  for (const nn::PlanBucket& b : p.plan.buckets) largest = std::max(largest, b.numel());
  const int buckets = static_cast<int>(p.plan.buckets.size());
  MemoryLine comm{
      "communication buffers", reducer.communication,
      pooled ? std::to_string(pool) + " bucket buffer(s) of " + format_count(largest) + " elements (of " +
                   std::to_string(buckets) + " buckets)" + (wire != in.grad ? " + staging" : "")
             : std::to_string(buckets) + " bucket(s)" +
                   (wire != in.grad ? ", staged in " + std::string(name_of(wire)) : ", none staged (same dtype)")};
  if (options.deterministic) {
    comm.bytes += ExactGradientSum::predicted_bytes(p.plan.total);
    comm.detail += ", exact-sum accumulator";
  }
  p.lines[5] = comm;

  p.bytes.parameters = p.lines[0].bytes;
  p.bytes.master_weights = p.lines[1].bytes;
  p.bytes.gathered = p.lines[2].bytes;
  p.bytes.gradients = p.lines[3].bytes;
  p.bytes.optimizer_state = p.lines[4].bytes;
  p.bytes.communication = p.lines[5].bytes;
  return p;
}

}  // namespace tutti::ddp
