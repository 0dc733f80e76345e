#include "tutti/parallel/tensor_parallel.h"

#include "tutti/core/error.h"
#include "tutti/kernels/linear.h"

namespace tutti::parallel {

namespace {

// x viewed as [rows, last] (a 2-D matrix over the last dimension).
Tensor as_rows(const Tensor& x, std::int64_t last) { return x.reshape({x.numel() / last, last}); }

Shape with_last(Shape shape, std::int64_t last) {
  shape.back() = last;
  return shape;
}

// The part of `whole` features this rank of `group` holds; InvalidArgument unless it divides.
std::int64_t part_of(const Communicator& group, std::int64_t whole, const char* layer, const char* what) {
  TUTTI_CHECK_ARG(whole > 0 && whole % group.size() == 0, layer, ": ", what, " ", whole,
                  " must divide by the tensor-parallel group's ", group.size(), " rank(s)");
  return whole / group.size();
}

// Sums `t` over the group in place, ordered on `stream` (COLLECTIVE).
void sum_over(Communicator& group, const Tensor& t, const Stream& stream, const std::string& label) {
  if (group.size() == 1) return;
  group.allreduce(t, ReduceOp::sum, {.label = label, .stream = stream}).wait(stream);
}

nn::Flops linear_flops(const nn::Module& m, std::int64_t in, std::int64_t out, const Shape& sample) {
  // Every row of the sample is one [in] x [in, out] product, this rank's share of the layer's.
  double rows = 1;
  for (std::size_t i = 0; i + 1 < sample.size(); ++i) rows *= static_cast<double>(sample[i]);
  const double forward = 2.0 * rows * static_cast<double>(in) * static_cast<double>(out);
  return {forward, m.backward_flops(forward)};
}

}  // namespace

// ---- ColumnParallelLinear -----------------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(Communicator& group, std::int64_t in_features, std::int64_t out_features,
                                           nn::LinearOptions options)
    : weight({part_of(group, out_features, "ColumnParallelLinear", "out_features"), in_features},
             options.init.spec(static_cast<double>(in_features), static_cast<double>(out_features))),
      bias({options.bias ? out_features / group.size() : 0}, nn::InitSpec::zeros()),
      group_(group),
      in_(in_features),
      out_(out_features),
      part_(out_features / group.size()),
      has_bias_(options.bias) {
  TUTTI_CHECK_ARG(in_features > 0, "ColumnParallelLinear(", in_features, ", ", out_features,
                  "): sizes must be positive");
  // Rows [r·part, (r+1)·part) of the whole [out, in] weight and of the bias.
  weight.init_slice = {{out_, in_}, 0, group.rank() * part_};
  bias.init_slice = {{out_}, 0, group.rank() * part_};
  bias.no_weight_decay = true;
  register_parameter("weight", weight);
  if (has_bias_) register_parameter("bias", bias);
}

std::string ColumnParallelLinear::describe() const {
  return detail::str("ColumnParallelLinear(", in_, ", ", out_, ", tp ", group_.size(), ")");
}

nn::Flops ColumnParallelLinear::flops(const Shape& sample, Shape& out) const {
  out = sample;
  if (out.empty()) out.push_back(in_);
  out.back() = part_;
  return linear_flops(*this, in_, part_, sample);
}

Tensor ColumnParallelLinear::forward_impl(const Tensor& x) {
  TUTTI_CHECK_ARG(x.ndim() >= 1 && x.dim(-1) == in_, describe(), ": input ", x.str(), " must end in ", in_);
  x_ = x;
  Tensor y = buffer(0, with_last(x.shape(), part_), x.dtype());
  kernels::linear_forward(as_rows(x, in_), weight.compute_value(), has_bias_ ? bias.compute_value() : Tensor(),
                          as_rows(y, part_), stream());
  return y;
}

Tensor ColumnParallelLinear::backward_impl(const Tensor& dy) {
  TUTTI_CHECK_ARG(x_.defined(), describe(), ": backward before forward");
  TUTTI_CHECK_ARG(dy.numel() == x_.numel() / in_ * part_, describe(), ": dy ", dy.str(), " does not match the output");
  Tensor dx = input_grad_needed() ? buffer(1, x_.shape(), x_.dtype()) : Tensor();
  Tensor dw = weight.requires_grad ? grad_of(weight) : buffer(2, weight.shape(), grad_dtype());
  Tensor db = has_bias_ && bias.requires_grad ? grad_of(bias) : Tensor();
  kernels::linear_backward(as_rows(x_, in_), weight.compute_value(), as_rows(dy, part_),
                           dx.defined() ? as_rows(dx, in_) : Tensor(), dw, db, /*accumulate_params=*/true, stream());
  if (db.defined()) grad_ready(bias);
  if (weight.requires_grad) grad_ready(weight);
  // Each rank's features contributed their part of the input gradient: the sum is the whole.
  if (dx.defined()) sum_over(group_, dx, stream(), describe() + " input gradient");
  return dx;
}

// ---- RowParallelLinear --------------------------------------------------------------------

RowParallelLinear::RowParallelLinear(Communicator& group, std::int64_t in_features, std::int64_t out_features,
                                     nn::LinearOptions options)
    : weight({out_features, part_of(group, in_features, "RowParallelLinear", "in_features")},
             options.init.spec(static_cast<double>(in_features), static_cast<double>(out_features))),
      bias({options.bias ? out_features : 0}, nn::InitSpec::zeros()),
      group_(group),
      in_(in_features),
      out_(out_features),
      part_(in_features / group.size()),
      has_bias_(options.bias) {
  TUTTI_CHECK_ARG(out_features > 0, "RowParallelLinear(", in_features, ", ", out_features, "): sizes must be positive");
  // Columns [r·part, (r+1)·part) of the whole [out, in] weight; the bias whole.
  weight.init_slice = {{out_, in_}, 1, group.rank() * part_};
  bias.no_weight_decay = true;
  register_parameter("weight", weight);
  if (has_bias_) register_parameter("bias", bias);
}

std::string RowParallelLinear::describe() const {
  return detail::str("RowParallelLinear(", in_, ", ", out_, ", tp ", group_.size(), ")");
}

nn::Flops RowParallelLinear::flops(const Shape& sample, Shape& out) const {
  out = sample;
  if (out.empty()) out.push_back(part_);
  out.back() = out_;
  return linear_flops(*this, part_, out_, sample);
}

Tensor RowParallelLinear::forward_impl(const Tensor& x) {
  TUTTI_CHECK_ARG(x.ndim() >= 1 && x.dim(-1) == part_, describe(), ": input ", x.str(), " must end in ", part_,
                  " (this rank's ", part_, " of ", in_, " features)");
  x_ = x;
  Tensor y = buffer(0, with_last(x.shape(), out_), x.dtype());
  // The bias once: on the group's first rank, before the sum.
  const bool add_bias = has_bias_ && group_.rank() == 0;
  kernels::linear_forward(as_rows(x, part_), weight.compute_value(), add_bias ? bias.compute_value() : Tensor(),
                          as_rows(y, out_), stream());
  sum_over(group_, y, stream(), describe() + " output");
  return y;
}

Tensor RowParallelLinear::backward_impl(const Tensor& dy) {
  TUTTI_CHECK_ARG(x_.defined(), describe(), ": backward before forward");
  TUTTI_CHECK_ARG(dy.numel() == x_.numel() / part_ * out_, describe(), ": dy ", dy.str(), " does not match the output");
  Tensor dx = input_grad_needed() ? buffer(1, x_.shape(), x_.dtype()) : Tensor();
  Tensor dw = weight.requires_grad ? grad_of(weight) : buffer(2, weight.shape(), grad_dtype());
  // Every rank has the whole dy: each computes the bias's whole gradient, the same on all.
  Tensor db = has_bias_ && bias.requires_grad ? grad_of(bias) : Tensor();
  kernels::linear_backward(as_rows(x_, part_), weight.compute_value(), as_rows(dy, out_),
                           dx.defined() ? as_rows(dx, part_) : Tensor(), dw, db, /*accumulate_params=*/true, stream());
  if (db.defined()) grad_ready(bias);
  if (weight.requires_grad) grad_ready(weight);
  return dx;
}

}  // namespace tutti::parallel
