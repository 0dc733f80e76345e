// 2-D convolution (NCHW) and 2x2 max-pooling. GPU: cuDNN; CPU: im2col + GEMM.
// See linear.h for the conventions.
#pragma once

#include "tutti/core/tensor.h"

namespace tutti::kernels {

struct Conv2dParams {
  int stride = 1;
  int padding = 0;  // zero padding on each side of H and W
};

// Output size of one spatial dimension: (in + 2 padding - kernel) / stride + 1.
int conv2d_output_size(int in, int kernel, const Conv2dParams& params);

// x [N, C, H, W], w [K, C, R, S], bias [K] (optional) -> y [N, K, P, Q].
void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                    const Conv2dParams& params = {}, const Stream& stream = Stream());

// Given dy [N, K, P, Q]: dx (optional; written), dw (+)= and db (optional, +=) with
// accumulate_params; dw/db may be f32 for half x.
void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw,
                     const Tensor& db, bool accumulate_params, const Conv2dParams& params = {},
                     const Stream& stream = Stream());

// x [N, C, H, W] -> y [N, C, H/2, W/2] (H and W even), the max of each 2x2 window.
void maxpool2x2_forward(const Tensor& x, const Tensor& y, const Stream& stream = Stream());
// dx (written) gets dy at the position of each window's max (the first one on ties; the
// max is recomputed from the forward input x), zero elsewhere.
void maxpool2x2_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, const Stream& stream = Stream());

}  // namespace tutti::kernels
