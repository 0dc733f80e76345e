// CPU convolution and max-pooling: im2col + OpenBLAS sgemm, halves through fp32 scratch.
// Internal header. Inputs are validated by the public functions in kernels/conv.cc.
#pragma once

#include "tutti/core/tensor.h"
#include "tutti/kernels/conv.h"

namespace tutti::kernels::cpu {

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Conv2dParams& params);
void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw,
                     const Tensor& db, bool accumulate_params, const Conv2dParams& params);
void maxpool2x2_forward(const Tensor& x, const Tensor& y);
void maxpool2x2_backward(const Tensor& x, const Tensor& dy, const Tensor& dx);

}  // namespace tutti::kernels::cpu
