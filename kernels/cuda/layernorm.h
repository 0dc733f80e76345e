// CUDA launchers of layer normalization (a warp per row, fp32 accumulation). Inputs are
// validated by kernels/layernorm.cc; launches are ordered on `stream`. No CUDA types here.
#pragma once

#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"

namespace tutti::kernels::cuda {

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd, const Stream& stream);
// dgamma and dbeta may be undefined (not wanted).
void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                        const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta, bool accumulate_params,
                        const Stream& stream);

}  // namespace tutti::kernels::cuda
