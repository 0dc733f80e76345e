// ZeRO-1 and 2 (ShardOptimizer, ShardGradients), and what every sharded strategy shares
// (ShardedState, sharded_state.h): the optimizer's spans over this rank's chunks, the gradient
// norm over the shards, the checkpoints gathered whole and the parts each rank holds.
#include <chrono>
#include <set>

#include "ddp/plan_state.h"
#include "ddp/sharded_state.h"
#include "tutti/core/error.h"
#include "tutti/core/trace.h"
#include "tutti/kernels/cast.h"
#include "tutti/kernels/reduce.h"

namespace tutti::ddp {

// ---- ShardedState ------------------------------------------------------------------------------

optim::FlatTarget ShardedState::target(const std::weak_ptr<int>& alive) {
  optim::FlatTarget target;
  const int rank = ctx_.comm.rank();
  for (int b = 0; b < reducer_->bucket_count(); ++b) {
    const nn::PlanBucket& pb = plan().buckets[static_cast<std::size_t>(b)];
    if (pb.chunk == 0) continue;
    const nn::ElementRange mine = pb.chunk_of(rank);
    optim::FlatSpan span;
    span.begin = mine.begin;
    span.end = mine.end;
    fill_span(pb, mine, span);
    span.grad = reducer_->shard_grad(b);
    target.spans.push_back(std::move(span));
  }
  target.after_step = [this, alive] {
    TUTTI_CHECK(!alive.expired(),
                "Optimizer::step: the DistributedDataParallel this optimizer was attached to is "
                "gone (its step would update one shard and gather nothing)");
    after_step();
  };
  return target;
}

void ShardedState::grad_squares(const Tensor& sq, const Stream& stream) {
  // The norm is a sum over the shards: each rank its own chunks, then one small allreduce.
  for (int b = 0; b < reducer_->bucket_count(); ++b) {
    const Tensor g = reducer_->shard_grad(b);
    if (g.numel() > 0) kernels::sum_squares(g, sq, /*accumulate=*/true, stream);
  }
  CallOptions call;
  call.label = "ddp gradient norm";
  call.stream = stream;
  ctx_.comm.allreduce(sq, ReduceOp::sum, call).wait(stream);
}

void ShardedState::keep_chunks(const Tensor& whole) {
  const int rank = ctx_.comm.rank();
  for (const nn::PlanBucket& pb : plan().buckets) {
    if (pb.chunk == 0) continue;
    master_shard_.view(pb.shard_offset, {pb.chunk})
        .copy_from(whole.view(pb.chunk_of(rank).begin, {pb.chunk}), ctx_.model.stream());
  }
}

Tensor ShardedState::gather_full(const Tensor& shard) {
  Tensor full = Tensor::zeros({plan().total}, DType::f32, ctx_.model.device());
  CallOptions call;
  call.stream = ctx_.model.stream();
  call.label = "zero checkpoint gather";
  // The host waits for each gather (not the stream): a GPU backend's Work lets go of `full` once
  // it has seen the collective complete, which a stream wait leaves to its watchdog's next poll;
  // the state dicts gather one vector after another and must hold one at a time.
  for (const nn::PlanBucket& pb : plan().buckets) {
    if (pb.numel() == 0) continue;
    ctx_.comm.allgather(shard.view(pb.shard_offset, {pb.chunk}), full.view(pb.begin, {pb.numel()}), call).wait();
  }
  return full;
}

StateDict ShardedState::model_state_dict() {
  synchronize_parameters();
  nn::Module& model = ctx_.model;
  if (!half_masters()) return model.state_dict();  // f32 compute: the gathers made the values whole
  const Tensor full = gather_full(master_shard_);
  // On the CPU the gathered vector is already host memory: its views are the state dict (a
  // copy would hold the model twice while a checkpoint is made).
  StateDict out =
      full.device().is_cpu() ? named_views_of_flat(plan(), full) : named_of_flat(plan(), full, model.stream());
  out.merge(model.extra_state());  // (a parameter's name wins)
  model.stream().synchronize();    // before `full` goes
  return out;
}

void ShardedState::load_model_state_dict(const StateDict& state) {
  synchronize_parameters();
  nn::Module& model = ctx_.model;
  if (!half_masters()) {
    model.load_state_dict(state);
    return;
  }
  std::set<std::string> used;
  for (const auto& [name, t] : model.extra_state()) used.insert(name);
  // Every entry checked before anything changes.
  const Tensor host = flat_of_named(plan(), state, "", "load_model_state_dict");
  for (const nn::PlanEntry& e : plan().entries) used.insert(e.name);
  for (const auto& [key, t] : state) {
    TUTTI_CHECK_ARG(used.count(key) == 1, "load_model_state_dict: entry '", key, "' matches no parameter or state");
  }
  model.load_extra_state(state);
  keep_chunks(host);
  loaded(host);
  for (nn::Parameter* p : ctx_.params) p->initialized = true;
}

Tensor ShardedState::parameters_flat() {
  if (half_masters()) return gather_full(master_shard_);
  const std::int64_t total = plan().total;
  Tensor out = Tensor::empty({total}, DType::f32, ctx_.model.device());
  out.copy_from(ctx_.model.storage().values().view(0, {total}), ctx_.model.stream());
  return out;
}

void ShardedState::load_parameters_flat(const Tensor& values) {
  if (half_masters()) {
    keep_chunks(values);
  } else {
    ctx_.model.storage().values().view(0, {plan().total}).copy_from(values, ctx_.model.stream());
  }
  loaded(values);
}

StateDict ShardedState::optimizer_state_dict(optim::Optimizer& optimizer) {
  TUTTI_CHECK_ARG(&optimizer == attached_,
                  "optimizer_state_dict: the optimizer is not the one attached to this DistributedDataParallel");
  if (ctx_.comm.size() == 1) return optimizer.state_dict();
  nn::Module& model = ctx_.model;
  StateDict out;
  out["step"] = int_scalar_tensor(optimizer.steps());
  // One state at a time gathered whole (collective, the same order on every rank). On a GPU
  // each is copied to the host and its gather freed before the next (one state's whole on the
  // device at a time); on the CPU the gathered vectors are the state dict's storage.
  Tensor full;
  std::size_t gathered = SIZE_MAX;
  const bool on_cpu = model.device().is_cpu();
  for_each_optimizer_state(optimizer, [&](const std::string& key, std::size_t k, const nn::PlanEntry& e) {
    if (k != gathered) {
      if (!on_cpu) model.stream().synchronize();  // the copies out of the previous state's gather
      full = Tensor();
      full = gather_full(optimizer.flat_state(k));
      gathered = k;
    }
    out[key] = on_cpu ? full.view(e.offset, e.shape) : full.view(e.offset, e.shape).to(Device::cpu(), model.stream());
  });
  model.stream().synchronize();
  return out;
}

StateDict ShardedState::model_state_views() {
  TUTTI_THROW(InvalidArgument, "model_state_views: ZeRO-", stage(),
              " keeps only a shard of the fp32 values on each rank: use model_state_dict(), which gathers them");
}

StateDict ShardedState::optimizer_state_views(optim::Optimizer& /*optimizer*/) {
  TUTTI_THROW(InvalidArgument, "optimizer_state_views: ZeRO-", stage(),
              " keeps only a shard of the optimizer's state on each rank: use optimizer_state_dict()");
}

namespace {

// The elements of plan entry `e` that lie in `rank`'s chunk of its bucket, as a view of `shard`
// (the rank's shard layout: its chunks of every bucket back to back) or of `flat` (the whole
// plan's layout) where `shard` is undefined. False when none do.
bool part_of(const nn::FlatPlan& plan, const nn::PlanEntry& e, int rank, const Tensor& shard, const Tensor& flat,
             StatePart& out) {
  const nn::ElementRange mine = plan.owned_part(e, rank);
  if (mine.size() == 0) return false;
  const nn::PlanBucket& pb = plan.buckets[static_cast<std::size_t>(e.bucket)];
  const std::int64_t at = shard.defined() ? pb.shard_offset + (mine.begin - pb.chunk_of(rank).begin) : mine.begin;
  out = StatePart{(shard.defined() ? shard : flat).view(at, {mine.size()}), mine.begin - e.offset, e.shape};
  return true;
}

}  // namespace

StateParts ShardedState::model_state_parts() {
  // This rank's own chunks are current once its optimizer stepped (the gathers bring the
  // others' chunks); half compute keeps them in the fp32 master shard.
  synchronize_parameters();
  StateParts out = whole_parts(ctx_.model.extra_state());
  const Tensor shard = half_masters() ? master_shard_ : Tensor();
  const Tensor flat = half_masters() ? Tensor() : ctx_.model.storage().values();
  for (const nn::PlanEntry& e : plan().entries) {
    StatePart p;
    if (part_of(plan(), e, ctx_.comm.rank(), shard, flat, p)) out[e.name] = std::move(p);
  }
  return out;
}

StateParts ShardedState::optimizer_state_parts(optim::Optimizer& optimizer) {
  TUTTI_CHECK_ARG(&optimizer == attached_, "optimizer_state_parts: the optimizer is not the one attached to this ",
                  "DistributedDataParallel (under ZeRO each rank's state is its shard of the attached one's)");
  StateParts out;
  out["step"] = whole_part(int_scalar_tensor(optimizer.steps()));
  for_each_optimizer_state(optimizer, [&](const std::string& key, std::size_t k, const nn::PlanEntry& e) {
    StatePart p;
    if (part_of(plan(), e, ctx_.comm.rank(), optimizer.flat_state(k), Tensor(), p))
      out[key] = std::move(p);  // shard layout
  });
  return out;
}

// ---- ZeRO-1 and 2 ------------------------------------------------------------------------------

namespace {

// The model keeps its whole parameters (compute dtype): after each step every bucket's updated
// chunks are all-gathered into them, waited for by the first forward that reads the bucket.
// Half compute: the fp32 masters are this rank's shard (the model's whole ones are released).
class ShardedOptimizer final : public ShardedState {
 public:
  ShardedOptimizer(StrategyContext context, bool shard_gradients, bool gather_during_forward)
      : ShardedState(context), shard_gradients_(shard_gradients), gather_during_forward_(gather_during_forward) {}
  ~ShardedOptimizer() override { release_grads(); }

  int stage() const override { return shard_gradients_ ? 2 : 1; }
  std::string refuses_deterministic() const override {
    return shard_gradients_ ? "ZeRO-2 keeps no full gradient buffer to sum the slices into" : "";
  }
  GradientSharding gradient_sharding() const override {
    return shard_gradients_ ? GradientSharding::shard_only : GradientSharding::scatter;
  }

  void shard(bool /*deferred: materialized whole*/, bool /*broadcast*/,
             const std::vector<std::string>& /*groups*/) override {
    nn::FlatStorage& storage = ctx_.model.storage();
    gathers_.resize(plan().buckets.size());
    pending_.assign(plan().buckets.size(), false);
    if (!storage.compute_copies().defined()) return;  // f32 compute: the values are the masters
    master_shard_ = Tensor::empty({plan().shard_numel}, DType::f32, ctx_.model.device());
    keep_chunks(storage.values());
    storage.release_masters();
  }

  void install_hooks(const std::function<std::size_t(const nn::Parameter&)>& index_of) override {
    nn::FlatStorage& storage = ctx_.model.storage();
    if (shard_gradients_) {
      storage.set_grad_placement_hook([this, index_of](nn::Parameter& p) { return reducer_->grad(index_of(p)); });
    }
    storage.set_param_use_hook([this, index_of](nn::Parameter& p) {
      const int b = plan().entries[index_of(p)].bucket;
      if (pending_[static_cast<std::size_t>(b)]) wait(b);
    });
  }

  void after_reduce(StepStats& stats) override {
    if (shard_gradients_) release_grads();  // views into pool buffers other buckets reuse
    stats.gather_ms = gather_ms_;
    stats.exposed_gather_ms = exposed_gather_ms_;
  }
  void zero_grad() override {
    if (shard_gradients_) release_grads();
  }
  void synchronize_parameters() override {
    for (int b = 0; b < static_cast<int>(gathers_.size()); ++b) wait(b);
  }

  void memory(DdpMemory& m) const override {
    whole_model_bytes(m);  // the compute copies stay whole; the masters are this rank's shard
    if (half_masters()) m.master_weights = static_cast<std::int64_t>(master_shard_.storage()->nbytes());
  }

 protected:
  void fill_span(const nn::PlanBucket& pb, const nn::ElementRange& mine, optim::FlatSpan& span) const override {
    const nn::FlatStorage& s = ctx_.model.storage();
    if (half_masters()) {
      span.value = master_shard_.view(pb.shard_offset, {pb.chunk});
      span.compute = s.compute_copies().view(mine.begin, {pb.chunk});
    } else {
      span.value = s.values().view(mine.begin, {pb.chunk});
    }
  }

  void after_step() override;

  void loaded(const Tensor& values) override {
    // Every rank holds the whole state: the compute copies need no gather.
    nn::Module& model = ctx_.model;
    const Tensor& compute = model.storage().compute_copies();
    if (!compute.defined()) return;
    const Stream& stream = model.stream();
    const Tensor on_device = values.device() == model.device() ? values : values.to(model.device(), stream);
    kernels::cast(on_device, compute.view(0, {plan().total}), stream);
    stream.synchronize();
  }

 private:
  void wait(int bucket);

  bool shard_gradients_;
  bool gather_during_forward_;
  std::vector<Work> gathers_;  // per bucket: the all-gather of its updated chunks
  std::vector<bool> pending_;
  int gathers_pending_ = 0;
  std::chrono::steady_clock::time_point t_gather_launch_;
  double gather_ms_ = 0, exposed_gather_ms_ = 0;
};

void ShardedOptimizer::after_step() {
  Communicator& comm = ctx_.comm;
  if (comm.size() == 1) return;  // the step wrote every element already
  nn::Module& model = ctx_.model;
  const Tensor& values = half_masters() ? model.storage().compute_copies() : model.storage().values();
  CallOptions call;
  call.stream = model.stream();
  t_gather_launch_ = std::chrono::steady_clock::now();
  gather_ms_ = exposed_gather_ms_ = 0;
  // Last bucket first: it holds the first layers, which the next forward needs first.
  for (int b = static_cast<int>(plan().buckets.size()) - 1; b >= 0; --b) {
    const nn::PlanBucket& pb = plan().buckets[static_cast<std::size_t>(b)];
    if (pb.numel() == 0) continue;
    Tensor whole = values.view(pb.begin, {pb.numel()});
    call.label = "zero gather " + std::to_string(b);
    gathers_[static_cast<std::size_t>(b)] = comm.allgather(whole.view(comm.rank() * pb.chunk, {pb.chunk}), whole, call);
    pending_[static_cast<std::size_t>(b)] = true;
    ++gathers_pending_;
  }
  if (!gather_during_forward_) synchronize_parameters();
}

void ShardedOptimizer::wait(int bucket) {
  const auto b = static_cast<std::size_t>(bucket);
  if (!pending_[b]) return;
  const auto t0 = std::chrono::steady_clock::now();
  gathers_[b].wait(ctx_.model.stream());
  const auto t1 = std::chrono::steady_clock::now();
  if (trace::on()) {
    using std::chrono::nanoseconds;
    trace::record("wait for parameters (bucket " + std::to_string(bucket) + ")", "wait", trace::Lane::host,
                  std::chrono::duration_cast<nanoseconds>(t0.time_since_epoch()).count(),
                  std::chrono::duration_cast<nanoseconds>(t1.time_since_epoch()).count());
  }
  gathers_[b] = Work();
  pending_[b] = false;
  exposed_gather_ms_ += std::chrono::duration<double, std::milli>(t1 - t0).count();
  if (--gathers_pending_ == 0) gather_ms_ = std::chrono::duration<double, std::milli>(t1 - t_gather_launch_).count();
}

}  // namespace

GradientSharding predict_sharded_optimizer(const PlannedModel& m, bool shard_gradients, MemoryPrediction& p) {
  // The model's flat values or compute copies stay whole (as Replicate's); shard() keeps the f32
  // masters' chunks (half compute); target() binds the optimizer to this rank's chunks.
  const std::int64_t shard = m.plan.shard_numel;
  const bool half = m.in.compute != DType::f32;
  predict_replicate(m, p);
  if (half) p.lines[1] = {"master weights", shard * 4, "f32" + shard_of(m.plan)};
  p.lines[4] = {"optimizer state", m.in.optimizer_states * shard * 4,
                std::to_string(m.in.optimizer_states) + " x f32" + shard_of(m.plan)};
  p.gathers_values = half;
  return shard_gradients ? GradientSharding::shard_only : GradientSharding::scatter;
}

std::unique_ptr<ShardingStrategy> make_replicate(StrategyContext context);  // replicate.cc

std::unique_ptr<ShardingStrategy> make_strategy(const Sharding& sharding, StrategyContext context) {
  if (const auto* s = std::get_if<ShardOptimizer>(&sharding))
    return std::make_unique<ShardedOptimizer>(context, /*shard_gradients=*/false, s->gather_during_forward);
  if (const auto* s = std::get_if<ShardGradients>(&sharding))
    return std::make_unique<ShardedOptimizer>(context, /*shard_gradients=*/true, s->gather_during_forward);
  if (const auto* s = std::get_if<ShardParameters>(&sharding)) return make_sharded_parameters(*s, context);
  return make_replicate(context);
}

}  // namespace tutti::ddp
