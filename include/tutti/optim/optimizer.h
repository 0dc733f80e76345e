// Optimizer: the base of SGD and AdamW. Updates fp32 master weights in place from their
// gradients with the fused kernels of tutti/kernels/optimizer.h, keeps the half-precision
// compute copies equal to them in the same pass, and saves and loads its state.
//
// Flat buffers: a step issues one fused kernel call per run of parameters whose values,
// gradients and compute copies lie in flat buffers with the same layout (same order, same
// distances). For a model whose parameters are flattened (Module::flatten_parameters) and
// whose gradients are one flat buffer of the same layout (Module::allocate_flat_grads, or
// the data-parallel runtime's buffer), that is ONE call for the whole model; otherwise it
// degrades to one call per parameter. Elements in gaps of such a layout are updated too:
// keep gradient gaps zero. The optimizer's own state (moments) mirrors the value layout and
// follows it when it changes (flattening or moving the model after the optimizer was made).
//
// Streams: every kernel is issued on stream() (set_stream; by default the CPU stream, i.e.
// the device's default stream on a GPU). step() never waits for the device.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tutti/core/state_dict.h"
#include "tutti/core/stream.h"
#include "tutti/nn/parameter.h"
#include "tutti/optim/lr_schedule.h"

namespace tutti::optim {

class Optimizer {
 public:
  // params: what to update, e.g. model.parameters(). Parameters with requires_grad false,
  // or without a gradient at a step, are skipped at that step. The pointers must outlive the
  // optimizer. Parameter::name keys the saved state ("param<i>" when a name is empty).
  explicit Optimizer(std::vector<nn::Parameter*> params);
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update. Every gradient is first multiplied by grad_scale (pass the clipping
  // coefficient here: clipping then costs no extra pass over the gradients). The learning
  // rate is lr() at this step. No host sync.
  void step(float grad_scale = 1.0f);
  // Zeroes the gradients of the parameters (adjacent views merged into one memset).
  void zero_grad();

  // Steps taken so far (skipped steps of a loss scaler are not taken and not counted).
  std::int64_t steps() const { return steps_; }
  // The learning rate the next step uses: the schedule's, when one is set.
  float lr() const;
  // Sets the base learning rate (and removes a schedule).
  void set_lr(float lr);
  void set_schedule(const LrSchedule& schedule);
  void set_stream(const Stream& stream) { stream_ = stream; }
  const Stream& stream() const { return stream_; }
  const std::vector<nn::Parameter*>& parameters() const { return params_; }
  // How many fused update calls the last step issued (1 for a fully flat model).
  int last_step_kernel_calls() const { return last_calls_; }

  // "step" (i64) and "<param name>.<state>" for each state buffer (CPU copies);
  // synchronizes. load_state_dict checks names and shapes and copies the state back.
  StateDict state_dict();
  void load_state_dict(const StateDict& state);

 protected:
  // A run of parameters updated by one kernel call: flat views over values, grads, compute
  // copies (undefined when none) and each state buffer.
  struct Segment {
    Tensor value, grad, compute;
    std::vector<Tensor> state;
  };
  // Per-element state buffers the subclass keeps ("exp_avg", ...), zero-initialized.
  virtual std::vector<std::string> state_names() const = 0;
  // Issues the fused update of one segment. step_index is 1 for the first step.
  virtual void update(const Segment& segment, float lr, float grad_scale, std::int64_t step_index) = 0;

  float base_lr_ = 1e-3f;

 private:
  void ensure_state();
  std::string key_of(std::size_t i) const;

  std::vector<nn::Parameter*> params_;
  std::int64_t steps_ = 0;
  std::optional<LrSchedule> schedule_;
  Stream stream_;
  int last_calls_ = 0;
  // state_[i][k]: the k-th state buffer of parameter i, a view into a zeroed buffer that
  // spans the parameter's value storage, so that it has the values' layout.
  std::vector<std::vector<Tensor>> state_;
  std::vector<std::pair<const void*, Device>> state_signature_;
  std::vector<Tensor> state_buffers_;
};

}  // namespace tutti::optim
