#include "tutti/nn/module.h"

#include <algorithm>
#include <optional>
#include <set>

#include "nn/slices.h"
#include "tutti/core/trace.h"
#include "tutti/kernels/cast.h"
#include "tutti/nn/init.h"

namespace tutti::nn {

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
  if (FlatStorage* st = settings_->storage; st != nullptr && st->param_use_hook_) {
    for (auto& [name, p] : params_) st->param_use_hook_(*p);
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
    storage().allocate_missing_grads();
  }
  // Backward reads the parameters again (ZeRO-3 gathers them here a second time).
  if (FlatStorage* st = settings_->storage; st != nullptr && st->param_use_hook_) {
    for (auto& [name, p] : params_) st->param_use_hook_(*p);
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

std::int64_t Module::buffer_bytes(const Shape& input, DType dtype, Shape& out) const {
  std::int64_t sum = 0;
  for (const BufferStatement& b : buffer_statements(input, dtype, out)) sum += b.bytes;
  return sum;
}

std::vector<BufferStatement> Module::buffer_statements(const Shape&, DType, Shape&) const {
  TUTTI_THROW(InvalidArgument, describe(),
              " does not state its buffers (Module::buffer_statements): it cannot be planned");
}

double Module::backward_flops(double forward) const { return input_grad_needed() ? 2.0 * forward : forward; }

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
  require_materialized("forward");
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
  if (storage_) storage_->require_masters(what);
}

void Module::require_materialized(const char* what) {
  for (const Parameter* p : parameters()) {
    TUTTI_CHECK_ARG(!p->deferred, what, ": parameter ", p->name,
                    " is deferred (made under nn::DeferredParameters) and has no storage yet: call materialize() on "
                    "the model, or hand it to DistributedDataParallel, first");
  }
}

FlatStorage& Module::storage() {
  require_root("storage");
  if (!storage_) {
    storage_.reset(new FlatStorage(*this));
    settings_->storage = storage_.get();
  }
  return *storage_;
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
  FlatStorage& st = storage();
  // The storage's own gradients move too (the plan outlives drop_grads).
  const std::shared_ptr<const FlatPlan> owned_plan = st.grads_owned_ ? st.grad_plan_ : nullptr;
  st.move_values(device, stream);
  stream.synchronize();
  settings_->device = device;
  settings_->stream = stream;
  clear_buffers_recursive();
  drop_grads();
  for (Parameter* p : parameters()) p->compute = Tensor();
  st.compute_ = Tensor();
  set_precision(settings_->compute_dtype, settings_->grad_dtype);
  if (owned_plan) st.allocate_grads(*owned_plan);
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
  FlatStorage& st = storage();
  st.make_compute_copies(compute);
  // Gradients of another dtype cannot be accumulated into: drop them.
  bool mismatched = false;
  for (Parameter* p : params) mismatched = mismatched || (p->grad.defined() && p->grad.dtype() != grad);
  if (mismatched) {
    const bool owned = st.grads_owned_;
    const std::shared_ptr<const FlatPlan> plan = st.grad_plan_;
    drop_grads();
    if (owned) st.allocate_grads(*plan);
  }
  return *this;
}

void Module::refresh_compute_copies() {
  require_masters("refresh_compute_copies");
  const Stream& s = stream();
  if (storage_ && storage_->compute_.defined()) {
    kernels::cast(storage_->values_, storage_->compute_, s);
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
    p.source = [spec = p.init, slice = p.init_slice, param_seed = derive_seed(seed, i)](Tensor& host) {
      InitRng rng(param_seed);
      if (slice.full.empty()) {
        fill_init(host, spec, rng);
        return;
      }
      // A shard: the whole tensor's draw, then this slice of it.
      const Tensor whole = Tensor::empty(slice.full, DType::f32);
      fill_init(whole, spec, rng);
      take_slice(whole, slice, host);
    };
    p.initialized = true;
    if (p.deferred) continue;  // the same values, drawn when the parameter is materialized
    fill_from_source(p, p.value, s);
    p.source = nullptr;
  }
  refresh_compute_copies();
  std::vector<Module*> modules;
  collect_modules(modules);
  // A separate seed space from the parameters', so adding a Dropout changes no weight.
  for (std::size_t i = 0; i < modules.size(); ++i) modules[i]->on_init(derive_seed(~seed, i));
  s.synchronize();
  return *this;
}

Module& Module::materialize() {
  require_root("materialize");
  const std::vector<Parameter*> params = parameters();
  const Stream& s = stream();
  bool any = false;
  for (Parameter* p : params) {
    if (!p->deferred) continue;
    Tensor value = Tensor::empty(p->shape(), DType::f32, device());
    fill_from_source(*p, value, s);
    p->value = value;
    p->deferred = false;
    p->source = nullptr;
    p->initialized = true;
    any = true;
  }
  if (any) storage().make_compute_copies(compute_dtype());  // for the new ones; refreshes all
  s.synchronize();
  return *this;
}

bool Module::has_deferred_parameters() {
  for (const Parameter* p : parameters()) {
    if (p->deferred) return true;
  }
  return false;
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

Module& Module::set_input_grad(bool needed) {
  input_grad_needed_ = needed;
  on_input_grad_changed();
  return *this;
}

void Module::grad_ready(Parameter& param) {
  if (FlatStorage* st = settings_->storage; st != nullptr && st->grad_ready_hook_) st->grad_ready_hook_(param);
}

Tensor Module::buffer(int slot, const Shape& shape, DType dtype) {
  Tensor* chosen = nullptr;
  if (workspace_) {
    chosen = &workspace_->slot(workspace_index_, slot);
  } else {
    const std::size_t index = static_cast<std::size_t>(slot + 2);  // slots -2 and -1 are the casts
    if (buffers_.size() <= index) buffers_.resize(index + 1);
    chosen = &buffers_[index];
  }
  Tensor& b = *chosen;
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
  if (workspace_) workspace_->clear();
  for (auto& [name, child] : children_) child->clear_buffers_recursive();
}

void Module::use_workspace(Module& body, const std::shared_ptr<RecomputeWorkspace>& workspace) {
  std::vector<Module*> modules;
  body.collect_modules(modules);  // depth first: bodies of one structure number their layers alike
  if (workspace) {
    // One level only: a checkpointed body inside another's would replay inside the replay, with
    // both numbering its layers in their workspaces.
    // (A body moving from one workspace to another holds its current one, body.workspace_.)
    bool nested = body.parent_ != nullptr && body.parent_->workspace_ != nullptr;
    for (const Module* m : modules) {
      nested = nested || (m->workspace_ != nullptr && m->workspace_ != workspace && m->workspace_ != body.workspace_);
    }
    TUTTI_CHECK_ARG(!nested, "recompute: ", body.describe(),
                    " is inside a checkpointed body or holds one; checkpointed bodies cannot nest");
  }
  for (std::size_t i = 0; i < modules.size(); ++i) {
    modules[i]->buffers_.clear();
    modules[i]->workspace_ = workspace;
    modules[i]->workspace_index_ = static_cast<int>(i);
  }
}

Tensor& RecomputeWorkspace::slot(int index, int slot) {
  const auto i = static_cast<std::size_t>(index);
  const auto j = static_cast<std::size_t>(slot + 2);  // slots -2 and -1 are the casts
  if (buffers_.size() <= i) buffers_.resize(i + 1);
  if (buffers_[i].size() <= j) buffers_[i].resize(j + 1);
  return buffers_[i][j];
}

std::int64_t RecomputeWorkspace::bytes() const {
  std::int64_t n = 0;
  for (const auto& v : buffers_) {
    for (const Tensor& t : v) n += t.defined() ? static_cast<std::int64_t>(t.nbytes()) : 0;
  }
  return n;
}

const Tensor& Module::grad_of(Parameter& param) {
  if (FlatStorage* st = settings_->storage; st != nullptr && st->grad_placement_hook_) {
    param.grad = st->grad_placement_hook_(param);
    TUTTI_CHECK(param.grad.defined() && param.grad.shape() == param.shape() && param.grad.dtype() == grad_dtype(),
                "the gradient placement hook gave parameter '", param.name, "' ", param.grad.str(), ", expected ",
                shape_str(param.shape()), " ", name_of(grad_dtype()));
    return param.grad;
  }
  if (!param.grad.defined()) param.grad = Tensor::zeros(param.shape(), grad_dtype(), device());
  return param.grad;
}

// ---- gradients -----------------------------------------------------------------------

void Module::zero_grad() {
  if (storage_ && storage_->grads_.defined()) {
    storage_->grads_.zero(stream());
    return;
  }
  std::vector<Tensor> grads;
  for (Parameter* p : parameters()) grads.push_back(p->grad);
  for (Tensor& t : coalesce_views(grads)) t.zero(stream());
}

void Module::drop_grads() {
  for (Parameter* p : parameters()) p->grad = Tensor();
  if (storage_) storage_->forget_grads();
}

// ---- state -----------------------------------------------------------------------------

StateDict Module::state_dict() {
  require_masters("state_dict");
  require_materialized("state_dict");
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
  require_materialized("load_state_dict");
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
