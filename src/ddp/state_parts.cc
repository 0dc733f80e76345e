// DistributedDataParallel::*_state_parts: each rank's own part of the whole state tensors, with
// no communication and no copy, for train::Run's memory snapshots (every rank writes its part
// alone; the parts of one step, put together, are model_state_dict() and optimizer_state_dict()).
#include <algorithm>

#include "tutti/core/error.h"
#include "tutti/ddp/ddp.h"

namespace tutti::ddp {
namespace {

StatePart whole(const Tensor& t) {
  const Tensor flat = t.view(0, {t.numel()});
  return StatePart{flat, 0, t.shape()};
}

StateParts whole_parts(const StateDict& state) {
  StateParts out;
  for (const auto& [name, t] : state) out[name] = whole(t);
  return out;
}

// The elements of plan entry `e` that lie in `rank`'s chunk of its bucket, as a view of `shard`
// (the rank's shard layout: its chunks of every bucket back to back) or of `flat` (the whole
// plan's layout) where `shard` is undefined. False when none do.
bool part_of(const nn::FlatPlan& plan, const nn::PlanEntry& e, int rank, const Tensor& shard, const Tensor& flat,
             StatePart& out) {
  const nn::PlanBucket& pb = plan.buckets[static_cast<std::size_t>(e.bucket)];
  const nn::ElementRange chunk = pb.chunk_of(rank);
  const std::int64_t lo = std::max(chunk.begin, e.offset);
  const std::int64_t hi = std::min(chunk.end, e.offset + e.numel);
  if (lo >= hi) return false;
  const std::int64_t at = shard.defined() ? pb.shard_offset + (lo - chunk.begin) : lo;
  out = StatePart{(shard.defined() ? shard : flat).view(at, {hi - lo}), lo - e.offset, e.shape};
  return true;
}

}  // namespace

StateParts DistributedDataParallel::model_state_parts() {
  if (options_.zero_stage == 0) return whole_parts(model_state_views());
  // ZeRO: this rank's own chunks are current once its optimizer stepped (the gathers bring
  // the others' chunks); half compute keeps them in the fp32 master shard.
  synchronize_parameters();
  StateParts out = whole_parts(model_.extra_state());
  const nn::FlatPlan& plan = reducer_->plan();
  const Tensor shard = half_masters() ? master_shard_ : Tensor();
  const Tensor flat = half_masters() ? Tensor() : model_.storage().values();
  for (const nn::PlanEntry& e : plan.entries) {
    StatePart p;
    if (part_of(plan, e, comm_.rank(), shard, flat, p)) out[e.name] = std::move(p);
  }
  return out;
}

StateParts DistributedDataParallel::optimizer_state_parts(optim::Optimizer& optimizer) {
  if (options_.zero_stage == 0) {
    if (&optimizer == attached_) return whole_parts(optimizer_state_views(optimizer));
    return whole_parts(optimizer.state_dict());
  }
  TUTTI_CHECK_ARG(&optimizer == attached_, "optimizer_state_parts: the optimizer is not the one attached to this ",
                  "DistributedDataParallel (under ZeRO each rank's state is its shard of the attached one's)");
  StateParts out;
  out["step"] = whole(int_scalar_tensor(optimizer.steps()));
  const nn::FlatPlan& plan = reducer_->plan();
  for_each_optimizer_state(optimizer, [&](const std::string& key, std::size_t k, const nn::PlanEntry& e) {
    StatePart p;
    if (part_of(plan, e, comm_.rank(), optimizer.flat_state(k), Tensor(), p)) out[key] = std::move(p);  // shard layout
  });
  return out;
}

}  // namespace tutti::ddp
