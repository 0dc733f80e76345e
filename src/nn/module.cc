#include "tutti/nn/module.h"

#include <algorithm>
#include <optional>
#include <set>

#include "tutti/core/trace.h"
#include "tutti/kernels/cast.h"
#include "tutti/nn/init.h"

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

Module::Module() : settings_(std::make_shared<ModuleSettings>()) {}
Module::~Module() = default;

// ---- running ---------------------------------------------------------------------------

Tensor Module::forward(const Tensor& x) {
  TUTTI_CHECK_ARG(x.defined(), describe(), ": forward of an undefined tensor");
  std::optional<trace::Span> span;
  if (trace::on()) span.emplace("forward" + trace_label(), "forward", stream());
  if (parent_ == nullptr) {
    check_initialized();
    awaiting_backward_ = true;
  }
  if (settings_->param_use_hook) {
    for (auto& [name, p] : params_) settings_->param_use_hook(*p);
  }
  TUTTI_CHECK_ARG(x.device() == device(), describe(), ": input ", x.str(), " is not on the model's device ",
                  device().str());
  Tensor y;
  if (is_floating(x.dtype()) && x.dtype() != compute_dtype()) {
    // Slot -1 of every module is the cast input: keep it apart from the layers' own slots.
    Tensor cast = buffer(-1, x.shape(), compute_dtype());
    kernels::cast(x, cast, stream());
    y = forward_impl(cast);
  } else {
    y = forward_impl(x);
  }
  if (parent_ == nullptr) output_shape_ = y.shape();
  return y;
}

Tensor Module::backward(const Tensor& dy) {
  TUTTI_CHECK_ARG(dy.defined(), describe(), ": backward of an undefined tensor");
  std::optional<trace::Span> span;
  if (trace::on()) span.emplace("backward" + trace_label(), "backward", stream());
  if (parent_ == nullptr) {
    TUTTI_CHECK_ARG(awaiting_backward_, describe(),
                    ": backward without a forward since the last backward: each "
                    "backward needs a forward of its own (a second backward of one forward would add the same "
                    "gradients again, and under DistributedDataParallel communicate again)");
    TUTTI_CHECK_ARG(dy.shape() == output_shape_, describe(), ": backward of dy ", dy.str(),
                    ", whose shape is not the forward's output's ", shape_str(output_shape_),
                    " (a loss of [..., C] logits gives its gradient in their shape)");
    awaiting_backward_ = false;
    bool missing = false;
    // A placement hook says where each gradient goes as it is written: nothing to allocate.
    if (!settings_->grad_placement_hook) {
      for (Parameter* p : trainable_parameters()) missing = missing || !p->grad.defined();
    }
    if (missing) {
      if (grads_owned_ ||
          std::none_of(all_params_.begin(), all_params_.end(), [](Parameter* p) { return p->grad.defined(); })) {
        allocate_flat_grads();
      } else {
        // Some grads were placed from outside and some not: give the rest their own.
        for (Parameter* p : trainable_parameters()) grad_of(*p);
      }
    }
  }
  if (is_floating(dy.dtype()) && dy.dtype() != compute_dtype()) {
    Tensor cast = buffer(-2, dy.shape(), compute_dtype());
    kernels::cast(dy, cast, stream());
    return backward_impl(cast);
  }
  return backward_impl(dy);
}

// " 0 Linear(784, 512)": the module's path in the model and what it is; "" for the model itself
// (its spans are "forward" and "backward"). Computed once, when a trace first needs it.
const std::string& Module::trace_label() const {
  if (!trace_label_) {
    std::string path;
    for (const Module* m = this; m->parent_ != nullptr; m = m->parent_) {
      for (const auto& [name, child] : m->parent_->children_) {
        if (child == m) path = path.empty() ? name : name + "." + path;
      }
    }
    trace_label_ = std::make_shared<std::string>(parent_ == nullptr ? "" : " " + path + " " + describe());
  }
  return *trace_label_;
}

Flops Module::flops(const Shape& sample, Shape& out) const {
  out = sample;
  return {};
}

double Module::training_flops_per_sample(const Shape& sample) const {
  Shape out;
  return flops(sample, out).total();
}

void Module::check_initialized() {
  if (checked_initialized_) return;
  for (Parameter* p : parameters()) {
    TUTTI_CHECK_ARG(p->initialized, "parameter ", p->name, " of ", describe(),
                    " was never initialized: call init(seed) or load_state_dict() on the model first");
  }
  checked_initialized_ = true;
}

// ---- structure -------------------------------------------------------------------------

void Module::collect(const std::string& prefix, std::vector<Parameter*>& out) {
  for (auto& [name, p] : params_) {
    p->name = prefix + name;
    out.push_back(p);
  }
  for (auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

void Module::collect_modules(std::vector<Module*>& out) {
  out.push_back(this);
  for (auto& [name, child] : children_) child->collect_modules(out);
}

void Module::collect_named_modules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>& out) {
  out.emplace_back(prefix, this);
  for (auto& [name, child] : children_) child->collect_named_modules(prefix + name + ".", out);
}

std::vector<Parameter*> Module::parameters() {
  if (!all_params_valid_) {
    all_params_.clear();
    collect("", all_params_);
    all_params_valid_ = true;
  }
  return all_params_;
}

std::vector<Parameter*> Module::trainable_parameters() {
  std::vector<Parameter*> out;
  for (Parameter* p : parameters()) {
    if (p->requires_grad) out.push_back(p);
  }
  return out;
}

std::string Module::signature() {
  std::string s;
  for (Parameter* p : parameters()) {
    // Masters are f32 (released ones too: the optimizer refuses any other).
    s += p->name + " " + shape_str(p->shape()) + " " + std::string(name_of(DType::f32)) +
         (p->requires_grad ? " trainable\n" : " frozen\n");
  }
  for (const auto& [name, t] : extra_state()) {
    s += name + " " + shape_str(t.shape()) + " " + std::string(name_of(t.dtype())) + " state\n";
  }
  return s;
}

std::uint64_t Module::structure_hash() {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : signature()) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

void Module::structure_changed() {
  for (Module* m = this; m != nullptr; m = m->parent_) {
    m->all_params_valid_ = false;
    m->checked_initialized_ = false;
  }
}

Parameter& Module::register_parameter(std::string name, Parameter& param) {
  for (auto& [n, p] : params_) TUTTI_CHECK_ARG(n != name, describe(), ": parameter '", name, "' registered twice");
  params_.emplace_back(std::move(name), &param);
  structure_changed();
  return param;
}

Module& Module::register_module(std::string name, Module& child) {
  TUTTI_CHECK_ARG(child.parent_ == nullptr && &child != this, "register_module: '", name,
                  "' already belongs to a model");
  for (auto& [n, c] : children_) TUTTI_CHECK_ARG(n != name, describe(), ": child '", name, "' registered twice");
  TUTTI_CHECK_ARG(child.device() == device(), "register_module: child '", name, "' is on ", child.device().str(),
                  " but the parent on ", device().str(), ": add layers before moving the model");
  child.parent_ = this;
  child.input_grad_needed_ = true;
  child.adopt_settings(settings_);
  children_.emplace_back(std::move(name), &child);
  child.on_input_grad_changed();
  on_input_grad_changed();
  structure_changed();
  return child;
}

Module& Module::register_module(std::string name, std::unique_ptr<Module> child) {
  TUTTI_CHECK_ARG(child != nullptr, "register_module: '", name, "' is null");
  Module& ref = register_module(std::move(name), *child);
  owned_children_.push_back(std::move(child));
  return ref;
}

void Module::adopt_settings(const std::shared_ptr<ModuleSettings>& settings) {
  settings_ = settings;
  for (auto& [name, child] : children_) child->adopt_settings(settings);
}

void Module::require_root(const char* what) const {
  TUTTI_CHECK_ARG(parent_ == nullptr, what, ": call it on the model (the root module), not on ", describe());
}

void Module::require_masters(const char* what) const {
  TUTTI_CHECK_ARG(!masters_released_, what,
                  ": this model's fp32 master weights were released "
                  "(release_master_values: under DistributedDataParallel's ZeRO stages with a half compute dtype "
                  "each rank keeps only its shard of them); save, load and change them through "
                  "DistributedDataParallel (model_state_dict, load_model_state_dict)");
}

// ---- settings --------------------------------------------------------------------------

Module& Module::set_stream(const Stream& stream) {
  require_root("set_stream");
  TUTTI_CHECK_ARG(stream.device().is_cpu() || stream.device() == device(), "set_stream: stream on ",
                  stream.device().str(), " but the model on ", device().str());
  settings_->stream = stream;
  return *this;
}

Module& Module::to(Device device, const Stream& stream) {
  require_root("to");
  require_masters("to");
  device.require_available();
  TUTTI_CHECK_ARG(stream.device().is_cpu() || stream.device() == device, "to: stream on ", stream.device().str(),
                  " but the target is ", device.str());
  const bool owned_grads = grads_owned_;
  const std::vector<Parameter*> params = parameters();
  const Stream& s = stream;
  if (flat_values_.defined()) {
    Tensor moved = flat_values_.to(device, s);
    for (std::size_t i = 0; i < params.size(); ++i) {
      params[i]->value = moved.view(value_plan_->entries[i].offset, params[i]->shape());
    }
    flat_values_ = moved;
  } else {
    for (Parameter* p : params) p->value = p->value.to(device, s);
  }
  s.synchronize();
  settings_->device = device;
  settings_->stream = stream;
  clear_buffers_recursive();
  drop_grads();
  for (Parameter* p : params) p->compute = Tensor();
  flat_compute_ = Tensor();
  set_precision(settings_->compute_dtype, settings_->grad_dtype);
  if (owned_grads) allocate_flat_grads(*grad_plan_);
  return *this;
}

Module& Module::set_precision(DType compute, DType grad) {
  require_root("set_precision");
  require_masters("set_precision");
  TUTTI_CHECK_ARG(is_floating(compute), "set_precision: compute dtype must be f32, f16 or bf16, got ",
                  name_of(compute));
  TUTTI_CHECK_ARG(grad == DType::f32 || grad == compute, "set_precision: gradients must be f32 or the compute dtype ",
                  name_of(compute), ", got ", name_of(grad));
  const std::vector<Parameter*> params = parameters();
  settings_->compute_dtype = compute;
  settings_->grad_dtype = grad;
  clear_buffers_recursive();
  // Compute copies: none for f32; else one per parameter, flat when the values are.
  const bool have_copies =
      !params.empty() && params.front()->compute.defined() && params.front()->compute.dtype() == compute;
  if (!is_half(compute)) {
    for (Parameter* p : params) p->compute = Tensor();
    flat_compute_ = Tensor();
  } else if (!have_copies) {
    if (flat_values_.defined()) {
      flat_compute_ = Tensor::zeros({value_plan_->total}, compute, device());
      for (std::size_t i = 0; i < params.size(); ++i) {
        params[i]->compute = flat_compute_.view(value_plan_->entries[i].offset, params[i]->shape());
      }
    } else {
      flat_compute_ = Tensor();
      for (Parameter* p : params) p->compute = Tensor::empty(p->shape(), compute, device());
    }
    refresh_compute_copies();
  }
  // Gradients of another dtype cannot be accumulated into: drop them.
  bool mismatched = false;
  for (Parameter* p : params) mismatched = mismatched || (p->grad.defined() && p->grad.dtype() != grad);
  if (mismatched) {
    const bool owned = grads_owned_;
    const std::shared_ptr<const FlatPlan> plan = grad_plan_;
    drop_grads();
    if (owned) allocate_flat_grads(*plan);
  }
  return *this;
}

void Module::refresh_compute_copies() {
  require_masters("refresh_compute_copies");
  const Stream& s = stream();
  if (flat_compute_.defined()) {
    kernels::cast(flat_values_, flat_compute_, s);
    return;
  }
  for (Parameter* p : parameters()) {
    if (p->compute.defined()) kernels::cast(p->value, p->compute, s);
  }
}

Module& Module::init(std::uint64_t seed) {
  require_root("init");
  require_masters("init");
  const std::vector<Parameter*> params = parameters();
  const Stream& s = stream();
  for (std::size_t i = 0; i < params.size(); ++i) {
    Parameter& p = *params[i];
    Tensor host = Tensor::empty(p.shape(), DType::f32);
    InitRng rng(derive_seed(seed, i));
    fill_init(host, p.init, rng);
    p.value.copy_from(host, s);
    s.synchronize();  // the host tensor goes away at the end of this iteration
    p.initialized = true;
  }
  refresh_compute_copies();
  std::vector<Module*> modules;
  collect_modules(modules);
  // A separate seed space from the parameters', so adding a Dropout changes no weight.
  for (std::size_t i = 0; i < modules.size(); ++i) modules[i]->on_init(derive_seed(~seed, i));
  s.synchronize();
  return *this;
}

Module& Module::set_grad_comm_dtype(DType dtype) {
  require_root("set_grad_comm_dtype");
  TUTTI_CHECK_ARG(is_floating(dtype), "set_grad_comm_dtype: must be f32, f16 or bf16, got ", name_of(dtype));
  settings_->grad_comm_dtype = dtype;
  return *this;
}

Module& Module::set_batch_slice(int index, int count) {
  require_root("set_batch_slice");
  TUTTI_CHECK_ARG(count >= 1 && index >= 0 && index < count, "set_batch_slice: slice ", index, " of ", count,
                  " (need 0 <= index < count)");
  settings_->batch_slice = index;
  settings_->batch_slices = count;
  return *this;
}

Module& Module::train(bool on) {
  require_root("train");
  settings_->training = on;
  return *this;
}

void Module::set_grad_ready_hook(GradReadyHook hook) {
  require_root("set_grad_ready_hook");
  settings_->grad_ready_hook = std::move(hook);
}

void Module::set_grad_placement_hook(GradPlacementHook hook) {
  require_root("set_grad_placement_hook");
  settings_->grad_placement_hook = std::move(hook);
}

void Module::set_param_use_hook(ParamUseHook hook) {
  require_root("set_param_use_hook");
  settings_->param_use_hook = std::move(hook);
}

Module& Module::set_input_grad(bool needed) {
  input_grad_needed_ = needed;
  on_input_grad_changed();
  return *this;
}

void Module::grad_ready(Parameter& param) {
  if (settings_->grad_ready_hook) settings_->grad_ready_hook(param);
}

Tensor Module::buffer(int slot, const Shape& shape, DType dtype) {
  const std::size_t index = static_cast<std::size_t>(slot + 2);  // slots -2 and -1 are the casts
  if (buffers_.size() <= index) buffers_.resize(index + 1);
  Tensor& b = buffers_[index];
  const std::int64_t n = numel_of(shape);
  if (!b.defined() || b.dtype() != dtype || b.device() != device() || b.numel() < n) {
    // Before a cudaFree, which synchronizes the device anyway, nothing needs the old one.
    b = Tensor();
    b = Tensor::empty({std::max<std::int64_t>(n, 1)}, dtype, device());
  }
  return b.view(0, shape);
}

void Module::clear_buffers_recursive() {
  buffers_.clear();
  for (auto& [name, child] : children_) child->clear_buffers_recursive();
}

const Tensor& Module::grad_of(Parameter& param) {
  if (settings_->grad_placement_hook) {
    param.grad = settings_->grad_placement_hook(param);
    TUTTI_CHECK(param.grad.defined() && param.grad.shape() == param.shape() && param.grad.dtype() == grad_dtype(),
                "the gradient placement hook gave parameter '", param.name, "' ", param.grad.str(), ", expected ",
                shape_str(param.shape()), " ", name_of(grad_dtype()));
    return param.grad;
  }
  if (!param.grad.defined()) param.grad = Tensor::zeros(param.shape(), grad_dtype(), device());
  return param.grad;
}

// ---- flat buffers ----------------------------------------------------------------------

FlatPlan Module::make_plan(const FlatPlanOptions& options) { return make_flat_plan(parameters(), options); }

void Module::flatten_parameters(const FlatPlan& plan) {
  require_root("flatten_parameters");
  require_masters("flatten_parameters");
  const std::vector<Parameter*> params = parameters();
  plan.check_matches(params, "flatten_parameters");
  const Stream& s = stream();
  Tensor flat = Tensor::zeros({plan.total}, DType::f32, device());
  for (std::size_t i = 0; i < params.size(); ++i) {
    Tensor view = flat.view(plan.entries[i].offset, params[i]->shape());
    view.copy_from(params[i]->value, s);
    params[i]->value = view;
  }
  flat_values_ = flat;
  value_plan_ = share(plan, grad_plan_);
  if (is_half(compute_dtype())) {
    flat_compute_ = Tensor::zeros({plan.total}, compute_dtype(), device());
    for (std::size_t i = 0; i < params.size(); ++i) {
      params[i]->compute = flat_compute_.view(plan.entries[i].offset, params[i]->shape());
    }
    refresh_compute_copies();
  }
  // Gradients flat in another plan cannot serve the values' plan: move them to it.
  if (grad_plan_ && grad_plan_ != value_plan_) {
    const bool owned = grads_owned_;
    drop_grads();
    if (owned) allocate_flat_grads(plan);
  }
  s.synchronize();
}

void Module::release_master_values() {
  require_root("release_master_values");
  TUTTI_CHECK_ARG(value_plan_ != nullptr, "release_master_values: the values are not flat (flatten_parameters first)");
  TUTTI_CHECK_ARG(is_half(compute_dtype()), "release_master_values: the compute dtype is ", name_of(compute_dtype()),
                  ": the values are what forward reads, they cannot go");
  stream().synchronize();
  for (Parameter* p : parameters()) p->value = Tensor();
  flat_values_ = Tensor();
  masters_released_ = true;
}

void Module::allocate_flat_grads(const FlatPlan& plan) {
  require_root("allocate_flat_grads");
  Tensor buffer = Tensor::zeros({plan.total}, grad_dtype(), device());
  set_grad_buffer(buffer, plan);
  grads_owned_ = true;
}

void Module::allocate_flat_grads() { allocate_flat_grads(value_plan_ ? *value_plan_ : make_plan()); }

void Module::set_grad_buffer(const Tensor& buffer, const FlatPlan& plan) {
  require_root("set_grad_buffer");
  const std::vector<Parameter*> params = parameters();
  plan.check_matches(params, "set_grad_buffer");
  TUTTI_CHECK_ARG(value_plan_ == nullptr || *value_plan_ == plan,
                  "set_grad_buffer: the values are flat in another "
                  "plan; values and gradients must share one (",
                  value_plan_ ? value_plan_->describe() : "", ")");
  TUTTI_CHECK_ARG(buffer.defined() && buffer.numel() >= plan.total, "set_grad_buffer: buffer ", buffer.str(),
                  " is smaller than the plan's ", plan.total, " elements");
  TUTTI_CHECK_ARG(buffer.device() == device(), "set_grad_buffer: buffer on ", buffer.device().str(),
                  " but the model on ", device().str());
  TUTTI_CHECK_ARG(buffer.dtype() == grad_dtype(), "set_grad_buffer: buffer is ", name_of(buffer.dtype()),
                  " but the model's gradient dtype is ", name_of(grad_dtype()));
  for (std::size_t i = 0; i < params.size(); ++i) {
    params[i]->grad = params[i]->requires_grad ? buffer.view(plan.entries[i].offset, params[i]->shape()) : Tensor();
  }
  flat_grads_ = buffer;
  grads_owned_ = false;
  grad_plan_ = share(plan, value_plan_);
}

void Module::zero_grad() {
  if (flat_grads_.defined()) {
    flat_grads_.zero(stream());
    return;
  }
  std::vector<Tensor> grads;
  for (Parameter* p : parameters()) grads.push_back(p->grad);
  for (Tensor& t : coalesce_views(grads)) t.zero(stream());
}

void Module::drop_grads() {
  for (Parameter* p : parameters()) p->grad = Tensor();
  flat_grads_ = Tensor();
  grads_owned_ = false;
  grad_plan_.reset();
}

// ---- state -----------------------------------------------------------------------------

StateDict Module::state_dict() {
  require_masters("state_dict");
  StateDict out = extra_state();
  for (Parameter* p : parameters()) out[p->name] = p->value.to(Device::cpu(), stream());
  stream().synchronize();
  return out;
}

StateDict Module::extra_state() {
  std::vector<std::pair<std::string, Module*>> modules;
  collect_named_modules("", modules);
  StateDict out;
  for (const auto& [path, m] : modules) {
    for (const auto& [key, t] : m->own_extra_state()) out.emplace(path + key, t);
  }
  return out;
}

void Module::load_extra_state(const StateDict& state, bool strict) {
  std::vector<std::pair<std::string, Module*>> modules;
  collect_named_modules("", modules);
  // Everything checked before anything is restored; a module's state is restored whole or
  // not at all.
  std::vector<std::pair<Module*, StateDict>> restore;
  for (const auto& [path, m] : modules) {
    const StateDict own = m->own_extra_state();
    StateDict given;
    for (const auto& [key, current] : own) {
      const auto it = state.find(path + key);
      if (it == state.end()) {
        TUTTI_CHECK_ARG(!strict, "load_state_dict: no entry for '", path + key, "' (state of ", m->describe(), ")");
        continue;
      }
      TUTTI_CHECK_ARG(it->second.shape() == current.shape() && it->second.dtype() == current.dtype(),
                      "load_state_dict: '", path + key, "' is ", it->second.str(), " but the state of ", m->describe(),
                      " is ", current.str());
      given.emplace(key, it->second.to(Device::cpu()));
    }
    if (!own.empty() && given.size() == own.size()) restore.emplace_back(m, std::move(given));
  }
  for (auto& [m, given] : restore) m->load_own_extra_state(given);
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  require_root("load_state_dict");
  require_masters("load_state_dict");
  std::set<std::string> used;
  for (const auto& [name, t] : extra_state()) used.insert(name);
  load_extra_state(state, strict);
  for (Parameter* p : parameters()) {
    const auto it = state.find(p->name);
    if (it == state.end()) {
      TUTTI_CHECK_ARG(!strict, "load_state_dict: no entry for parameter '", p->name, "'");
      continue;
    }
    TUTTI_CHECK_ARG(it->second.shape() == p->shape() && it->second.dtype() == DType::f32, "load_state_dict: '", p->name,
                    "' is ", it->second.str(), " but the parameter is ", p->value.str());
    p->value.copy_from(it->second, stream());
    p->initialized = true;
    used.insert(p->name);
  }
  if (strict) {
    for (const auto& [key, t] : state) {
      TUTTI_CHECK_ARG(used.count(key) == 1, "load_state_dict: entry '", key, "' matches no parameter or state");
    }
  }
  refresh_compute_copies();
  stream().synchronize();
  checked_initialized_ = false;
}

}  // namespace tutti::nn
