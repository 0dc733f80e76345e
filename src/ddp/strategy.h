// The sharding strategies behind DistributedDataParallel (DdpOptions::sharding, ddp/sharding.h).
//
// DistributedDataParallel is the frame: the start-up checks, the plan, the reducer, the
// gradient hooks, the step's order and its statistics. Wherever an answer depends on what a
// rank holds, it asks its strategy, and only the strategy: no stage number is tested outside
// these files. Each strategy owns its buffers (the fp32 master shard, the gathers of the updated
// parameters, ZeRO-3's gather buffers), its part of the checkpoints and its memory figure.
//
//   Replicate         (replicate.cc)      every tensor whole on every rank
//   ShardedOptimizer  (zero.cc)           ZeRO-1 and 2: the fp32 masters and the optimizer's
//                                         state by shard; the updated parameters gathered
//                                         bucket by bucket during the next forward
//   ShardedParameters (zero3_strategy.cc) ZeRO-3: the parameters by shard too, gathered group by
//                                         group (Zero3Parameters, zero3.h)
// ShardedOptimizer and ShardedParameters share what a shard means (ShardedState, zero.cc): the
// optimizer's spans, the gradient norm over shards, the gathered checkpoints and the parts.
//
// The frame calls, in its constructor: flat_plan_options, gradient_sharding (the reducer is made),
// lay_out, (the parameters are broadcast), shard, install_hooks. Then per step: attach once,
// before_backward, after_reduce; zero_grad; and the state functions whenever asked.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tutti/comm/communicator.h"
#include "tutti/core/state_dict.h"
#include "tutti/ddp/ddp.h"
#include "tutti/ddp/memory.h"
#include "tutti/ddp/reducer.h"
#include "tutti/ddp/sharding.h"
#include "tutti/nn/flat_plan.h"
#include "tutti/nn/module.h"
#include "tutti/optim/optimizer.h"

namespace tutti::ddp {

// What the frame shares with its strategy, for the strategy's whole life.
struct StrategyContext {
  Communicator& comm;
  nn::Module& model;
  const std::vector<nn::Parameter*>& params;  // entry i of the plan is params[i]
  const std::unordered_map<const nn::Parameter*, std::size_t>& index;
};

class ShardingStrategy {
 public:
  explicit ShardingStrategy(StrategyContext context) : ctx_(context) {}
  virtual ~ShardingStrategy() = default;
  ShardingStrategy(const ShardingStrategy&) = delete;
  ShardingStrategy& operator=(const ShardingStrategy&) = delete;

  // ---- What it is ----
  virtual int stage() const = 0;  // ZeRO's number, for messages and figures
  // Whether each rank holds a shard of the state (so the state dicts gather, and no views exist).
  virtual bool sharded() const = 0;
  // Why `what` (the deterministic mode, a communication hook) cannot be used with this strategy;
  // "" when it can. The frame's refusals name the feature; this says why.
  virtual std::string refuses_deterministic() const { return ""; }
  virtual std::string refuses_comm_hook() const { return ""; }

  // ---- Set-up, in the frame's constructor ----
  // Whether deferred parameters are materialized whole before the plan (ZeRO-3 fills its shards
  // one group at a time instead).
  virtual bool materializes_whole() const { return true; }
  virtual GradientSharding gradient_sharding() const = 0;
  // The reducer exists: lays the model's values (unless deferred) and gradients out by its plan.
  // Before the parameters are broadcast.
  virtual void lay_out(Reducer& reducer, bool deferred);
  // After the broadcast: keeps this rank's shards (broadcast: rank 0's values are everyone's).
  // groups: each parameter's gather group (flat_plan_options'; ShardParameters only).
  virtual void shard(bool /*deferred*/, bool /*broadcast*/, const std::vector<std::string>& /*groups*/) {}
  // Installs the model's parameter-use and gradient-placement hooks, if it needs them.
  // index_of(p): p's entry in the plan.
  virtual void install_hooks(const std::function<std::size_t(const nn::Parameter&)>& /*index_of*/) {}

  // ---- The step ----
  // The optimizer's target: its spans over this rank's state.
  virtual optim::FlatTarget target(const std::weak_ptr<int>& alive) = 0;
  void set_attached(optim::Optimizer* optimizer) { attached_ = optimizer; }
  optim::Optimizer* attached() const { return attached_; }
  // Whether a step needs the optimizer attached (each rank updates its shard only).
  virtual bool needs_attached() const { return false; }
  // Before a backward: the gathers of the last step must be done (this step's update writes
  // what they read).
  virtual void before_backward() { synchronize_parameters(); }
  // After the reducer finished a step: releases what the optimizer must not see, and adds this
  // strategy's figures to the step's statistics.
  virtual void after_reduce(StepStats& /*stats*/) {}
  // zero_grad: forgets the gradients that live in the reducer's pool.
  virtual void zero_grad() {}
  // Waits until every parameter this rank reads outside forward is current.
  virtual void synchronize_parameters() {}
  // The squares of this rank's reduced gradients into sq (f32 [1], zero), summed over the
  // ranks where each holds a part: sq is then the global squared norm.
  virtual void grad_squares(const Tensor& sq, const Stream& stream) = 0;
  // The bytes of parameters, masters and gathered groups (DdpMemory's fields).
  virtual void memory(DdpMemory& m) const = 0;

  // ---- The state (DistributedDataParallel's functions of the same names say what each gives) ----
  virtual StateDict model_state_dict() = 0;
  virtual void load_model_state_dict(const StateDict& state) = 0;
  virtual StateDict optimizer_state_dict(optim::Optimizer& optimizer) = 0;
  virtual StateDict model_state_views() = 0;
  virtual StateDict optimizer_state_views(optim::Optimizer& optimizer) = 0;
  virtual StateParts model_state_parts() = 0;
  virtual StateParts optimizer_state_parts(optim::Optimizer& optimizer) = 0;
  virtual Tensor parameters_flat() = 0;
  virtual void load_parameters_flat(const Tensor& flat) = 0;

 protected:
  const nn::FlatPlan& plan() const { return reducer_->plan(); }
  // The parameters and masters as the model's flat storage holds them (whole): its compute
  // copies and f32 values, or the f32 values alone.
  void whole_model_bytes(DdpMemory& m) const;
  // The optimizer's state tensors as its checkpoints name them: fn(key, k, entry) for state k
  // (state_names()[k], in order) of each of its parameters (plan entry `entry`), key
  // "<key_of(i)>.<state name>".
  void for_each_optimizer_state(
      optim::Optimizer& optimizer,
      const std::function<void(const std::string& key, std::size_t k, const nn::PlanEntry& entry)>& fn) const;

  StrategyContext ctx_;
  Reducer* reducer_ = nullptr;  // set by lay_out
  optim::Optimizer* attached_ = nullptr;
};

// The strategy that carries out `sharding`.
std::unique_ptr<ShardingStrategy> make_strategy(const Sharding& sharding, StrategyContext context);

// THE flat plan's options for `options` (its sharding and bucket caps) over `world_size` ranks:
// the shards' world size and, for ShardParameters, a bucket per run of one gather group (each
// parameter's group into `groups`; a frozen parameter is refused). DistributedDataParallel's
// constructor and predict_memory (ddp/memory.h) both make their plan with it.
nn::FlatPlanOptions flat_plan_options(const DdpOptions& options, const std::vector<nn::PlanParam>& params,
                                      int world_size, DType grad, std::vector<std::string>& groups);

// ---- Predictions (ddp/memory.h): each strategy's lines, beside the code that allocates them ----
struct PlannedModel {
  const MemoryInputs& in;
  const nn::FlatPlan& plan;
  const std::vector<std::string>& groups;  // ShardParameters' gather groups
};
// Fill prediction.lines[0..2] (parameters, master weights, gathered parameters), [4] (optimizer
// state), the matching DdpMemory fields and the gathers_* flags; return the reducer's sharding.
GradientSharding predict_replicate(const PlannedModel& m, MemoryPrediction& prediction);
GradientSharding predict_sharded_optimizer(const PlannedModel& m, bool shard_gradients, MemoryPrediction& prediction);
GradientSharding predict_sharded_parameters(const PlannedModel& m, const ShardParameters& options,
                                            MemoryPrediction& prediction);
// " (shard 1,234 of 5,678)" for a shard's lines.
std::string shard_of(const nn::FlatPlan& plan);
// The elements of the parameters (without the plan's padding).
std::int64_t numel_of(const std::vector<nn::PlanParam>& params);

// A whole state tensor as one part (begin 0), and every entry of a state dict so.
StatePart whole_part(const Tensor& t);
StateParts whole_parts(const StateDict& state);

}  // namespace tutti::ddp
