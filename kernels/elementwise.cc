// Public elementwise ops: validate, then run on the tensors' device.
#include "tutti/kernels/elementwise.h"

#include <cmath>

#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/dropout_rng.h"
#include "kernels/validate.h"

namespace tutti::kernels {
namespace {

// Two value tensors of one call: both floating, same dtype, same number of elements.
void require_like(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b) {
  detail::require_floating(op, a_name, a);
  detail::require_defined(op, b_name, b);
  TUTTI_CHECK_ARG(b.dtype() == a.dtype(), op, ": ", b_name, " ", b.str(), " must have the dtype of ", a_name, " ",
                  a.str());
  detail::require_same_numel(op, a_name, a, b_name, b);
}

struct ChannelView {
  std::int64_t outer = 1, channels = 1, inner = 1;
};

// x as [outer, channels, inner] around channel_dim (negative counts from the end).
ChannelView channel_view(const char* op, const Tensor& x, int channel_dim) {
  const int d = channel_dim < 0 ? channel_dim + x.ndim() : channel_dim;
  TUTTI_CHECK_ARG(d >= 0 && d < x.ndim(), op, ": channel_dim ", channel_dim, " is out of range for ", x.str());
  ChannelView v;
  for (int i = 0; i < x.ndim(); ++i) {
    const std::int64_t s = x.shape()[static_cast<std::size_t>(i)];
    if (i < d)
      v.outer *= s;
    else if (i == d)
      v.channels = s;
    else
      v.inner *= s;
  }
  return v;
}

void require_probability(const char* op, float p) {
  TUTTI_CHECK_ARG(p >= 0.0f && p < 1.0f, op, ": p must be in [0, 1), got ", p);
}

}  // namespace

void relu_forward(const Tensor& x, const Tensor& y, const Stream& stream) {
  constexpr const char* op = "relu_forward";
  require_like(op, "x", x, "y", y);
  if (detail::require_same_device(op, {&x, &y}, stream).is_cuda())
    cuda::relu_forward(x, y, stream);
  else
    cpu::relu_forward(x, y);
}

void relu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, const Stream& stream) {
  constexpr const char* op = "relu_backward";
  require_like(op, "x", x, "dy", dy);
  require_like(op, "x", x, "dx", dx);
  if (detail::require_same_device(op, {&x, &dy, &dx}, stream).is_cuda())
    cuda::relu_backward(x, dy, dx, stream);
  else
    cpu::relu_backward(x, dy, dx);
}

void gelu_forward(const Tensor& x, const Tensor& y, const Stream& stream) {
  constexpr const char* op = "gelu_forward";
  require_like(op, "x", x, "y", y);
  if (detail::require_same_device(op, {&x, &y}, stream).is_cuda())
    cuda::gelu_forward(x, y, stream);
  else
    cpu::gelu_forward(x, y);
}

void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, const Stream& stream) {
  constexpr const char* op = "gelu_backward";
  require_like(op, "x", x, "dy", dy);
  require_like(op, "x", x, "dx", dx);
  if (detail::require_same_device(op, {&x, &dy, &dx}, stream).is_cuda())
    cuda::gelu_backward(x, dy, dx, stream);
  else
    cpu::gelu_backward(x, dy, dx);
}

namespace {
// x [..., 2F] and y (or dy) [..., F] with the same leading dimensions.
void require_swiglu(const char* op, const Tensor& x, const char* name, const Tensor& half) {
  detail::require_floating(op, "x", x);
  TUTTI_CHECK_ARG(x.ndim() >= 1 && x.dim(-1) % 2 == 0, op, ": x must be [..., 2F], got ", x.str());
  Shape want = x.shape();
  want.back() /= 2;
  detail::require_dtype(op, name, half, x.dtype());
  detail::require_shape(op, name, half, want);
}
}  // namespace

void swiglu_forward(const Tensor& x, const Tensor& y, const Stream& stream) {
  constexpr const char* op = "swiglu_forward";
  require_swiglu(op, x, "y", y);
  if (detail::require_same_device(op, {&x, &y}, stream).is_cuda())
    cuda::swiglu_forward(x, y, stream);
  else
    cpu::swiglu_forward(x, y);
}

void swiglu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, const Stream& stream) {
  constexpr const char* op = "swiglu_backward";
  require_swiglu(op, x, "dy", dy);
  detail::require_dtype(op, "dx", dx, x.dtype());
  detail::require_shape(op, "dx", dx, x.shape());
  if (detail::require_same_device(op, {&x, &dy, &dx}, stream).is_cuda())
    cuda::swiglu_backward(x, dy, dx, stream);
  else
    cpu::swiglu_backward(x, dy, dx);
}

void add(const Tensor& a, const Tensor& b, const Tensor& out, const Stream& stream) {
  constexpr const char* op = "add";
  require_like(op, "a", a, "b", b);
  require_like(op, "a", a, "out", out);
  if (detail::require_same_device(op, {&a, &b, &out}, stream).is_cuda())
    cuda::add(a, b, out, stream);
  else
    cpu::add(a, b, out);
}

void scale(const Tensor& x, float alpha, const Tensor& out, const Stream& stream) {
  constexpr const char* op = "scale";
  require_like(op, "x", x, "out", out);
  if (detail::require_same_device(op, {&x, &out}, stream).is_cuda())
    cuda::scale(x, alpha, out, stream);
  else
    cpu::scale(x, alpha, out);
}

void add_scaled(const Tensor& x, float alpha, const Tensor& out, const Stream& stream) {
  constexpr const char* op = "add_scaled";
  require_like(op, "x", x, "out", out);
  if (detail::require_same_device(op, {&x, &out}, stream).is_cuda())
    cuda::add_scaled(x, alpha, out, stream);
  else
    cpu::add_scaled(x, alpha, out);
}

void fill(const Tensor& out, float value, const Stream& stream) {
  constexpr const char* op = "fill";
  detail::require_floating(op, "out", out);
  if (detail::require_same_device(op, {&out}, stream).is_cuda())
    cuda::fill(out, value, stream);
  else
    cpu::fill(out, value);
}

void bias_add(const Tensor& x, const Tensor& bias, int channel_dim, const Tensor& out, const Stream& stream) {
  constexpr const char* op = "bias_add";
  detail::require_floating(op, "x", x);
  detail::require_dtype(op, "bias", bias, x.dtype());
  detail::require_dtype(op, "out", out, x.dtype());
  detail::require_shape(op, "out", out, x.shape());
  const ChannelView v = channel_view(op, x, channel_dim);
  detail::require_shape(op, "bias", bias, {v.channels});
  if (detail::require_same_device(op, {&x, &bias, &out}, stream).is_cuda())
    cuda::bias_add(x, bias, v.outer, v.channels, v.inner, out, stream);
  else
    cpu::bias_add(x, bias, v.outer, v.channels, v.inner, out);
}

void bias_backward(const Tensor& dy, int channel_dim, const Tensor& dbias, bool accumulate, const Stream& stream) {
  constexpr const char* op = "bias_backward";
  detail::require_floating(op, "dy", dy);
  detail::require_dtype_or_f32(op, "dbias", dbias, dy.dtype());
  const ChannelView v = channel_view(op, dy, channel_dim);
  detail::require_shape(op, "dbias", dbias, {v.channels});
  if (detail::require_same_device(op, {&dy, &dbias}, stream).is_cuda())
    cuda::bias_backward(dy, v.outer, v.channels, v.inner, dbias, accumulate, stream);
  else
    cpu::bias_backward(dy, v.outer, v.channels, v.inner, dbias, accumulate);
}

void dropout_forward(const Tensor& x, float p, std::uint64_t seed, std::uint64_t offset, const Tensor& y,
                     const Stream& stream) {
  constexpr const char* op = "dropout_forward";
  require_like(op, "x", x, "y", y);
  require_probability(op, p);
  const float keep_scale = 1.0f / (1.0f - p);
  if (detail::require_same_device(op, {&x, &y}, stream).is_cuda())
    cuda::dropout(x, p, keep_scale, seed, offset, y, stream);
  else
    cpu::dropout(x, p, keep_scale, seed, offset, y);
}

void dropout_backward(const Tensor& dy, float p, std::uint64_t seed, std::uint64_t offset, const Tensor& dx,
                      const Stream& stream) {
  // The same mask and scale as forward: d(x · keep · s)/dx = keep · s.
  constexpr const char* op = "dropout_backward";
  require_like(op, "dy", dy, "dx", dx);
  require_probability(op, p);
  const float keep_scale = 1.0f / (1.0f - p);
  if (detail::require_same_device(op, {&dy, &dx}, stream).is_cuda())
    cuda::dropout(dy, p, keep_scale, seed, offset, dx, stream);
  else
    cpu::dropout(dy, p, keep_scale, seed, offset, dx);
}

float dropout_uniform(std::uint64_t seed, std::uint64_t index) { return rng::uniform(rng::key_of(seed), index); }

}  // namespace tutti::kernels
