// Public linear ops: validate, then run on the tensors' device.
#include "tutti/kernels/linear.h"

#include "kernels/cpu/linear.h"
#include "kernels/cuda/linear.h"
#include "kernels/validate.h"

namespace tutti::kernels {
namespace {

// [d0, ..., d(n-2), last]: t's shape with its last dimension replaced.
Shape with_last(const Shape& shape, std::int64_t last) {
  Shape s = shape;
  s.back() = last;
  return s;
}

}  // namespace

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Stream& stream) {
  constexpr const char* op = "linear_forward";
  detail::require_floating(op, "x", x);
  detail::require_dtype(op, "w", w, x.dtype());
  detail::require_dtype(op, "y", y, x.dtype());
  TUTTI_CHECK_ARG(w.ndim() == 2, op, ": w must be [out, in], got ", w.str());
  TUTTI_CHECK_ARG(x.ndim() >= 2 && x.dim(-1) == w.dim(1), op, ": x must be [N, ", w.dim(1), "] for w ", w.str(),
                  ", got ", x.str());
  detail::require_shape(op, "y", y, with_last(x.shape(), w.dim(0)));
  if (bias.defined()) {
    detail::require_dtype(op, "bias", bias, x.dtype());
    detail::require_shape(op, "bias", bias, {w.dim(0)});
  }
  const Device device = detail::require_same_device(op, {&x, &w, &bias, &y}, stream);
  if (device.is_cuda())
    cuda::linear_forward(x, w, bias, y, stream);
  else
    cpu::linear_forward(x, w, bias, y);
}

void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw,
                     const Tensor& db, bool accumulate_params, const Stream& stream) {
  constexpr const char* op = "linear_backward";
  detail::require_floating(op, "x", x);
  detail::require_dtype(op, "w", w, x.dtype());
  detail::require_dtype(op, "dy", dy, x.dtype());
  TUTTI_CHECK_ARG(w.ndim() == 2, op, ": w must be [out, in], got ", w.str());
  TUTTI_CHECK_ARG(x.ndim() >= 2 && x.dim(-1) == w.dim(1), op, ": x must be [N, ", w.dim(1), "] for w ", w.str(),
                  ", got ", x.str());
  detail::require_shape(op, "dy", dy, with_last(x.shape(), w.dim(0)));
  if (dx.defined()) {
    detail::require_dtype(op, "dx", dx, x.dtype());
    detail::require_shape(op, "dx", dx, x.shape());
  }
  detail::require_defined(op, "dw", dw);
  detail::require_dtype_or_f32(op, "dw", dw, x.dtype());
  detail::require_shape(op, "dw", dw, w.shape());
  if (db.defined()) {
    detail::require_dtype_or_f32(op, "db", db, x.dtype());
    detail::require_shape(op, "db", db, {w.dim(0)});
  }
  const Device device = detail::require_same_device(op, {&x, &w, &dy, &dx, &dw, &db}, stream);
  if (device.is_cuda())
    cuda::linear_backward(x, w, dy, dx, dw, db, accumulate_params, stream);
  else
    cpu::linear_backward(x, w, dy, dx, dw, db, accumulate_params);
}

void matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, const Tensor& c, float alpha,
            float beta, const Stream& stream) {
  constexpr const char* op = "matmul";
  detail::require_floating(op, "a", a);
  detail::require_dtype(op, "b", b, a.dtype());
  detail::require_dtype_or_f32(op, "c", c, a.dtype());
  TUTTI_CHECK_ARG(a.ndim() == 2 && b.ndim() == 2 && c.ndim() == 2, op, ": a, b and c must be 2-D, got a ", a.str(),
                  ", b ", b.str(), ", c ", c.str());
  const std::int64_t M = transpose_a ? a.dim(1) : a.dim(0);
  const std::int64_t Ka = transpose_a ? a.dim(0) : a.dim(1);
  const std::int64_t Kb = transpose_b ? b.dim(1) : b.dim(0);
  const std::int64_t N = transpose_b ? b.dim(0) : b.dim(1);
  TUTTI_CHECK_ARG(Ka == Kb, op, ": inner dimensions differ: op(a) is [", M, ", ", Ka, "] (a ", a.str(),
                  transpose_a ? ", transposed" : "", "), op(b) is [", Kb, ", ", N, "] (b ", b.str(),
                  transpose_b ? ", transposed" : "", ")");
  detail::require_shape(op, "c", c, {M, N});
  const Device device = detail::require_same_device(op, {&a, &b, &c}, stream);
  if (device.is_cuda())
    cuda::matmul(a, transpose_a, b, transpose_b, c, alpha, beta, stream);
  else
    cpu::matmul(a, transpose_a, b, transpose_b, c, alpha, beta);
}

}  // namespace tutti::kernels
