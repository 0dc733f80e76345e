#include "tutti/ddp/ddp.h"

#include <sstream>
#include <unordered_map>

#include "tutti/core/error.h"

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
  ErrorContext context("setting up DistributedDataParallel on rank " + std::to_string(comm.rank()) + " of " +
                       std::to_string(comm.size()));
  if (options_.verify_model) verify_same_model();

  const std::vector<nn::Parameter*> params = model_.parameters();
  std::vector<GradientSpec> specs;
  specs.reserve(params.size());
  for (const nn::Parameter* p : params) specs.push_back({p->name, p->shape(), p->requires_grad});

  ReducerOptions ro;
  ro.bucket_cap_mb = options_.bucket_cap_mb;
  ro.first_bucket_cap_mb = options_.first_bucket_cap_mb;
  if (!options_.grad_comm_dtype) options_.grad_comm_dtype = model_.grad_comm_dtype();
  ro.grad_comm_dtype = *options_.grad_comm_dtype;
  ro.average = options_.average;
  ro.overlap = options_.overlap;
  ro.allow_unused = options_.allow_unused_parameters;
  reducer_ = std::make_unique<Reducer>(comm_, std::move(specs), model_.grad_dtype(), model_.device(), ro);

  // Values and gradients in one layout: the optimizer then updates the whole model in one
  // fused call, and every gradient is written straight into its bucket.
  nn::FlatLayout layout;
  layout.offsets = reducer_->offsets();
  layout.total = reducer_->buffer().numel();
  model_.flatten_parameters(layout);
  model_.set_grad_buffer(reducer_->buffer(), layout);
  // Before the hook: a refusal here must not leave the model calling into a DDP never made.
  if (options_.broadcast_parameters) broadcast_parameters();

  std::unordered_map<const nn::Parameter*, std::size_t> index;
  for (std::size_t i = 0; i < params.size(); ++i) index.emplace(params[i], i);
  model_.set_grad_ready_hook([this, index = std::move(index)](nn::Parameter& p) {
    const auto it = index.find(&p);
    TUTTI_CHECK(it != index.end(), "DistributedDataParallel: gradient of unknown parameter '", p.name,
                "' (was a layer added after DistributedDataParallel was made?)");
    reducer_->mark_ready(it->second);
  });
  model_.set_batch_slice(comm_.rank(), comm_.size());
}

DistributedDataParallel::~DistributedDataParallel() {
  model_.set_grad_ready_hook({});
  model_.set_batch_slice(0, 1);
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
    if (hashes[static_cast<std::size_t>(r)] != hashes[0]) differing += (differing.empty() ? "" : ", ") + std::to_string(r);
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

void DistributedDataParallel::broadcast_parameters() {
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

  CallOptions call;
  call.label = "ddp parameter broadcast";
  call.stream = model_.stream();
  comm_.broadcast(model_.flat_values(), 0, call).wait(model_.stream());
  for (nn::Parameter* p : params) p->initialized = true;
  model_.refresh_compute_copies();
}

bool DistributedDataParallel::backward(const Tensor& dy, double loss_scale) {
  TUTTI_CHECK_ARG(loss_scale > 0, "DistributedDataParallel::backward: loss_scale must be positive, got ", loss_scale);
  TUTTI_CHECK_ARG(model_.awaiting_backward(), "DistributedDataParallel::backward: no forward since the last "
                  "backward. Each backward needs its own forward: a second backward of one forward would add the "
                  "same gradients again and ", next_backward_syncs() ? "reduce them across ranks a second time" :
                  "count them twice in the accumulation", " (nothing was communicated)");
  const bool sync = next_backward_syncs();
  reducer_->prepare(sync, model_.stream());
  model_.backward(dy);
  if (!sync) {
    ++micro_step_;
    return false;
  }
  micro_step_ = 0;
  reducer_->finish(static_cast<double>(options_.accumulation_steps) * loss_scale);
  return true;
}

bool DistributedDataParallel::found_nonfinite() {
  model_.stream().synchronize();  // the flag is written on the model's stream
  return found_nonfinite_flag().to_ints()[0] != 0;
}

void DistributedDataParallel::zero_grad() { reducer_->zero(); }

}  // namespace tutti::ddp
