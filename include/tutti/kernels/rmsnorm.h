// Root-mean-square layer normalization over the last dimension (Zhang & Sennrich 2019; Llama's
// norm): no mean subtracted, no bias. See linear.h for the conventions.
#pragma once

#include "tutti/core/tensor.h"

namespace tutti::kernels {

// x [N, D], weight [D] -> y [N, D] = x · rstd · weight, and saves rstd [N] (f32,
// rstd = 1 / sqrt(mean(x²) + eps)) for backward. Computed in fp32 and rounded once.
void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y, const Tensor& rstd,
                     const Stream& stream = Stream());

// Given dy [N, D]: dx [N, D] (written), dweight [D] (+)= the rows' sum of dy · x · rstd
// (accumulate_params); dweight may be f32 for half x, or undefined (not wanted). Deterministic on
// every device (fixed summation order, no float atomics).
void rmsnorm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                      const Tensor& dweight, bool accumulate_params, const Stream& stream = Stream());

}  // namespace tutti::kernels
