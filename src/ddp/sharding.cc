// The sharding values (ddp/sharding.h) and what every strategy shares (strategy.h).
#include "tutti/ddp/sharding.h"

#include "core/format_bytes.h"
#include "ddp/strategy.h"
#include "ddp/zero3.h"
#include "tutti/core/error.h"

namespace tutti::ddp {

using tutti::detail::format_count;

int zero_stage(const Sharding& sharding) { return static_cast<int>(sharding.index()); }

Sharding sharding_of_stage(int stage, std::function<std::string(const std::string& name)> gather_group) {
  switch (stage) {
    case 0: return Replicate{};
    case 1: return ShardOptimizer{};
    case 2: return ShardGradients{};
    case 3: return ShardParameters{.gather_group = std::move(gather_group)};
    default: TUTTI_THROW(InvalidArgument, "sharding_of_stage: ZeRO stage ", stage, " does not exist (0, 1, 2 or 3)");
  }
}

nn::FlatPlanOptions flat_plan_options(const DdpOptions& options, const std::vector<nn::PlanParam>& params,
                                      int world_size, DType grad, std::vector<std::string>& groups) {
  nn::FlatPlanOptions po;
  po.bucket_cap_mb = options.bucket_cap_mb;
  po.first_bucket_cap_mb = options.first_bucket_cap_mb;
  po.grad_element_bytes = size_of(grad);
  po.world_size = std::holds_alternative<Replicate>(options.sharding) ? 1 : world_size;
  groups.clear();
  if (const auto* zero3 = std::get_if<ShardParameters>(&options.sharding)) {
    po.segments = gather_segments(params, zero3->gather_group, groups);
    po.bucket_cap_mb = po.first_bucket_cap_mb = 1e12;  // one bucket per group
  }
  return po;
}

std::int64_t numel_of(const std::vector<nn::PlanParam>& params) {
  std::int64_t n = 0;
  for (const nn::PlanParam& p : params) {
    std::int64_t k = 1;
    for (const std::int64_t d : p.shape) k *= d;
    n += k;
  }
  return n;
}

std::string shard_of(const nn::FlatPlan& plan) {
  return " (shard " + format_count(plan.shard_numel) + " of " + format_count(plan.total) + ")";
}

void ShardingStrategy::lay_out(Reducer& reducer, bool deferred) {
  reducer_ = &reducer;
  nn::Module& model = ctx_.model;
  model.drop_grads();
  if (!deferred) model.storage().flatten(plan());
  // A whole gradient buffer: every gradient is written straight into its bucket.
  if (gradient_sharding() != GradientSharding::shard_only) model.storage().set_grad_buffer(reducer.buffer(), plan());
}

void ShardingStrategy::for_each_optimizer_state(
    optim::Optimizer& optimizer,
    const std::function<void(const std::string& key, std::size_t k, const nn::PlanEntry& entry)>& fn) const {
  const std::vector<std::string> names = optimizer.state_names();
  const std::vector<nn::Parameter*> mine = optimizer.parameters();
  for (std::size_t k = 0; k < names.size(); ++k) {
    for (std::size_t i = 0; i < mine.size(); ++i) {
      fn(optimizer.key_of(i) + "." + names[k], k, plan().entries[ctx_.index.at(mine[i])]);
    }
  }
}

void ShardingStrategy::whole_model_bytes(DdpMemory& m) const {
  const nn::FlatStorage& s = ctx_.model.storage();
  const auto bytes = [](const Tensor& t) { return t.defined() ? static_cast<std::int64_t>(t.storage()->nbytes()) : 0; };
  if (s.compute_copies().defined()) {
    m.parameters = bytes(s.compute_copies());
    m.master_weights = bytes(s.values());
  } else {
    m.parameters = bytes(s.values());  // f32 compute: the parameters are the masters
  }
}

StatePart whole_part(const Tensor& t) { return StatePart{t.view(0, {t.numel()}), 0, t.shape()}; }

StateParts whole_parts(const StateDict& state) {
  StateParts out;
  for (const auto& [name, t] : state) out[name] = whole_part(t);
  return out;
}

}  // namespace tutti::ddp
