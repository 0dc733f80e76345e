#include "tutti/nn/layers.h"

#include <bit>
#include <optional>

#include "nn/slices.h"
#include "tutti/core/trace.h"
#include "tutti/kernels/conv.h"
#include "tutti/kernels/elementwise.h"
#include "tutti/kernels/layernorm.h"
#include "tutti/kernels/linear.h"
#include "tutti/kernels/rmsnorm.h"

namespace tutti::nn {

namespace {
using Kind = BufferStatement::Kind;
// A dtype's bytes, as the buffer statements count them.
std::int64_t dtype_bytes(DType d) { return static_cast<std::int64_t>(size_of(d)); }
// `numel` elements of `dtype` in `slot`.
BufferStatement statement(int slot, std::int64_t numel, DType dtype, Kind kind) {
  return {slot, numel * dtype_bytes(dtype), kind};
}
}  // namespace

InitSpec WeightInit::spec(double fan_in, double fan_out) const {
  switch (kind) {
    case Kind::kaiming_uniform: return InitSpec::kaiming_uniform(fan_in);
    case Kind::xavier_uniform: return InitSpec::xavier_uniform(fan_in, fan_out);
    case Kind::normal: break;
  }
  TUTTI_CHECK_ARG(stddev > 0, "WeightInit::normal: the standard deviation must be positive, got ", stddev);
  return InitSpec::normal(stddev);
}

// ---- Linear ----------------------------------------------------------------------------

Linear::Linear(std::int64_t in_features, std::int64_t out_features, LinearOptions options)
    : weight({out_features, in_features},
             options.init.spec(static_cast<double>(in_features), static_cast<double>(out_features))),
      bias({options.bias ? out_features : 0}, InitSpec::zeros()),
      in_(in_features),
      out_(out_features),
      has_bias_(options.bias) {
  TUTTI_CHECK_ARG(in_features > 0 && out_features > 0, "Linear(", in_features, ", ", out_features,
                  "): sizes must be positive");
  bias.no_weight_decay = true;
  register_parameter("weight", weight);
  if (has_bias_) register_parameter("bias", bias);
}

std::string Linear::describe() const { return detail::str("Linear(", in_, ", ", out_, ")"); }

Tensor Linear::forward_impl(const Tensor& x) {
  TUTTI_CHECK_ARG(x.ndim() >= 1 && x.dim(-1) == in_, describe(), ": input ", x.str(), " must end in ", in_);
  x_ = x;
  Tensor y = buffer(0, with_last(x.shape(), out_), x.dtype());
  multiply(x, y);
  return y;
}

Tensor Linear::backward_impl(const Tensor& dy) {
  TUTTI_CHECK_ARG(x_.defined(), describe(), ": backward before forward");
  Tensor dx = input_grad_needed() ? buffer(1, x_.shape(), x_.dtype()) : Tensor();
  multiply_backward(x_, dy, dx);
  return dx;
}

void Linear::multiply(const Tensor& x, const Tensor& y) {
  TUTTI_CHECK_ARG(x.ndim() >= 1 && x.dim(-1) == in_, describe(), ": input ", x.str(), " must end in ", in_);
  kernels::linear_forward(as_rows(x, in_), weight.compute_value(), forward_bias(), as_rows(y, out_), stream());
}

void Linear::multiply_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  TUTTI_CHECK_ARG(dy.numel() == x.numel() / in_ * out_, describe(), ": dy ", dy.str(), " does not match the output");
  // The kernel always writes dw: a frozen weight gets a scratch buffer.
  Tensor dw = weight.requires_grad ? grad_of(weight) : buffer(2, weight.shape(), grad_dtype());
  Tensor db = has_bias_ && bias.requires_grad ? grad_of(bias) : Tensor();
  kernels::linear_backward(as_rows(x, in_), weight.compute_value(), as_rows(dy, out_),
                           dx.defined() ? as_rows(dx, in_) : Tensor(), dw, db, /*accumulate_params=*/true, stream());
  // Reverse registration order, the order in which gradients become ready model-wide.
  if (db.defined()) grad_ready(bias);
  if (weight.requires_grad) grad_ready(weight);
}

std::vector<BufferStatement> Linear::buffer_statements(const Shape& input, DType dtype, Shape& out) const {
  out = input;
  out.back() = out_;
  // y (slot 0); dx where the input needs a gradient (1); a frozen weight's scratch gradient (2).
  std::vector<BufferStatement> b{statement(0, numel_of(out), dtype, Kind::output)};
  if (input_grad_needed()) b.push_back(statement(1, numel_of(input), dtype, Kind::backward));
  if (!weight.requires_grad) b.push_back(statement(2, weight.numel(), grad_dtype(), Kind::backward));
  return b;
}

// ---- ReLU, GELU ------------------------------------------------------------------------

Tensor ReLU::forward_impl(const Tensor& x) {
  x_ = x;
  Tensor y = buffer(0, x.shape(), x.dtype());
  kernels::relu_forward(x, y, stream());
  return y;
}

Tensor ReLU::backward_impl(const Tensor& dy) {
  TUTTI_CHECK_ARG(x_.defined(), "ReLU: backward before forward");
  if (!input_grad_needed()) return Tensor();
  Tensor dx = buffer(1, x_.shape(), x_.dtype());
  kernels::relu_backward(x_, dy.reshape(x_.shape()), dx, stream());
  return dx;
}

namespace {
// An elementwise layer's: y (slot 0) of `out`, and dx (1) of `input` where the input needs a gradient.
std::vector<BufferStatement> output_and_input_grad(const Module& m, const Shape& input, const Shape& out, DType dtype) {
  std::vector<BufferStatement> b{statement(0, numel_of(out), dtype, Kind::output)};
  if (m.input_grad_needed()) b.push_back(statement(1, numel_of(input), dtype, Kind::backward));
  return b;
}
}  // namespace

std::vector<BufferStatement> ReLU::buffer_statements(const Shape& input, DType dtype, Shape& out) const {
  out = input;
  return output_and_input_grad(*this, input, out, dtype);
}

Tensor GELU::forward_impl(const Tensor& x) {
  x_ = x;
  Tensor y = buffer(0, x.shape(), x.dtype());
  kernels::gelu_forward(x, y, stream());
  return y;
}

Tensor GELU::backward_impl(const Tensor& dy) {
  TUTTI_CHECK_ARG(x_.defined(), "GELU: backward before forward");
  if (!input_grad_needed()) return Tensor();
  Tensor dx = buffer(1, x_.shape(), x_.dtype());
  kernels::gelu_backward(x_, dy.reshape(x_.shape()), dx, stream());
  return dx;
}

std::vector<BufferStatement> GELU::buffer_statements(const Shape& input, DType dtype, Shape& out) const {
  out = input;
  return output_and_input_grad(*this, input, out, dtype);
}

Tensor SwiGLU::forward_impl(const Tensor& x) {
  TUTTI_CHECK_ARG(x.ndim() >= 1 && x.dim(-1) % 2 == 0, "SwiGLU: input ", x.str(), " must be [..., 2F] ([gate | up])");
  x_ = x;
  Tensor y = buffer(0, with_last(x.shape(), x.dim(-1) / 2), x.dtype());
  kernels::swiglu_forward(x, y, stream());
  return y;
}

Tensor SwiGLU::backward_impl(const Tensor& dy) {
  TUTTI_CHECK_ARG(x_.defined(), "SwiGLU: backward before forward");
  if (!input_grad_needed()) return Tensor();
  Tensor dx = buffer(1, x_.shape(), x_.dtype());
  kernels::swiglu_backward(x_, dy.reshape(with_last(x_.shape(), x_.dim(-1) / 2)), dx, stream());
  return dx;
}

std::vector<BufferStatement> SwiGLU::buffer_statements(const Shape& input, DType dtype, Shape& out) const {
  TUTTI_CHECK_ARG(!input.empty() && input.back() % 2 == 0, "SwiGLU::buffer_statements: the input is [..., 2F]");
  out = with_last(input, input.back() / 2);
  return output_and_input_grad(*this, input, out, dtype);
}

Flops SwiGLU::flops(const Shape& sample, Shape& out) const {
  TUTTI_CHECK_ARG(!sample.empty() && sample.back() % 2 == 0, "SwiGLU::flops: a sample is [..., 2F]");
  out = with_last(sample, sample.back() / 2);
  return {};
}

// ---- Dropout ---------------------------------------------------------------------------

Dropout::Dropout(float p) : p_(p) { TUTTI_CHECK_ARG(p >= 0.0f && p < 1.0f, "Dropout: p must be in [0, 1), got ", p); }

std::string Dropout::describe() const { return detail::str("Dropout(", p_, ")"); }

void Dropout::on_init(std::uint64_t seed) {
  seed_ = seed;
  counter_ = 0;
}

StateDict Dropout::own_extra_state() const {
  return {{"rng_seed", int_scalar_tensor(std::bit_cast<std::int64_t>(seed_))},
          {"rng_counter", int_scalar_tensor(std::bit_cast<std::int64_t>(counter_))}};
}

void Dropout::load_own_extra_state(const StateDict& state) {
  seed_ = std::bit_cast<std::uint64_t>(get_int_scalar(state, "rng_seed"));
  counter_ = std::bit_cast<std::uint64_t>(get_int_scalar(state, "rng_counter"));
}

Tensor Dropout::forward_impl(const Tensor& x) {
  last_dropped_ = is_training() && p_ > 0.0f;
  if (!last_dropped_) return x;
  // This rank's rows are slice `batch_slice` of `batch_slices` equal ones: its elements come
  // that many whole slices into the global batch, which is `batch_slices` times its size.
  // A checkpointed module's replay in backward (Residual::set_recompute) draws the mask of the
  // forward it replays: same offset, and the counter stays where that forward left it.
  if (!settings().recomputing) {
    const auto n = static_cast<std::uint64_t>(x.numel());
    last_offset_ = counter_ + static_cast<std::uint64_t>(settings().batch_slice) * n;
    counter_ += static_cast<std::uint64_t>(settings().batch_slices) * n;
  }
  Tensor y = buffer(0, x.shape(), x.dtype());
  kernels::dropout_forward(x, p_, seed_, last_offset_, y, stream());
  return y;
}

Tensor Dropout::backward_impl(const Tensor& dy) {
  if (!input_grad_needed()) return Tensor();
  if (!last_dropped_) return dy;
  Tensor dx = buffer(1, dy.shape(), dy.dtype());
  kernels::dropout_backward(dy, p_, seed_, last_offset_, dx, stream());
  return dx;
}

std::vector<BufferStatement> Dropout::buffer_statements(const Shape& input, DType dtype, Shape& out) const {
  out = input;
  if (!is_training() || p_ <= 0.0f) return {};  // the identity
  return output_and_input_grad(*this, input, out, dtype);
}

// ---- LayerNorm -------------------------------------------------------------------------

LayerNorm::LayerNorm(std::int64_t dim, float eps)
    : gamma({dim}, InitSpec::ones()), beta({dim}, InitSpec::zeros()), dim_(dim), eps_(eps) {
  TUTTI_CHECK_ARG(dim > 0, "LayerNorm(", dim, "): dim must be positive");
  gamma.no_weight_decay = beta.no_weight_decay = true;
  register_parameter("gamma", gamma);
  register_parameter("beta", beta);
}

std::string LayerNorm::describe() const { return detail::str("LayerNorm(", dim_, ")"); }

Tensor LayerNorm::forward_impl(const Tensor& x) {
  TUTTI_CHECK_ARG(x.ndim() >= 1 && x.dim(-1) == dim_, describe(), ": input ", x.str(), " must end in ", dim_);
  const std::int64_t rows = x.numel() / dim_;
  x_ = x;
  Tensor y = buffer(0, x.shape(), x.dtype());
  mean_ = buffer(1, {rows}, DType::f32);
  rstd_ = buffer(2, {rows}, DType::f32);
  kernels::layernorm_forward(as_rows(x, dim_), gamma.compute_value(), beta.compute_value(), eps_, as_rows(y, dim_),
                             mean_, rstd_, stream());
  return y;
}

Tensor LayerNorm::backward_impl(const Tensor& dy) {
  TUTTI_CHECK_ARG(x_.defined(), describe(), ": backward before forward");
  // The kernel always writes dx and both parameter gradients: scratch where not wanted, and all
  // of [dgamma | dbeta] where they cover only some rows of the batch (summed, then added).
  const bool partial = partial_rows();
  const Tensor partial_grads = partial ? buffer(6, {2, dim_}, grad_dtype()) : Tensor();
  Tensor dx = buffer(3, x_.shape(), x_.dtype());
  Tensor dgamma = partial               ? partial_grads.view(0, {dim_})
                  : gamma.requires_grad ? grad_of(gamma)
                                        : buffer(4, gamma.shape(), grad_dtype());
  Tensor dbeta = partial              ? partial_grads.view(dim_, {dim_})
                 : beta.requires_grad ? grad_of(beta)
                                      : buffer(5, beta.shape(), grad_dtype());
  kernels::layernorm_backward(as_rows(x_, dim_), gamma.compute_value(), mean_, rstd_, as_rows(dy, dim_),
                              as_rows(dx, dim_), dgamma, dbeta, /*accumulate_params=*/!partial, stream());
  if (partial) {
    sum_partial_grads(partial_grads);
    if (beta.requires_grad) {
      const Tensor& g = grad_of(beta);
      kernels::add(g, dbeta, g, stream());
    }
    if (gamma.requires_grad) {
      const Tensor& g = grad_of(gamma);
      kernels::add(g, dgamma, g, stream());
    }
  }
  if (beta.requires_grad) grad_ready(beta);
  if (gamma.requires_grad) grad_ready(gamma);
  return input_grad_needed() ? dx : Tensor();
}

std::vector<BufferStatement> LayerNorm::buffer_statements(const Shape& input, DType dtype, Shape& out) const {
  out = input;
  const std::int64_t rows = numel_of(input) / dim_;
  // y (slot 0), mean and rstd (1, 2: f32 per row), dx (3); where the rows are some of the batch's,
  // [dgamma | dbeta] (6); else frozen gamma and beta a scratch each (4, 5).
  std::vector<BufferStatement> b{
      statement(0, numel_of(input), dtype, Kind::output), statement(1, rows, DType::f32, Kind::saved),
      statement(2, rows, DType::f32, Kind::saved), statement(3, numel_of(input), dtype, Kind::backward)};
  if (partial_rows()) {
    b.push_back(statement(6, 2 * dim_, grad_dtype(), Kind::backward));
  } else {
    if (!gamma.requires_grad) b.push_back(statement(4, dim_, grad_dtype(), Kind::backward));
    if (!beta.requires_grad) b.push_back(statement(5, dim_, grad_dtype(), Kind::backward));
  }
  return b;
}

// ---- RMSNorm ---------------------------------------------------------------------------

RMSNorm::RMSNorm(std::int64_t dim, float eps) : weight({dim}, InitSpec::ones()), dim_(dim), eps_(eps) {
  TUTTI_CHECK_ARG(dim > 0 && eps >= 0.0f, "RMSNorm(", dim, ", eps ", eps, "): dim must be positive, eps >= 0");
  weight.no_weight_decay = true;
  register_parameter("weight", weight);
}

std::string RMSNorm::describe() const { return detail::str("RMSNorm(", dim_, ")"); }

Tensor RMSNorm::forward_impl(const Tensor& x) {
  TUTTI_CHECK_ARG(x.ndim() >= 1 && x.dim(-1) == dim_, describe(), ": input ", x.str(), " must end in ", dim_);
  x_ = x;
  Tensor y = buffer(0, x.shape(), x.dtype());
  rstd_ = buffer(1, {x.numel() / dim_}, DType::f32);
  kernels::rmsnorm_forward(as_rows(x, dim_), weight.compute_value(), eps_, as_rows(y, dim_), rstd_, stream());
  return y;
}

Tensor RMSNorm::backward_impl(const Tensor& dy) {
  TUTTI_CHECK_ARG(x_.defined(), describe(), ": backward before forward");
  Tensor dx = buffer(2, x_.shape(), x_.dtype());
  // Where the rows are only some of the batch's, the weight's gradient goes to scratch, is
  // summed (sum_partial_grads), then added.
  const bool partial = partial_rows() && weight.requires_grad;
  const Tensor dw = partial                ? buffer(3, weight.shape(), grad_dtype())
                    : weight.requires_grad ? grad_of(weight)
                                           : Tensor();
  kernels::rmsnorm_backward(as_rows(x_, dim_), weight.compute_value(), rstd_, as_rows(dy, dim_), as_rows(dx, dim_), dw,
                            /*accumulate_params=*/!partial, stream());
  if (partial) {
    sum_partial_grads(dw);
    const Tensor& g = grad_of(weight);
    kernels::add(g, dw, g, stream());
  }
  if (weight.requires_grad) grad_ready(weight);
  return input_grad_needed() ? dx : Tensor();
}

std::vector<BufferStatement> RMSNorm::buffer_statements(const Shape& input, DType dtype, Shape& out) const {
  out = input;
  // y (slot 0), rstd (1: f32 per row), dx (2); where the rows are some of the batch's, the
  // weight's partial gradient (3).
  std::vector<BufferStatement> b{statement(0, numel_of(input), dtype, Kind::output),
                                 statement(1, numel_of(input) / dim_, DType::f32, Kind::saved),
                                 statement(2, numel_of(input), dtype, Kind::backward)};
  if (partial_rows() && weight.requires_grad) b.push_back(statement(3, dim_, grad_dtype(), Kind::backward));
  return b;
}

// ---- Conv2d ----------------------------------------------------------------------------

Conv2d::Conv2d(std::int64_t in_channels, std::int64_t out_channels, int kernel_size, Conv2dOptions options)
    : weight({out_channels, in_channels, kernel_size, kernel_size},
             options.init.spec(static_cast<double>(in_channels) * kernel_size * kernel_size,
                               static_cast<double>(out_channels) * kernel_size * kernel_size)),
      bias({options.bias ? out_channels : 0}, InitSpec::zeros()),
      in_(in_channels),
      out_(out_channels),
      kernel_(kernel_size),
      params_{options.stride, options.padding},
      has_bias_(options.bias) {
  TUTTI_CHECK_ARG(in_channels > 0 && out_channels > 0 && kernel_size > 0 && options.stride > 0 && options.padding >= 0,
                  "Conv2d(", in_channels, ", ", out_channels, ", ", kernel_size, ", stride ", options.stride,
                  ", padding ", options.padding, "): sizes must be positive");
  bias.no_weight_decay = true;
  register_parameter("weight", weight);
  if (has_bias_) register_parameter("bias", bias);
}

std::string Conv2d::describe() const {
  return detail::str("Conv2d(", in_, ", ", out_, ", ", kernel_, ", stride ", params_.stride, ", padding ",
                     params_.padding, ")");
}

Tensor Conv2d::forward_impl(const Tensor& x) {
  TUTTI_CHECK_ARG(x.ndim() == 4 && x.dim(1) == in_, describe(), ": input ", x.str(), " must be [N, ", in_, ", H, W]");
  const int p = kernels::conv2d_output_size(static_cast<int>(x.dim(2)), kernel_, params_);
  const int q = kernels::conv2d_output_size(static_cast<int>(x.dim(3)), kernel_, params_);
  TUTTI_CHECK_ARG(p > 0 && q > 0, describe(), ": input ", x.str(), " is smaller than the kernel");
  x_ = x;
  Tensor y = buffer(0, {x.dim(0), out_, p, q}, x.dtype());
  kernels::conv2d_forward(x, weight.compute_value(), has_bias_ ? bias.compute_value() : Tensor(), y, params_, stream());
  return y;
}

Tensor Conv2d::backward_impl(const Tensor& dy) {
  TUTTI_CHECK_ARG(x_.defined(), describe(), ": backward before forward");
  Tensor dx = input_grad_needed() ? buffer(1, x_.shape(), x_.dtype()) : Tensor();
  Tensor dw = weight.requires_grad ? grad_of(weight) : buffer(2, weight.shape(), grad_dtype());
  Tensor db = has_bias_ && bias.requires_grad ? grad_of(bias) : Tensor();
  kernels::conv2d_backward(x_, weight.compute_value(), dy, dx, dw, db, /*accumulate_params=*/true, params_, stream());
  if (db.defined()) grad_ready(bias);
  if (weight.requires_grad) grad_ready(weight);
  return dx;
}

std::vector<BufferStatement> Conv2d::buffer_statements(const Shape& input, DType dtype, Shape& out) const {
  TUTTI_CHECK_ARG(input.size() == 4, describe(), "::buffer_statements: the input is [N, C, H, W], got ",
                  shape_str(input));
  const int p = kernels::conv2d_output_size(static_cast<int>(input[2]), kernel_, params_);
  const int q = kernels::conv2d_output_size(static_cast<int>(input[3]), kernel_, params_);
  out = {input[0], out_, p, q};
  // y (slot 0); dx where the input needs a gradient (1); a frozen weight's scratch gradient (2).
  // The kernels' own scratch is not Module::buffer's: host vectors on the CPU, stream-ordered
  // scratch on a GPU (neither in Storage's count).
  std::vector<BufferStatement> b = output_and_input_grad(*this, input, out, dtype);
  if (!weight.requires_grad) b.push_back(statement(2, weight.numel(), grad_dtype(), Kind::backward));
  return b;
}

// ---- MaxPool2d, Flatten ----------------------------------------------------------------

Tensor MaxPool2d::forward_impl(const Tensor& x) {
  TUTTI_CHECK_ARG(x.ndim() == 4 && x.dim(2) % 2 == 0 && x.dim(3) % 2 == 0, describe(), ": input ", x.str(),
                  " must be [N, C, H, W] with H and W even");
  x_ = x;
  Tensor y = buffer(0, {x.dim(0), x.dim(1), x.dim(2) / 2, x.dim(3) / 2}, x.dtype());
  kernels::maxpool2x2_forward(x, y, stream());
  return y;
}

Tensor MaxPool2d::backward_impl(const Tensor& dy) {
  TUTTI_CHECK_ARG(x_.defined(), describe(), ": backward before forward");
  if (!input_grad_needed()) return Tensor();
  Tensor dx = buffer(1, x_.shape(), x_.dtype());
  kernels::maxpool2x2_backward(x_, dy, dx, stream());
  return dx;
}

std::vector<BufferStatement> MaxPool2d::buffer_statements(const Shape& input, DType dtype, Shape& out) const {
  TUTTI_CHECK_ARG(input.size() == 4, describe(), "::buffer_statements: the input is [N, C, H, W], got ",
                  shape_str(input));
  out = {input[0], input[1], input[2] / 2, input[3] / 2};
  return output_and_input_grad(*this, input, out, dtype);
}

Tensor Flatten::forward_impl(const Tensor& x) {
  TUTTI_CHECK_ARG(x.ndim() >= 1, "Flatten: input must have a batch dimension, got ", x.str());
  in_shape_ = x.shape();
  const std::int64_t n = x.dim(0);
  return x.reshape({n, n == 0 ? 0 : x.numel() / n});
}

Tensor Flatten::backward_impl(const Tensor& dy) {
  if (!input_grad_needed()) return Tensor();
  return dy.reshape(in_shape_);
}

std::vector<BufferStatement> Flatten::buffer_statements(const Shape& input, DType, Shape& out) const {
  out = {input.at(0), input.at(0) == 0 ? 0 : numel_of(input) / input.at(0)};
  return {};  // views, no buffers
}

// ---- Residual --------------------------------------------------------------------------

Residual::Residual() {
  auto body = std::make_unique<Sequential>();
  body_ = body.get();
  register_module("body", std::move(body));
}

Residual::Residual(std::unique_ptr<Module> inner) : Residual() { body_->add(std::move(inner)); }

Residual& Residual::set_recompute(std::shared_ptr<RecomputeWorkspace> workspace) {
  TUTTI_CHECK_ARG(workspace == nullptr || body_->size() > 0,
                  "Residual::set_recompute: the body is empty, so there is nothing to recompute");
  use_workspace(*body_, workspace);
  workspace_ = std::move(workspace);
  x_ = Tensor();
  return *this;
}

Tensor Residual::forward_impl(const Tensor& x) {
  if (workspace_) x_ = x;  // all the backward needs: the body's activations are recomputed from it
  Tensor b = body_->forward(x);
  TUTTI_CHECK_ARG(b.shape() == x.shape(), "Residual: the body turns ", x.str(), " into ", b.str(),
                  "; it must keep the shape");
  Tensor y = buffer(0, x.shape(), x.dtype());
  kernels::add(x, b, y, stream());
  return y;
}

Tensor Residual::backward_impl(const Tensor& dy) {
  if (workspace_) {
    // Replay the body's forward into the workspace (overwriting the last checkpointed body's
    // activations, which nothing needs any more), then its backward as usual. dy is the next
    // layer's own buffer, never the workspace's.
    TUTTI_CHECK_ARG(x_.defined(), describe(), ": backward before forward");
    std::optional<trace::Span> span;
    if (trace::on()) span.emplace("recompute", "forward", stream());
    set_recomputing(true);
    try {
      body_->forward(x_);
    } catch (...) {
      set_recomputing(false);
      throw;
    }
    set_recomputing(false);
  }
  Tensor db = body_->backward(dy);
  if (!input_grad_needed()) return Tensor();
  Tensor dx = buffer(1, dy.shape(), dy.dtype());
  kernels::add(dy, db, dx, stream());
  return dx;
}

std::vector<BufferStatement> Residual::buffer_statements(const Shape& input, DType dtype, Shape& out) const {
  out = input;
  return output_and_input_grad(*this, input, out, dtype);  // y (slot 0), dx (1)
}

std::int64_t Residual::buffer_bytes(const Shape& input, DType dtype, Shape& out) const {
  return Module::buffer_bytes(input, dtype, out) + body_->buffer_bytes(input, dtype, out);
}

// ---- FLOPs (Module::flops) -------------------------------------------------------------------

namespace {
double product(const Shape& s, std::size_t from, std::size_t to) {
  double p = 1;
  for (std::size_t i = from; i < to && i < s.size(); ++i) p *= static_cast<double>(s[i]);
  return p;
}
}  // namespace

Flops Linear::flops(const Shape& sample, Shape& out) const {
  out = sample;
  if (out.empty()) out.push_back(in_);
  out.back() = out_;
  // Every row of the sample (a token of a sequence, or the sample itself) is one [in] x [in, out] product.
  const double rows = sample.empty() ? 1.0 : product(sample, 0, sample.size() - 1);
  const double forward = 2.0 * rows * static_cast<double>(in_) * static_cast<double>(out_);
  return {forward, backward_flops(forward)};
}

Flops Conv2d::flops(const Shape& sample, Shape& out) const {
  TUTTI_CHECK_ARG(sample.size() == 3, describe(), "::flops: a sample is [C, H, W], got ", sample.size(), " dimensions");
  const int p = kernels::conv2d_output_size(static_cast<int>(sample[1]), kernel_, params_);
  const int q = kernels::conv2d_output_size(static_cast<int>(sample[2]), kernel_, params_);
  out = {out_, p, q};
  const double forward = 2.0 * static_cast<double>(out_) * p * q * static_cast<double>(in_) * kernel_ * kernel_;
  return {forward, backward_flops(forward)};
}

Flops MaxPool2d::flops(const Shape& sample, Shape& out) const {
  out = sample;
  if (out.size() >= 2) {
    out[out.size() - 1] /= 2;
    out[out.size() - 2] /= 2;
  }
  return {};
}

Flops Flatten::flops(const Shape& sample, Shape& out) const {
  out = {static_cast<std::int64_t>(product(sample, 0, sample.size()))};
  return {};
}

Flops Residual::flops(const Shape& sample, Shape& out) const { return body_->flops(sample, out); }

}  // namespace tutti::nn
