#include "tutti/nn/transformer.h"

#include "tutti/kernels/attention.h"
#include "tutti/kernels/embedding.h"
#include "tutti/kernels/linear.h"

namespace tutti::nn {

namespace {

Tensor as_rows(const Tensor& x, std::int64_t last) { return x.reshape({x.numel() / last, last}); }

Shape with_last(Shape shape, std::int64_t last) {
  shape.back() = last;
  return shape;
}

}  // namespace

// ---- TokenPositionEmbedding --------------------------------------------------------------

TokenPositionEmbedding::TokenPositionEmbedding(std::int64_t vocab, std::int64_t context, std::int64_t width)
    : wte({vocab, width}, InitSpec::normal(0.02)),
      wpe({context, width}, InitSpec::normal(0.02)),
      vocab_(vocab),
      context_(context),
      width_(width) {
  TUTTI_CHECK_ARG(vocab > 0 && context > 0 && width > 0, "TokenPositionEmbedding(", vocab, ", ", context, ", ", width,
                  "): sizes must be positive");
  wte.no_weight_decay = wpe.no_weight_decay = true;  // GPT-2's and nanoGPT's recipe
  register_parameter("wte", wte);
  register_parameter("wpe", wpe);
}

std::string TokenPositionEmbedding::describe() const {
  return detail::str("TokenPositionEmbedding(vocab ", vocab_, ", context ", context_, ", width ", width_, ")");
}

Tensor TokenPositionEmbedding::forward_impl(const Tensor& tokens) {
  TUTTI_CHECK_ARG(tokens.ndim() == 2 && tokens.dtype() == DType::i32 && tokens.dim(1) <= context_, describe(),
                  ": tokens must be [B, T <= ", context_, "] i32, got ", tokens.str());
  tokens_ = tokens;
  Tensor y = buffer(0, {tokens.dim(0), tokens.dim(1), width_}, compute_dtype());
  kernels::embedding_forward(tokens, wte.compute_value(), wpe.compute_value(), y, stream());
  return y;
}

Tensor TokenPositionEmbedding::backward_impl(const Tensor& dy) {
  TUTTI_CHECK_ARG(tokens_.defined(), describe(), ": backward before forward");
  const Tensor dwte = wte.requires_grad ? grad_of(wte) : Tensor();
  const Tensor dwpe = wpe.requires_grad ? grad_of(wpe) : Tensor();
  if (dwte.defined() || dwpe.defined()) {
    kernels::embedding_backward(tokens_, dy.reshape({tokens_.dim(0), tokens_.dim(1), width_}), dwte, dwpe,
                                /*accumulate_params=*/true, stream());
  }
  // Reverse registration order. wte's gradient may also hold a tied head's share (TiedLinear):
  // it is complete only now.
  if (wpe.requires_grad) grad_ready(wpe);
  if (wte.requires_grad) grad_ready(wte);
  return Tensor();  // token ids have no gradient
}

// ---- CausalSelfAttention -----------------------------------------------------------------

CausalSelfAttention::CausalSelfAttention(std::int64_t heads) : heads_(heads) {
  TUTTI_CHECK_ARG(heads > 0, "CausalSelfAttention(", heads, "): heads must be positive");
}

std::string CausalSelfAttention::describe() const { return detail::str("CausalSelfAttention(heads ", heads_, ")"); }

Tensor CausalSelfAttention::forward_impl(const Tensor& qkv) {
  TUTTI_CHECK_ARG(qkv.ndim() == 3 && qkv.dim(2) % (3 * heads_) == 0, describe(), ": input must be [B, T, 3C] with ",
                  heads_, " heads dividing C, got ", qkv.str());
  const std::int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3;
  qkv_ = qkv;
  Tensor y = buffer(0, {B, T, C}, qkv.dtype());
  probs_ = buffer(1, {B, heads_, T, T}, qkv.dtype());
  kernels::attention_forward(qkv, heads_, y, probs_, stream());
  return y;
}

Tensor CausalSelfAttention::backward_impl(const Tensor& dy) {
  TUTTI_CHECK_ARG(qkv_.defined(), describe(), ": backward before forward");
  if (!input_grad_needed()) return Tensor();
  Tensor dqkv = buffer(2, qkv_.shape(), qkv_.dtype());
  kernels::attention_backward(qkv_, probs_, dy.reshape({qkv_.dim(0), qkv_.dim(1), qkv_.dim(2) / 3}), heads_, dqkv,
                              stream());
  return dqkv;
}

// ---- TiedLinear ----------------------------------------------------------------------------

TiedLinear::TiedLinear(Parameter& weight) : weight_(weight) {
  TUTTI_CHECK_ARG(weight.shape().size() == 2, "TiedLinear: the weight must be [out, in], got ",
                  shape_str(weight.shape()));
}

std::string TiedLinear::describe() const {
  return detail::str("TiedLinear(", weight_.shape()[1], ", ", weight_.shape()[0], ", weight ",
                     weight_.name.empty() ? "shared" : weight_.name, ")");
}

Tensor TiedLinear::forward_impl(const Tensor& x) {
  const std::int64_t in = weight_.shape()[1], out = weight_.shape()[0];
  TUTTI_CHECK_ARG(x.ndim() >= 1 && x.dim(-1) == in, describe(), ": input ", x.str(), " must end in ", in);
  x_ = x;
  Tensor y = buffer(0, with_last(x.shape(), out), x.dtype());
  kernels::linear_forward(as_rows(x, in), weight_.compute_value(), Tensor(), as_rows(y, out), stream());
  return y;
}

Tensor TiedLinear::backward_impl(const Tensor& dy) {
  TUTTI_CHECK_ARG(x_.defined(), describe(), ": backward before forward");
  const std::int64_t in = weight_.shape()[1], out = weight_.shape()[0];
  Tensor dx = input_grad_needed() ? buffer(1, x_.shape(), x_.dtype()) : Tensor();
  Tensor dw = weight_.requires_grad ? grad_of(weight_) : buffer(2, weight_.shape(), grad_dtype());
  kernels::linear_backward(as_rows(x_, in), weight_.compute_value(), as_rows(dy, out),
                           dx.defined() ? as_rows(dx, in) : Tensor(), dw, Tensor(), /*accumulate_params=*/true,
                           stream());
  // No grad_ready: the weight's owner reports it once its own share is added.
  return dx;
}

// ---- FLOPs (Module::flops) -------------------------------------------------------------------

Flops TokenPositionEmbedding::flops(const Shape& sample, Shape& out) const {
  out = sample;
  out.push_back(width_);
  return {};
}

Flops CausalSelfAttention::flops(const Shape& sample, Shape& out) const {
  TUTTI_CHECK_ARG(sample.size() == 2 && sample[1] % 3 == 0, describe(), "::flops: a sample is [T, 3C]");
  const double t = static_cast<double>(sample[0]), c = static_cast<double>(sample[1] / 3);
  out = {sample[0], sample[1] / 3};
  const double forward = 4.0 * t * t * c;
  return {forward, 2.0 * forward};
}

Flops TiedLinear::flops(const Shape& sample, Shape& out) const {
  const Shape& w = weight_.shape();  // [out, in]
  out = sample;
  if (out.empty()) out.push_back(w[1]);
  out.back() = w[0];
  double rows = 1;
  for (std::size_t i = 0; i + 1 < sample.size(); ++i) rows *= static_cast<double>(sample[i]);
  const double forward = 2.0 * rows * static_cast<double>(w[0]) * static_cast<double>(w[1]);
  return {forward, 2.0 * forward};
}

}  // namespace tutti::nn
