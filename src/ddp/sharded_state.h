// What a shard means, for the strategies that keep one (ZeRO-1, 2 and 3; strategy.h): each rank
// owns chunk `rank` of every bucket of the plan. It keeps the fp32 masters of its chunks (the
// master shard) where the model computes in a half dtype, and at stage 3 always; its optimizer
// updates those chunks only; its gradient norm and its state parts are its chunks'; whole state
// tensors are gathered from every rank's chunks.
#pragma once

#include "ddp/strategy.h"

namespace tutti::ddp {

class ShardedState : public ShardingStrategy {
 public:
  using ShardingStrategy::ShardingStrategy;

  bool sharded() const override { return true; }
  std::string refuses_comm_hook() const override {
    return "a hook replaces the allreduce of whole gradients; ZeRO reduce-scatters";
  }
  bool needs_attached() const override { return true; }

  optim::FlatTarget target(const std::weak_ptr<int>& alive) override;
  void grad_squares(const Tensor& sq, const Stream& stream) override;

  StateDict model_state_dict() override;
  void load_model_state_dict(const StateDict& state) override;
  StateDict optimizer_state_dict(optim::Optimizer& optimizer) override;
  StateDict model_state_views() override;
  StateDict optimizer_state_views(optim::Optimizer& optimizer) override;
  StateParts model_state_parts() override;
  StateParts optimizer_state_parts(optim::Optimizer& optimizer) override;
  Tensor parameters_flat() override;
  void load_parameters_flat(const Tensor& values) override;

 protected:
  // Where the optimizer reads and writes bucket `pb`'s chunk `mine` (its span's value and compute).
  virtual void fill_span(const nn::PlanBucket& pb, const nn::ElementRange& mine, optim::FlatSpan& span) const = 0;
  // Called by the optimizer after each step: the updated chunks go to every rank.
  virtual void after_step() = 0;
  // The whole fp32 values (plan layout, `values` on the device, `host` on the CPU) were loaded
  // into the master shard: refresh the parameters that forward reads.
  virtual void loaded(const Tensor& values) = 0;
  // Whether the fp32 masters are this rank's shard (else the model's values hold them whole).
  bool half_masters() const { return master_shard_.defined(); }
  // master_shard_ <- this rank's chunks of the whole fp32 values `whole` (plan layout).
  void keep_chunks(const Tensor& whole);
  // Forgets the parameters' gradients: views into the reducer's pool buffers, which other buckets
  // reuse (ShardGradients, ShardParameters).
  void release_grads() {
    for (nn::Parameter* p : ctx_.params) p->grad = Tensor();
  }
  // A whole [plan.total] f32 vector on the device from every rank's shard (chunks in bucket order).
  Tensor gather_full(const Tensor& shard);

  Tensor master_shard_;  // f32 [shard_numel]: half compute, and always at ZeRO-3
};

// ZeRO-3's strategy (zero3_strategy.cc).
std::unique_ptr<ShardingStrategy> make_sharded_parameters(const ShardParameters& options, StrategyContext context);

}  // namespace tutti::ddp
