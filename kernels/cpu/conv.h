// CPU convolution and max-pooling. Internal header. Inputs are validated by the public functions
// in kernels/conv.cc. The convolution runs f32 on oneDNN where tutti was built with it
// (kernels/cpu/conv_onednn.h), and otherwise (halves, or no oneDNN) on im2col + OpenBLAS sgemm,
// halves through fp32 scratch: the tests' reference for the oneDNN path.
#pragma once

#include <string>

#include "tutti/core/tensor.h"
#include "tutti/kernels/conv.h"

namespace tutti::kernels::cpu {

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Conv2dParams& params);
void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw,
                     const Tensor& db, bool accumulate_params, const Conv2dParams& params);
// Always im2col + OpenBLAS.
void conv2d_forward_im2col(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                           const Conv2dParams& params);
void conv2d_backward_im2col(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw,
                            const Tensor& db, bool accumulate_params, const Conv2dParams& params);
// What conv2d_forward / conv2d_backward run on: "oneDNN 2.6.3 (avx512_core_bf16, OpenMP) for
// f32, im2col + OpenBLAS for halves", or "im2col + OpenBLAS".
std::string conv2d_backend();

void maxpool2x2_forward(const Tensor& x, const Tensor& y);
void maxpool2x2_backward(const Tensor& x, const Tensor& dy, const Tensor& dx);

}  // namespace tutti::kernels::cpu
