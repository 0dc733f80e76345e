#include "tutti/ddp/ddp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <unordered_map>

#include "ddp/exact_sum.h"
#include "ddp/zero3.h"
#include "tutti/core/error.h"
#include "tutti/core/trace.h"
#include "tutti/kernels/reduce.h"

namespace tutti::ddp {
namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(Communicator& comm, nn::Module& model, DdpOptions options)
    : comm_(comm), model_(model), options_(options) {
  TUTTI_CHECK_ARG(options_.accumulation_steps >= 1, "DistributedDataParallel: accumulation_steps must be >= 1, got ",
                  options_.accumulation_steps);
  TUTTI_CHECK_ARG(options_.zero_stage >= 0 && options_.zero_stage <= 3,
                  "DistributedDataParallel: zero_stage must be 0, 1, 2 or 3, got ", options_.zero_stage);
  TUTTI_CHECK_ARG(options_.reducer.sharding == GradientSharding::none,
                  "DistributedDataParallel: set zero_stage, not "
                  "reducer.sharding (zero_stage decides how gradients are sharded)");
  TUTTI_CHECK_ARG(!options_.deterministic || options_.zero_stage < 2,
                  "DistributedDataParallel: deterministic needs zero_stage 0 or 1, got ", options_.zero_stage,
                  " (ZeRO-2 and 3 keep no full gradient buffer to sum the slices into)");
  ErrorContext context("setting up DistributedDataParallel on rank " + std::to_string(comm.rank()) + " of " +
                       std::to_string(comm.size()));
  if (options_.verify_model) verify_same_model();

  // Deferred parameters (nn::DeferredParameters): ZeRO-3 fills its shards one gather group at a
  // time (below); the other stages keep the whole model anyway.
  if (options_.zero_stage < 3) model_.materialize();
  const bool deferred = model_.has_deferred_parameters();
  params_ = model_.parameters();
  for (std::size_t i = 0; i < params_.size(); ++i) index_.emplace(params_[i], i);
  const int zero = options_.zero_stage;
  nn::FlatPlanOptions po;
  po.bucket_cap_mb = options_.bucket_cap_mb;
  po.first_bucket_cap_mb = options_.first_bucket_cap_mb;
  po.grad_element_bytes = size_of(model_.grad_dtype());
  po.world_size = zero > 0 ? comm_.size() : 1;
  std::vector<std::string> groups;  // ZeRO-3: each parameter's gather group, one bucket per run
  if (zero == 3) {
    po.segments = gather_segments(params_, options_.gather_group, groups);
    po.bucket_cap_mb = po.first_bucket_cap_mb = 1e12;
  }
  ReducerOptions& ro = options_.reducer;
  if (!ro.grad_comm_dtype) ro.grad_comm_dtype = model_.grad_comm_dtype();
  ro.sharding = zero == 0   ? GradientSharding::none
                : zero == 1 ? GradientSharding::scatter
                            : GradientSharding::shard_only;  // 2 and 3
  // THE plan: the reducer's buckets and shards, the model's values and gradients, the optimizer's state.
  reducer_ =
      std::make_unique<Reducer>(comm_, nn::make_flat_plan(params_, po), model_.grad_dtype(), model_.device(), ro);
  const nn::FlatPlan& plan = reducer_->plan();
  model_.drop_grads();
  if (!deferred) model_.storage().flatten(plan);
  if (zero < 2) {
    // Every gradient is written straight into its bucket.
    model_.storage().set_grad_buffer(reducer_->buffer(), plan);
  }
  // Before the hooks: a refusal here must not leave the model calling into a DDP never made.
  if (options_.broadcast_parameters) broadcast_parameters(!deferred);
  if (zero == 3 || (zero > 0 && model_.storage().compute_copies().defined())) {
    // Half compute: the model reads its compute copies; the fp32 masters are this rank's shard.
    master_shard_ = Tensor::empty({plan.shard_numel}, DType::f32, model_.device());
    std::vector<Tensor> resident;  // deferred: the resident buckets' values
    if (deferred) {
      resident = shard_deferred_parameters(comm_, model_, plan, groups, options_.broadcast_parameters, master_shard_);
    } else {
      for (const nn::PlanBucket& b : plan.buckets) {
        master_shard_.view(b.shard_offset, {b.chunk})
            .copy_from(model_.storage().values().view(b.chunk_of(comm_.rank()).begin, {b.chunk}), model_.stream());
      }
    }
    if (zero == 3) {
      const auto bucket_values = [&](int b) {
        const nn::PlanBucket& pb = plan.buckets[static_cast<std::size_t>(b)];
        return deferred ? resident[static_cast<std::size_t>(b)]
                        : model_.storage().values().view(pb.begin, {pb.numel()});
      };
      zero3_ = std::make_unique<Zero3Parameters>(comm_, model_, plan, groups, options_.gather_buffer_mb, master_shard_,
                                                 bucket_values);
    } else {
      model_.storage().release_masters();
    }
  }
  if (options_.deterministic) {
    exact_ = std::make_unique<ExactGradientSum>(comm_, plan.total, model_.device(),
                                                options_.deterministic->fixed_point_fraction_bits,
                                                comm_.size() * options_.accumulation_steps);
  }
  gathers_.resize(plan.buckets.size());
  gather_pending_.assign(plan.buckets.size(), false);

  auto index_of = [this](const nn::Parameter& p) {
    const auto it = index_.find(&p);
    TUTTI_CHECK(it != index_.end(), "DistributedDataParallel: unknown parameter '", p.name,
                "' (was a layer added after DistributedDataParallel was made?)");
    return it->second;
  };
  model_.storage().set_grad_ready_hook([this, index_of](nn::Parameter& p) { reducer_->mark_ready(index_of(p)); });
  if (zero >= 2) {
    model_.storage().set_grad_placement_hook(
        [this, index_of](nn::Parameter& p) { return reducer_->grad(index_of(p)); });
  }
  if (zero == 3) {
    model_.storage().set_param_use_hook(
        [this, index_of](nn::Parameter& p) { zero3_->use(reducer_->plan().entries[index_of(p)].bucket); });
  } else if (zero > 0) {
    model_.storage().set_param_use_hook([this, index_of](nn::Parameter& p) {
      const int b = reducer_->plan().entries[index_of(p)].bucket;
      if (gather_pending_[static_cast<std::size_t>(b)]) wait_gather(b);
    });
  }
  model_.set_batch_slice(comm_.rank(), comm_.size());
}

DistributedDataParallel::~DistributedDataParallel() {
  try {
    synchronize_parameters();
  } catch (...) {
  }
  model_.storage().set_grad_ready_hook({});
  model_.storage().set_grad_placement_hook({});
  model_.storage().set_param_use_hook({});
  model_.set_batch_slice(0, 1);
  if (options_.zero_stage >= 2) {
    for (nn::Parameter* p : params_) p->grad = Tensor();
  }
}

void DistributedDataParallel::attach(optim::Optimizer& optimizer) {
  const nn::FlatPlan& plan = reducer_->plan();
  optim::FlatTarget target;
  target.plan = reducer_->shared_plan();
  target.params = params_;
  if (options_.zero_stage == 0) {
    optim::FlatSpan all;
    all.begin = 0;
    all.end = plan.total;
    all.value = model_.storage().values().view(0, {plan.total});
    all.grad = reducer_->buffer().view(0, {plan.total});
    if (model_.storage().compute_copies().defined())
      all.compute = model_.storage().compute_copies().view(0, {plan.total});
    target.spans.push_back(std::move(all));
  } else {
    const int rank = comm_.rank();
    for (int b = 0; b < static_cast<int>(plan.buckets.size()); ++b) {
      const nn::PlanBucket& pb = plan.buckets[static_cast<std::size_t>(b)];
      if (pb.chunk == 0) continue;
      const nn::ElementRange mine = pb.chunk_of(rank);
      optim::FlatSpan span;
      span.begin = mine.begin;
      span.end = mine.end;
      if (zero3_) {
        span.value = master_shard_.view(pb.shard_offset, {pb.chunk});
        if (zero3_->half()) span.compute = zero3_->compute_shard().view(pb.shard_offset, {pb.chunk});
      } else if (half_masters()) {
        span.value = master_shard_.view(pb.shard_offset, {pb.chunk});
        span.compute = model_.storage().compute_copies().view(mine.begin, {pb.chunk});
      } else {
        span.value = model_.storage().values().view(mine.begin, {pb.chunk});
      }
      span.grad = reducer_->shard_grad(b);
      target.spans.push_back(std::move(span));
    }
    std::weak_ptr<int> alive = alive_;
    target.after_step = [this, alive] {
      TUTTI_CHECK(!alive.expired(),
                  "Optimizer::step: the DistributedDataParallel this optimizer was attached to is "
                  "gone (its step would update one shard and gather nothing)");
      launch_gathers();
    };
  }
  optimizer.set_stream(model_.stream());
  optimizer.bind(std::move(target));
  attached_ = &optimizer;
}

// ---- ZeRO: gathering the updated parameters ------------------------------------------------

void DistributedDataParallel::launch_gathers() {
  if (zero3_) return zero3_->after_step();  // even on one rank: the gathers fill the whole buffers
  if (comm_.size() == 1) return;            // the step wrote every element already
  const nn::FlatPlan& plan = reducer_->plan();
  const Tensor& values = half_masters() ? model_.storage().compute_copies() : model_.storage().values();
  CallOptions call;
  call.stream = model_.stream();
  t_gather_launch_ = std::chrono::steady_clock::now();
  gather_ms_ = exposed_gather_ms_ = 0;
  // Last bucket first: it holds the first layers, which the next forward needs first.
  for (int b = static_cast<int>(plan.buckets.size()) - 1; b >= 0; --b) {
    const nn::PlanBucket& pb = plan.buckets[static_cast<std::size_t>(b)];
    if (pb.numel() == 0) continue;
    Tensor whole = values.view(pb.begin, {pb.numel()});
    call.label = "zero gather " + std::to_string(b);
    gathers_[static_cast<std::size_t>(b)] =
        comm_.allgather(whole.view(comm_.rank() * pb.chunk, {pb.chunk}), whole, call);
    gather_pending_[static_cast<std::size_t>(b)] = true;
    ++gathers_pending_;
  }
  if (!options_.gather_during_forward) synchronize_parameters();
}

void DistributedDataParallel::wait_gather(int bucket) {
  const auto b = static_cast<std::size_t>(bucket);
  if (!gather_pending_[b]) return;
  const auto t0 = std::chrono::steady_clock::now();
  gathers_[b].wait(model_.stream());
  const auto t1 = std::chrono::steady_clock::now();
  if (trace::on()) {
    using std::chrono::nanoseconds;
    trace::record("wait for parameters (bucket " + std::to_string(bucket) + ")", "wait", trace::Lane::host,
                  std::chrono::duration_cast<nanoseconds>(t0.time_since_epoch()).count(),
                  std::chrono::duration_cast<nanoseconds>(t1.time_since_epoch()).count());
  }
  gathers_[b] = Work();
  gather_pending_[b] = false;
  exposed_gather_ms_ += std::chrono::duration<double, std::milli>(t1 - t0).count();
  if (--gathers_pending_ == 0) gather_ms_ = std::chrono::duration<double, std::milli>(t1 - t_gather_launch_).count();
}

void DistributedDataParallel::synchronize_parameters() {
  if (zero3_) zero3_->synchronize();
  for (int b = 0; b < static_cast<int>(gathers_.size()); ++b) wait_gather(b);
}

// A whole [plan.total] f32 buffer on the device from every rank's shard (chunks in bucket order).
Tensor DistributedDataParallel::gather_full(const Tensor& shard) {
  const nn::FlatPlan& plan = reducer_->plan();
  Tensor full = Tensor::zeros({plan.total}, DType::f32, model_.device());
  CallOptions call;
  call.stream = model_.stream();
  call.label = "zero checkpoint gather";
  // The host waits for each gather (not the stream): a GPU backend's Work lets go of `full` once
  // it has seen the collective complete, which a stream wait leaves to its watchdog's next poll;
  // the state dicts gather one vector after another and must hold one at a time.
  for (const nn::PlanBucket& pb : plan.buckets) {
    if (pb.numel() == 0) continue;
    comm_.allgather(shard.view(pb.shard_offset, {pb.chunk}), full.view(pb.begin, {pb.numel()}), call).wait();
  }
  return full;
}

void DistributedDataParallel::verify_same_model() {
  const Device device = model_.device();
  const std::string signature = model_.signature();
  const auto hash = static_cast<std::int64_t>(model_.structure_hash());
  const int n = comm_.size();
  Tensor mine = Tensor::from_ints({hash}, {1}, DType::i64).to(device);
  Tensor all = Tensor::empty({n}, DType::i64, device);
  CallOptions call;
  call.label = "ddp model check";
  comm_.allgather(mine, all, call).wait();
  const std::vector<std::int64_t> hashes = all.to_ints();
  std::string differing;
  for (int r = 1; r < n; ++r) {
    if (hashes[static_cast<std::size_t>(r)] != hashes[0])
      differing += (differing.empty() ? "" : ", ") + std::to_string(r);
  }
  if (differing.empty()) return;

  // Rank 0's signature to every rank, so each can name its first difference.
  Tensor length = Tensor::from_ints({static_cast<std::int64_t>(signature.size())}, {1}, DType::i64).to(device);
  comm_.broadcast(length, 0, call).wait();
  const std::int64_t len = length.to_ints()[0];
  std::vector<std::int64_t> chars(static_cast<std::size_t>(len), 0);
  if (comm_.rank() == 0) {
    for (std::size_t i = 0; i < signature.size(); ++i) chars[i] = static_cast<unsigned char>(signature[i]);
  }
  Tensor text = Tensor::from_ints(chars, {len}, DType::i32).to(device);
  comm_.broadcast(text, 0, call).wait();
  std::string reference;
  for (std::int64_t c : text.to_ints()) reference.push_back(static_cast<char>(c));

  std::string detail = "this rank matches rank 0; the differing ranks name their first difference";
  if (hashes[static_cast<std::size_t>(comm_.rank())] != hashes[0]) {
    const std::vector<std::string> a = split_lines(reference), b = split_lines(signature);
    std::size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    const std::string theirs = i < a.size() ? "'" + a[i] + "'" : "no parameter";
    const std::string ours = i < b.size() ? "'" + b[i] + "'" : "no parameter";
    detail = "first difference at parameter #" + std::to_string(i) + ": rank 0 has " + theirs + ", rank " +
             std::to_string(comm_.rank()) + " has " + ours;
  }
  TUTTI_THROW(InvalidArgument, "DistributedDataParallel: the model differs across ranks (rank(s) ", differing,
              " differ from rank 0); ", detail);
}

void DistributedDataParallel::broadcast_parameters(bool values) {
  // One small broadcast first: whether rank 0 has initialized every parameter (the index of
  // the first it has not, or -1), so that every rank refuses alike instead of training rank
  // 0's uninitialized memory; then the layers' state (Dropout's seeds and positions), which
  // the start-up check made the same list on every rank.
  const std::vector<nn::Parameter*> params = model_.parameters();
  std::int64_t uninitialized = -1;
  for (std::size_t i = 0; i < params.size() && uninitialized < 0; ++i) {
    if (!params[i]->initialized) uninitialized = static_cast<std::int64_t>(i);
  }
  StateDict extra = model_.extra_state();
  std::vector<std::int64_t> head = {uninitialized};
  for (const auto& [name, t] : extra) {
    TUTTI_CHECK(t.dtype() == DType::i64, "DistributedDataParallel: the model's state '", name, "' is ",
                name_of(t.dtype()), ", extra state must be i64");
    for (std::int64_t v : t.to_ints()) head.push_back(v);
  }
  Tensor packed = Tensor::from_ints(head, {static_cast<std::int64_t>(head.size())}, DType::i64).to(model_.device());
  CallOptions state_call;
  state_call.label = "ddp initialization and layer state broadcast";
  comm_.broadcast(packed, 0, state_call).wait();
  head = packed.to_ints();
  if (head[0] >= 0 && static_cast<std::size_t>(head[0]) < params.size()) {
    const std::string& name = params[static_cast<std::size_t>(head[0])]->name;
    TUTTI_THROW(InvalidArgument, "DistributedDataParallel: parameter '", name, "' was never initialized on rank 0, ",
                "whose values every rank receives: call init(seed) or load_state_dict() on the model before making ",
                "DistributedDataParallel (on rank 0 at least)");
  }
  auto next = head.begin() + 1;
  for (auto& [name, t] : extra) {
    const std::vector<std::int64_t> values(next, next + t.numel());
    next += t.numel();
    t = Tensor::from_ints(values, t.shape(), DType::i64);
  }
  model_.load_extra_state(extra);

  if (!values) return;  // deferred parameters: ZeRO-3 broadcasts them group by group
  CallOptions call;
  call.label = "ddp parameter broadcast";
  call.stream = model_.stream();
  comm_.broadcast(model_.storage().values(), 0, call).wait(model_.stream());
  for (nn::Parameter* p : params) p->initialized = true;
  model_.refresh_compute_copies();
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  if (!step_clock_running_) {
    t_step_start_ = std::chrono::steady_clock::now();
    step_clock_running_ = true;
  }
  return model_.forward(x);
}

bool DistributedDataParallel::backward(const Tensor& dy, double loss_scale) {
  TUTTI_CHECK_ARG(loss_scale > 0, "DistributedDataParallel::backward: loss_scale must be positive, got ", loss_scale);
  TUTTI_CHECK_ARG(
      model_.awaiting_backward(),
      "DistributedDataParallel::backward: no forward since the last "
      "backward. Each backward needs its own forward: a second backward of one forward would add the "
      "same gradients again and ",
      next_backward_syncs() ? "reduce them across ranks a second time" : "count them twice in the accumulation",
      " (nothing was communicated)");
  const bool sync = next_backward_syncs();
  TUTTI_CHECK_ARG(options_.zero_stage == 0 || attached_ != nullptr || !sync, "DistributedDataParallel: zero_stage ",
                  options_.zero_stage,
                  " needs the optimizer attached before the first step (ddp.attach(optimizer)): "
                  "each rank updates only its shard of the parameters, and only an attached optimizer knows which");
  // The all-gathers of the last step read the buffers this step's update will write.
  synchronize_parameters();
  if (exact_) return exact_backward(dy, loss_scale);
  reducer_->prepare(sync, model_.stream());
  model_.backward(dy);
  if (!sync) {
    ++micro_step_;
    return false;
  }
  micro_step_ = 0;
  reducer_->finish(static_cast<double>(options_.accumulation_steps) * loss_scale);
  if (zero3_) zero3_->synchronize();  // no gather may read the compute shard the optimizer writes
  if (options_.zero_stage >= 2) {
    for (nn::Parameter* p : params_) p->grad = Tensor();  // views into pool buffers other buckets reuse
  }
  StepStats& stats = reducer_->mutable_stats();
  if (step_clock_running_) {
    const auto t_first = reducer_->first_launch().value_or(std::chrono::steady_clock::now());
    stats.compute_before_comm_ms =
        std::max(0.0, std::chrono::duration<double, std::milli>(t_first - t_step_start_).count());
    step_clock_running_ = false;
  }
  stats.gather_ms = gather_ms_;
  stats.exposed_gather_ms = exposed_gather_ms_;
  if (zero3_) stats.exposed_gather_ms = zero3_->take_exposed_ms();
  return true;
}

bool DistributedDataParallel::found_nonfinite() {
  std::optional<trace::Span> span;
  if (trace::on()) span.emplace("loss-scaler check (host sync)", "scaler");
  model_.stream().synchronize();  // the flag is written on the model's stream
  return found_nonfinite_flag().to_ints()[0] != 0;
}

void DistributedDataParallel::zero_grad() {
  reducer_->zero();
  if (exact_) exact_->zero(model_.stream());
  exact_reduced_ = false;
  micro_step_ = 0;
  if (options_.zero_stage >= 2) {
    for (nn::Parameter* p : params_) p->grad = Tensor();
  }
}

optim::GradNorm DistributedDataParallel::grad_norm(double max_norm) {
  TUTTI_CHECK_ARG(max_norm > 0, "DistributedDataParallel::grad_norm: max_norm must be positive, got ", max_norm);
  TUTTI_CHECK(exact_ ? exact_reduced_ : reducer_->phase() == Reducer::Phase::reduced,
              "DistributedDataParallel::grad_norm: call it after a "
              "backward that completed a step (the gradients are not reduced yet)");
  const Stream& stream = model_.stream();
  Tensor sq = Tensor::zeros({1}, DType::f32, model_.device());
  if (options_.zero_stage == 0 || exact_) {
    // Deterministic mode: every rank holds every summed gradient (ZeRO-1 too), and sums them
    // in the same order whatever the world size.
    kernels::sum_squares(reducer_->buffer(), sq, /*accumulate=*/false, stream);
  } else {
    // The norm is a sum over the shards: each rank its own chunks, then one small allreduce.
    for (int b = 0; b < reducer_->bucket_count(); ++b) {
      const Tensor g = reducer_->shard_grad(b);
      if (g.numel() > 0) kernels::sum_squares(g, sq, /*accumulate=*/true, stream);
    }
    CallOptions call;
    call.label = "ddp gradient norm";
    call.stream = stream;
    comm_.allreduce(sq, ReduceOp::sum, call).wait(stream);
  }
  stream.synchronize();
  optim::GradNorm out;
  out.norm = std::sqrt(static_cast<double>(sq.to_floats()[0]));
  out.finite = std::isfinite(out.norm);
  out.coefficient = optim::clip_coefficient(out.norm, max_norm);
  return out;
}

DdpMemory DistributedDataParallel::memory() const {
  auto bytes = [](const Tensor& t) { return t.defined() ? static_cast<std::int64_t>(t.storage()->nbytes()) : 0; };
  DdpMemory m;
  if (zero3_) {
    m.parameters = zero3_->half() ? zero3_->compute_shard_bytes() : bytes(master_shard_);
    m.master_weights = zero3_->half() ? bytes(master_shard_) : 0;
    m.gathered = zero3_->gathered_bytes();
  } else if (model_.storage().compute_copies().defined()) {
    m.parameters = bytes(model_.storage().compute_copies());
    m.master_weights = half_masters() ? bytes(master_shard_) : bytes(model_.storage().values());
  } else {
    m.parameters = bytes(model_.storage().values());  // f32 compute: the parameters are the masters
  }
  m.gradients = reducer_->gradient_bytes();
  m.optimizer_state = attached_ != nullptr ? attached_->state_bytes() : 0;
  m.communication = reducer_->communication_bytes() + (exact_ ? exact_->bytes() : 0);
  return m;
}

void DistributedDataParallel::register_comm_hook(std::shared_ptr<CommHook> hook) {
  TUTTI_CHECK_ARG(hook != nullptr, "DistributedDataParallel::register_comm_hook: the hook is null");
  TUTTI_CHECK_ARG(options_.zero_stage == 0, "DistributedDataParallel::register_comm_hook: the hook '", hook->name(),
                  "' needs zero_stage 0, got ", options_.zero_stage,
                  " (a hook replaces the allreduce of whole gradients; ZeRO reduce-scatters)");
  TUTTI_CHECK_ARG(!options_.deterministic, "DistributedDataParallel::register_comm_hook: the hook '", hook->name(),
                  "' and deterministic cannot be combined (the deterministic sum is exact and never reaches the "
                  "reducer's allreduce)");
  reducer_->register_comm_hook(std::move(hook));
}

}  // namespace tutti::ddp
