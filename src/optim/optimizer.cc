#include "tutti/optim/optimizer.h"

#include <algorithm>
#include <map>


namespace tutti::optim {

namespace {

// Offset of t's first element in its storage, in elements of its dtype.
std::int64_t element_offset(const Tensor& t) {
  return static_cast<std::int64_t>(t.storage_offset_bytes() / size_of(t.dtype()));
}

// Whether b follows a in the same storage at exactly `delta` elements (same dtype).
bool follows(const Tensor& a, const Tensor& b, std::int64_t delta) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  return a.storage() == b.storage() && a.dtype() == b.dtype() && element_offset(b) - element_offset(a) == delta;
}

// A flat view of `length` elements starting at t's first element. It does not own the
// storage: t (which does) outlives it.
Tensor span_from(const Tensor& t, std::int64_t length) {
  if (!t.defined()) return Tensor();
  if (length == t.numel()) return t.flatten();
  return Tensor::wrap(t.data(), {length}, t.dtype(), t.device());
}

}  // namespace

Optimizer::Optimizer(std::vector<nn::Parameter*> params) : params_(std::move(params)) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    TUTTI_CHECK_ARG(params_[i] != nullptr, "Optimizer: parameter ", i, " is null");
    for (std::size_t j = 0; j < i; ++j) {
      TUTTI_CHECK_ARG(params_[i] != params_[j], "Optimizer: parameter ", key_of(i), " is listed twice");
    }
  }
}

Optimizer::~Optimizer() = default;

std::string Optimizer::key_of(std::size_t i) const {
  return params_[i]->name.empty() ? "param" + std::to_string(i) : params_[i]->name;
}

float Optimizer::lr() const { return schedule_ ? schedule_->at(steps_) : base_lr_; }

void Optimizer::set_lr(float lr) {
  base_lr_ = lr;
  schedule_.reset();
}

void Optimizer::set_schedule(const LrSchedule& schedule) { schedule_ = schedule; }

void Optimizer::ensure_state() {
  std::vector<std::pair<const void*, Device>> signature;
  signature.reserve(params_.size());
  for (nn::Parameter* p : params_) signature.emplace_back(p->value.data(), p->value.device());
  if (!state_.empty() && signature == state_signature_) return;

  const std::vector<std::string> names = state_names();
  std::vector<std::vector<Tensor>> fresh(params_.size());
  std::vector<Tensor> buffers;
  if (!names.empty()) {
    // One group per value storage, spanning the parameters in it: the state then has the
    // values' layout, so a run that is flat in the values is flat in the state too.
    struct Group {
      std::int64_t begin, end;
      std::size_t first_buffer;  // index in `buffers` of the group's first state buffer
    };
    std::map<const Storage*, Group> groups;
    for (nn::Parameter* p : params_) {
      TUTTI_CHECK_ARG(p->value.dtype() == DType::f32, "Optimizer: parameter ", p->name, " has master value ",
                      p->value.str(), "; master weights must be f32");
      const std::int64_t b = element_offset(p->value), e = b + p->numel();
      auto [it, added] = groups.try_emplace(p->value.storage().get(), Group{b, e, 0});
      if (!added) {
        it->second.begin = std::min(it->second.begin, b);
        it->second.end = std::max(it->second.end, e);
      }
    }
    for (auto& [storage, g] : groups) {
      g.first_buffer = buffers.size();
      for (std::size_t k = 0; k < names.size(); ++k) {
        buffers.push_back(Tensor::zeros({g.end - g.begin}, DType::f32, storage->device()));
      }
    }
    for (std::size_t i = 0; i < params_.size(); ++i) {
      nn::Parameter* p = params_[i];
      const Group& g = groups.at(p->value.storage().get());
      for (std::size_t k = 0; k < names.size(); ++k) {
        fresh[i].push_back(buffers[g.first_buffer + k].view(element_offset(p->value) - g.begin, p->shape()));
        // Carry state over from the previous layout (after flattening or moving the model).
        if (!state_.empty()) fresh[i][k].copy_from(state_[i][k], stream_);
      }
    }
    stream_.synchronize();
  }
  state_ = std::move(fresh);
  state_buffers_ = std::move(buffers);
  state_signature_ = std::move(signature);
}

void Optimizer::step(float grad_scale) {
  ensure_state();
  std::vector<std::size_t> active;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    nn::Parameter* p = params_[i];
    if (!p->requires_grad || !p->grad.defined()) continue;
    TUTTI_CHECK_ARG(p->grad.shape() == p->shape() && p->grad.device() == p->value.device(), "Optimizer: gradient ",
                    p->grad.str(), " of ", key_of(i), " does not match its value ", p->value.str());
    active.push_back(i);
  }
  // Value-layout order, so runs that are flat in memory come out consecutive.
  std::sort(active.begin(), active.end(), [&](std::size_t a, std::size_t b) {
    const Tensor& va = params_[a]->value;
    const Tensor& vb = params_[b]->value;
    if (va.storage() != vb.storage()) return va.storage().get() < vb.storage().get();
    return va.storage_offset_bytes() < vb.storage_offset_bytes();
  });
  const float lr_now = lr();
  const std::int64_t step_index = steps_ + 1;
  last_calls_ = 0;
  const std::size_t n_state = state_names().size();
  std::size_t at = 0;
  while (at < active.size()) {
    std::size_t last = at;
    while (last + 1 < active.size()) {
      const nn::Parameter* p = params_[active[last]];
      const nn::Parameter* q = params_[active[last + 1]];
      if (p->value.storage() != q->value.storage()) break;
      const std::int64_t delta = element_offset(q->value) - element_offset(p->value);
      if (delta < p->numel() || !follows(p->grad, q->grad, delta) || !follows(p->compute, q->compute, delta)) break;
      ++last;
    }
    const nn::Parameter* first = params_[active[at]];
    const nn::Parameter* end = params_[active[last]];
    const std::int64_t length = element_offset(end->value) + end->numel() - element_offset(first->value);
    Segment segment;
    segment.value = span_from(first->value, length);
    segment.grad = span_from(first->grad, length);
    segment.compute = span_from(first->compute, length);
    for (std::size_t k = 0; k < n_state; ++k) segment.state.push_back(span_from(state_[active[at]][k], length));
    update(segment, lr_now, grad_scale, step_index);
    ++last_calls_;
    at = last + 1;
  }
  steps_ = step_index;
}

void Optimizer::zero_grad() {
  std::vector<Tensor> grads;
  for (nn::Parameter* p : params_) grads.push_back(p->grad);
  for (Tensor& t : nn::coalesce_views(grads)) t.zero(stream_);
}

StateDict Optimizer::state_dict() {
  ensure_state();
  StateDict out;
  out["step"] = int_scalar_tensor(steps_);
  const std::vector<std::string> names = state_names();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    for (std::size_t k = 0; k < names.size(); ++k) out[key_of(i) + "." + names[k]] = state_[i][k].to(Device::cpu(), stream_);
  }
  stream_.synchronize();
  return out;
}

void Optimizer::load_state_dict(const StateDict& state) {
  const std::int64_t step = get_int_scalar(state, "step");
  TUTTI_CHECK_ARG(step >= 0, "Optimizer::load_state_dict: negative step ", step);
  ensure_state();
  const std::vector<std::string> names = state_names();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    for (std::size_t k = 0; k < names.size(); ++k) {
      const std::string key = key_of(i) + "." + names[k];
      const Tensor& t = get_tensor(state, key);
      TUTTI_CHECK_ARG(t.shape() == state_[i][k].shape() && t.dtype() == DType::f32, "Optimizer::load_state_dict: '",
                      key, "' is ", t.str(), " but the state is ", state_[i][k].str());
      state_[i][k].copy_from(t, stream_);
    }
  }
  stream_.synchronize();
  steps_ = step;
}

}  // namespace tutti::optim
