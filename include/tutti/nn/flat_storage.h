// FlatStorage: the flat buffers of one model under one FlatPlan (flat_plan.h), and the hooks
// through which a data-parallel runtime meets the model's forward and backward.
//
// A layer author never sees it: layers read Parameter::value / compute and write through
// Module::grad_of / grad_ready. The owner of a plan (DistributedDataParallel, an optimizer bound
// to flat buffers, a test) reaches it through the model: `model.storage()`, on the root module
// only. It holds the fp32 values (the masters, unless released), their compute-dtype copies,
// the gradients (the model's own buffer, or one placed from outside), and the three hooks; the
// Parameters are views into these buffers. Like PyTorch FSDP2's FSDPParamGroup, it keeps the
// flat (later: sharded) state outside the layers.
//
// Threading and streams: as the model's (module.h): every copy is issued on the model's
// stream; calls that synchronize say so.
#pragma once

#include <functional>
#include <memory>

#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"
#include "tutti/nn/flat_plan.h"
#include "tutti/nn/parameter.h"

namespace tutti::nn {

class Module;

// Called during backward right after a layer has issued the last kernel that writes
// (accumulates into) a parameter's gradient, on the thread that runs backward. On a GPU the
// kernel is only issued, not finished: record an Event on the model's stream to know when.
using GradReadyHook = std::function<void(Parameter&)>;
// Called by a layer's backward right before it writes (accumulates into) a parameter's
// gradient, every time (Module::grad_of): returns where that gradient lives now. A
// data-parallel runtime that keeps no full-size gradient buffer (ZeRO-2) hands out bucket
// buffers from a pool this way.
using GradPlacementHook = std::function<Tensor(Parameter&)>;
// Called by forward before a module's forward reads its own parameters, and by backward before
// a module's backward reads them, once per parameter (the model's awaiting_backward() tells
// which: true in forward, false in backward and in a checkpointed module's replay). A
// data-parallel runtime that gathers updated parameters from other ranks (ZeRO) waits here for
// the gather of the parameter's bucket; ZeRO-3 places the gathered parameter here.
using ParamUseHook = std::function<void(Parameter&)>;

class FlatStorage {
 public:
  ~FlatStorage();
  FlatStorage(const FlatStorage&) = delete;
  FlatStorage& operator=(const FlatStorage&) = delete;

  // ---- values: laid out by a FlatPlan, never guessed ----------------------------------------
  // The plan make_flat_plan gives the model's parameters with `options` (by default: REVERSE
  // registration order, offsets aligned to 8 elements, one rank).
  FlatPlan make_plan(const FlatPlanOptions& options = {});
  // Moves every parameter's fp32 value (and its compute copy, into a second flat buffer of
  // the same layout) into one flat buffer laid out by `plan`; each value becomes a view. Gaps
  // are zero. Gradients already placed in another plan are dropped. Issued on the model's
  // stream; synchronizes.
  void flatten(const FlatPlan& plan);
  void flatten() { flatten(make_plan()); }
  // The plan the values are flat in (null unless flatten ran), the flat fp32 values
  // (undefined after release_masters) and compute copies (undefined for f32).
  const std::shared_ptr<const FlatPlan>& plan() const { return value_plan_; }
  const Tensor& values() const { return values_; }
  const Tensor& compute_copies() const { return compute_; }

  // ---- gradients ----------------------------------------------------------------------------
  // Allocates one zeroed flat gradient buffer of the model's grad_dtype() on its device() laid
  // out by `plan` and makes every trainable parameter's grad a view into it. The storage owns
  // the buffer. When the values are flat, `plan` must be theirs (InvalidArgument otherwise).
  void allocate_grads(const FlatPlan& plan);
  // The same in the values' plan when they are flat, else in make_plan(). What the model's
  // first backward does when some trainable parameter has no gradient.
  void allocate_grads();
  // Makes every trainable parameter's grad a view into `buffer` (owned by the caller; its
  // dtype the model's grad_dtype(), on its device(), at least plan.total elements) at the
  // plan's offsets. Does not zero it. When the values are flat, `plan` must be theirs.
  void set_grad_buffer(const Tensor& buffer, const FlatPlan& plan);
  // The plan the gradients are flat in (null when they are not) and their buffer (undefined
  // when they are not flat), the storage's own or one placed with set_grad_buffer.
  const std::shared_ptr<const FlatPlan>& grad_plan() const { return grad_plan_; }
  const Tensor& grads() const { return grads_; }
  // Whether grads() is the storage's own (allocate_grads) rather than placed.
  bool owns_grad_buffer() const { return grads_owned_; }

  // ---- master weights -----------------------------------------------------------------------
  // ZeRO with a half compute dtype: the fp32 master weights are kept elsewhere (each rank
  // holds its shard), so the storage frees its flat fp32 values; every Parameter::value
  // becomes undefined and forward/backward read the compute copies, which stay whole.
  // Afterwards the model's init, to, set_precision, state_dict, load_state_dict and
  // refresh_compute_copies throw, and so does flatten (the owner of the masters saves, loads
  // and refreshes them). Needs flat values and a half compute dtype.
  void release_masters();
  bool masters_released() const { return masters_released_; }
  // ZeRO-3: the owner of the plan keeps each rank's shard of every parameter and places whole
  // parameters (views of its gather buffers) in Parameter::value (f32 compute) or ::compute
  // (half) only while layers read them (the param-use hook). The storage frees its flat values
  // and compute copies; every Parameter::value and ::compute becomes undefined. Afterwards the
  // model's init, to, set_precision, state_dict, load_state_dict and refresh_compute_copies
  // throw, as after release_masters (masters_released() is true). Needs flat values, or deferred
  // parameters (nn::DeferredParameters), which it marks no longer deferred: their owner holds
  // their values.
  void release_parameters();
  bool parameters_released() const { return parameters_released_; }

  // ---- hooks (see above); empty to remove ---------------------------------------------------
  // The hook backward calls for each parameter whose gradient is written.
  void set_grad_ready_hook(GradReadyHook hook);
  // The hooks a layer calls before it writes a gradient and before it reads its parameters in
  // forward. With a placement hook, backward allocates no gradients of its own.
  void set_grad_placement_hook(GradPlacementHook hook);
  void set_param_use_hook(ParamUseHook hook);

 private:
  friend class Module;
  explicit FlatStorage(Module& model);

  // What the model calls (module.cc).
  void require_root(const char* what) const;
  void require_masters(const char* what) const;
  // Backward of the model: gives the trainable parameters without a gradient one.
  void allocate_missing_grads();
  // to(): moves the values (flat or not) to `device`.
  void move_values(Device device, const Stream& stream);
  // Gives every parameter a compute copy of `dtype` (flat when the values are) and fills it;
  // none for f32.
  void make_compute_copies(DType dtype);
  // drop_grads(): forgets the gradient buffer.
  void forget_grads();

  Module& model_;
  Tensor values_, compute_, grads_;
  std::shared_ptr<const FlatPlan> value_plan_, grad_plan_;
  bool masters_released_ = false;
  bool parameters_released_ = false;
  bool grads_owned_ = false;
  GradReadyHook grad_ready_hook_;
  GradPlacementHook grad_placement_hook_;
  ParamUseHook param_use_hook_;
};

}  // namespace tutti::nn
