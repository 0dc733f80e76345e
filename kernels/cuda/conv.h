// CUDA convolution (cuDNN when the build has it, else a direct kernel) and max-pooling.
// Launchers only, with tutti types, so the dispatcher needs no CUDA headers. Inputs are
// validated by kernels/conv.cc; every launch is ordered on `stream` and never syncs the host.
#pragma once

#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"
#include "tutti/kernels/conv.h"

namespace tutti::kernels::cuda {

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Conv2dParams& params,
                    const Stream& stream);
void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw,
                     const Tensor& db, bool accumulate_params, const Conv2dParams& params, const Stream& stream);
void maxpool2x2_forward(const Tensor& x, const Tensor& y, const Stream& stream);
void maxpool2x2_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, const Stream& stream);

}  // namespace tutti::kernels::cuda
