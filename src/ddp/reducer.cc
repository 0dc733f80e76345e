#include "tutti/ddp/reducer.h"

#include <algorithm>

#include "tutti/core/error.h"
#include "tutti/core/trace.h"
#include "tutti/kernels/cast.h"
#include "tutti/kernels/elementwise.h"

namespace tutti::ddp {
namespace {

using Clock = std::chrono::steady_clock;

std::int64_t ns_of(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

bool is_half(DType d) { return d == DType::f16 || d == DType::bf16; }

const char* phase_name(Reducer::Phase p) {
  switch (p) {
    case Reducer::Phase::idle: return "idle";
    case Reducer::Phase::accumulating: return "accumulating";
    case Reducer::Phase::reducing: return "reducing";
    case Reducer::Phase::reduced: return "reduced";
    case Reducer::Phase::failed: return "failed";
  }
  return "?";
}

}  // namespace

Reducer::Reducer(Communicator& comm, nn::FlatPlan plan, DType grad_dtype, Device device, ReducerOptions options)
    : comm_(comm),
      plan_(std::make_shared<const nn::FlatPlan>(std::move(plan))),
      options_(options),
      grad_dtype_(grad_dtype),
      device_(device) {
  TUTTI_CHECK_ARG(is_floating(grad_dtype), "Reducer: gradient dtype must be f32, f16 or bf16, got ",
                  name_of(grad_dtype));
  if (!options_.grad_comm_dtype) options_.grad_comm_dtype = grad_dtype;
  TUTTI_CHECK_ARG(is_floating(*options_.grad_comm_dtype), "Reducer: grad_comm_dtype must be f32, f16 or bf16, got ",
                  name_of(*options_.grad_comm_dtype));
  TUTTI_CHECK_ARG(options_.sharding == GradientSharding::none || plan_->world_size() == comm.size(),
                  "Reducer: sharded gradients need a plan made for the communicator's ", comm.size(),
                  " rank(s), got one for ", plan_->world_size(), " (FlatPlanOptions::world_size)");
  device_.require_available();
  const DType wire = *options_.grad_comm_dtype;
  buckets_.resize(plan_->buckets.size());
  if (options_.sharding == GradientSharding::shard_only) {
    shard_ = Tensor::zeros({plan_->shard_numel}, grad_dtype_, device_);
  } else {
    buffer_ = Tensor::zeros({plan_->total}, grad_dtype_, device_);
    if (wire != grad_dtype_) {
      for (std::size_t b = 0; b < buckets_.size(); ++b) {
        buckets_[b].staging = Tensor::empty({plan_->buckets[b].numel()}, wire, device_);
      }
    }
  }
  found_ = Tensor::zeros({1}, DType::i32, device_);
  marked_.assign(plan_->entries.size(), false);
}

Reducer::Bytes Reducer::predicted_bytes(const nn::FlatPlan& plan, DType grad_dtype, DType wire_dtype,
                                        GradientSharding sharding, int pool) {
  const auto g = static_cast<std::int64_t>(size_of(grad_dtype)), w = static_cast<std::int64_t>(size_of(wire_dtype));
  const bool staged = wire_dtype != grad_dtype;
  Bytes out;
  if (sharding == GradientSharding::shard_only) {  // the shard; the pool's buffers (acquire_slot)
    std::int64_t largest = 0;
    for (const nn::PlanBucket& pb : plan.buckets) largest = std::max(largest, pb.numel());
    out.gradients = plan.shard_numel * g;
    out.communication = pool * largest * (g + (staged ? w : 0));
  } else {  // the flat buffer; a staging buffer per bucket
    out.gradients = plan.total * g;
    out.communication = staged ? plan.total * w : 0;
  }
  return out;
}

Reducer::~Reducer() {
  // Collectives still in flight read the buffers: let them finish before they are freed
  // (their Works keep the storage alive too). After a failure they may never finish.
  if (phase_ == Phase::failed) return;
  for (Bucket& b : buckets_) {
    try {
      if (b.launched) b.work.wait();
    } catch (...) {
    }
  }
}

void Reducer::require_usable(const char* what) const {
  TUTTI_CHECK(phase_ != Phase::failed, "Reducer::", what, ": the reducer failed earlier and cannot be used again (",
              failure_, ")");
}

template <typename F>
auto Reducer::guarded(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    phase_ = Phase::failed;
    failure_ = std::string(what) + ": " + e.what();
    throw;
  }
}

Tensor Reducer::grad(std::size_t i) {
  TUTTI_CHECK_ARG(i < size(), "Reducer::grad: index ", i, " out of range (", size(), " gradients)");
  const nn::PlanEntry& e = plan_->entries[i];
  if (options_.sharding != GradientSharding::shard_only) return buffer_.view(e.offset, e.shape);
  require_usable("grad");
  TUTTI_CHECK(phase_ == Phase::accumulating || phase_ == Phase::reducing, "Reducer::grad('", e.name,
              "'): with sharding shard_only a gradient is placed only within a backward pass (prepare first); the "
              "reducer is ",
              phase_name(phase_));
  Bucket& b = buckets_[static_cast<std::size_t>(e.bucket)];
  TUTTI_CHECK(!b.launched, "Reducer::grad: gradient '", e.name, "' is written after its bucket ", e.bucket,
              " was launched (mark a gradient ready after its last kernel, once per pass)");
  if (b.slot < 0) b.slot = guarded("placing a bucket", [&] { return acquire_slot(e.bucket); });
  const nn::PlanBucket& pb = plan_->buckets[static_cast<std::size_t>(e.bucket)];
  return slots_[static_cast<std::size_t>(b.slot)].grads.view(e.offset - pb.begin, e.shape);
}

Tensor Reducer::shard_grad(int bucket) const {
  TUTTI_CHECK_ARG(options_.sharding != GradientSharding::none, "Reducer::shard_grad: the gradients are not sharded");
  TUTTI_CHECK_ARG(bucket >= 0 && bucket < bucket_count(), "Reducer::shard_grad: bucket ", bucket, " of ",
                  bucket_count());
  const nn::PlanBucket& pb = plan_->buckets[static_cast<std::size_t>(bucket)];
  if (options_.sharding == GradientSharding::shard_only) return shard_.view(pb.shard_offset, {pb.chunk});
  return buffer_.view(pb.chunk_of(comm_.rank()).begin, {pb.chunk});
}

// ---- the pool (shard_only) -----------------------------------------------------------------

int Reducer::acquire_slot(int bucket) {
  int chosen = -1;
  for (std::size_t s = 0; s < slots_.size() && chosen < 0; ++s) {
    if (slots_[s].bucket < 0) chosen = static_cast<int>(s);
  }
  if (chosen < 0) {
    // The earliest launched bucket gives its buffer back once its chunk is in the shard.
    int oldest = -1;
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      const int b = slots_[s].bucket;
      if (buckets_[static_cast<std::size_t>(b)].launched &&
          (oldest < 0 || b < slots_[static_cast<std::size_t>(oldest)].bucket)) {
        oldest = static_cast<int>(s);
      }
    }
    if (oldest >= 0) {
      retire(slots_[static_cast<std::size_t>(oldest)].bucket);
      chosen = oldest;
    }
  }
  if (chosen < 0) {
    // Every buffer holds a bucket still being written: one more.
    std::int64_t largest = 0;
    for (const nn::PlanBucket& pb : plan_->buckets) largest = std::max(largest, pb.numel());
    Slot slot;
    slot.grads = Tensor::empty({largest}, grad_dtype_, device_);
    if (*options_.grad_comm_dtype != grad_dtype_)
      slot.staging = Tensor::empty({largest}, *options_.grad_comm_dtype, device_);
    slots_.push_back(std::move(slot));
    chosen = static_cast<int>(slots_.size()) - 1;
  }
  Slot& slot = slots_[static_cast<std::size_t>(chosen)];
  slot.bucket = bucket;
  slot.grads.view(0, {plan_->buckets[static_cast<std::size_t>(bucket)].numel()}).zero(stream_);
  return chosen;
}

int Reducer::pool_buffers(const nn::FlatPlan& plan, const std::vector<GradientEvent>& order) {
  const std::size_t nb = plan.buckets.size();
  std::vector<int> slots;  // the bucket each buffer holds, -1 free
  std::vector<int> slot_of(nb, -1);
  std::vector<bool> launched(nb, false);
  std::vector<std::int64_t> pending(nb, 0);
  for (std::size_t b = 0; b < nb; ++b) pending[b] = static_cast<std::int64_t>(plan.buckets[b].entries.size());
  std::size_t next = 0;  // buckets launch in order (launch_ready_buckets)
  for (const GradientEvent& e : order) {
    const auto b = static_cast<std::size_t>(plan.entries.at(e.param).bucket);
    if (e.ready) {
      --pending[b];
      while (next < nb && pending[next] == 0) launched[next++] = true;
      continue;
    }
    if (slot_of[b] >= 0) continue;
    int chosen = -1;  // as acquire_slot
    for (std::size_t s = 0; s < slots.size() && chosen < 0; ++s) {
      if (slots[s] < 0) chosen = static_cast<int>(s);
    }
    if (chosen < 0) {
      for (std::size_t s = 0; s < slots.size(); ++s) {
        if (launched[static_cast<std::size_t>(slots[s])] &&
            (chosen < 0 || slots[s] < slots[static_cast<std::size_t>(chosen)])) {
          chosen = static_cast<int>(s);
        }
      }
      if (chosen >= 0) slot_of[static_cast<std::size_t>(slots[static_cast<std::size_t>(chosen)])] = -1;
    }
    if (chosen < 0) {
      slots.push_back(-1);
      chosen = static_cast<int>(slots.size()) - 1;
    }
    slots[static_cast<std::size_t>(chosen)] = static_cast<int>(b);
    slot_of[b] = chosen;
  }
  return static_cast<int>(slots.size());
}

// Waits for bucket b's reduce-scatter, adds its chunk to the shard and frees its buffer.
void Reducer::retire(int b) {
  Bucket& bucket = buckets_[static_cast<std::size_t>(b)];
  const nn::PlanBucket& pb = plan_->buckets[static_cast<std::size_t>(b)];
  Slot& slot = slots_[static_cast<std::size_t>(bucket.slot)];
  bucket.work.wait(stream_);
  stats_.comm_run_ms += bucket.work.run_ms().value_or(0.0);
  Tensor chunk = slot.grads.view(comm_.rank() * pb.chunk, {pb.chunk});
  if (slot.staging.defined()) kernels::cast(slot.staging.view(comm_.rank() * pb.chunk, {pb.chunk}), chunk, stream_);
  Tensor mine = shard_.view(pb.shard_offset, {pb.chunk});
  kernels::add(mine, chunk, mine, stream_);
  slot.bucket = -1;
  bucket.slot = -1;
  bucket.work = Work();
}

// ---- passes --------------------------------------------------------------------------------

void Reducer::prepare(bool sync, const Stream& stream) {
  require_usable("prepare");
  TUTTI_CHECK(phase_ != Phase::reducing,
              "Reducer::prepare: the previous synchronized pass was never finished: call "
              "finish() after the last mark_ready() of a pass prepared with sync = true");
  TUTTI_CHECK(phase_ != Phase::reduced,
              "Reducer::prepare: the last step's reduced gradients are still in the buffer "
              "and would be added to: call zero() after the optimizer has used them");
  if (phase_ == Phase::accumulating) guarded("closing an accumulating pass", [&] { close_accumulating_pass(); });
  begin_pass(sync, stream);
}

void Reducer::begin_pass(bool sync, const Stream& stream) {
  phase_ = sync ? Phase::reducing : Phase::accumulating;
  stream_ = stream;
  next_to_launch_ = 0;
  if (!step_started_) {
    launched_any_ = false;
    stats_ = StepStats();
    t_prepare_ = Clock::now();
  }
  std::fill(marked_.begin(), marked_.end(), false);
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    bucket.launched = false;
    bucket.work = Work();
    bucket.pending = 0;
    for (std::size_t i : plan_->buckets[b].entries) {
      if (plan_->entries[i].requires_grad) ++bucket.pending;
    }
  }
  // A bucket of frozen weights only is ready from the start.
  if (communicates() && options_.overlap) guarded("launching a bucket", [&] { launch_ready_buckets(); });
}

void Reducer::close_accumulating_pass() {
  if (options_.sharding != GradientSharding::shard_only) return;  // nothing was sent
  launch_rest();
  for (int b = 0; b < bucket_count(); ++b) {
    if (buckets_[static_cast<std::size_t>(b)].slot >= 0) retire(b);
  }
  phase_ = Phase::idle;
}

void Reducer::mark_ready(std::size_t i) {
  TUTTI_CHECK_ARG(i < size(), "Reducer::mark_ready: index ", i, " out of range (", size(), " gradients)");
  require_usable("mark_ready");
  const nn::PlanEntry& e = plan_->entries[i];
  TUTTI_CHECK(phase_ == Phase::accumulating || phase_ == Phase::reducing, "Reducer::mark_ready('", e.name,
              "') outside a backward pass (call prepare first; the reducer is ", phase_name(phase_), ")");
  TUTTI_CHECK(!marked_[i], "Reducer::mark_ready: gradient '", e.name,
              "' was marked ready twice in one backward pass (a parameter used twice must be marked once, "
              "after its last gradient kernel)");
  marked_[i] = true;
  if (!communicates() || !e.requires_grad) return;
  --buckets_[static_cast<std::size_t>(e.bucket)].pending;
  if (options_.overlap) guarded("launching a bucket", [&] { launch_ready_buckets(); });
}

void Reducer::launch_ready_buckets() {
  // In bucket order only: the same order on every rank, whatever order gradients arrive in.
  while (next_to_launch_ < bucket_count() && buckets_[static_cast<std::size_t>(next_to_launch_)].pending == 0) {
    launch(next_to_launch_);
    ++next_to_launch_;
  }
}

void Reducer::launch_rest() {
  for (int b = next_to_launch_; b < bucket_count(); ++b) {
    if (buckets_[static_cast<std::size_t>(b)].pending > 0 && !options_.allow_unused) throw_unready();
  }
  for (; next_to_launch_ < bucket_count(); ++next_to_launch_) launch(next_to_launch_);
}

Tensor Reducer::wire_of(int b) {
  const nn::PlanBucket& pb = plan_->buckets[static_cast<std::size_t>(b)];
  Bucket& bucket = buckets_[static_cast<std::size_t>(b)];
  if (options_.sharding == GradientSharding::shard_only) {
    const Slot& slot = slots_[static_cast<std::size_t>(bucket.slot)];
    return (slot.staging.defined() ? slot.staging : slot.grads).view(0, {pb.numel()});
  }
  return bucket.staging.defined() ? bucket.staging : buffer_.view(pb.begin, {pb.numel()});
}

void Reducer::launch(int b) {
  Bucket& bucket = buckets_[static_cast<std::size_t>(b)];
  const nn::PlanBucket& pb = plan_->buckets[static_cast<std::size_t>(b)];
  if (options_.sharding == GradientSharding::shard_only && bucket.slot < 0) bucket.slot = acquire_slot(b);
  const Tensor grads = options_.sharding == GradientSharding::shard_only
                           ? slots_[static_cast<std::size_t>(bucket.slot)].grads.view(0, {pb.numel()})
                           : buffer_.view(pb.begin, {pb.numel()});
  Tensor wire = wire_of(b);
  if (wire.dtype() != grads.dtype()) kernels::cast(grads, wire, stream_);
  // A half sum of N gradients can overflow where their average would not: divide first.
  if (options_.average && is_half(wire.dtype()) && comm_.size() > 1) {
    kernels::scale(wire, 1.0f / static_cast<float>(comm_.size()), wire, stream_);
  }
  if (!launched_any_) {
    t_first_launch_ = Clock::now();
    launched_any_ = true;
  }
  if (compressing()) {
    stats_.bytes_reduced += hook_->launch(b, stream_);
    bucket.launched = true;
    step_started_ = true;
    return;
  }
  CallOptions call;
  call.label = "ddp bucket " + std::to_string(b);
  call.stream = stream_;
  if (options_.sharding == GradientSharding::none) {
    bucket.work = comm_.allreduce(wire, ReduceOp::sum, call);
  } else {
    bucket.work = comm_.reduce_scatter(wire, wire.view(comm_.rank() * pb.chunk, {pb.chunk}), ReduceOp::sum, call);
  }
  bucket.launched = true;
  step_started_ = true;
  stats_.bytes_reduced += static_cast<std::int64_t>(wire.nbytes());
}

void Reducer::throw_unready() const {
  std::string names;
  int count = 0;
  for (std::size_t i = 0; i < size(); ++i) {
    if (!plan_->entries[i].requires_grad || marked_[i]) continue;
    if (count < 8) names += (count ? ", '" : "'") + plan_->entries[i].name + "'";
    ++count;
  }
  if (count > 8) names += ", ...";
  TUTTI_THROW(Error, "Reducer: ", count, " gradient(s) were not marked ready in this backward pass: ", names,
              ". Their buckets cannot be reduced. If some parameters are unused on purpose, set "
              "ReducerOptions::allow_unused (their gradient then counts as zero)");
}

const Tensor& Reducer::finish(double divisor) {
  require_usable("finish");
  TUTTI_CHECK(phase_ == Phase::reducing,
              "Reducer::finish: no synchronized backward pass to finish (prepare(true) "
              "first; the reducer is ",
              phase_name(phase_), ")");
  TUTTI_CHECK_ARG(divisor > 0, "Reducer::finish: divisor must be positive, got ", divisor);
  ErrorContext context("finishing the gradient reduction of " + std::to_string(bucket_count()) + " bucket(s)");
  return guarded("finishing a reduction", [&]() -> const Tensor& {
    const Clock::time_point t_finish = Clock::now();
    launch_rest();  // what backward did not launch: everything when overlap is off, unused gradients otherwise
    const int rank = comm_.rank();
    if (options_.sharding == GradientSharding::shard_only) {
      for (int b = 0; b < bucket_count(); ++b) {
        if (buckets_[static_cast<std::size_t>(b)].slot >= 0) retire(b);
      }
    } else {
      for (Bucket& b : buckets_) {
        b.work.wait(stream_);
        stats_.comm_run_ms += b.work.run_ms().value_or(0.0);
      }
      if (compressing()) stats_.bytes_reduced += hook_->finish(stream_, &stats_.comm_run_ms);
    }
    const Clock::time_point t_done = Clock::now();
    if (trace::on()) {
      trace::record(
          "wait for gradients", "wait", trace::Lane::host, ns_of(t_finish), ns_of(t_done),
          "\"buckets\":" + std::to_string(bucket_count()) + ",\"bytes\":" + std::to_string(stats_.bytes_reduced));
    }

    // One fused pass per bucket (or per chunk): divide and check. Scaling by 1/(N · divisor)
    // after the sum (or 1/divisor after a half reduction that already divided by N).
    const bool prescaled = options_.average && is_half(*options_.grad_comm_dtype) && comm_.size() > 1;
    double factor = 1.0 / divisor;
    if (options_.average && !prescaled) factor /= comm_.size();
    found_.zero(stream_);
    if (options_.sharding == GradientSharding::shard_only) {
      kernels::unscale_and_check(shard_, static_cast<float>(factor), found_, stream_);
    } else {
      for (int b = 0; b < bucket_count(); ++b) {
        const nn::PlanBucket& pb = plan_->buckets[static_cast<std::size_t>(b)];
        const Bucket& bucket = buckets_[static_cast<std::size_t>(b)];
        const bool scattered = options_.sharding == GradientSharding::scatter;
        const std::int64_t begin = scattered ? pb.chunk_of(rank).begin : pb.begin;
        const std::int64_t n = scattered ? pb.chunk : pb.numel();
        Tensor view = buffer_.view(begin, {n});
        if (bucket.staging.defined()) kernels::cast(bucket.staging.view(begin - pb.begin, {n}), view, stream_);
        kernels::unscale_and_check(view, static_cast<float>(factor), found_, stream_);
      }
    }
    if (options_.sharding != GradientSharding::none && comm_.size() > 1) {
      // Each rank checked its own chunks: agree, so that every rank skips alike.
      CallOptions call;
      call.label = "ddp found-nonfinite flag";
      call.stream = stream_;
      comm_.allreduce(found_, ReduceOp::max, call).wait(stream_);
    }
    phase_ = Phase::reduced;
    step_started_ = false;
    if (hook_) hook_->end_step();

    const Clock::time_point t_end = Clock::now();
    stats_.buckets = bucket_count();
    stats_.backward_ms = ms_between(t_prepare_, t_finish);
    stats_.exposed_comm_ms = ms_between(t_finish, t_done);
    stats_.comm_ms = launched_any_ ? ms_between(t_first_launch_, t_done) : 0.0;
    stats_.finish_ms = ms_between(t_finish, t_end);
    stats_.compute_before_comm_ms = ms_between(t_prepare_, launched_any_ ? t_first_launch_ : t_finish);
    const int n = comm_.size();
    const double busy_ms = stats_.comm_run_ms > 0 ? stats_.comm_run_ms : stats_.comm_ms;
    const double f = options_.sharding == GradientSharding::none ? 2.0 * (n - 1) / n : 1.0 * (n - 1) / n;
    if (busy_ms > 0 && n > 1) stats_.busbw_gbs = static_cast<double>(stats_.bytes_reduced) * f / (busy_ms * 1e-3) / 1e9;
    return found_;
  });
}

std::int64_t Reducer::gradient_bytes() const {
  const Tensor& t = buffer_.defined() ? buffer_ : shard_;
  return static_cast<std::int64_t>(t.storage()->nbytes());
}

std::int64_t Reducer::communication_bytes() const {
  std::int64_t bytes = 0;
  for (const Bucket& b : buckets_) bytes += b.staging.defined() ? static_cast<std::int64_t>(b.staging.nbytes()) : 0;
  for (const Slot& s : slots_) {
    bytes += static_cast<std::int64_t>(s.grads.nbytes());
    if (s.staging.defined()) bytes += static_cast<std::int64_t>(s.staging.nbytes());
  }
  return bytes + (hook_ ? hook_->bytes() : 0);
}

void Reducer::register_comm_hook(std::shared_ptr<CommHook> hook) {
  require_usable("register_comm_hook");
  TUTTI_CHECK_ARG(hook != nullptr, "Reducer::register_comm_hook: the hook is null");
  TUTTI_CHECK_ARG(hook_ == nullptr, "Reducer::register_comm_hook: a hook ('", hook_->name(),
                  "') is registered already; a reducer takes one");
  TUTTI_CHECK(phase_ == Phase::idle && !step_started_,
              "Reducer::register_comm_hook: only between steps (the reducer is ", phase_name(phase_), ")");
  ErrorContext context("registering the communication hook '" + hook->name() + "'");
  hook->bind(CommHookContext{comm_, plan_, buffer_, *options_.grad_comm_dtype, options_});
  hook_ = std::move(hook);
}

bool Reducer::compressing() const { return hook_ && hook_->active(); }

void Reducer::zero() {
  require_usable("zero");
  TUTTI_CHECK(phase_ != Phase::reducing,
              "Reducer::zero: a synchronized pass is in progress (finish() it first: its "
              "collectives are in flight on every rank)");
  if (phase_ == Phase::accumulating) guarded("closing an accumulating pass", [&] { close_accumulating_pass(); });
  (options_.sharding == GradientSharding::shard_only ? shard_ : buffer_).zero(stream_);
  phase_ = Phase::idle;
  step_started_ = false;
}

}  // namespace tutti::ddp
