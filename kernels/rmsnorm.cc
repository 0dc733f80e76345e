// Public RMS normalization: validate, then run on the tensors' device.
#include "tutti/kernels/rmsnorm.h"

#include "kernels/cpu/rmsnorm.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/validate.h"

namespace tutti::kernels {
namespace {

// x is [N, D] (or [..., D], leading dimensions flattened); returns N.
std::int64_t require_rows(const char* op, const Tensor& x) {
  detail::require_floating(op, "x", x);
  TUTTI_CHECK_ARG(x.ndim() >= 1 && x.dim(-1) > 0, op, ": x must be [N, D] with D > 0, got ", x.str());
  return x.numel() / x.dim(-1);
}

void require_rstd(const char* op, const Tensor& rstd, std::int64_t rows, const Tensor& x) {
  detail::require_dtype(op, "rstd", rstd, DType::f32);
  TUTTI_CHECK_ARG(rstd.numel() == rows, op, ": rstd must hold one f32 per row of x ", x.str(), " (", rows, "), got ",
                  rstd.str());
}

}  // namespace

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y, const Tensor& rstd,
                     const Stream& stream) {
  constexpr const char* op = "rmsnorm_forward";
  const std::int64_t rows = require_rows(op, x);
  detail::require_dtype(op, "weight", weight, x.dtype());
  detail::require_shape(op, "weight", weight, {x.dim(-1)});
  detail::require_dtype(op, "y", y, x.dtype());
  detail::require_shape(op, "y", y, x.shape());
  require_rstd(op, rstd, rows, x);
  TUTTI_CHECK_ARG(eps >= 0.0f, op, ": eps must be >= 0, got ", eps);
  const Device device = detail::require_same_device(op, {&x, &weight, &y, &rstd}, stream);
  if (device.is_cuda())
    cuda::rmsnorm_forward(x, weight, eps, y, rstd, stream);
  else
    cpu::rmsnorm_forward(x, weight, eps, y, rstd);
}

void rmsnorm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                      const Tensor& dweight, bool accumulate_params, const Stream& stream) {
  constexpr const char* op = "rmsnorm_backward";
  const std::int64_t rows = require_rows(op, x);
  detail::require_dtype(op, "weight", weight, x.dtype());
  detail::require_shape(op, "weight", weight, {x.dim(-1)});
  require_rstd(op, rstd, rows, x);
  detail::require_dtype(op, "dy", dy, x.dtype());
  detail::require_shape(op, "dy", dy, x.shape());
  detail::require_dtype(op, "dx", dx, x.dtype());
  detail::require_shape(op, "dx", dx, x.shape());
  if (dweight.defined()) {
    detail::require_dtype_or_f32(op, "dweight", dweight, x.dtype());
    detail::require_shape(op, "dweight", dweight, {x.dim(-1)});
  }
  const Device device = detail::require_same_device(op, {&x, &weight, &rstd, &dy, &dx, &dweight}, stream);
  if (device.is_cuda())
    cuda::rmsnorm_backward(x, weight, rstd, dy, dx, dweight, accumulate_params, stream);
  else
    cpu::rmsnorm_backward(x, weight, rstd, dy, dx, dweight, accumulate_params);
}

}  // namespace tutti::kernels
