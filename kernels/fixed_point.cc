#include "tutti/kernels/fixed_point.h"

#include "kernels/cpu/fixed_point.h"
#include "kernels/cuda/fixed_point.h"
#include "kernels/validate.h"

namespace tutti::kernels {

void fixed_point_accumulate(const Tensor& x, double scale, double limit, const Tensor& acc, const Tensor& status,
                            bool zero_x, const Stream& stream) {
  const char* op = "fixed_point_accumulate";
  detail::require_floating(op, "x", x);
  detail::require_dtype(op, "acc", acc, DType::i64);
  detail::require_dtype(op, "status", status, DType::i64);
  detail::require_same_numel(op, "x", x, "acc", acc);
  TUTTI_CHECK_ARG(status.numel() == 2, op, ": status must hold two elements ([2]), got ", status.str());
  TUTTI_CHECK_ARG(scale > 0 && limit > 0, op, ": scale and limit must be positive, got ", scale, " and ", limit);
  const Device device = detail::require_same_device(op, {&x, &acc, &status}, stream);
  if (x.numel() == 0) return;
  if (device.is_cuda()) {
    cuda::fixed_point_accumulate(x, scale, limit, acc, status, zero_x, stream);
  } else {
    cpu::fixed_point_accumulate(x, scale, limit, acc, status, zero_x);
  }
}

void fixed_point_to_float(const Tensor& acc, double scale, const Tensor& out, const Stream& stream) {
  const char* op = "fixed_point_to_float";
  detail::require_dtype(op, "acc", acc, DType::i64);
  detail::require_floating(op, "out", out);
  detail::require_same_numel(op, "acc", acc, "out", out);
  const Device device = detail::require_same_device(op, {&acc, &out}, stream);
  if (acc.numel() == 0) return;
  if (device.is_cuda()) {
    cuda::fixed_point_to_float(acc, scale, out, stream);
  } else {
    cpu::fixed_point_to_float(acc, scale, out);
  }
}

}  // namespace tutti::kernels
