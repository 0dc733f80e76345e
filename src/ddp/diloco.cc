// DiLoCo (tutti/ddp/diloco.h): the outer sync across nodes and its checkpoint state.
#include "tutti/ddp/diloco.h"

#include <algorithm>
#include <set>
#include <string>

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

std::string node_prefix(int node) { return "node" + std::to_string(node) + "."; }

}  // namespace

DiLoCo::DiLoCo(DistributedDataParallel& inner, optim::Optimizer& optimizer, const NodeGroups& groups,
               DiLoCoOptions options)
    : inner_(inner), optimizer_(optimizer), groups_(groups), options_(options) {
  TUTTI_CHECK_ARG(groups_.intra && groups_.inter && !groups_.node_sizes.empty(),
                  "DiLoCo: the NodeGroups have no communicators (make them with Job::node_groups or "
                  "ThreadGroup::node_groups)");
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
  const int local = groups_.intra->size();
  total_ = inner_.plan().total;
  std::int64_t widest = 0;
  for (int f = 0; f < options_.fragments; ++f) widest = std::max(widest, fragment(f).second - fragment(f).first);
  shard_ = (widest + local - 1) / local;
  const Stream& stream = inner_.module().stream();
  const Device device = inner_.module().device();
  // Node 0's parameters are everybody's start: each local index broadcasts the whole vector.
  global_ = inner_.parameters_flat();
  CallOptions call{"diloco start broadcast", stream};
  groups_.inter->broadcast(global_, 0, call).wait(stream);
  inner_.load_parameters_flat(global_);
  momentum_ = Tensor::zeros({total_}, DType::f32, device);
  avg_ = Tensor::zeros({local * shard_}, DType::f32, device);
  // Error feedback: whole-length, holding this rank's slice of every fragment (zero elsewhere).
  if (options_.error_feedback && options_.outer_dtype != OuterDType::f32)
    residual_ = Tensor::zeros({total_}, DType::f32, device);
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

bool DiLoCo::end_inner_step() {
  // Fragment 0 syncs at the end of each period (inner step H), fragment f > 0 at inner step
  // f · H / F of it (F = 1: the whole vector every H steps).
  const int h = options_.sync_every, k = options_.fragments;
  inner_step_ = std::min(inner_step_ + 1, h);  // (a resume with a smaller H may find it beyond)
  if (k == 1) {
    if (inner_step_ < h) return false;
    sync();
    return true;
  }
  bool synced = false;
  Tensor local;
  for (int f = 0; f < k; ++f) {
    if (inner_step_ != (f == 0 ? h : f * h / k)) continue;
    if (!local.defined()) local = inner_.parameters_flat();
    sync_fragment(f, local);
    synced = true;
  }
  if (synced) {
    inner_.load_parameters_flat(local);
    inner_.module().stream().synchronize();
    ++syncs_;
  }
  if (inner_step_ == h) inner_step_ = 0;
  return synced;
}

void DiLoCo::sync() {
  const Tensor local = inner_.parameters_flat();  // collective over the node under ZeRO with half masters
  for (int f = 0; f < options_.fragments; ++f) sync_fragment(f, local);
  inner_.load_parameters_flat(local);
  inner_.module().stream().synchronize();
  inner_step_ = 0;
  ++syncs_;
}

void DiLoCo::sync_fragment(int f, const Tensor& local) {
  // On return local's elements of fragment f are the new global ones (not yet in the model).
  const Stream& stream = inner_.module().stream();
  const auto [fb, fe] = fragment(f);
  const std::int64_t m = fe - fb, local_ranks = groups_.intra->size(), shard = (m + local_ranks - 1) / local_ranks;
  if (shard == 0) return;
  const auto [begin, n] = my_slice(f);
  const Tensor mine = avg_.view(groups_.intra->rank() * shard, {shard});
  kernels::fill(mine, 0.0f, stream);
  if (n > 0) {
    // Δ = global − local on this rank's slice, averaged over the nodes in place.
    Tensor delta = mine.view(0, {n});
    delta.copy_from(global_.view(begin, {n}), stream);
    kernels::add_scaled(local.view(begin, {n}), -1.0f, delta, stream);
    average_slice(delta, residual_.defined() ? residual_.view(begin, {n}) : Tensor());
  }
  if (local_ranks > 1) {
    CallOptions call{"diloco node all-gather", stream};
    groups_.intra->allgather(mine, avg_.view(0, {local_ranks * shard}), call).wait(stream);
  }
  // The outer step on the fragment, the same on every rank: m = μ m + Δ, then
  // global −= lr (Δ + μ m) (Nesterov) or global −= lr m.
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
  local.view(fb, {m}).copy_from(global, stream);
}

void DiLoCo::average_slice(const Tensor& delta, const Tensor& residual) {
  const Stream& stream = inner_.module().stream();
  const Device device = delta.device();
  const std::int64_t n = delta.numel();
  const int nodes = groups_.inter->size();
  const float inv = 1.0f / static_cast<float>(nodes);
  CallOptions call{"diloco outer sync", stream};
  switch (options_.outer_dtype) {
    case OuterDType::f32:
      groups_.inter->allreduce(delta, ReduceOp::sum, call).wait(stream);
      kernels::scale(delta, inv, delta, stream);
      last_bytes_ = n * 4;
      return;
    case OuterDType::bf16: {
      // v = Δ + residual; sent: bf16(v); residual = v − bf16(v).
      if (residual.defined()) kernels::add_scaled(residual, 1.0f, delta, stream);
      const Tensor half = buffer(0, {n}, DType::bf16, device);
      kernels::cast(delta, half, stream);
      if (residual.defined()) {
        Tensor(residual).copy_from(delta, stream);
        const Tensor sent = buffer(1, {n}, DType::f32, device);
        kernels::cast(half, sent, stream);
        kernels::add_scaled(sent, -1.0f, residual, stream);
      }
      groups_.inter->allreduce(half, ReduceOp::sum, call).wait(stream);
      kernels::cast(half, delta, stream);
      kernels::scale(delta, inv, delta, stream);
      last_bytes_ = n * 2;
      return;
    }
    case OuterDType::int8:
    case OuterDType::int4: {
      // Quantized values cannot be summed on the wire: every rank gets every node's bytes and
      // scales and adds them up itself, in node order (the same bits on every rank).
      const int bits = options_.outer_dtype == OuterDType::int8 ? 8 : 4;
      const std::int64_t block = options_.block;
      const std::int64_t words = kernels::quantized_words(n, bits), blocks = kernels::quantized_blocks(n, block);
      const Tensor q = buffer(0, {words}, DType::i32, device);
      const Tensor scales = buffer(1, {blocks}, DType::f32, device);
      kernels::quantize_blocks(delta, bits, block, q, scales, residual, stream);
      const Tensor all_q = buffer(2, {nodes * words}, DType::i32, device);
      const Tensor all_scales = buffer(3, {nodes * blocks}, DType::f32, device);
      groups_.inter->allgather(q, all_q, call).wait(stream);
      groups_.inter->allgather(scales, all_scales, call).wait(stream);
      for (int k = 0; k < nodes; ++k) {
        kernels::dequantize_blocks(all_q.view(k * words, {words}), all_scales.view(k * blocks, {blocks}), bits, block,
                                   delta, /*accumulate=*/k > 0, stream);
      }
      kernels::scale(delta, inv, delta, stream);
      last_bytes_ = (words + blocks) * 4;
      return;
    }
  }
}

const Tensor& DiLoCo::buffer(int i, Shape shape, DType dtype, Device device) {
  // Kept from sync to sync: a buffer freed while the stream still uses it would be a race
  // wherever freeing does not wait for the device.
  Tensor& b = buffers_[static_cast<std::size_t>(i)];
  if (!b.defined() || b.shape() != shape || b.dtype() != dtype) b = Tensor::empty(std::move(shape), dtype, device);
  return b;
}

StateDict DiLoCo::named(const Tensor& flat) const {
  StateDict out;
  for (const nn::PlanEntry& e : inner_.plan().entries)
    out[e.name] = flat.view(e.offset, e.shape).to(Device::cpu(), inner_.module().stream());
  return out;
}

Tensor DiLoCo::flat_of(const StateDict& state, const std::string& prefix) const {
  Tensor host = Tensor::zeros({total_}, DType::f32);
  for (const nn::PlanEntry& e : inner_.plan().entries) {
    const auto it = state.find(prefix + e.name);
    TUTTI_CHECK_ARG(it != state.end(), "DiLoCo::load_state_dict: no entry '", prefix, e.name,
                    "' (the checkpoint is of another model, or not of --sync diloco)");
    TUTTI_CHECK_ARG(it->second.shape() == e.shape && it->second.dtype() == DType::f32, "DiLoCo::load_state_dict: '",
                    prefix, e.name, "' is ", it->second.str(), " but the parameter is ", shape_str(e.shape), " f32");
    host.view(e.offset, e.shape).copy_from(it->second);
  }
  Tensor out = host.to(inner_.module().device(), inner_.module().stream());
  inner_.module().stream().synchronize();  // before `host` goes
  return out;
}

StateDict DiLoCo::state_dict() {
  const Stream& stream = inner_.module().stream();
  StateDict out;
  io::add_prefixed(out, "global.", named(global_));
  io::add_prefixed(out, "momentum.", named(momentum_));
  out[kInnerStep] = int_scalar_tensor(inner_step_);
  out[kNodes] = int_scalar_tensor(nodes());
  // This node's own state (collective over the node under ZeRO).
  StateDict mine;
  io::add_prefixed(mine, "model.", inner_.model_state_dict());
  io::add_prefixed(mine, "optim.", inner_.optimizer_state_dict(optimizer_));
  if (residual_.defined()) {
    // The node's residuals: each rank holds its slices and zeros elsewhere, so the sum.
    Tensor whole = Tensor::empty({total_}, DType::f32, residual_.device());
    CallOptions call{"diloco checkpoint residuals", stream};
    groups_.intra->allreduce(residual_, whole, ReduceOp::sum, call).wait(stream);
    mine["residual"] = whole.to(Device::cpu(), stream);
    stream.synchronize();  // before `whole` goes
  }
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
                  "the checkpoint holds no DiLoCo state: it was written with --sync ddp; resume it with --sync ddp "
                  "(or start afresh)");
  const Stream& stream = inner_.module().stream();
  global_ = flat_of(state, "global.");
  momentum_ = flat_of(state, "momentum.");
  const auto saved_nodes = static_cast<int>(get_int_scalar(state, kNodes));
  if (residual_.defined()) kernels::fill(residual_, 0.0f, stream);
  if (saved_nodes != nodes()) {
    // Another layout of nodes: the period restarts from the global parameters, with node 0's
    // inner optimizer state; the residuals start at zero (diloco.h says why).
    inner_.load_parameters_flat(global_);
    const StateDict opt0 = io::strip_prefix(state, node_prefix(0) + "optim.");
    if (!opt0.empty()) inner_.load_optimizer_state_dict(optimizer_, opt0);
    inner_step_ = 0;
    stream.synchronize();
    return;
  }
  const std::string mine = node_prefix(groups_.node);
  const StateDict model = io::strip_prefix(state, mine + "model.");
  TUTTI_CHECK_ARG(!model.empty(), "DiLoCo::load_state_dict: no entries '", mine,
                  "model.*' (a state_dict() of another rank than rank 0?)");
  inner_.load_model_state_dict(model);
  inner_.load_optimizer_state_dict(optimizer_, io::strip_prefix(state, mine + "optim."));
  const auto res = state.find(mine + "residual");
  if (residual_.defined() && res != state.end()) {
    TUTTI_CHECK_ARG(res->second.numel() == total_, "DiLoCo::load_state_dict: '", mine, "residual' has ",
                    res->second.numel(), " elements, not ", total_);
    for (int f = 0; f < options_.fragments; ++f) {
      const auto [begin, n] = my_slice(f);
      if (n > 0) residual_.view(begin, {n}).copy_from(res->second.view(begin, {n}), stream);
    }
  }
  inner_step_ = static_cast<int>(get_int_scalar(state, kInnerStep));
  stream.synchronize();
}

}  // namespace tutti::ddp
