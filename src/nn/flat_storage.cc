#include "tutti/nn/flat_storage.h"

#include <algorithm>
#include <utility>

#include "tutti/kernels/cast.h"
#include "tutti/nn/module.h"

namespace tutti::nn {

namespace {

bool is_half(DType d) { return d == DType::f16 || d == DType::bf16; }

// The plan as a shared value, reusing `current` when it is the same plan (so that values and
// gradients laid out by equal plans share one object).
std::shared_ptr<const FlatPlan> share(const FlatPlan& plan, const std::shared_ptr<const FlatPlan>& current) {
  if (current && *current == plan) return current;
  return std::make_shared<const FlatPlan>(plan);
}

}  // namespace

FlatStorage::FlatStorage(Module& model) : model_(model) {}
FlatStorage::~FlatStorage() = default;

void FlatStorage::require_root(const char* what) const { model_.require_root(what); }

void FlatStorage::require_masters(const char* what) const {
  TUTTI_CHECK_ARG(!masters_released_, what,
                  ": this model's fp32 master weights were released "
                  "(storage().release_masters: under DistributedDataParallel's ZeRO stages with a half compute "
                  "dtype each rank keeps only its shard of them); save, load and change them through "
                  "DistributedDataParallel (model_state_dict, load_model_state_dict)");
}

// ---- values ----------------------------------------------------------------------------

FlatPlan FlatStorage::make_plan(const FlatPlanOptions& options) { return make_flat_plan(model_.parameters(), options); }

void FlatStorage::flatten(const FlatPlan& plan) {
  require_root("flatten");
  require_masters("flatten");
  model_.require_materialized("flatten");
  const std::vector<Parameter*> params = model_.parameters();
  plan.check_matches(params, "flatten");
  const Stream& s = model_.stream();
  Tensor flat = Tensor::zeros({plan.total}, DType::f32, model_.device());
  for (std::size_t i = 0; i < params.size(); ++i) {
    Tensor view = flat.view(plan.entries[i].offset, params[i]->shape());
    view.copy_from(params[i]->value, s);
    params[i]->value = view;
  }
  values_ = flat;
  value_plan_ = share(plan, grad_plan_);
  if (is_half(model_.compute_dtype())) {
    compute_ = Tensor();
    for (Parameter* p : params) p->compute = Tensor();
    make_compute_copies(model_.compute_dtype());
  }
  // Gradients flat in another plan cannot serve the values' plan: move them to it.
  if (grad_plan_ && grad_plan_ != value_plan_) {
    const bool owned = grads_owned_;
    model_.drop_grads();
    if (owned) allocate_grads(plan);
  }
  s.synchronize();
}

void FlatStorage::move_values(Device device, const Stream& stream) {
  const std::vector<Parameter*> params = model_.parameters();
  if (values_.defined()) {
    Tensor moved = values_.to(device, stream);
    for (std::size_t i = 0; i < params.size(); ++i) {
      params[i]->value = moved.view(value_plan_->entries[i].offset, params[i]->shape());
    }
    values_ = moved;
  } else {
    for (Parameter* p : params) {
      if (!p->deferred) p->value = p->value.to(device, stream);  // a deferred one is filled on `device`
    }
  }
}

void FlatStorage::make_compute_copies(DType dtype) {
  const std::vector<Parameter*> params = model_.parameters();
  // Deferred parameters get theirs when they are materialized.
  const bool have_copies = std::all_of(params.begin(), params.end(), [dtype](const Parameter* p) {
    return p->deferred || (p->compute.defined() && p->compute.dtype() == dtype);
  });
  if (!is_half(dtype)) {
    for (Parameter* p : params) p->compute = Tensor();
    compute_ = Tensor();
    return;
  }
  if (have_copies) return;
  if (values_.defined()) {
    compute_ = Tensor::zeros({value_plan_->total}, dtype, model_.device());
    for (std::size_t i = 0; i < params.size(); ++i) {
      params[i]->compute = compute_.view(value_plan_->entries[i].offset, params[i]->shape());
    }
  } else {
    compute_ = Tensor();
    for (Parameter* p : params) {
      if (p->deferred) continue;
      if (!p->compute.defined() || p->compute.dtype() != dtype)
        p->compute = Tensor::empty(p->shape(), dtype, model_.device());
    }
  }
  model_.refresh_compute_copies();
}

void FlatStorage::release_masters() {
  require_root("release_masters");
  TUTTI_CHECK_ARG(value_plan_ != nullptr, "release_masters: the values are not flat (storage().flatten first)");
  TUTTI_CHECK_ARG(is_half(model_.compute_dtype()), "release_masters: the compute dtype is ",
                  name_of(model_.compute_dtype()), ": the values are what forward reads, they cannot go");
  model_.stream().synchronize();
  for (Parameter* p : model_.parameters()) p->value = Tensor();
  values_ = Tensor();
  masters_released_ = true;
}

void FlatStorage::release_parameters() {
  require_root("release_parameters");
  TUTTI_CHECK_ARG(value_plan_ != nullptr || model_.has_deferred_parameters(),
                  "release_parameters: the values are not flat (storage().flatten first)");
  model_.stream().synchronize();
  for (Parameter* p : model_.parameters()) {
    p->value = Tensor();
    p->compute = Tensor();
    p->deferred = false;  // its owner holds its values now
    p->source = nullptr;
  }
  values_ = Tensor();
  compute_ = Tensor();
  masters_released_ = true;
  parameters_released_ = true;
}

// ---- gradients -------------------------------------------------------------------------

void FlatStorage::allocate_grads(const FlatPlan& plan) {
  require_root("allocate_grads");
  Tensor buffer = Tensor::zeros({plan.total}, model_.grad_dtype(), model_.device());
  set_grad_buffer(buffer, plan);
  grads_owned_ = true;
}

void FlatStorage::allocate_grads() { allocate_grads(value_plan_ ? *value_plan_ : make_plan()); }

void FlatStorage::set_grad_buffer(const Tensor& buffer, const FlatPlan& plan) {
  require_root("set_grad_buffer");
  const std::vector<Parameter*> params = model_.parameters();
  plan.check_matches(params, "set_grad_buffer");
  TUTTI_CHECK_ARG(value_plan_ == nullptr || *value_plan_ == plan,
                  "set_grad_buffer: the values are flat in another "
                  "plan; values and gradients must share one (",
                  value_plan_ ? value_plan_->describe() : "", ")");
  TUTTI_CHECK_ARG(buffer.defined() && buffer.numel() >= plan.total, "set_grad_buffer: buffer ", buffer.str(),
                  " is smaller than the plan's ", plan.total, " elements");
  TUTTI_CHECK_ARG(buffer.device() == model_.device(), "set_grad_buffer: buffer on ", buffer.device().str(),
                  " but the model on ", model_.device().str());
  TUTTI_CHECK_ARG(buffer.dtype() == model_.grad_dtype(), "set_grad_buffer: buffer is ", name_of(buffer.dtype()),
                  " but the model's gradient dtype is ", name_of(model_.grad_dtype()));
  for (std::size_t i = 0; i < params.size(); ++i) {
    params[i]->grad = params[i]->requires_grad ? buffer.view(plan.entries[i].offset, params[i]->shape()) : Tensor();
  }
  grads_ = buffer;
  grads_owned_ = false;
  grad_plan_ = share(plan, value_plan_);
}

void FlatStorage::allocate_missing_grads() {
  // A placement hook says where each gradient goes as it is written: nothing to allocate.
  if (grad_placement_hook_) return;
  const std::vector<Parameter*> trainable = model_.trainable_parameters();
  const bool missing = std::any_of(trainable.begin(), trainable.end(), [](Parameter* p) { return !p->grad.defined(); });
  if (!missing) return;
  const std::vector<Parameter*> all = model_.parameters();
  if (grads_owned_ || std::none_of(all.begin(), all.end(), [](Parameter* p) { return p->grad.defined(); })) {
    allocate_grads();
  } else {
    // Some grads were placed from outside and some not: give the rest their own.
    for (Parameter* p : trainable) model_.grad_of(*p);
  }
}

void FlatStorage::forget_grads() {
  grads_ = Tensor();
  grads_owned_ = false;
  grad_plan_.reset();
}

// ---- hooks -----------------------------------------------------------------------------

void FlatStorage::set_grad_ready_hook(GradReadyHook hook) {
  require_root("set_grad_ready_hook");
  grad_ready_hook_ = std::move(hook);
}

void FlatStorage::set_grad_placement_hook(GradPlacementHook hook) {
  require_root("set_grad_placement_hook");
  grad_placement_hook_ = std::move(hook);
}

void FlatStorage::set_param_use_hook(ParamUseHook hook) {
  require_root("set_param_use_hook");
  param_use_hook_ = std::move(hook);
}

}  // namespace tutti::nn
