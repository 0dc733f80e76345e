// CUDA launchers of RMS normalization (see rmsnorm.cu). Inputs are validated by
// kernels/rmsnorm.cc; launches are ordered on `stream`. No CUDA types here.
#pragma once

#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"

namespace tutti::kernels::cuda {

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y, const Tensor& rstd,
                     const Stream& stream);
void rmsnorm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                      const Tensor& dweight, bool accumulate_params, const Stream& stream);

}  // namespace tutti::kernels::cuda
