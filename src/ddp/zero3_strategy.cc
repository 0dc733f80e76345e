// ZeRO-3 (ShardParameters): the parameters by shard too. Zero3Parameters (zero3.h) owns the
// compute shard, the two gather buffers and the resident group; this strategy makes it, routes
// the model's hooks to it and answers for its state.
#include "core/format_bytes.h"
#include "ddp/sharded_state.h"
#include "ddp/zero3.h"
#include "tutti/core/error.h"

namespace tutti::ddp {

using tutti::detail::format_count;
namespace {

class ShardedParameters final : public ShardedState {
 public:
  ShardedParameters(StrategyContext context, ShardParameters options)
      : ShardedState(context), options_(std::move(options)) {}
  ~ShardedParameters() override { release_grads(); }

  int stage() const override { return 3; }
  std::string refuses_deterministic() const override {
    return "ZeRO-3 keeps no full gradient buffer to sum the slices into";
  }
  bool materializes_whole() const override { return false; }
  GradientSharding gradient_sharding() const override { return GradientSharding::shard_only; }

  void shard(bool deferred, bool broadcast, const std::vector<std::string>& groups) override {
    groups_ = groups;
    nn::Module& model = ctx_.model;
    const nn::FlatPlan& p = plan();
    master_shard_ = Tensor::empty({p.shard_numel}, DType::f32, model.device());
    std::vector<Tensor> resident;  // deferred: the resident buckets' values
    if (deferred) {
      resident = shard_deferred_parameters(ctx_.comm, model, p, groups_, broadcast, master_shard_);
    } else {
      keep_chunks(model.storage().values());
    }
    const auto bucket_values = [&](int b) {
      const nn::PlanBucket& pb = p.buckets[static_cast<std::size_t>(b)];
      return deferred ? resident[static_cast<std::size_t>(b)] : model.storage().values().view(pb.begin, {pb.numel()});
    };
    zero3_ = std::make_unique<Zero3Parameters>(ctx_.comm, model, p, groups_, options_.gather_buffer_mb, master_shard_,
                                               bucket_values, options_.prefetch);
  }

  void install_hooks(const std::function<std::size_t(const nn::Parameter&)>& index_of) override {
    nn::FlatStorage& storage = ctx_.model.storage();
    storage.set_grad_placement_hook([this, index_of](nn::Parameter& p) { return reducer_->grad(index_of(p)); });
    storage.set_param_use_hook([this, index_of](nn::Parameter& p) { zero3_->use(plan().entries[index_of(p)].bucket); });
  }

  void after_reduce(StepStats& stats) override {
    zero3_->synchronize();  // no gather may read the compute shard the optimizer writes
    release_grads();        // views into pool buffers other buckets reuse
    stats.gather_ms = 0;
    stats.exposed_gather_ms = zero3_->take_exposed_ms();
  }
  void zero_grad() override { release_grads(); }
  void synchronize_parameters() override { zero3_->synchronize(); }

  void memory(DdpMemory& m) const override {
    const std::int64_t master = static_cast<std::int64_t>(master_shard_.storage()->nbytes());
    m.parameters = zero3_->half() ? zero3_->compute_shard_bytes() : master;
    m.master_weights = zero3_->half() ? master : 0;
    m.gathered = zero3_->gathered_bytes();
  }

 protected:
  void fill_span(const nn::PlanBucket& pb, const nn::ElementRange& /*mine*/, optim::FlatSpan& span) const override {
    span.value = master_shard_.view(pb.shard_offset, {pb.chunk});
    if (zero3_->half()) span.compute = zero3_->compute_shard().view(pb.shard_offset, {pb.chunk});
  }
  // Even on one rank: the gathers fill the whole buffers.
  void after_step() override { zero3_->after_step(); }
  // The compute shard and the resident buckets; the gathered groups are dropped.
  void loaded(const Tensor& values) override { zero3_->load(values); }

 private:
  ShardParameters options_;
  std::vector<std::string> groups_;  // each parameter's gather group ("": resident)
  std::unique_ptr<Zero3Parameters> zero3_;
};

}  // namespace

GradientSharding predict_sharded_parameters(const PlannedModel& m, const ShardParameters& options,
                                            MemoryPrediction& p) {
  // shard(): the master shard, and Zero3Parameters' compute shard (half), two gather buffers and
  // the resident buckets.
  const std::int64_t total = m.plan.total, shard = m.plan.shard_numel;
  const bool half = m.in.compute != DType::f32;
  const auto cd = static_cast<std::int64_t>(size_of(m.in.compute));
  const std::string dtype = half ? std::string(name_of(m.in.compute)) : "f32";
  p.lines[0] = {"parameters", shard * (half ? cd : 4),
                dtype + " shard, " + format_count(shard) + " of " + format_count(total) + " elements" +
                    (half ? "" : " (the masters)")};
  p.lines[1] = {"master weights", half ? shard * 4 : 0,
                half ? "f32" + shard_of(m.plan) : "none: the f32 shard is the masters"};
  std::int64_t largest = 0, resident = 0;
  for (const nn::PlanBucket& b : m.plan.buckets) {
    if (b.entries.empty()) continue;
    if (m.groups[b.entries.front()].empty())
      resident += b.numel();
    else
      largest = std::max(largest, b.numel());
  }
  const std::int64_t buffer =
      options.gather_buffer_mb > 0 ? static_cast<std::int64_t>(options.gather_buffer_mb * 1024 * 1024) / cd : largest;
  p.lines[2] = {"gathered parameters", (2 * std::max<std::int64_t>(buffer, 1) + resident) * cd,
                "2 gather buffers of " + format_count(buffer) + " elements (" +
                    (options.gather_buffer_mb > 0 ? "ShardParameters::gather_buffer_mb" : "the largest group") +
                    ") + the resident group of " + format_count(resident) +
                    (m.in.resident.empty() ? "" : " (" + m.in.resident + ")") + ", " + dtype};
  p.lines[4] = {"optimizer state", m.in.optimizer_states * shard * 4,
                std::to_string(m.in.optimizer_states) + " x f32" + shard_of(m.plan)};
  p.gathers_values = true;
  return GradientSharding::shard_only;
}

std::unique_ptr<ShardingStrategy> make_sharded_parameters(const ShardParameters& options, StrategyContext context) {
  return std::make_unique<ShardedParameters>(context, options);
}

}  // namespace tutti::ddp
