#include "tutti/nn/transformer.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "nn/slices.h"
#include "tutti/kernels/attention.h"
#include "tutti/kernels/embedding.h"
#include "tutti/kernels/flash_attention.h"
#include "tutti/kernels/linear.h"
#include "tutti/kernels/rope.h"

namespace tutti::nn {

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
  check_tokens(tokens);
  Tensor y = buffer(0, {tokens.dim(0), tokens.dim(1), width_}, compute_dtype());
  embed_into(tokens, y);
  return y;
}

void TokenPositionEmbedding::check_tokens(const Tensor& tokens) const {
  TUTTI_CHECK_ARG(tokens.ndim() == 2 && tokens.dtype() == DType::i32 && tokens.dim(1) <= context_, describe(),
                  ": tokens must be [B, T <= ", context_, "] i32, got ", tokens.str());
}

void TokenPositionEmbedding::embed_into(const Tensor& tokens, const Tensor& y) {
  check_tokens(tokens);
  tokens_ = tokens;
  kernels::embedding_forward(tokens, wte.compute_value(), adds_positions_ ? wpe.compute_value() : Tensor(), y, rows_,
                             stream());
}

Tensor TokenPositionEmbedding::backward_impl(const Tensor& dy) {
  TUTTI_CHECK_ARG(tokens_.defined(), describe(), ": backward before forward");
  const Tensor dwte = wte.requires_grad ? grad_of(wte) : Tensor();
  const Tensor dwpe = wpe.requires_grad ? grad_of(wpe) : Tensor();
  if (dwte.defined() || dwpe.defined()) {
    kernels::embedding_backward(tokens_, dy.reshape({tokens_.dim(0), tokens_.dim(1), width_}), dwte, dwpe,
                                /*accumulate_params=*/true, rows_, stream());
  }
  // Reverse registration order. wte's gradient may also hold a tied head's share (TiedLinear):
  // it is complete only now.
  if (wpe.requires_grad) grad_ready(wpe);
  if (wte.requires_grad) grad_ready(wte);
  return Tensor();  // token ids have no gradient
}

// ---- TokenEmbedding ------------------------------------------------------------------------

TokenEmbedding::TokenEmbedding(std::int64_t vocab, std::int64_t width)
    : weight({vocab, width}, InitSpec::normal(0.02)), vocab_(vocab), width_(width) {
  TUTTI_CHECK_ARG(vocab > 0 && width > 0, "TokenEmbedding(", vocab, ", ", width, "): sizes must be positive");
  weight.no_weight_decay = true;
  register_parameter("weight", weight);
}

std::string TokenEmbedding::describe() const {
  return detail::str("TokenEmbedding(vocab ", vocab_, ", width ", width_, ")");
}

Tensor TokenEmbedding::forward_impl(const Tensor& tokens) {
  check_tokens(tokens);
  Tensor y = buffer(0, {tokens.dim(0), tokens.dim(1), width_}, compute_dtype());
  embed_into(tokens, y);
  return y;
}

void TokenEmbedding::check_tokens(const Tensor& tokens) const {
  TUTTI_CHECK_ARG(tokens.ndim() == 2 && tokens.dtype() == DType::i32, describe(), ": tokens must be [B, T] i32, got ",
                  tokens.str());
}

void TokenEmbedding::embed_into(const Tensor& tokens, const Tensor& y) {
  check_tokens(tokens);
  tokens_ = tokens;
  kernels::embedding_forward(tokens, weight.compute_value(), Tensor(), y, rows_, stream());
}

Tensor TokenEmbedding::backward_impl(const Tensor& dy) {
  TUTTI_CHECK_ARG(tokens_.defined(), describe(), ": backward before forward");
  if (weight.requires_grad) {
    kernels::embedding_backward(tokens_, dy.reshape({tokens_.dim(0), tokens_.dim(1), width_}), grad_of(weight),
                                Tensor(), /*accumulate_params=*/true, rows_, stream());
    // A tied head (TiedLinear) has added its share already: the gradient is complete only now.
    grad_ready(weight);
  }
  return Tensor();  // token ids have no gradient
}

// ---- Rotary position embedding -------------------------------------------------------------

std::vector<float> rope_inv_freq(std::int64_t head_size, const RopeOptions& o) {
  TUTTI_CHECK_ARG(head_size >= 2 && head_size % 2 == 0 && o.theta > 0, "rope_inv_freq: head_size ", head_size,
                  " must be even and theta ", o.theta, " positive");
  const RopeScaling& sc = o.scaling;
  TUTTI_CHECK_ARG(sc.factor == 0 || (sc.factor > 0 && sc.high_freq_factor > sc.low_freq_factor &&
                                     sc.low_freq_factor > 0 && sc.original_context > 0),
                  "rope_inv_freq: llama3 scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and an ",
                  "original context > 0, got factor ", sc.factor, ", low ", sc.low_freq_factor, ", high ",
                  sc.high_freq_factor, ", original context ", sc.original_context);
  // As transformers computes them, in f32: 1 / theta ** (arange(0, d, 2).float() / d), then
  // _compute_llama3_parameters on those f32 values.
  const auto base = static_cast<float>(o.theta);
  std::vector<float> f;
  for (std::int64_t i = 0; i < head_size; i += 2) {
    const float exponent = static_cast<float>(i) / static_cast<float>(head_size);
    f.push_back(1.0f / static_cast<float>(std::pow(static_cast<double>(base), static_cast<double>(exponent))));
  }
  if (sc.factor == 0) return f;
  const auto factor = static_cast<float>(sc.factor), low = static_cast<float>(sc.low_freq_factor),
             high = static_cast<float>(sc.high_freq_factor), old = static_cast<float>(sc.original_context);
  const float low_wavelen = old / low, high_wavelen = old / high;
  for (float& v : f) {
    const float wavelen = static_cast<float>(2 * M_PI) / v;
    const float scaled = wavelen > low_wavelen ? v / factor : v;
    if (wavelen < high_wavelen || wavelen > low_wavelen) {
      v = scaled;
      continue;
    }
    const float smooth = (old / wavelen - low) / (high - low);
    v = (1 - smooth) * scaled / factor + smooth * scaled;
  }
  return f;
}

RopeTable::RopeTable(std::int64_t head_size, const RopeOptions& options)
    : head_size_(head_size), options_(options), inv_freq_(rope_inv_freq(head_size, options)) {}

const Tensor& RopeTable::get(std::int64_t T, Device device, const Stream& stream) {
  if (table_.defined() && table_.dim(0) >= T && table_.device() == device) return table_;
  const std::int64_t rows = table_.defined() ? std::max(T, table_.dim(0)) : T;
  table_ = Tensor();  // the old table is freed before the new one is made
  Tensor host = kernels::rope_table(inv_freq_, rows);
  table_ = device.is_cpu() ? host : host.to(device, stream);
  return table_;
}

RotaryEmbedding::RotaryEmbedding(std::int64_t heads, std::int64_t kv_heads, std::shared_ptr<RopeTable> table)
    : heads_(heads), kv_heads_(kv_heads), table_(std::move(table)) {
  TUTTI_CHECK_ARG(table_ != nullptr && heads > 0 && kv_heads > 0 && heads % kv_heads == 0, "RotaryEmbedding(", heads,
                  " heads, ", kv_heads, " kv_heads): kv_heads must divide heads, and a table is needed");
}

std::string RotaryEmbedding::describe() const {
  return detail::str("RotaryEmbedding(heads ", heads_, ", kv_heads ", kv_heads_, ", head_size ", table_->head_size(),
                     ", theta ", table_->options().theta, table_->options().scaling.factor > 0 ? ", llama3" : "", ")");
}

Tensor RotaryEmbedding::forward_impl(const Tensor& qkv) {
  TUTTI_CHECK_ARG(qkv.ndim() == 3 && qkv.dim(2) == (heads_ + 2 * kv_heads_) * table_->head_size(), describe(),
                  ": input must be [B, T, ", (heads_ + 2 * kv_heads_) * table_->head_size(), "], got ", qkv.str());
  kernels::rope_forward(qkv, heads_, kv_heads_, table_->get(qkv.dim(1), device(), stream()), stream());
  return qkv;
}

Tensor RotaryEmbedding::backward_impl(const Tensor& dqkv) {
  if (!input_grad_needed()) return Tensor();
  kernels::rope_backward(dqkv, heads_, kv_heads_, table_->get(dqkv.dim(1), device(), stream()), stream());
  return dqkv;
}

// ---- CausalSelfAttention -----------------------------------------------------------------

AttentionKernel parse_attention_kernel(const std::string& name) {
  if (name == "flash") return AttentionKernel::flash;
  if (name == "materialized") return AttentionKernel::materialized;
  TUTTI_THROW(InvalidArgument, "attention kernel '", name,
              "': expected flash (tiled, memory linear in T) or materialized (keeps the T x T probabilities)");
}

const char* name_of(AttentionKernel kernel) { return kernel == AttentionKernel::flash ? "flash" : "materialized"; }

CausalSelfAttention::CausalSelfAttention(std::int64_t heads, AttentionOptions options)
    : heads_(heads), kv_heads_(options.kv_heads == 0 ? heads : options.kv_heads), options_(options) {
  TUTTI_CHECK_ARG(heads > 0 && kv_heads_ > 0 && heads % kv_heads_ == 0, "CausalSelfAttention(", heads, " heads, ",
                  kv_heads_, " kv_heads): heads must be positive and kv_heads divide them");
  TUTTI_CHECK_ARG(options.kernel == AttentionKernel::flash || kv_heads_ == heads, "CausalSelfAttention(", heads,
                  " heads, ", kv_heads_,
                  " kv_heads): the materialized kernel has no grouped-query attention; use flash");
  options_.kv_heads = kv_heads_;
}

std::string CausalSelfAttention::describe() const {
  if (kv_heads_ == heads_)
    return detail::str("CausalSelfAttention(heads ", heads_, ", ", name_of(options_.kernel), ")");
  return detail::str("CausalSelfAttention(heads ", heads_, ", kv_heads ", kv_heads_, ", ", name_of(options_.kernel),
                     ")");
}

Tensor CausalSelfAttention::forward_impl(const Tensor& qkv) {
  const std::int64_t parts = heads_ + 2 * kv_heads_;
  TUTTI_CHECK_ARG(qkv.ndim() == 3 && qkv.dim(2) % parts == 0 && qkv.dim(2) > 0, describe(), ": input must be [B, T, (",
                  heads_, " + 2 x ", kv_heads_, ") x head_size], got ", qkv.str());
  const std::int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / parts * heads_;
  qkv_ = qkv;
  out_ = buffer(0, {B, T, C}, qkv.dtype());
  if (options_.kernel == AttentionKernel::materialized) {
    saved_ = buffer(1, {B, heads_, T, T}, qkv.dtype());
    kernels::attention_forward(qkv, heads_, out_, saved_, stream());
  } else {
    saved_ = buffer(1, {B, heads_, T}, DType::f32);
    kernels::flash_attention_forward(qkv, {heads_, kv_heads_, options_.query_tile, options_.key_tile}, out_, saved_,
                                     stream());
  }
  return out_;
}

Tensor CausalSelfAttention::backward_impl(const Tensor& dy) {
  TUTTI_CHECK_ARG(qkv_.defined(), describe(), ": backward before forward");
  if (!input_grad_needed()) return Tensor();
  Tensor dqkv = buffer(2, qkv_.shape(), qkv_.dtype());
  const Tensor d = dy.reshape(out_.shape());
  if (options_.kernel == AttentionKernel::materialized) {
    kernels::attention_backward(qkv_, saved_, d, heads_, dqkv, stream());
  } else {
    kernels::flash_attention_backward(qkv_, out_, saved_, d,
                                      {heads_, kv_heads_, options_.query_tile, options_.key_tile}, dqkv, stream());
  }
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
  multiply(x, y);
  return y;
}

Tensor TiedLinear::backward_impl(const Tensor& dy) {
  TUTTI_CHECK_ARG(x_.defined(), describe(), ": backward before forward");
  Tensor dx = input_grad_needed() ? buffer(1, x_.shape(), x_.dtype()) : Tensor();
  multiply_backward(x_, dy, dx);
  return dx;
}

void TiedLinear::multiply(const Tensor& x, const Tensor& y) {
  const std::int64_t in = weight_.shape()[1], out = weight_.shape()[0];
  kernels::linear_forward(as_rows(x, in), weight_.compute_value(), Tensor(), as_rows(y, out), stream());
}

void TiedLinear::multiply_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const std::int64_t in = weight_.shape()[1], out = weight_.shape()[0];
  Tensor dw = weight_.requires_grad ? grad_of(weight_) : buffer(2, weight_.shape(), grad_dtype());
  kernels::linear_backward(as_rows(x, in), weight_.compute_value(), as_rows(dy, out),
                           dx.defined() ? as_rows(dx, in) : Tensor(), dw, Tensor(), /*accumulate_params=*/true,
                           stream());
  // No grad_ready: the weight's owner reports it once its own share is added.
}

// ---- buffers (Module::buffer_statements) ------------------------------------------------------

namespace {
using Kind = BufferStatement::Kind;
BufferStatement statement(int slot, std::int64_t numel, DType dtype, Kind kind) {
  return {slot, numel * static_cast<std::int64_t>(size_of(dtype)), kind};
}
// An embedding's output [B, T, width] for tokens [B, T].
std::vector<BufferStatement> embedding_output(const Module& m, const Shape& tokens, std::int64_t width, DType dtype,
                                              Shape& out) {
  TUTTI_CHECK_ARG(tokens.size() == 2, m.describe(), "::buffer_statements: tokens are [B, T], got ", shape_str(tokens));
  out = {tokens[0], tokens[1], width};
  return {statement(0, numel_of(out), dtype, Kind::output)};
}
}  // namespace

std::vector<BufferStatement> TokenPositionEmbedding::buffer_statements(const Shape& input, DType dtype,
                                                                       Shape& out) const {
  return embedding_output(*this, input, width_, dtype, out);
}

std::vector<BufferStatement> TokenEmbedding::buffer_statements(const Shape& input, DType dtype, Shape& out) const {
  return embedding_output(*this, input, width_, dtype, out);
}

std::vector<BufferStatement> RotaryEmbedding::buffer_statements(const Shape& input, DType, Shape& out) const {
  out = input;
  return {};
}

std::vector<BufferStatement> CausalSelfAttention::buffer_statements(const Shape& input, DType dtype, Shape& out) const {
  const std::int64_t parts = heads_ + 2 * kv_heads_;
  TUTTI_CHECK_ARG(input.size() == 3 && input[2] % parts == 0, describe(), "::buffer_statements: the input is [B, T, (",
                  heads_, " + 2 x ", kv_heads_, ") x head_size], got ", shape_str(input));
  const std::int64_t B = input[0], T = input[1];
  out = {B, T, input[2] / parts * heads_};
  std::vector<BufferStatement> b{statement(0, numel_of(out), dtype, Kind::saved)};
  if (options_.kernel == AttentionKernel::materialized)
    b.push_back(statement(1, B * heads_ * T * T, dtype, Kind::saved));  // the probabilities
  else
    b.push_back(statement(1, B * heads_ * T, DType::f32, Kind::saved));  // the log-sum-exp
  if (input_grad_needed()) b.push_back(statement(2, numel_of(input), dtype, Kind::backward));
  return b;
}

std::int64_t CausalSelfAttention::gpu_scratch_bytes(const Shape& input, DType dtype) const {
  const std::int64_t parts = heads_ + 2 * kv_heads_;
  TUTTI_CHECK_ARG(input.size() == 3 && input[2] % parts == 0, describe(), "::gpu_scratch_bytes: the input is [B, T, (",
                  heads_, " + 2 x ", kv_heads_, ") x head_size], got ", shape_str(input));
  const std::int64_t B = input[0], T = input[1], hs = input[2] / parts;
  if (options_.kernel == AttentionKernel::materialized) {
    // kernels/cuda/attention.cu: backward's q, k, v, dy, dq, dk, dv head-major and dP.
    return (7 * B * T * heads_ * hs + B * heads_ * T * T) * static_cast<std::int64_t>(size_of(dtype));
  }
  const kernels::FlashAttentionParams p{heads_, kv_heads_, options_.query_tile, options_.key_tile};
  return std::max(kernels::flash_attention_gpu_scratch_bytes(B, T, hs, p, dtype, false),
                  kernels::flash_attention_gpu_scratch_bytes(B, T, hs, p, dtype, true));
}

std::vector<BufferStatement> TiedLinear::buffer_statements(const Shape& input, DType dtype, Shape& out) const {
  const std::int64_t in = weight_.shape()[1], outs = weight_.shape()[0];
  TUTTI_CHECK_ARG(!input.empty() && input.back() == in, describe(), "::buffer_statements: the input ", shape_str(input),
                  " must end in ", in);
  out = with_last(input, outs);
  std::vector<BufferStatement> b{statement(0, numel_of(out), dtype, Kind::output)};
  if (input_grad_needed()) b.push_back(statement(1, numel_of(input), dtype, Kind::backward));
  if (!weight_.requires_grad) b.push_back(statement(2, weight_.numel(), grad_dtype(), Kind::backward));
  return b;
}

// ---- FLOPs (Module::flops) -------------------------------------------------------------------

Flops TokenPositionEmbedding::flops(const Shape& sample, Shape& out) const {
  out = sample;
  out.push_back(width_);
  return {};
}

Flops TokenEmbedding::flops(const Shape& sample, Shape& out) const {
  out = sample;
  out.push_back(width_);
  return {};
}

Flops CausalSelfAttention::flops(const Shape& sample, Shape& out) const {
  const std::int64_t parts = heads_ + 2 * kv_heads_;
  TUTTI_CHECK_ARG(sample.size() == 2 && sample[1] % parts == 0, describe(), "::flops: a sample is [T, (", heads_,
                  " + 2 x ", kv_heads_, ") x head_size]");
  const std::int64_t C = sample[1] / parts * heads_;
  const double t = static_cast<double>(sample[0]), c = static_cast<double>(C);
  out = {sample[0], C};
  const double forward = 4.0 * t * t * c;
  // No parameters: without an input gradient, backward computes nothing.
  return {forward, input_grad_needed() ? 2.0 * forward : 0.0};
}

Flops TiedLinear::flops(const Shape& sample, Shape& out) const {
  const Shape& w = weight_.shape();  // [out, in]
  out = sample;
  if (out.empty()) out.push_back(w[1]);
  out.back() = w[0];
  double rows = 1;
  for (std::size_t i = 0; i + 1 < sample.size(); ++i) rows *= static_cast<double>(sample[i]);
  const double forward = 2.0 * rows * static_cast<double>(w[0]) * static_cast<double>(w[1]);
  return {forward, backward_flops(forward)};
}

}  // namespace tutti::nn
