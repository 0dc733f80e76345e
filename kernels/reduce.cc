#include "tutti/kernels/reduce.h"

#include "kernels/cpu/reduce.h"
#include "kernels/cuda/reduce.h"
#include "kernels/validate.h"

namespace tutti::kernels {
namespace {

// A one-element output of `dtype` (shape [1], or any shape holding exactly one element).
void require_scalar_out(const char* op, const char* name, const Tensor& t, DType dtype) {
  detail::require_dtype(op, name, t, dtype);
  TUTTI_CHECK_ARG(t.numel() == 1, op, ": ", name, " must hold one element ([1]), got ", t.str());
}

}  // namespace

void sum(const Tensor& x, const Tensor& out, bool accumulate, const Stream& stream) {
  const char* op = "sum";
  detail::require_floating(op, "x", x);
  require_scalar_out(op, "out", out, DType::f32);
  const Device device = detail::require_same_device(op, {&x, &out}, stream);
  if (device.is_cuda()) {
    cuda::sum(x, out, accumulate, stream);
  } else {
    cpu::sum(x, out, accumulate);
  }
}

void sum_squares(const Tensor& x, const Tensor& out, bool accumulate, const Stream& stream) {
  const char* op = "sum_squares";
  detail::require_floating(op, "x", x);
  require_scalar_out(op, "out", out, DType::f32);
  const Device device = detail::require_same_device(op, {&x, &out}, stream);
  if (device.is_cuda()) {
    cuda::sum_squares(x, out, accumulate, stream);
  } else {
    cpu::sum_squares(x, out, accumulate);
  }
}

void check_finite(const Tensor& x, const Tensor& found, const Stream& stream) {
  const char* op = "check_finite";
  detail::require_floating(op, "x", x);
  require_scalar_out(op, "found", found, DType::i32);
  const Device device = detail::require_same_device(op, {&x, &found}, stream);
  if (x.numel() == 0) return;
  if (device.is_cuda()) {
    cuda::check_finite(x, found, stream);
  } else {
    cpu::check_finite(x, found);
  }
}

}  // namespace tutti::kernels
