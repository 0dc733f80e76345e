// DiLoCo (tutti/ddp/diloco.h): the outer sync across nodes and its checkpoint state.
#include "tutti/ddp/diloco.h"

#include <algorithm>
#include <set>
#include <string>

#include "ddp/plan_state.h"
#include "tutti/core/error.h"
#include "tutti/io/checkpoint.h"
#include "tutti/kernels/cast.h"
#include "tutti/kernels/compress.h"
#include "tutti/kernels/elementwise.h"

namespace tutti::ddp {

OuterDType parse_outer_dtype(std::string_view text) {
  if (text == "f32" || text == "fp32") return OuterDType::f32;
  if (text == "bf16") return OuterDType::bf16;
  if (text == "int8") return OuterDType::int8;
  if (text == "int4") return OuterDType::int4;
  TUTTI_THROW(InvalidArgument, "--outer-dtype: '", text, "' is not one of f32, bf16, int8, int4");
}

const char* outer_dtype_name(OuterDType dtype) {
  switch (dtype) {
    case OuterDType::f32: return "f32";
    case OuterDType::bf16: return "bf16";
    case OuterDType::int8: return "int8";
    case OuterDType::int4: return "int4";
  }
  return "?";
}

namespace {

constexpr const char* kInnerStep = "inner_step";
constexpr const char* kNodes = "nodes";
constexpr const char* kPendingFragment = "pending_fragment";  // overlap: -1, or the fragment in flight
constexpr const char* kPendingAge = "pending_age";
constexpr const char* kPendingAverage = "pending_average";

std::string node_prefix(int node) { return "node" + std::to_string(node) + "."; }

}  // namespace

DiLoCo::DiLoCo(DistributedDataParallel& inner, optim::Optimizer& optimizer, const NodeGroups& groups,
               DiLoCoOptions options)
    : inner_(inner), optimizer_(optimizer), groups_(groups), options_(options) {
  TUTTI_CHECK_ARG(groups_.intra && groups_.inter && !groups_.node_sizes.empty(),
                  "DiLoCo: the NodeGroups have no communicators (make them with Job::node_groups or "
                  "ThreadGroup::node_groups)");
  TUTTI_CHECK_ARG(inner_.reducer().comm_hook() == nullptr, "--sync diloco with --allreduce ",
                  inner_.reducer().comm_hook() ? inner_.reducer().comm_hook()->name() : "",
                  ": DiLoCo's inner DDP must have no communication hook (register_comm_hook); DiLoCo already "
                  "communicates across nodes only every H steps");
  TUTTI_CHECK_ARG(options_.sync_every >= 1, "--sync diloco:H: H (DiLoCoOptions::sync_every) must be at least 1, not ",
                  options_.sync_every);
  TUTTI_CHECK_ARG(options_.outer_lr > 0, "--outer-lr: the outer learning rate must be > 0, not ", options_.outer_lr);
  TUTTI_CHECK_ARG(options_.outer_momentum >= 0 && options_.outer_momentum < 1,
                  "--outer-momentum: the outer momentum must be in [0, 1), not ", options_.outer_momentum);
  TUTTI_CHECK_ARG(options_.block >= 2 && options_.block % 2 == 0,
                  "DiLoCoOptions::block must be even and at least 2, not ", options_.block);
  TUTTI_CHECK_ARG(groups_.node_count() >= 2, "--sync diloco needs at least 2 nodes, but this job has one node of ",
                  groups_.node_sizes.front(),
                  " rank(s): use --sync ddp, or fake nodes on one machine with --ranks-per-node");
  const bool equal = std::all_of(groups_.node_sizes.begin(), groups_.node_sizes.end(),
                                 [&](int s) { return s == groups_.node_sizes.front(); });
  TUTTI_CHECK_ARG(equal, "--sync diloco needs the same number of ranks on every node, but this job has ",
                  groups_.sizes_str(), " rank(s) on its ", groups_.node_count(),
                  " nodes (place as many ranks on every node, or set --ranks-per-node)");
  TUTTI_CHECK_ARG(options_.fragments >= 1 && options_.fragments <= options_.sync_every,
                  "--streaming: the fragments (DiLoCoOptions::fragments) must be between 1 and H = ",
                  options_.sync_every, ", not ", options_.fragments);
  TUTTI_CHECK_ARG(options_.overlap_steps >= 0 && options_.overlap_steps <= options_.sync_every / options_.fragments,
                  "--overlap: the inner steps a sync may travel (DiLoCoOptions::overlap_steps) must be between 0 and "
                  "H / fragments = ",
                  options_.sync_every / options_.fragments, ", not ", options_.overlap_steps);
  const int local = groups_.intra->size();
  total_ = inner_.reducer().plan().total;
  std::int64_t widest = 0;
  for (int f = 0; f < options_.fragments; ++f) widest = std::max(widest, fragment(f).second - fragment(f).first);
  shard_ = (widest + local - 1) / local;
  const Stream& stream = inner_.module().stream();
  const Device device = inner_.module().device();
  // Node 0's parameters are everybody's start: each local index broadcasts the whole vector.
  global_ = inner_.state().parameters_flat();
  CallOptions call{"diloco start broadcast", stream};
  groups_.inter->broadcast(global_, 0, call).wait(stream);
  inner_.state().load_parameters_flat(global_);
  momentum_ = Tensor::zeros({total_}, DType::f32, device);
  avg_ = Tensor::zeros({local * shard_}, DType::f32, device);
  // Error feedback: whole-length, holding this rank's slice of every fragment (zero elsewhere).
  if (options_.error_feedback && options_.outer_dtype != OuterDType::f32)
    residual_ = Tensor::zeros({total_}, DType::f32, device);
  if (options_.error_feedback && reduce_scatter_exchange())
    owner_residual_ = Tensor::zeros({total_}, DType::f32, device);
  snapshot_ = Tensor::zeros({options_.overlap_steps > 0 ? widest : 1}, DType::f32, device);
  stream.synchronize();
}

std::pair<std::int64_t, std::int64_t> DiLoCo::fragment(int f) const {
  const std::int64_t k = options_.fragments;
  return {total_ * f / k, total_ * (f + 1) / k};
}

std::pair<std::int64_t, std::int64_t> DiLoCo::my_slice(int f) const {
  const auto [b, e] = fragment(f);
  const std::int64_t local = groups_.intra->size(), shard = (e - b + local - 1) / local;
  const std::int64_t begin = std::min(e, b + groups_.intra->rank() * shard);
  return {begin, std::min(e, begin + shard) - begin};
}

DiLoCo::~DiLoCo() = default;

bool DiLoCo::end_inner_step(bool last_step) {
  if (scheduled_step()) return true;
  if (!last_step) return false;
  sync();  // the run's last step: the final model is the global one
  return true;
}

bool DiLoCo::scheduled_step() {
  // Fragment 0 syncs at the end of each period (inner step H), fragment f > 0 at inner step
  // f · H / F of it (F = 1: the whole vector every H steps). Overlapped: a sync launched is
  // applied τ steps later, before any launch of that step (τ <= floor(H / F): one in flight).
  const int h = options_.sync_every, k = options_.fragments;
  inner_step_ = std::min(inner_step_ + 1, h);  // (a resume with a smaller H may find it beyond)
  if (k == 1 && options_.overlap_steps == 0 && pending_ < 0) {
    if (inner_step_ < h) return false;
    sync();
    return true;
  }
  Tensor local;
  bool changed = false;
  if (pending_ >= 0 && ++pending_age_ >= options_.overlap_steps) {
    local = inner_.state().parameters_flat();
    apply_pending(local);
    changed = true;
  }
  bool synced = false;
  for (int f = 0; f < k; ++f) {
    if (inner_step_ != (f == 0 ? h : f * h / k)) continue;
    if (!local.defined()) local = inner_.state().parameters_flat();
    if (options_.overlap_steps > 0) {
      launch(f, local, /*keep_snapshot=*/true);
      pending_ = f;
      pending_age_ = 0;
      received_ = false;
    } else {
      sync_fragment(f, local);
      changed = true;
    }
    synced = true;
  }
  if (changed) inner_.state().load_parameters_flat(local);
  if (changed || synced) inner_.module().stream().synchronize();
  if (synced) ++syncs_;
  if (inner_step_ == h) inner_step_ = 0;
  return synced;
}

void DiLoCo::sync() {
  const Tensor local = inner_.state().parameters_flat();  // collective over the node under ZeRO with half masters
  if (pending_ >= 0) apply_pending(local);
  for (int f = 0; f < options_.fragments; ++f) sync_fragment(f, local);
  inner_.state().load_parameters_flat(local);
  inner_.module().stream().synchronize();
  inner_step_ = 0;
  ++syncs_;
}

void DiLoCo::launch(int f, const Tensor& local, bool keep_snapshot) {
  const Stream& stream = inner_.module().stream();
  const auto [fb, fe] = fragment(f);
  const std::int64_t shard = (fe - fb + groups_.intra->size() - 1) / groups_.intra->size();
  if (keep_snapshot) snapshot_.view(0, {fe - fb}).copy_from(local.view(fb, {fe - fb}), stream);
  if (shard == 0) return;
  const auto [begin, n] = my_slice(f);
  const Tensor mine = avg_.view(groups_.intra->rank() * shard, {shard});
  kernels::fill(mine, 0.0f, stream);
  if (n == 0) return;
  // Δ = global − local on this rank's slice, to be averaged over the nodes in place.
  Tensor delta = mine.view(0, {n});
  delta.copy_from(global_.view(begin, {n}), stream);
  kernels::add_scaled(local.view(begin, {n}), -1.0f, delta, stream);
  launch_exchange(delta, residual_.defined() ? residual_.view(begin, {n}) : Tensor());
}

void DiLoCo::receive(int f) {
  const Stream& stream = inner_.module().stream();
  const auto [fb, fe] = fragment(f);
  const std::int64_t local_ranks = groups_.intra->size(), shard = (fe - fb + local_ranks - 1) / local_ranks;
  if (shard == 0) return;
  const auto [begin, n] = my_slice(f);
  if (n > 0) {
    finish_exchange(avg_.view(groups_.intra->rank() * shard, {n}),
                    owner_residual_.defined() ? owner_residual_.view(begin, {n}) : Tensor());
  }
  if (local_ranks > 1) {
    CallOptions call{"diloco node all-gather", stream};
    groups_.intra
        ->allgather(avg_.view(groups_.intra->rank() * shard, {shard}), avg_.view(0, {local_ranks * shard}), call)
        .wait(stream);
  }
}

void DiLoCo::outer_step(int f) {
  // The same on every rank: m = μ m + Δ, then global −= lr (Δ + μ m) (Nesterov) or
  // global −= lr m.
  const Stream& stream = inner_.module().stream();
  const auto [fb, fe] = fragment(f);
  const std::int64_t m = fe - fb;
  const Tensor avg = avg_.view(0, {m}), global = global_.view(fb, {m}), momentum = momentum_.view(fb, {m});
  const auto mu = static_cast<float>(options_.outer_momentum), lr = static_cast<float>(options_.outer_lr);
  kernels::scale(momentum, mu, momentum, stream);
  kernels::add_scaled(avg, 1.0f, momentum, stream);
  if (options_.nesterov) {
    kernels::add_scaled(avg, -lr, global, stream);
    kernels::add_scaled(momentum, -lr * mu, global, stream);
  } else {
    kernels::add_scaled(momentum, -lr, global, stream);
  }
}

void DiLoCo::sync_fragment(int f, const Tensor& local) {
  // On return local's elements of fragment f are the new global ones (not yet in the model).
  const auto [fb, fe] = fragment(f);
  if (fe == fb) return;
  launch(f, local, /*keep_snapshot=*/false);
  receive(f);
  outer_step(f);
  local.view(fb, {fe - fb}).copy_from(global_.view(fb, {fe - fb}), inner_.module().stream());
}

void DiLoCo::apply_pending(const Tensor& local) {
  // local's fragment = global_new + (local − snapshot): the new global parameters plus the
  // inner progress made while the sync travelled, computed as local + (global_new − snapshot).
  const Stream& stream = inner_.module().stream();
  const int f = pending_;
  pending_ = -1;
  const auto [fb, fe] = fragment(f);
  if (fe == fb) return;
  if (!received_) receive(f);
  received_ = false;
  outer_step(f);
  const Tensor snap = snapshot_.view(0, {fe - fb});
  kernels::scale(snap, -1.0f, snap, stream);
  kernels::add_scaled(global_.view(fb, {fe - fb}), 1.0f, snap, stream);
  kernels::add_scaled(snap, 1.0f, local.view(fb, {fe - fb}), stream);
}

StateDict DiLoCo::named(const Tensor& flat) const {
  return named_of_flat(inner_.reducer().plan(), flat, inner_.module().stream());
}

Tensor DiLoCo::flat_of(const StateDict& state, const std::string& prefix) const {
  const Tensor host = flat_of_named(inner_.reducer().plan(), state, prefix, "DiLoCo::load_state_dict",
                                    " (the checkpoint is of another model, or not of --sync diloco)");
  Tensor out = host.to(inner_.module().device(), inner_.module().stream());
  inner_.module().stream().synchronize();  // before `host` goes
  return out;
}

StateDict DiLoCo::state_dict() {
  const Stream& stream = inner_.module().stream();
  // An overlapped sync in flight is received (not applied): its average and this node's
  // snapshot are saved, and it is applied at its step after the resume as it would have been.
  if (pending_ >= 0 && !received_) {
    receive(pending_);
    received_ = true;
  }
  StateDict out;
  io::add_prefixed(out, "global.", named(global_));
  out[kPendingFragment] = int_scalar_tensor(pending_);
  out[kPendingAge] = int_scalar_tensor(pending_age_);
  std::int64_t pending_len = 0;
  if (pending_ >= 0) {
    pending_len = fragment(pending_).second - fragment(pending_).first;
    out[kPendingAverage] = avg_.view(0, {pending_len}).to(Device::cpu(), stream);
  }
  io::add_prefixed(out, "momentum.", named(momentum_));
  out[kInnerStep] = int_scalar_tensor(inner_step_);
  out[kNodes] = int_scalar_tensor(nodes());
  // This node's own state (collective over the node under ZeRO).
  StateDict mine;
  io::add_prefixed(mine, "model.", inner_.state().model_state_dict());
  io::add_prefixed(mine, "optim.", inner_.state().optimizer_state_dict(optimizer_));
  // The node's residuals: each rank holds its slices and zeros elsewhere, so the sum.
  for (const auto& [key, part] : {std::pair{"residual", residual_}, std::pair{"owner_residual", owner_residual_}}) {
    if (!part.defined()) continue;
    Tensor whole = Tensor::empty({total_}, DType::f32, part.device());
    CallOptions call{std::string("diloco checkpoint ") + key, stream};
    groups_.intra->allreduce(part, whole, ReduceOp::sum, call).wait(stream);
    mine[key] = whole.to(Device::cpu(), stream);
    stream.synchronize();  // before `whole` goes
  }
  if (pending_ >= 0) mine["snapshot"] = snapshot_.view(0, {pending_len}).to(Device::cpu(), stream);
  stream.synchronize();
  if (groups_.intra->rank() != 0) {
    io::add_prefixed(out, node_prefix(groups_.node), mine);
    return out;
  }
  // The first rank of each node gathers every node's state across the nodes, entry by entry
  // (a map: the same order on every node).
  const int nodes = groups_.inter->size();
  const Device device = inner_.module().device();
  for (const auto& [key, t] : mine) {
    const Tensor here = t.to(device, stream);
    const Tensor all = Tensor::empty({nodes * t.numel()}, t.dtype(), device);
    CallOptions call{"diloco checkpoint gather", stream};
    groups_.inter->allgather(here, all, call).wait(stream);
    for (int k = 0; k < nodes; ++k)
      out[node_prefix(k) + key] = all.view(k * t.numel(), t.shape()).to(Device::cpu(), stream);
    stream.synchronize();  // before `here` and `all` go
  }
  stream.synchronize();
  return out;
}

void DiLoCo::load_state_dict(const StateDict& state) {
  TUTTI_CHECK_ARG(state.count(kInnerStep) == 1 && state.count(kNodes) == 1,
                  "the checkpoint holds no DiLoCo state for this rank: it was written with --sync ddp (resume it "
                  "with --sync ddp), or with --sync diloco at another --tp (DiLoCo's state is each tensor-parallel "
                  "rank's own: resume it at the same --tp); or start afresh");
  const Stream& stream = inner_.module().stream();
  global_ = flat_of(state, "global.");
  momentum_ = flat_of(state, "momentum.");
  const auto saved_nodes = static_cast<int>(get_int_scalar(state, kNodes));
  if (residual_.defined()) kernels::fill(residual_, 0.0f, stream);
  if (owner_residual_.defined()) kernels::fill(owner_residual_, 0.0f, stream);
  pending_ = -1;
  received_ = false;
  if (saved_nodes != nodes()) {
    // Another layout of nodes: the period restarts from the global parameters, with node 0's
    // inner optimizer state; the residuals start at zero and a sync in flight is dropped
    // (diloco.h says why).
    inner_.state().load_parameters_flat(global_);
    const StateDict opt0 = io::strip_prefix(state, node_prefix(0) + "optim.");
    if (!opt0.empty()) inner_.state().load_optimizer_state_dict(optimizer_, opt0);
    inner_step_ = 0;
    stream.synchronize();
    return;
  }
  const std::string mine = node_prefix(groups_.node);
  const StateDict model = io::strip_prefix(state, mine + "model.");
  TUTTI_CHECK_ARG(!model.empty(), "DiLoCo::load_state_dict: no entries '", mine,
                  "model.*' (a state_dict() of another rank than rank 0?)");
  inner_.state().load_model_state_dict(model);
  inner_.state().load_optimizer_state_dict(optimizer_, io::strip_prefix(state, mine + "optim."));
  for (const auto& [key, into] : {std::pair{"residual", residual_}, std::pair{"owner_residual", owner_residual_}}) {
    const auto res = state.find(mine + key);
    if (!into.defined() || res == state.end()) continue;
    TUTTI_CHECK_ARG(res->second.numel() == total_, "DiLoCo::load_state_dict: '", mine, key, "' has ",
                    res->second.numel(), " elements, not ", total_);
    for (int f = 0; f < options_.fragments; ++f) {
      const auto [begin, n] = my_slice(f);
      if (n > 0) into.view(begin, {n}).copy_from(res->second.view(begin, {n}), stream);
    }
  }
  const auto pf = state.find(kPendingFragment);
  const int pending = pf == state.end() ? -1 : static_cast<int>(get_int_scalar(state, kPendingFragment));
  if (pending >= 0) {
    TUTTI_CHECK_ARG(pending < options_.fragments, "DiLoCo::load_state_dict: the sync in flight is of fragment ",
                    pending, " but there are ", options_.fragments, " fragments (resume with the same --streaming)");
    const std::int64_t len = fragment(pending).second - fragment(pending).first;
    const auto avg = state.find(kPendingAverage), snap = state.find(mine + "snapshot");
    TUTTI_CHECK_ARG(
        avg != state.end() && snap != state.end() && avg->second.numel() == len && snap->second.numel() == len,
        "DiLoCo::load_state_dict: the sync in flight (fragment ", pending, ", ", len,
        " elements) has no or other-sized '", kPendingAverage, "' and '", mine, "snapshot'");
    if (snapshot_.numel() < len) snapshot_ = Tensor::zeros({len}, DType::f32, avg_.device());
    avg_.view(0, {len}).copy_from(avg->second, stream);
    snapshot_.view(0, {len}).copy_from(snap->second, stream);
    pending_ = pending;
    pending_age_ = static_cast<int>(get_int_scalar(state, kPendingAge));
    received_ = true;
  }
  inner_step_ = static_cast<int>(get_int_scalar(state, kInnerStep));
  stream.synchronize();
}

}  // namespace tutti::ddp
