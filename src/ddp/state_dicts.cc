// DistributedDataParallel's checkpoints: the whole state tensors whatever the stage and world
// size (model_state_dict, optimizer_state_dict and their loads; under ZeRO they gather or take
// this rank's shard), the live views at stage 0, and the flat parameter
// vector DiLoCo reads and sets.
#include <set>

#include "ddp/plan_state.h"
#include "ddp/zero3.h"
#include "tutti/core/error.h"
#include "tutti/ddp/ddp.h"
#include "tutti/kernels/cast.h"

namespace tutti::ddp {

StateDict DistributedDataParallel::model_state_dict() {
  synchronize_parameters();
  if (!half_masters()) return model_.state_dict();
  const Tensor full = gather_full(master_shard_);
  // On the CPU the gathered vector is already host memory: its views are the state dict (a
  // copy would hold the model twice while a checkpoint is made).
  StateDict out = full.device().is_cpu() ? named_views_of_flat(reducer_->plan(), full)
                                         : named_of_flat(reducer_->plan(), full, model_.stream());
  out.merge(model_.extra_state());  // (a parameter's name wins)
  model_.stream().synchronize();    // before `full` goes
  return out;
}

void DistributedDataParallel::load_model_state_dict(const StateDict& state) {
  synchronize_parameters();
  if (!half_masters()) {
    model_.load_state_dict(state);
    return;
  }
  const nn::FlatPlan& plan = reducer_->plan();
  std::set<std::string> used;
  for (const auto& [name, t] : model_.extra_state()) used.insert(name);
  // Every entry checked before anything changes.
  const Tensor host = flat_of_named(plan, state, "", "load_model_state_dict");
  for (const nn::PlanEntry& e : plan.entries) used.insert(e.name);
  for (const auto& [key, t] : state) {
    TUTTI_CHECK_ARG(used.count(key) == 1, "load_model_state_dict: entry '", key, "' matches no parameter or state");
  }
  model_.load_extra_state(state);
  const Stream& stream = model_.stream();
  for (const nn::PlanBucket& pb : plan.buckets) {
    if (pb.chunk == 0) continue;
    master_shard_.view(pb.shard_offset, {pb.chunk})
        .copy_from(host.view(pb.chunk_of(comm_.rank()).begin, {pb.chunk}), stream);
  }
  if (zero3_) {
    zero3_->load(host);
    for (nn::Parameter* p : params_) p->initialized = true;
    return;
  }
  // Every rank holds the whole state: the compute copies need no gather.
  const Tensor values = host.to(model_.device(), stream);
  kernels::cast(values, model_.storage().compute_copies(), stream);
  stream.synchronize();
  for (nn::Parameter* p : params_) p->initialized = true;
}

Tensor DistributedDataParallel::parameters_flat() {
  synchronize_parameters();
  const nn::FlatPlan& plan = reducer_->plan();
  if (half_masters()) return gather_full(master_shard_);
  Tensor out = Tensor::empty({plan.total}, DType::f32, model_.device());
  out.copy_from(model_.storage().values().view(0, {plan.total}), model_.stream());
  return out;
}

void DistributedDataParallel::load_parameters_flat(const Tensor& flat) {
  const nn::FlatPlan& plan = reducer_->plan();
  TUTTI_CHECK_ARG(flat.dtype() == DType::f32 && flat.numel() == plan.total, "load_parameters_flat: got ", flat.str(),
                  " but the plan holds ", plan.total, " f32 values");
  synchronize_parameters();
  const Stream& stream = model_.stream();
  const Tensor values =
      flat.device() == model_.device() ? flat.view(0, {plan.total}) : flat.to(model_.device(), stream);
  if (half_masters()) {
    for (const nn::PlanBucket& pb : plan.buckets) {
      if (pb.chunk == 0) continue;
      master_shard_.view(pb.shard_offset, {pb.chunk})
          .copy_from(values.view(pb.chunk_of(comm_.rank()).begin, {pb.chunk}), stream);
    }
  } else {
    model_.storage().values().view(0, {plan.total}).copy_from(values, stream);
  }
  if (zero3_) {
    zero3_->load(values);  // the compute shard, the resident buckets; the gathered groups are dropped
  } else if (model_.storage().compute_copies().defined())
    kernels::cast(values, model_.storage().compute_copies().view(0, {plan.total}), stream);
  if (values.data() != flat.data()) stream.synchronize();  // before the copy on this device goes
  for (nn::Parameter* p : params_) p->initialized = true;
}

StateDict DistributedDataParallel::optimizer_state_dict(optim::Optimizer& optimizer) {
  TUTTI_CHECK_ARG(&optimizer == attached_ || options_.zero_stage == 0,
                  "optimizer_state_dict: the optimizer is not "
                  "the one attached to this DistributedDataParallel");
  if (options_.zero_stage == 0 || comm_.size() == 1) return optimizer.state_dict();
  StateDict out;
  out["step"] = int_scalar_tensor(optimizer.steps());
  // One state at a time gathered whole (collective, the same order on every rank). On a GPU
  // each is copied to the host and its gather freed before the next (one state's whole on the
  // device at a time); on the CPU the gathered vectors are the state dict's storage.
  Tensor full;
  std::size_t gathered = SIZE_MAX;
  const bool on_cpu = model_.device().is_cpu();
  for_each_optimizer_state(optimizer, [&](const std::string& key, std::size_t k, const nn::PlanEntry& e) {
    if (k != gathered) {
      if (!on_cpu) model_.stream().synchronize();  // the copies out of the previous state's gather
      full = Tensor();
      full = gather_full(optimizer.flat_state(k));
      gathered = k;
    }
    out[key] = on_cpu ? full.view(e.offset, e.shape) : full.view(e.offset, e.shape).to(Device::cpu(), model_.stream());
  });
  model_.stream().synchronize();
  return out;
}

void DistributedDataParallel::for_each_optimizer_state(
    optim::Optimizer& optimizer,
    const std::function<void(const std::string& key, std::size_t k, const nn::PlanEntry& entry)>& fn) const {
  const std::vector<std::string> names = optimizer.state_names();
  const nn::FlatPlan& plan = reducer_->plan();
  const std::vector<nn::Parameter*> mine = optimizer.parameters();
  for (std::size_t k = 0; k < names.size(); ++k) {
    for (std::size_t i = 0; i < mine.size(); ++i) {
      fn(optimizer.key_of(i) + "." + names[k], k, plan.entries[index_.at(mine[i])]);
    }
  }
}

StateDict DistributedDataParallel::model_state_views() {
  TUTTI_CHECK_ARG(options_.zero_stage == 0, "model_state_views: zero_stage ", options_.zero_stage,
                  " keeps only a shard of the fp32 values on each rank: use model_state_dict(), which gathers them");
  TUTTI_CHECK_ARG(!model_.storage().masters_released(),
                  "model_state_views: the model's fp32 values were released: use model_state_dict()");
  StateDict out = model_.extra_state();
  for (nn::Parameter* p : params_) out[p->name] = p->value;
  return out;
}

StateDict DistributedDataParallel::optimizer_state_views(optim::Optimizer& optimizer) {
  TUTTI_CHECK_ARG(options_.zero_stage == 0 && &optimizer == attached_, "optimizer_state_views: needs zero_stage 0 ",
                  "and the optimizer attached (whole state tensors in this object's flat layout); here zero_stage ",
                  options_.zero_stage, ", ", &optimizer == attached_ ? "attached" : "not attached",
                  ": use optimizer_state_dict()");
  StateDict out;
  out["step"] = int_scalar_tensor(optimizer.steps());
  // At stage 0 the attached optimizer's state is one span over the whole plan: plan offsets.
  for_each_optimizer_state(optimizer, [&](const std::string& key, std::size_t k, const nn::PlanEntry& e) {
    out[key] = optimizer.flat_state(k).view(e.offset, e.shape);
  });
  return out;
}

void DistributedDataParallel::load_optimizer_state_dict(optim::Optimizer& optimizer, const StateDict& state) {
  optimizer.load_state_dict(state);
}

}  // namespace tutti::ddp
