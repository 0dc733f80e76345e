// CPU layer normalization (the reference). Internal header; inputs are validated by
// kernels/layernorm.cc. x is [rows, D] (leading dimensions flattened).
#pragma once

#include "tutti/core/tensor.h"

namespace tutti::kernels::cpu {

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd);
// dgamma and dbeta may be undefined (not wanted).
void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                        const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta, bool accumulate_params);

}  // namespace tutti::kernels::cpu
