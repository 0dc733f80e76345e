// Public layer normalization: validate, then run on the tensors' device.
#include "tutti/kernels/layernorm.h"

#include "kernels/cpu/layernorm.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/validate.h"

namespace tutti::kernels {
namespace {

// x is [N, D] (or [..., D], leading dimensions flattened); returns N.
std::int64_t require_rows(const char* op, const Tensor& x) {
  detail::require_floating(op, "x", x);
  TUTTI_CHECK_ARG(x.ndim() >= 1 && x.dim(-1) > 0, op, ": x must be [N, D] with D > 0, got ", x.str());
  return x.numel() / x.dim(-1);
}

void require_row_stat(const char* op, const char* name, const Tensor& t, std::int64_t rows, const Tensor& x) {
  detail::require_dtype(op, name, t, DType::f32);
  TUTTI_CHECK_ARG(t.numel() == rows, op, ": ", name, " must hold one f32 per row of x ", x.str(), " (", rows, "), got ",
                  t.str());
}

void require_param_grad(const char* op, const char* name, const Tensor& g, const Tensor& x) {
  if (!g.defined()) return;
  detail::require_dtype_or_f32(op, name, g, x.dtype());
  detail::require_shape(op, name, g, {x.dim(-1)});
}

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd, const Stream& stream) {
  constexpr const char* op = "layernorm_forward";
  const std::int64_t rows = require_rows(op, x);
  detail::require_dtype(op, "gamma", gamma, x.dtype());
  detail::require_shape(op, "gamma", gamma, {x.dim(-1)});
  detail::require_dtype(op, "beta", beta, x.dtype());
  detail::require_shape(op, "beta", beta, {x.dim(-1)});
  detail::require_dtype(op, "y", y, x.dtype());
  detail::require_shape(op, "y", y, x.shape());
  require_row_stat(op, "mean", mean, rows, x);
  require_row_stat(op, "rstd", rstd, rows, x);
  TUTTI_CHECK_ARG(eps >= 0.0f, op, ": eps must be >= 0, got ", eps);
  const Device device = detail::require_same_device(op, {&x, &gamma, &beta, &y, &mean, &rstd}, stream);
  if (device.is_cuda())
    cuda::layernorm_forward(x, gamma, beta, eps, y, mean, rstd, stream);
  else
    cpu::layernorm_forward(x, gamma, beta, eps, y, mean, rstd);
}

void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                        const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta, bool accumulate_params,
                        const Stream& stream) {
  constexpr const char* op = "layernorm_backward";
  const std::int64_t rows = require_rows(op, x);
  detail::require_dtype(op, "gamma", gamma, x.dtype());
  detail::require_shape(op, "gamma", gamma, {x.dim(-1)});
  require_row_stat(op, "mean", mean, rows, x);
  require_row_stat(op, "rstd", rstd, rows, x);
  detail::require_dtype(op, "dy", dy, x.dtype());
  detail::require_shape(op, "dy", dy, x.shape());
  detail::require_dtype(op, "dx", dx, x.dtype());
  detail::require_shape(op, "dx", dx, x.shape());
  require_param_grad(op, "dgamma", dgamma, x);
  require_param_grad(op, "dbeta", dbeta, x);
  const Device device = detail::require_same_device(op, {&x, &gamma, &mean, &rstd, &dy, &dx, &dgamma, &dbeta}, stream);
  if (device.is_cuda())
    cuda::layernorm_backward(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, accumulate_params, stream);
  else
    cpu::layernorm_backward(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, accumulate_params);
}

}  // namespace tutti::kernels
