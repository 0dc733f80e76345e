#include "tutti/kernels/conv.h"

#include "kernels/cpu/conv.h"
#include "kernels/cuda/conv.h"
#include "kernels/validate.h"

namespace tutti::kernels {
namespace {

void check_params(const char* op, const Conv2dParams& params) {
  TUTTI_CHECK_ARG(params.stride >= 1, op, ": stride must be >= 1, got ", params.stride);
  TUTTI_CHECK_ARG(params.padding >= 0, op, ": padding must be >= 0, got ", params.padding);
}

// Checks x, w, bias and the output shape [N, K, P, Q] they imply; returns that shape.
Shape check_conv_inputs(const char* op, const Tensor& x, const Tensor& w, const Tensor& bias,
                        const Conv2dParams& params) {
  check_params(op, params);
  detail::require_floating(op, "x", x);
  detail::require_dtype(op, "w", w, x.dtype());
  TUTTI_CHECK_ARG(x.ndim() == 4, op, ": x must be [N, C, H, W], got ", x.str());
  TUTTI_CHECK_ARG(w.ndim() == 4, op, ": w must be [K, C, R, S], got ", w.str());
  TUTTI_CHECK_ARG(w.dim(1) == x.dim(1), op, ": w ", w.str(), " has ", w.dim(1), " input channels but x ", x.str(),
                  " has ", x.dim(1));
  for (int d = 2; d < 4; ++d) {
    TUTTI_CHECK_ARG(x.dim(d) + 2 * params.padding >= w.dim(d), op, ": kernel ", w.str(), " larger than padded input ",
                    x.str(), " (padding ", params.padding, ")");
  }
  if (bias.defined()) {
    detail::require_dtype(op, "bias", bias, x.dtype());
    detail::require_shape(op, "bias", bias, {w.dim(0)});
  }
  const int p = conv2d_output_size(static_cast<int>(x.dim(2)), static_cast<int>(w.dim(2)), params);
  const int q = conv2d_output_size(static_cast<int>(x.dim(3)), static_cast<int>(w.dim(3)), params);
  return {x.dim(0), w.dim(0), p, q};
}

void check_pool_input(const char* op, const Tensor& x) {
  detail::require_floating(op, "x", x);
  TUTTI_CHECK_ARG(x.ndim() == 4, op, ": x must be [N, C, H, W], got ", x.str());
  TUTTI_CHECK_ARG(x.dim(2) % 2 == 0 && x.dim(3) % 2 == 0, op, ": H and W must be even, got ", x.str());
}

}  // namespace

int conv2d_output_size(int in, int kernel, const Conv2dParams& params) {
  check_params("conv2d_output_size", params);
  TUTTI_CHECK_ARG(in >= 1 && kernel >= 1, "conv2d_output_size: input ", in, " and kernel ", kernel,
                  " must be positive");
  TUTTI_CHECK_ARG(in + 2 * params.padding >= kernel, "conv2d_output_size: kernel ", kernel,
                  " larger than the padded input ", in, " + 2 x ", params.padding);
  return (in + 2 * params.padding - kernel) / params.stride + 1;
}

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Conv2dParams& params,
                    const Stream& stream) {
  const char* op = "conv2d_forward";
  const Shape y_shape = check_conv_inputs(op, x, w, bias, params);
  detail::require_dtype(op, "y", y, x.dtype());
  detail::require_shape(op, "y", y, y_shape);
  const Device device = detail::require_same_device(op, {&x, &w, &bias, &y}, stream);
  if (y.numel() == 0) return;
  if (device.is_cuda()) {
    cuda::conv2d_forward(x, w, bias, y, params, stream);
  } else {
    cpu::conv2d_forward(x, w, bias, y, params);
  }
}

void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw,
                     const Tensor& db, bool accumulate_params, const Conv2dParams& params, const Stream& stream) {
  const char* op = "conv2d_backward";
  const Shape y_shape = check_conv_inputs(op, x, w, Tensor(), params);
  detail::require_dtype(op, "dy", dy, x.dtype());
  detail::require_shape(op, "dy", dy, y_shape);
  if (dx.defined()) {
    detail::require_dtype(op, "dx", dx, x.dtype());
    detail::require_shape(op, "dx", dx, x.shape());
  }
  detail::require_dtype_or_f32(op, "dw", dw, x.dtype());
  detail::require_shape(op, "dw", dw, w.shape());
  if (db.defined()) {
    detail::require_dtype_or_f32(op, "db", db, x.dtype());
    detail::require_shape(op, "db", db, {w.dim(0)});
  }
  const Device device = detail::require_same_device(op, {&x, &w, &dy, &dx, &dw, &db}, stream);
  if (device.is_cuda()) {
    cuda::conv2d_backward(x, w, dy, dx, dw, db, accumulate_params, params, stream);
  } else {
    cpu::conv2d_backward(x, w, dy, dx, dw, db, accumulate_params, params);
  }
}

void maxpool2x2_forward(const Tensor& x, const Tensor& y, const Stream& stream) {
  const char* op = "maxpool2x2_forward";
  check_pool_input(op, x);
  detail::require_dtype(op, "y", y, x.dtype());
  detail::require_shape(op, "y", y, {x.dim(0), x.dim(1), x.dim(2) / 2, x.dim(3) / 2});
  const Device device = detail::require_same_device(op, {&x, &y}, stream);
  if (y.numel() == 0) return;
  if (device.is_cuda()) {
    cuda::maxpool2x2_forward(x, y, stream);
  } else {
    cpu::maxpool2x2_forward(x, y);
  }
}

void maxpool2x2_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, const Stream& stream) {
  const char* op = "maxpool2x2_backward";
  check_pool_input(op, x);
  detail::require_dtype(op, "dy", dy, x.dtype());
  detail::require_shape(op, "dy", dy, {x.dim(0), x.dim(1), x.dim(2) / 2, x.dim(3) / 2});
  detail::require_dtype(op, "dx", dx, x.dtype());
  detail::require_shape(op, "dx", dx, x.shape());
  const Device device = detail::require_same_device(op, {&x, &dy, &dx}, stream);
  if (dx.numel() == 0) return;
  if (device.is_cuda()) {
    cuda::maxpool2x2_backward(x, dy, dx, stream);
  } else {
    cpu::maxpool2x2_backward(x, dy, dx);
  }
}

}  // namespace tutti::kernels
