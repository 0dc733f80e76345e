// CPU RMS normalization (the reference). Internal header; inputs are validated by
// kernels/rmsnorm.cc. x is [rows, D] (leading dimensions flattened).
#pragma once

#include "tutti/core/tensor.h"

namespace tutti::kernels::cpu {

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y, const Tensor& rstd);
// dweight may be undefined (not wanted).
void rmsnorm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                      const Tensor& dweight, bool accumulate_params);

}  // namespace tutti::kernels::cpu
