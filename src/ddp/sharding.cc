// The sharding values (ddp/sharding.h) and what every strategy shares (strategy.h).
#include "tutti/ddp/sharding.h"

#include "ddp/strategy.h"
#include "tutti/core/error.h"

namespace tutti::ddp {

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

StatePart whole_part(const Tensor& t) { return StatePart{t.view(0, {t.numel()}), 0, t.shape()}; }

StateParts whole_parts(const StateDict& state) {
  StateParts out;
  for (const auto& [name, t] : state) out[name] = whole_part(t);
  return out;
}

}  // namespace tutti::ddp
