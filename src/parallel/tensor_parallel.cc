#include "tutti/parallel/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "nn/slices.h"
#include "parallel/reduce_over.h"
#include "parallel/same_group.h"
#include "parallel/split_owner.h"
#include "tutti/core/error.h"
#include "tutti/ddp/ddp.h"
#include "tutti/kernels/linear.h"
#include "tutti/kernels/reduce.h"

namespace tutti::parallel {

namespace {

// The part of `whole` features this rank of `group` holds; InvalidArgument unless it divides.
std::int64_t part_of(const Communicator& group, std::int64_t whole, const char* layer, const char* what) {
  TUTTI_CHECK_ARG(whole > 0 && whole % group.size() == 0, layer, ": ", what, " ", whole,
                  " must divide by the tensor-parallel group's ", group.size(), " rank(s)");
  return whole / group.size();
}

// This rank's features of `out` made of `blocks` (empty: one block), each split over the group;
// InvalidArgument unless the blocks sum to out and each divides by the group's size.
std::int64_t column_part(const Communicator& group, std::int64_t out, const std::vector<std::int64_t>& blocks) {
  if (blocks.empty()) return part_of(group, out, "ColumnParallelLinear", "out_features");
  std::int64_t sum = 0, part = 0;
  for (const std::int64_t b : blocks) {
    sum += b;
    part += part_of(group, b, "ColumnParallelLinear", "a block of out_features");
  }
  TUTTI_CHECK_ARG(sum == out, "ColumnParallelLinear: blocks summing to ", sum, ", not out_features ", out);
  return part;
}

std::string blocks_str(const std::vector<std::int64_t>& blocks) {
  std::string s;
  for (const std::int64_t b : blocks) s += (s.empty() ? "" : " | ") + std::to_string(b);
  return s;
}

}  // namespace

// ---- ColumnParallelLinear -----------------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(Communicator& group, std::int64_t in_features, std::int64_t out_features,
                                           nn::LinearOptions options, std::vector<std::int64_t> blocks,
                                           SequenceParallel* sequence)
    : nn::Linear(in_features, column_part(group, out_features, blocks), options),
      group_(group),
      in_(in_features),
      out_(out_features),
      blocks_(std::move(blocks)),
      sequence_(same_group(sequence, group, "ColumnParallelLinear")) {
  // Part r of each block of the whole [out, in] weight's rows and of the bias, drawn as the whole
  // layer's (its fan-out, not the part's).
  weight.init = options.init.spec(static_cast<double>(in_features), static_cast<double>(out_features));
  weight.init_slice = {{out_, in_}, 0, group.rank(), group.size(), blocks_};
  bias.init_slice = {{out_}, 0, group.rank(), group.size(), blocks_};
}

std::string ColumnParallelLinear::describe() const {
  return detail::str("ColumnParallelLinear(", in_, ", ", out_, blocks_.empty() ? "" : " [" + blocks_str(blocks_) + "]",
                     ", tp ", group_.size(), sequence_ ? ", sequence-parallel" : "", ")");
}

Tensor ColumnParallelLinear::forward_impl(const Tensor& x) {
  if (sequence_ == nullptr || !sequence_->active()) return nn::Linear::forward_impl(x);
  // Keep only this rank's rows; multiply the whole batch's, gathered into the shared buffer.
  x_ = x;
  const Tensor whole = sequence_->gather(x, 0, stream(), describe() + " input");
  Tensor y = buffer(0, nn::with_last(whole.shape(), weight.shape()[0]), x.dtype());
  multiply(whole, y);
  return y;
}

Tensor ColumnParallelLinear::backward_impl(const Tensor& dy) {
  if (sequence_ == nullptr || !sequence_->active()) {
    Tensor dx = nn::Linear::backward_impl(dy);
    // Each rank's features contributed their part of the input gradient: the sum is the whole.
    if (dx.defined()) reduce_over(group_, dx, stream(), describe() + " input gradient");
    return dx;
  }
  TUTTI_CHECK_ARG(x_.defined(), describe(), ": backward before forward");
  // The whole input again for the weight's gradient, gathered while the input gradient's multiply
  // (which does not need it) runs: the whole input gradient (this rank's features' part of it),
  // in the other shared buffer, then summed over the group into this rank's rows.
  const SequenceParallel::Gathering input =
      sequence_->start_gather(x_, 0, stream(), describe() + " input, again for backward");
  Tensor dx_whole;
  if (input_grad_needed()) {
    dx_whole = sequence_->whole_buffer(1, in_, x_.dtype(), x_.device());
    const std::int64_t out = weight.shape()[0];
    kernels::matmul(nn::as_rows(dy, out), false, weight.compute_value(), false, nn::as_rows(dx_whole, in_), 1.0f, 0.0f,
                    stream());
  }
  input.work.wait(stream());
  multiply_backward(input.whole, dy, Tensor());
  if (!dx_whole.defined()) return Tensor();
  Tensor dx = buffer(1, x_.shape(), x_.dtype());
  sequence_->scatter_sum(dx_whole, dx, stream(), describe() + " input gradient");
  return dx;
}

std::vector<nn::BufferStatement> ColumnParallelLinear::buffer_statements(const Shape& input, DType dtype,
                                                                         Shape& out) const {
  if (sequence_ == nullptr || !sequence_->active()) return nn::Linear::buffer_statements(input, dtype, out);
  // y of the gathered whole batch (slot 0), dx of this rank's rows (1); the gathered input and the
  // whole input gradient are SequenceParallel's shared buffers.
  std::vector<nn::BufferStatement> b = nn::Linear::buffer_statements(sequence_->whole_shape(in_), dtype, out);
  for (nn::BufferStatement& s : b)
    if (s.slot == 1) s.bytes = numel_of(input) * static_cast<std::int64_t>(size_of(dtype));
  return b;
}

// ---- RowParallelLinear --------------------------------------------------------------------

RowParallelLinear::RowParallelLinear(Communicator& group, std::int64_t in_features, std::int64_t out_features,
                                     nn::LinearOptions options, SequenceParallel* sequence)
    : nn::Linear(part_of(group, in_features, "RowParallelLinear", "in_features"), out_features, options),
      group_(group),
      in_(in_features),
      out_(out_features),
      sequence_(same_group(sequence, group, "RowParallelLinear")) {
  // Columns [r·part, (r+1)·part) of the whole [out, in] weight, drawn as the whole layer's (its
  // fan-in, not the part's); the bias whole.
  weight.init = options.init.spec(static_cast<double>(in_features), static_cast<double>(out_features));
  weight.init_slice = {{out_, in_}, 1, group.rank(), group.size(), {}};
}

std::string RowParallelLinear::describe() const {
  return detail::str("RowParallelLinear(", in_, ", ", out_, ", tp ", group_.size(),
                     sequence_ ? ", sequence-parallel" : "", ")");
}

Tensor RowParallelLinear::forward_bias() const {
  // The bias once: on the group's first rank, before the sum.
  return group_.rank() == 0 ? nn::Linear::forward_bias() : Tensor();
}

Tensor RowParallelLinear::forward_impl(const Tensor& x) {
  if (sequence_ == nullptr || !sequence_->active()) {
    Tensor y = nn::Linear::forward_impl(x);
    reduce_over(group_, y, stream(), describe() + " output");
    return y;
  }
  // This rank's part of the sum in the shared buffer; this rank's rows of the sum kept.
  x_ = x;
  const Tensor partial = sequence_->whole_buffer(0, out_, x.dtype(), x.device());
  multiply(x, partial);
  Tensor y = buffer(0, sequence_->local_shape(out_), x.dtype());
  sequence_->scatter_sum(partial, y, stream(), describe() + " output");
  return y;
}

std::vector<nn::BufferStatement> RowParallelLinear::buffer_statements(const Shape& input, DType dtype,
                                                                      Shape& out) const {
  std::vector<nn::BufferStatement> b = nn::Linear::buffer_statements(input, dtype, out);
  if (sequence_ == nullptr || !sequence_->active()) return b;
  // y: this rank's rows of the sum (slot 0); the partial sum is SequenceParallel's shared buffer.
  out = sequence_->local_shape(out_);
  for (nn::BufferStatement& s : b)
    if (s.slot == 0) s.bytes = numel_of(out) * static_cast<std::int64_t>(size_of(dtype));
  return b;
}

// Backward is nn::Linear's once every rank has the whole dy (gathered from the rows under
// sequence parallelism): each computes the bias's whole gradient, the same on all, and its
// weight columns' own.
Tensor RowParallelLinear::backward_impl(const Tensor& dy) {
  if (sequence_ == nullptr || !sequence_->active()) return nn::Linear::backward_impl(dy);
  TUTTI_CHECK_ARG(x_.defined(), describe(), ": backward before forward");
  const Tensor whole = sequence_->gather(dy, 0, stream(), describe() + " output gradient");
  Tensor dx = input_grad_needed() ? buffer(1, x_.shape(), x_.dtype()) : Tensor();
  multiply_backward(x_, whole, dx);
  return dx;
}

// ---- whole tensors of split parameters ------------------------------------------------------

StateDict whole_state_dict(const StateDict& mine, nn::Module& model, Communicator& group) {
  const std::vector<nn::Parameter*> params = model.parameters();
  StateDict out;
  // The split entries (every rank has the same, in key order), gathered in batches of at most
  // kBatchBytes of this rank's slices: one allgather per batch rather than per tensor, and no
  // more than tp x kBatchBytes on the device at once.
  constexpr std::int64_t kBatchBytes = 64 << 20;
  struct Split {
    std::string key;
    const nn::Parameter* param;
    Tensor slice;
  };
  std::vector<Split> batch;
  std::int64_t batch_numel = 0;
  const Stream& stream = model.stream();
  auto gather_batch = [&] {
    if (batch.empty()) return;
    // Every rank's slices back to back (in rank order, each rank's in key order), gathered on
    // the model's device (the group serves it: nccl takes no host tensors), then each put in
    // its place on the host.
    const Tensor flat = Tensor::empty({batch_numel}, DType::f32, model.device());
    std::int64_t at = 0;
    for (const Split& e : batch) {
      flat.view(at, {e.slice.numel()}).copy_from(e.slice.reshape({e.slice.numel()}), stream);
      at += e.slice.numel();
    }
    const Tensor gathered = Tensor::empty({group.size() * batch_numel}, DType::f32, model.device());
    CallOptions call;
    call.label = "whole_state_dict of " + std::to_string(batch.size()) + " tensor(s) from '" + batch.front().key + "'";
    call.stream = stream;
    group.allgather(flat, gathered, call).wait(stream);
    // On the CPU the gathered tensor is the host's already: no copy of tp x the batch.
    const Tensor host = gathered.device().is_cpu() ? gathered : gathered.to(Device::cpu(), stream);
    stream.synchronize();
    at = 0;
    for (const Split& e : batch) {
      const nn::Parameter::InitSlice& s = e.param->init_slice;
      const Tensor whole = Tensor::empty(s.full, DType::f32);
      for (int r = 0; r < group.size(); ++r) {
        nn::Parameter::InitSlice of_r = s;
        of_r.part = r;
        nn::put_slice(host.view(r * batch_numel + at, e.param->shape()), of_r, whole);
      }
      out[e.key] = whole;
      at += e.slice.numel();
    }
    batch.clear();
    batch_numel = 0;
  };
  for (const auto& [key, t] : mine) {
    const nn::Parameter* p = split_owner(params, key);
    if (p == nullptr || t.shape() != p->shape()) {
      out[key] = t;
      continue;
    }
    const nn::Parameter::InitSlice& s = p->init_slice;
    TUTTI_CHECK_ARG(s.part == group.rank() && s.parts == group.size(), "whole_state_dict: '", key, "' holds part ",
                    s.part, " of ", s.parts, ", not rank ", group.rank(), "'s of the group's ", group.size());
    TUTTI_CHECK_ARG(t.dtype() == DType::f32, "whole_state_dict: '", key, "' is ", t.str(), ", not f32");
    if (batch_numel > 0 && (batch_numel + t.numel()) * 4 > kBatchBytes) gather_batch();
    batch.push_back({key, p, t});
    batch_numel += t.numel();
  }
  gather_batch();
  return out;
}

StateDict split_state_dict(const StateDict& whole, nn::Module& model) {
  const std::vector<nn::Parameter*> params = model.parameters();
  StateDict out;
  for (const auto& [key, t] : whole) {
    const nn::Parameter* p = split_owner(params, key);
    if (p == nullptr) {
      out[key] = t;
      continue;
    }
    const nn::Parameter::InitSlice& s = p->init_slice;
    TUTTI_CHECK_ARG(t.shape() == s.full, "split_state_dict: '", key, "' is ", t.str(), ", not the whole ", p->name,
                    " (", shape_str(s.full), ")");
    TUTTI_CHECK_ARG(t.dtype() == DType::f32, "split_state_dict: '", key, "' is ", t.str(), ", not f32");
    const Tensor part = Tensor::empty(p->shape(), DType::f32);
    nn::take_slice(t.to(Device::cpu()), s, part);
    out[key] = part;
  }
  return out;
}

optim::GradNorm grad_norm(ddp::DistributedDataParallel& ddp, Communicator& group, double max_norm) {
  TUTTI_CHECK_ARG(max_norm > 0, "parallel::grad_norm: max_norm must be positive, got ", max_norm);
  TUTTI_CHECK(ddp.reducer().phase() == ddp::Reducer::Phase::reduced || ddp.options().deterministic,
              "parallel::grad_norm: call it after a backward that completed a step (the gradients are not reduced "
              "yet)");
  nn::Module& model = ddp.module();
  const Stream& stream = model.stream();
  // [0]: the split parameters' squares (this rank's slices), [1]: the replicated ones'.
  const Tensor squares = Tensor::zeros({2}, DType::f32, model.device());
  const Tensor split = squares.view(0, {1}), replicated = squares.view(1, {1});
  // Whole gradients on every rank: unsharded, or the deterministic mode's exact sums (ZeRO-1 too).
  if (!ddp.sharded() || ddp.options().deterministic) {
    for (nn::Parameter* p : model.parameters()) {
      if (!p->requires_grad || !p->grad.defined()) continue;
      kernels::sum_squares(p->grad, p->init_slice.full.empty() ? replicated : split, /*accumulate=*/true, stream);
    }
  } else {
    // ZeRO: this rank's chunk of each bucket, cut at the entries' bounds, then the sum over the
    // data-parallel ranks (the chunks of all of them hold every element once).
    std::map<std::string, const nn::Parameter*> by_name;
    for (const nn::Parameter* p : model.parameters()) by_name[p->name] = p;
    const ddp::Reducer& reducer = ddp.reducer();
    const nn::FlatPlan& plan = reducer.plan();
    const int dp_rank = reducer.communicator().rank();
    for (int b = 0; b < reducer.bucket_count(); ++b) {
      const nn::PlanBucket& pb = plan.buckets[static_cast<std::size_t>(b)];
      const nn::ElementRange chunk = pb.chunk_of(dp_rank);
      const Tensor g = reducer.shard_grad(b);
      for (std::size_t i : pb.entries) {
        const nn::PlanEntry& e = plan.entries[i];
        const nn::ElementRange mine = plan.owned_part(e, dp_rank);
        if (!e.requires_grad || mine.size() == 0) continue;
        const auto p = by_name.find(e.name);
        const bool is_split = p != by_name.end() && !p->second->init_slice.full.empty();
        kernels::sum_squares(g.view(mine.begin - chunk.begin, {mine.size()}), is_split ? split : replicated,
                             /*accumulate=*/true, stream);
      }
    }
    reduce_over(reducer.communicator(), squares, stream, "parallel::grad_norm over the data-parallel ranks");
  }
  reduce_over(group, split, stream, "parallel::grad_norm");
  stream.synchronize();
  optim::GradNorm out;
  const std::vector<float> sq = squares.to(Device::cpu()).to_floats();
  out.norm = std::sqrt(static_cast<double>(sq[0]) + static_cast<double>(sq[1]));
  out.finite = std::isfinite(out.norm);
  out.coefficient = optim::clip_coefficient(out.norm, max_norm);
  return out;
}

}  // namespace tutti::parallel
