// Layer normalization over the last dimension. See linear.h for the conventions.
#pragma once

#include "tutti/core/tensor.h"

namespace tutti::kernels {

// x [N, D], gamma [D], beta [D] -> y [N, D] = (x - mean) · rstd · gamma + beta, and saves
// mean [N] and rstd [N] (f32, rstd = 1 / sqrt(var + eps), biased variance) for backward.
void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd, const Stream& stream = Stream());

// Given dy [N, D]: dx [N, D] (written), dgamma [D] and dbeta [D] (+)= (accumulate_params);
// dgamma/dbeta may be f32 for half x.
void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                        const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta, bool accumulate_params,
                        const Stream& stream = Stream());

}  // namespace tutti::kernels
