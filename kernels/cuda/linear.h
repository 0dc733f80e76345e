// CUDA launchers of the linear family (cuBLAS / cuBLASLt, fp32 compute for every dtype).
// Inputs are validated by kernels/linear.cc; these only launch, ordered on `stream`, on the
// tensors' device. No CUDA types here, so the dispatcher can include it.
#pragma once

#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"

namespace tutti::kernels::cuda {

void matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, const Tensor& c, float alpha,
            float beta, const Stream& stream);
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Stream& stream);
void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw,
                     const Tensor& db, bool accumulate_params, const Stream& stream);

}  // namespace tutti::kernels::cuda
