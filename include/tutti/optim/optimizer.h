// Optimizer: the base of SGD and AdamW. Updates fp32 master weights in place from their
// gradients with the fused kernels of tutti/kernels/optimizer.h, keeps the half-precision
// compute copies equal to them in the same pass, and saves and loads its state.
//
// Parameter groups: an optimizer takes its parameters in groups (ParamGroup), each with its
// own weight decay (unset: the options'); weight_decay_groups() splits a model's parameters
// into decay and no-decay groups by a rule you can read (by default: matrices decay, unless
// their layer marked them no_weight_decay, as embeddings are; vectors do not). A list of
// parameters is one group.
//
// Two ways to update, chosen explicitly, never guessed:
// - Per parameter (the default): one fused kernel call per parameter that has a gradient at
//   the step, state buffers per parameter.
// - Bound to flat buffers (bind(FlatTarget)): the target names a FlatPlan (nn/flat_plan.h)
//   and spans of it (all of it, or one rank's shard under ZeRO) with their values, gradients
//   and compute copies. A step issues one fused call per run of elements that share a weight
//   decay (a whole model in one group: one call per span), and the state covers exactly the
//   spans, back to back. flat_target(model) binds a flattened model;
//   ddp::DistributedDataParallel::attach binds its buffers or this rank's shard.
// Binding carries the state over, parameter by parameter, so an optimizer can be bound (or
// rebound) after steps were taken.
//
// Streams: every kernel is issued on stream() (set_stream; by default the CPU stream, i.e.
// the device's default stream on a GPU). step() never waits for the device.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tutti/core/state_dict.h"
#include "tutti/core/stream.h"
#include "tutti/nn/flat_plan.h"
#include "tutti/nn/parameter.h"
#include "tutti/optim/lr_schedule.h"

namespace tutti::nn {
class Module;
}

namespace tutti::optim {

// Parameters that share hyperparameters.
struct ParamGroup {
  std::vector<nn::Parameter*> parameters;
  // Unset: the optimizer's options' weight_decay.
  std::optional<float> weight_decay;
};

// The default rule of weight_decay_groups: a parameter decays when it has 2 or more
// dimensions (weight matrices, convolution kernels) and its layer did not mark it
// no_weight_decay (nn/parameter.h: embedding tables, LayerNorm gains and offsets, biases). For
// a GPT of tutti's layers (TokenPositionEmbedding, blocks, TiedLinear) that is exactly the
// blocks' weight matrices, GPT-2's and nanoGPT's recipe; for an MLP or CNN, the weights.
bool decays_by_default(const nn::Parameter& p);
// By shape alone: parameters with 2 or more dimensions decay, embedding tables included
// (the default rule before 0.2.0).
bool decays_if_matrix(const nn::Parameter& p);

// Two groups, in this order: the parameters for which `decays` is true, with weight_decay,
// and the others, with 0. Frozen parameters are left out.
std::vector<ParamGroup> weight_decay_groups(
    const std::vector<nn::Parameter*>& params, float weight_decay,
    const std::function<bool(const nn::Parameter&)>& decays = decays_by_default);

// A contiguous part of a plan's flat buffer that a bound optimizer updates.
struct FlatSpan {
  std::int64_t begin = 0, end = 0;  // [begin, end): elements of the plan's flat buffer
  Tensor value;                     // f32 [end - begin]: the fp32 master weights of these elements
  Tensor grad;                      // [end - begin] f32, f16 or bf16: their gradients
  Tensor compute;  // [end - begin] f16/bf16: where the updated weights are written too (undefined: none)
};

// What a bound optimizer updates.
struct FlatTarget {
  std::shared_ptr<const nn::FlatPlan> plan;
  std::vector<nn::Parameter*> params;  // the plan's parameters: entry i is params[i]
  std::vector<FlatSpan> spans;         // increasing and disjoint
  // Called at the end of every step, after the updates were issued (ZeRO: the all-gather of
  // the updated shard). May be empty.
  std::function<void()> after_step;
};

// The target of a model whose values and gradients are flat in one plan (storage().flatten,
// then storage().allocate_grads or a backward): the whole plan, one span. Throws InvalidArgument
// when they are not.
FlatTarget flat_target(nn::Module& model);

class Optimizer {
 public:
  // The parameters must outlive the optimizer; none may be listed twice. Parameters with
  // requires_grad false, or (per parameter) without a gradient at a step, are skipped.
  // Parameter::name keys the saved state ("param<i>" when a name is empty).
  explicit Optimizer(std::vector<ParamGroup> groups);
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update. Every gradient is first multiplied by grad_scale (pass the clipping
  // coefficient here: clipping then costs no extra pass over the gradients). The learning
  // rate is lr() at this step. No host sync.
  void step(float grad_scale = 1.0f);
  // Zeroes the gradients: of the parameters, or of the bound spans.
  void zero_grad();

  // Updates the target's spans from now on (see the top of this file); the state so far is
  // carried over. Every parameter of this optimizer must be in the plan. Throws
  // InvalidArgument on spans that do not fit the plan or tensors of the wrong size or dtype.
  void bind(FlatTarget target);
  // Back to per-parameter updates (the state is carried over where the values are defined).
  void unbind();
  bool bound() const { return target_ != nullptr; }
  // The plan and spans bound (null when unbound).
  const FlatTarget* target() const { return target_.get(); }

  // Steps taken so far (skipped steps of a loss scaler are not taken and not counted).
  std::int64_t steps() const { return steps_; }
  // The learning rate the next step uses: the schedule's, when one is set.
  float lr() const;
  // Sets the base learning rate (and removes a schedule).
  void set_lr(float lr);
  void set_schedule(const LrSchedule& schedule);
  void set_stream(const Stream& stream) { stream_ = stream; }
  const Stream& stream() const { return stream_; }
  // Every parameter, group by group.
  std::vector<nn::Parameter*> parameters() const;
  const std::vector<ParamGroup>& groups() const { return groups_; }
  // How many fused update calls the last step issued.
  int last_step_kernel_calls() const { return last_calls_; }
  // The weight decay a group's parameters get.
  float weight_decay_of(const ParamGroup& group) const { return group.weight_decay.value_or(default_weight_decay()); }

  // Names of the per-element state buffers ("exp_avg", ...).
  std::vector<std::string> state_names() const { return state_names_impl(); }
  // Bound: the k-th state buffer (f32, the spans' elements back to back).
  const Tensor& flat_state(std::size_t k) const;
  // Bytes of the state buffers this optimizer holds.
  std::int64_t state_bytes() const;

  // "step" (i64) and "<param name>.<state>" for each state buffer: CPU copies of whole
  // tensors, the same whatever the binding; synchronizes. Throws when bound to spans that do
  // not cover the plan (one rank's shard: DdpState::optimizer_state_dict
  // gathers it). load_state_dict checks names and shapes and copies back what this optimizer
  // holds (for a shard, its part of every tensor).
  StateDict state_dict();
  void load_state_dict(const StateDict& state);
  // The "<param name>" of parameters()[i] in those keys ("param<i>" for a nameless one).
  std::string key_of(std::size_t i) const;
  // The step count alone (what load_state_dict sets from "step").
  void set_steps(std::int64_t steps);

 protected:
  // A run of elements updated by one kernel call: flat views over values, grads, compute
  // copies (undefined when none) and each state buffer, and the run's weight decay.
  struct Segment {
    Tensor value, grad, compute;
    std::vector<Tensor> state;
    float weight_decay = 0;
  };
  virtual std::vector<std::string> state_names_impl() const = 0;
  // The options' weight decay (what a group without its own gets).
  virtual float default_weight_decay() const = 0;
  // Issues the fused update of one segment. step_index is 1 for the first step.
  virtual void update(const Segment& segment, float lr, float grad_scale, std::int64_t step_index) = 0;

  float base_lr_ = 1e-3f;

 private:
  struct Run {  // a bound run: elements [begin, end) of span `span` (span-local), one weight decay
    std::size_t span = 0;
    std::int64_t begin = 0, end = 0;
    float weight_decay = 0;
  };
  void ensure_per_parameter_state();
  // Copies the state of parameter i (whole tensors, CPU or device) into the current storage
  // where it holds the parameter (all of it, or its part within the spans).
  void store_state(std::size_t i, std::size_t k, const Tensor& whole);
  // Parameter i's whole state tensor k, where the current storage has all of it (else undefined).
  Tensor whole_state(std::size_t i, std::size_t k) const;
  void step_per_parameter(float lr_now, float grad_scale, std::int64_t step_index);
  void step_bound(float lr_now, float grad_scale, std::int64_t step_index);

  std::vector<ParamGroup> groups_;
  std::vector<nn::Parameter*> params_;  // every parameter, group by group
  std::vector<int> group_of_;           // params_[i]'s group
  std::int64_t steps_ = 0;
  std::optional<LrSchedule> schedule_;
  Stream stream_;
  int last_calls_ = 0;
  // Per parameter: state_[i][k], the k-th state buffer of parameter i (undefined until the
  // first step that updates it).
  std::vector<std::vector<Tensor>> state_;
  // Bound.
  std::unique_ptr<FlatTarget> target_;
  std::vector<std::size_t> entry_;  // params_[i] is the plan's entry entry_[i]
  std::vector<Run> runs_;
  std::vector<std::int64_t> span_state_offset_;  // where span s starts in the flat state
  std::vector<Tensor> flat_state_;               // per state name
};

}  // namespace tutti::optim
