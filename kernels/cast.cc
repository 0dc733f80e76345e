#include "tutti/kernels/cast.h"

#include "kernels/cpu/cast.h"
#include "kernels/cuda/cast.h"
#include "kernels/validate.h"

namespace tutti::kernels {

void cast(const Tensor& x, const Tensor& out, const Stream& stream) {
  const char* op = "cast";
  detail::require_floating(op, "x", x);
  detail::require_floating(op, "out", out);
  detail::require_same_numel(op, "x", x, "out", out);
  const Device device = detail::require_same_device(op, {&x, &out}, stream);
  if (x.numel() == 0) return;
  if (device.is_cuda()) {
    cuda::cast(x, out, stream);
  } else {
    cpu::cast(x, out);
  }
}

void unscale_and_check(const Tensor& grad, float inv_scale, const Tensor& found, const Stream& stream) {
  const char* op = "unscale_and_check";
  detail::require_floating(op, "grad", grad);
  detail::require_dtype(op, "found", found, DType::i32);
  TUTTI_CHECK_ARG(found.numel() == 1, op, ": found must hold one element ([1]), got ", found.str());
  const Device device = detail::require_same_device(op, {&grad, &found}, stream);
  if (grad.numel() == 0) return;
  if (device.is_cuda()) {
    cuda::unscale_and_check(grad, inv_scale, found, stream);
  } else {
    cpu::unscale_and_check(grad, inv_scale, found);
  }
}

}  // namespace tutti::kernels
