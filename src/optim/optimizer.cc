#include "tutti/optim/optimizer.h"

#include <optional>

#include "tutti/core/trace.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "tutti/nn/module.h"

namespace tutti::optim {

bool decays_if_matrix(const nn::Parameter& p) { return p.ndim() >= 2; }
bool decays_by_default(const nn::Parameter& p) { return p.ndim() >= 2 && !p.no_weight_decay; }

std::vector<ParamGroup> weight_decay_groups(const std::vector<nn::Parameter*>& params, float weight_decay,
                                            const std::function<bool(const nn::Parameter&)>& decays) {
  TUTTI_CHECK_ARG(weight_decay >= 0, "weight_decay_groups: weight_decay must be >= 0, got ", weight_decay);
  std::vector<ParamGroup> out(2);
  out[0].weight_decay = weight_decay;
  out[1].weight_decay = 0.0f;
  for (nn::Parameter* p : params) {
    TUTTI_CHECK_ARG(p != nullptr, "weight_decay_groups: a parameter is null");
    if (!p->requires_grad) continue;
    out[decays(*p) ? 0 : 1].parameters.push_back(p);
  }
  return out;
}

FlatTarget flat_target(nn::Module& model) {
  nn::FlatStorage& storage = model.storage();
  const auto& plan = storage.plan();
  TUTTI_CHECK_ARG(plan != nullptr, "flat_target: the model's values are not flat (storage().flatten first)");
  TUTTI_CHECK_ARG(storage.values().defined(), "flat_target: the model's master values were released");
  TUTTI_CHECK_ARG(storage.grad_plan() != nullptr && *storage.grad_plan() == *plan,
                  "flat_target: the model's gradients are not flat in the values' plan (storage().allocate_grads, or "
                  "run a backward, first)");
  FlatTarget t;
  t.plan = plan;
  t.params = model.parameters();
  FlatSpan all;
  all.begin = 0;
  all.end = plan->total;
  all.value = storage.values().view(0, {plan->total});
  all.grad = storage.grads().view(0, {plan->total});
  if (storage.compute_copies().defined()) all.compute = storage.compute_copies().view(0, {plan->total});
  t.spans.push_back(std::move(all));
  return t;
}

Optimizer::Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  std::unordered_set<const nn::Parameter*> seen;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    TUTTI_CHECK_ARG(!groups_[g].weight_decay || *groups_[g].weight_decay >= 0, "Optimizer: group ", g,
                    " has weight_decay ", *groups_[g].weight_decay, "; it must be >= 0");
    for (nn::Parameter* p : groups_[g].parameters) {
      TUTTI_CHECK_ARG(p != nullptr, "Optimizer: parameter ", params_.size(), " is null");
      params_.push_back(p);
      group_of_.push_back(static_cast<int>(g));
      TUTTI_CHECK_ARG(seen.insert(p).second, "Optimizer: parameter ", key_of(params_.size() - 1), " is listed twice");
    }
  }
  state_.resize(params_.size());
}

Optimizer::~Optimizer() = default;

std::string Optimizer::key_of(std::size_t i) const {
  return params_[i]->name.empty() ? "param" + std::to_string(i) : params_[i]->name;
}

std::vector<nn::Parameter*> Optimizer::parameters() const { return params_; }

float Optimizer::lr() const { return schedule_ ? schedule_->at(steps_) : base_lr_; }

void Optimizer::set_lr(float lr) {
  base_lr_ = lr;
  schedule_.reset();
}

void Optimizer::set_schedule(const LrSchedule& schedule) { schedule_ = schedule; }

void Optimizer::set_steps(std::int64_t steps) {
  TUTTI_CHECK_ARG(steps >= 0, "Optimizer: negative step count ", steps);
  steps_ = steps;
}

// ---- where parameter i's state lives ----------------------------------------------------

namespace {

// Part of a parameter's state: its elements [begin, end) (parameter-local) in `where`.
struct Piece {
  std::int64_t begin, end;
  Tensor where;
};

}  // namespace

void Optimizer::ensure_per_parameter_state() {
  const std::vector<std::string> names = state_names();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (state_[i].size() == names.size()) continue;
    state_[i].clear();
    for (std::size_t k = 0; k < names.size(); ++k) {
      state_[i].push_back(Tensor::zeros(params_[i]->shape(), DType::f32, params_[i]->device()));
    }
  }
}

Tensor Optimizer::whole_state(std::size_t i, std::size_t k) const {
  if (!target_) return k < state_[i].size() ? state_[i][k] : Tensor();
  return Tensor();
}

void Optimizer::store_state(std::size_t i, std::size_t k, const Tensor& whole) {
  const Tensor flat = whole.flatten();
  if (!target_) {
    ensure_per_parameter_state();
    state_[i][k].flatten().copy_from(flat, stream_);
    return;
  }
  const nn::PlanEntry& e = target_->plan->entries[entry_[i]];
  for (std::size_t s = 0; s < target_->spans.size(); ++s) {
    const FlatSpan& span = target_->spans[s];
    const std::int64_t b = std::max(span.begin, e.offset), end = std::min(span.end, e.offset + e.numel);
    if (b >= end) continue;
    Tensor dst = flat_state_[k].view(span_state_offset_[s] + (b - span.begin), {end - b});
    dst.copy_from(flat.view(b - e.offset, {end - b}), stream_);
  }
}

void Optimizer::bind(FlatTarget target) {
  TUTTI_CHECK_ARG(target.plan != nullptr, "Optimizer::bind: the target has no plan");
  const nn::FlatPlan& plan = *target.plan;
  plan.check_matches(target.params, "Optimizer::bind");
  std::unordered_map<const nn::Parameter*, std::size_t> entry_of;
  for (std::size_t e = 0; e < target.params.size(); ++e) entry_of.emplace(target.params[e], e);
  std::vector<std::size_t> entry(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto it = entry_of.find(params_[i]);
    TUTTI_CHECK_ARG(it != entry_of.end(), "Optimizer::bind: parameter ", key_of(i), " is not in the target's plan");
    entry[i] = it->second;
  }
  std::int64_t last_end = 0;
  Device device = Device::cpu();
  for (std::size_t s = 0; s < target.spans.size(); ++s) {
    const FlatSpan& span = target.spans[s];
    const std::int64_t n = span.end - span.begin;
    TUTTI_CHECK_ARG(span.begin >= last_end && n >= 0 && span.end <= plan.total, "Optimizer::bind: span ", s, " [",
                    span.begin, ", ", span.end, ") is not inside the plan's ", plan.total,
                    " elements after the previous span");
    TUTTI_CHECK_ARG(span.value.defined() && span.value.numel() == n && span.value.dtype() == DType::f32,
                    "Optimizer::bind: span ", s, " needs f32 values of ", n, " elements, got ",
                    span.value.defined() ? span.value.str() : "none");
    TUTTI_CHECK_ARG(span.grad.defined() && span.grad.numel() == n && is_floating(span.grad.dtype()) &&
                        span.grad.device() == span.value.device(),
                    "Optimizer::bind: span ", s, " needs gradients of ", n, " elements beside its values, got ",
                    span.grad.defined() ? span.grad.str() : "none");
    TUTTI_CHECK_ARG(
        !span.compute.defined() ||
            (span.compute.numel() == n && (span.compute.dtype() == DType::f16 || span.compute.dtype() == DType::bf16) &&
             span.compute.device() == span.value.device()),
        "Optimizer::bind: span ", s, " has compute copies ", span.compute.str(), " (need f16/bf16 of ", n,
        " elements)");
    if (s == 0) device = span.value.device();
    TUTTI_CHECK_ARG(span.value.device() == device, "Optimizer::bind: spans on different devices");
    last_end = span.end;
  }

  // The runs: per span, consecutive parameters of one weight decay (padding between them too).
  std::vector<float> decay_of_entry(plan.entries.size(), 0.0f);
  std::vector<bool> updated(plan.entries.size(), false);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    updated[entry[i]] = params_[i]->requires_grad;
    decay_of_entry[entry[i]] = weight_decay_of(groups_[static_cast<std::size_t>(group_of_[i])]);
  }
  std::vector<std::size_t> by_offset(plan.entries.size());
  for (std::size_t e = 0; e < by_offset.size(); ++e) by_offset[e] = e;
  std::sort(by_offset.begin(), by_offset.end(),
            [&](std::size_t a, std::size_t b) { return plan.entries[a].offset < plan.entries[b].offset; });
  std::vector<Run> runs;
  for (std::size_t s = 0; s < target.spans.size(); ++s) {
    const FlatSpan& span = target.spans[s];
    bool open = false;
    Run run;
    for (std::size_t e : by_offset) {
      const nn::PlanEntry& pe = plan.entries[e];
      const std::int64_t b = std::max(span.begin, pe.offset), end = std::min(span.end, pe.offset + pe.numel);
      if (b >= end) continue;
      if (!updated[e]) {
        if (open) runs.push_back(run);
        open = false;
        continue;
      }
      if (open && run.weight_decay == decay_of_entry[e]) {
        run.end = end - span.begin;
        continue;
      }
      if (open) runs.push_back(run);
      run = Run{s, b - span.begin, end - span.begin, decay_of_entry[e]};
      open = true;
    }
    if (open) runs.push_back(run);
  }

  // The new state, carried over parameter by parameter from wherever it is now.
  const std::vector<std::string> names = state_names();
  std::vector<std::vector<Tensor>> wholes(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    for (std::size_t k = 0; k < names.size(); ++k) {
      Tensor w = whole_state(i, k);
      if (!w.defined() && target_) {
        // From a previous binding: assemble what it holds of the parameter (zeros elsewhere).
        w = Tensor::zeros(params_[i]->shape(), DType::f32, device);
        const nn::PlanEntry& oe = target_->plan->entries[entry_[i]];
        for (std::size_t s = 0; s < target_->spans.size(); ++s) {
          const FlatSpan& span = target_->spans[s];
          const std::int64_t b = std::max(span.begin, oe.offset), end = std::min(span.end, oe.offset + oe.numel);
          if (b >= end) continue;
          w.flatten()
              .view(b - oe.offset, {end - b})
              .copy_from(flat_state_[k].view(span_state_offset_[s] + (b - span.begin), {end - b}), stream_);
        }
      }
      wholes[i].push_back(w);
    }
  }
  std::vector<std::int64_t> offsets;
  std::int64_t total = 0;
  for (const FlatSpan& span : target.spans) {
    offsets.push_back(total);
    total += span.end - span.begin;
  }
  std::vector<Tensor> fresh;
  for (std::size_t k = 0; k < names.size(); ++k) fresh.push_back(Tensor::zeros({total}, DType::f32, device));

  target_ = std::make_unique<FlatTarget>(std::move(target));
  entry_ = std::move(entry);
  runs_ = std::move(runs);
  span_state_offset_ = std::move(offsets);
  flat_state_ = std::move(fresh);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    for (std::size_t k = 0; k < names.size(); ++k) {
      if (wholes[i][k].defined()) store_state(i, k, wholes[i][k]);
    }
  }
  stream_.synchronize();
  state_.assign(params_.size(), {});
}

void Optimizer::unbind() {
  if (!target_) return;
  const std::vector<std::string> names = state_names();
  std::vector<std::vector<Tensor>> per(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const nn::PlanEntry& pe = target_->plan->entries[entry_[i]];
    for (std::size_t k = 0; k < names.size(); ++k) {
      Tensor w = Tensor::zeros(params_[i]->shape(), DType::f32, params_[i]->device());
      for (std::size_t s = 0; s < target_->spans.size(); ++s) {
        const FlatSpan& span = target_->spans[s];
        const std::int64_t b = std::max(span.begin, pe.offset), end = std::min(span.end, pe.offset + pe.numel);
        if (b >= end) continue;
        w.flatten()
            .view(b - pe.offset, {end - b})
            .copy_from(flat_state_[k].view(span_state_offset_[s] + (b - span.begin), {end - b}), stream_);
      }
      per[i].push_back(w);
    }
  }
  stream_.synchronize();
  target_.reset();
  entry_.clear();
  runs_.clear();
  span_state_offset_.clear();
  flat_state_.clear();
  state_ = std::move(per);
}

// ---- stepping ----------------------------------------------------------------------------

void Optimizer::step(float grad_scale) {
  std::optional<trace::Span> span;
  if (trace::on()) span.emplace("optimizer step", "optimizer", stream_);
  const float lr_now = lr();
  const std::int64_t step_index = steps_ + 1;
  last_calls_ = 0;
  if (target_) {
    step_bound(lr_now, grad_scale, step_index);
  } else {
    step_per_parameter(lr_now, grad_scale, step_index);
  }
  steps_ = step_index;
  if (target_ && target_->after_step) target_->after_step();
}

void Optimizer::step_per_parameter(float lr_now, float grad_scale, std::int64_t step_index) {
  ensure_per_parameter_state();
  const std::size_t n_state = state_names().size();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    nn::Parameter* p = params_[i];
    if (!p->requires_grad || !p->grad.defined()) continue;
    TUTTI_CHECK_ARG(p->value.defined(), "Optimizer: parameter ", key_of(i),
                    " has no master value here (its masters "
                    "are sharded by DistributedDataParallel's ZeRO stages: attach this optimizer with "
                    "ddp.attach(optimizer))");
    TUTTI_CHECK_ARG(p->value.dtype() == DType::f32, "Optimizer: parameter ", key_of(i), " has master value ",
                    p->value.str(), "; master weights must be f32");
    TUTTI_CHECK_ARG(p->grad.shape() == p->shape() && p->grad.device() == p->value.device(), "Optimizer: gradient ",
                    p->grad.str(), " of ", key_of(i), " does not match its value ", p->value.str());
    if (state_[i].size() == n_state && n_state > 0 && state_[i][0].device() != p->value.device()) {
      // The model moved since the state was made: the state follows it.
      for (Tensor& t : state_[i]) t = t.to(p->value.device(), stream_);
    }
    Segment segment;
    segment.value = p->value.flatten();
    segment.grad = p->grad.flatten();
    if (p->compute.defined()) segment.compute = p->compute.flatten();
    for (std::size_t k = 0; k < n_state; ++k) segment.state.push_back(state_[i][k].flatten());
    segment.weight_decay = weight_decay_of(groups_[static_cast<std::size_t>(group_of_[i])]);
    update(segment, lr_now, grad_scale, step_index);
    ++last_calls_;
  }
}

void Optimizer::step_bound(float lr_now, float grad_scale, std::int64_t step_index) {
  const std::size_t n_state = flat_state_.size();
  for (const Run& run : runs_) {
    const FlatSpan& span = target_->spans[run.span];
    const std::int64_t n = run.end - run.begin;
    Segment segment;
    segment.value = span.value.view(run.begin, {n});
    segment.grad = span.grad.view(run.begin, {n});
    if (span.compute.defined()) segment.compute = span.compute.view(run.begin, {n});
    for (std::size_t k = 0; k < n_state; ++k) {
      segment.state.push_back(flat_state_[k].view(span_state_offset_[run.span] + run.begin, {n}));
    }
    segment.weight_decay = run.weight_decay;
    update(segment, lr_now, grad_scale, step_index);
    ++last_calls_;
  }
}

void Optimizer::zero_grad() {
  if (target_) {
    for (const FlatSpan& span : target_->spans) {
      Tensor g = span.grad;
      g.zero(stream_);
    }
    return;
  }
  std::vector<Tensor> grads;
  for (nn::Parameter* p : params_) grads.push_back(p->grad);
  for (Tensor& t : nn::coalesce_views(grads)) t.zero(stream_);
}

// ---- state -------------------------------------------------------------------------------

const Tensor& Optimizer::flat_state(std::size_t k) const {
  TUTTI_CHECK_ARG(target_ != nullptr, "Optimizer::flat_state: the optimizer is not bound to flat buffers");
  TUTTI_CHECK_ARG(k < flat_state_.size(), "Optimizer::flat_state: state ", k, " of ", flat_state_.size());
  return flat_state_[k];
}

std::int64_t Optimizer::state_bytes() const {
  std::int64_t bytes = 0;
  for (const Tensor& t : flat_state_) bytes += static_cast<std::int64_t>(t.storage()->nbytes());
  for (const auto& per : state_) {
    for (const Tensor& t : per) bytes += t.defined() ? static_cast<std::int64_t>(t.storage()->nbytes()) : 0;
  }
  return bytes;
}

StateDict Optimizer::state_dict() {
  StateDict out;
  out["step"] = int_scalar_tensor(steps_);
  const std::vector<std::string> names = state_names();
  if (!target_) {
    ensure_per_parameter_state();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      for (std::size_t k = 0; k < names.size(); ++k) {
        out[key_of(i) + "." + names[k]] = state_[i][k].to(Device::cpu(), stream_);
      }
    }
    stream_.synchronize();
    return out;
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const nn::PlanEntry& pe = target_->plan->entries[entry_[i]];
    std::int64_t covered = 0;
    for (const FlatSpan& span : target_->spans) {
      covered += std::max<std::int64_t>(0, std::min(span.end, pe.offset + pe.numel) - std::max(span.begin, pe.offset));
    }
    TUTTI_CHECK(covered == pe.numel, "Optimizer::state_dict: this optimizer holds ", covered, " of the ", pe.numel,
                " elements of the state of '", key_of(i),
                "' (one rank's shard under ZeRO): save it with "
                "DdpState::optimizer_state_dict, which gathers the shards");
    for (std::size_t k = 0; k < names.size(); ++k) {
      Tensor whole = Tensor::empty(pe.shape, DType::f32);
      for (std::size_t s = 0; s < target_->spans.size(); ++s) {
        const FlatSpan& span = target_->spans[s];
        const std::int64_t b = std::max(span.begin, pe.offset), end = std::min(span.end, pe.offset + pe.numel);
        if (b >= end) continue;
        whole.flatten()
            .view(b - pe.offset, {end - b})
            .copy_from(flat_state_[k].view(span_state_offset_[s] + (b - span.begin), {end - b}), stream_);
      }
      out[key_of(i) + "." + names[k]] = whole;
    }
  }
  stream_.synchronize();
  return out;
}

void Optimizer::load_state_dict(const StateDict& state) {
  const std::int64_t step = get_int_scalar(state, "step");
  TUTTI_CHECK_ARG(step >= 0, "Optimizer::load_state_dict: negative step ", step);
  const std::vector<std::string> names = state_names();
  // Everything checked before anything is copied.
  std::vector<std::vector<const Tensor*>> found(params_.size());
  for (std::size_t i = 0; i < params_.size(); ++i) {
    for (std::size_t k = 0; k < names.size(); ++k) {
      const std::string key = key_of(i) + "." + names[k];
      const Tensor& t = get_tensor(state, key);
      TUTTI_CHECK_ARG(t.shape() == params_[i]->shape() && t.dtype() == DType::f32, "Optimizer::load_state_dict: '", key,
                      "' is ", t.str(), " but the parameter is ", shape_str(params_[i]->shape()), " f32");
      found[i].push_back(&t);
    }
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    for (std::size_t k = 0; k < names.size(); ++k) store_state(i, k, *found[i][k]);
  }
  stream_.synchronize();
  steps_ = step;
}

}  // namespace tutti::optim
