#include "tutti/kernels/optimizer.h"

#include "kernels/cpu/optimizer.h"
#include "kernels/cuda/optimizer.h"
#include "kernels/validate.h"

namespace tutti::kernels {
namespace {

// The tensors beside w are flat buffers of the same length: only the element count matters.
void require_like_w(const char* op, const char* name, const Tensor& t, const Tensor& w) {
  detail::require_defined(op, name, t);
  detail::require_same_numel(op, "w", w, name, t);
}

void require_half_copy(const char* op, const Tensor& weights_half, const Tensor& w) {
  if (!weights_half.defined()) return;
  TUTTI_CHECK_ARG(weights_half.dtype() == DType::f16 || weights_half.dtype() == DType::bf16, op,
                  ": weights_half must be f16 or bf16, got ", weights_half.str());
  detail::require_same_numel(op, "w", w, "weights_half", weights_half);
}

}  // namespace

void sgd_update(const Tensor& w, const Tensor& grad, const Tensor& momentum_buf, const Tensor& weights_half,
                const SgdParams& params, bool first_step, const Stream& stream) {
  const char* op = "sgd_update";
  detail::require_dtype(op, "w", w, DType::f32);
  detail::require_floating(op, "grad", grad);
  require_like_w(op, "grad", grad, w);
  if (params.momentum != 0.0f) {
    TUTTI_CHECK_ARG(momentum_buf.defined(), op, ": momentum_buf is required when momentum != 0 (momentum ",
                    params.momentum, ")");
    detail::require_dtype(op, "momentum_buf", momentum_buf, DType::f32);
    require_like_w(op, "momentum_buf", momentum_buf, w);
  }
  require_half_copy(op, weights_half, w);
  const Device device = detail::require_same_device(op, {&w, &grad, &momentum_buf, &weights_half}, stream);
  if (w.numel() == 0) return;
  if (device.is_cuda()) {
    cuda::sgd_update(w, grad, momentum_buf, weights_half, params, first_step, stream);
  } else {
    cpu::sgd_update(w, grad, momentum_buf, weights_half, params, first_step);
  }
}

void adamw_update(const Tensor& w, const Tensor& grad, const Tensor& m, const Tensor& v, const Tensor& weights_half,
                  const AdamWParams& params, const Stream& stream) {
  const char* op = "adamw_update";
  detail::require_dtype(op, "w", w, DType::f32);
  detail::require_floating(op, "grad", grad);
  require_like_w(op, "grad", grad, w);
  detail::require_dtype(op, "m", m, DType::f32);
  require_like_w(op, "m", m, w);
  detail::require_dtype(op, "v", v, DType::f32);
  require_like_w(op, "v", v, w);
  require_half_copy(op, weights_half, w);
  TUTTI_CHECK_ARG(params.step >= 1, op, ": step is 1-based, got ", params.step);
  TUTTI_CHECK_ARG(params.beta1 >= 0.0f && params.beta1 < 1.0f && params.beta2 >= 0.0f && params.beta2 < 1.0f, op,
                  ": betas must be in [0, 1), got ", params.beta1, " and ", params.beta2);
  const Device device = detail::require_same_device(op, {&w, &grad, &m, &v, &weights_half}, stream);
  if (w.numel() == 0) return;
  if (device.is_cuda()) {
    cuda::adamw_update(w, grad, m, v, weights_half, params, stream);
  } else {
    cpu::adamw_update(w, grad, m, v, weights_half, params);
  }
}

}  // namespace tutti::kernels
