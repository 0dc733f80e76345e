#include "tutti/ddp/ddp.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <unordered_map>

#include "ddp/exact_sum.h"
#include "ddp/strategy.h"
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
    : comm_(comm), model_(model), options_(std::move(options)) {
  TUTTI_CHECK_ARG(options_.accumulation_steps >= 1, "DistributedDataParallel: accumulation_steps must be >= 1, got ",
                  options_.accumulation_steps);
  TUTTI_CHECK_ARG(options_.reducer.sharding == GradientSharding::none,
                  "DistributedDataParallel: set DdpOptions::sharding, not "
                  "reducer.sharding (the sharding strategy decides how gradients are reduced)");
  ErrorContext context("setting up DistributedDataParallel on rank " + std::to_string(comm.rank()) + " of " +
                       std::to_string(comm.size()));
  // The strategy sees params_ and index_ by reference: they are filled below.
  strategy_ = make_strategy(options_.sharding, StrategyContext{comm_, model_, params_, index_});
  if (options_.deterministic) {
    const std::string why = strategy_->refuses_deterministic();
    TUTTI_CHECK_ARG(why.empty(), "DistributedDataParallel: deterministic needs Replicate or ShardOptimizer (ZeRO-0 ",
                    "or 1), got ZeRO-", strategy_->stage(), " (", why, ")");
  }
  if (options_.verify_model) verify_same_model();

  // Deferred parameters (nn::DeferredParameters): ZeRO-3 fills its shards one gather group at a
  // time; the other strategies keep the whole model anyway.
  if (strategy_->materializes_whole()) model_.materialize();
  const bool deferred = model_.has_deferred_parameters();
  params_ = model_.parameters();
  for (std::size_t i = 0; i < params_.size(); ++i) index_.emplace(params_[i], i);
  const std::vector<nn::PlanParam> specs = nn::plan_params(params_);
  std::vector<std::string> groups;  // ShardParameters: each parameter's gather group
  const nn::FlatPlanOptions po = flat_plan_options(options_, specs, comm_.size(), model_.grad_dtype(), groups);
  ReducerOptions& ro = options_.reducer;
  if (!ro.grad_comm_dtype) ro.grad_comm_dtype = model_.grad_comm_dtype();
  ro.sharding = strategy_->gradient_sharding();
  // THE plan: the reducer's buckets and shards, the model's values and gradients, the optimizer's state.
  reducer_ = std::make_unique<Reducer>(comm_, nn::make_flat_plan(specs, po), model_.grad_dtype(), model_.device(), ro);
  strategy_->lay_out(*reducer_, deferred);
  // Before the hooks: a refusal here must not leave the model calling into a DDP never made.
  if (options_.broadcast_parameters) broadcast_parameters(!deferred);
  strategy_->shard(deferred, options_.broadcast_parameters, groups);
  if (options_.deterministic) {
    exact_ = std::make_unique<ExactGradientSum>(comm_, reducer_->plan().total, model_.device(),
                                                options_.deterministic->fixed_point_fraction_bits,
                                                comm_.size() * options_.accumulation_steps);
  }

  auto index_of = [this](const nn::Parameter& p) {
    const auto it = index_.find(&p);
    TUTTI_CHECK(it != index_.end(), "DistributedDataParallel: unknown parameter '", p.name,
                "' (was a layer added after DistributedDataParallel was made?)");
    return it->second;
  };
  model_.storage().set_grad_ready_hook([this, index_of](nn::Parameter& p) { reducer_->mark_ready(index_of(p)); });
  strategy_->install_hooks(index_of);
  model_.set_batch_slice(comm_.rank(), comm_.size());
}

DistributedDataParallel::~DistributedDataParallel() {
  try {
    strategy_->synchronize_parameters();
  } catch (...) {
  }
  model_.storage().set_grad_ready_hook({});
  model_.storage().set_grad_placement_hook({});
  model_.storage().set_param_use_hook({});
  model_.set_batch_slice(0, 1);
}

void DistributedDataParallel::attach(optim::Optimizer& optimizer) {
  optim::FlatTarget target = strategy_->target(alive_);
  target.plan = reducer_->shared_plan();
  target.params = params_;
  optimizer.set_stream(model_.stream());
  optimizer.bind(std::move(target));
  strategy_->set_attached(&optimizer);
}

bool DistributedDataParallel::sharded() const { return strategy_->sharded(); }

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
  TUTTI_CHECK_ARG(!strategy_->needs_attached() || strategy_->attached() != nullptr || !sync,
                  "DistributedDataParallel: ZeRO-", strategy_->stage(),
                  " needs the optimizer attached before the first step (ddp.attach(optimizer)): "
                  "each rank updates only its shard of the parameters, and only an attached optimizer knows which");
  // The all-gathers of the last step read the buffers this step's update will write.
  strategy_->before_backward();
  if (exact_) return exact_backward(dy, loss_scale);
  reducer_->prepare(sync, model_.stream());
  model_.backward(dy);
  if (!sync) {
    ++micro_step_;
    return false;
  }
  micro_step_ = 0;
  reducer_->finish(static_cast<double>(options_.accumulation_steps) * loss_scale);
  StepStats& stats = reducer_->mutable_stats();
  strategy_->after_reduce(stats);
  if (step_clock_running_) {
    const auto t_first = reducer_->first_launch().value_or(std::chrono::steady_clock::now());
    stats.compute_before_comm_ms =
        std::max(0.0, std::chrono::duration<double, std::milli>(t_first - t_step_start_).count());
    step_clock_running_ = false;
  }
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
  strategy_->zero_grad();
}

optim::GradNorm DistributedDataParallel::grad_norm(double max_norm) {
  TUTTI_CHECK_ARG(max_norm > 0, "DistributedDataParallel::grad_norm: max_norm must be positive, got ", max_norm);
  TUTTI_CHECK(exact_ ? exact_reduced_ : reducer_->phase() == Reducer::Phase::reduced,
              "DistributedDataParallel::grad_norm: call it after a "
              "backward that completed a step (the gradients are not reduced yet)");
  const Stream& stream = model_.stream();
  Tensor sq = Tensor::zeros({1}, DType::f32, model_.device());
  if (exact_) {
    // Deterministic mode: every rank holds every summed gradient (ZeRO-1 too), and sums them
    // in the same order whatever the world size.
    kernels::sum_squares(reducer_->buffer(), sq, /*accumulate=*/false, stream);
  } else {
    strategy_->grad_squares(sq, stream);
  }
  stream.synchronize();
  optim::GradNorm out;
  out.norm = std::sqrt(static_cast<double>(sq.to_floats()[0]));
  out.finite = std::isfinite(out.norm);
  out.coefficient = optim::clip_coefficient(out.norm, max_norm);
  return out;
}

DdpMemory DistributedDataParallel::memory() const {
  DdpMemory m;
  strategy_->memory(m);
  m.gradients = reducer_->gradient_bytes();
  optim::Optimizer* attached = strategy_->attached();
  m.optimizer_state = attached != nullptr ? attached->state_bytes() : 0;
  m.communication = reducer_->communication_bytes() + (exact_ ? exact_->bytes() : 0);
  return m;
}

void DistributedDataParallel::register_comm_hook(std::shared_ptr<CommHook> hook) {
  TUTTI_CHECK_ARG(hook != nullptr, "DistributedDataParallel::register_comm_hook: the hook is null");
  const std::string why = strategy_->refuses_comm_hook();
  TUTTI_CHECK_ARG(why.empty(), "DistributedDataParallel::register_comm_hook: the hook '", hook->name(),
                  "' needs Replicate (ZeRO-0), got ZeRO-", strategy_->stage(), " (", why, ")");
  TUTTI_CHECK_ARG(!options_.deterministic, "DistributedDataParallel::register_comm_hook: the hook '", hook->name(),
                  "' and deterministic cannot be combined (the deterministic sum is exact and never reaches the "
                  "reducer's allreduce)");
  reducer_->register_comm_hook(std::move(hook));
}

}  // namespace tutti::ddp
