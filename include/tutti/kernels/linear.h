// Linear layers and matrix products. GPU: cuBLAS / cuBLASLt (fp32 accumulation for every
// dtype); CPU: OpenBLAS sgemm (f16/bf16 convert to fp32 around it).
//
// Conventions of every kernel header in tutti/kernels/:
// - Outputs are passed in, allocated by the caller, and written (or added to, where an
//   `accumulate` flag says so). All tensors of one call live on one device; the call is
//   ordered on `stream` (a CUDA stream on the GPU, ignored on the CPU, where the call is
//   synchronous). An undefined Tensor() marks an optional argument as absent.
// - Values are f32, f16 or bf16 (all value tensors of a call share one dtype unless a
//   comment says otherwise); arithmetic accumulates in fp32.
// - Bad input (shapes, dtypes, devices, absent required tensors) throws InvalidArgument
//   naming the op and the shapes, before anything is written.
#pragma once

#include "tutti/core/tensor.h"

namespace tutti::kernels {

// y[N, O] = x[N, I] · w[O, I]^T + bias[O]. bias is optional.
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                    const Stream& stream = Stream());

// Gradients of linear_forward given dy[N, O]:
//   dx[N, I]  = dy · w                 (optional; written, never accumulated)
//   dw[O, I] (+)= dy^T · x             (required)
//   db[O]    (+)= sum over rows of dy  (optional)
// dw and db may be f32 even when x, w and dy are f16/bf16 (fp32 gradient buffers); with
// accumulate_params they are added to (gradient accumulation), else overwritten.
void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw,
                     const Tensor& db, bool accumulate_params, const Stream& stream = Stream());

// c[M, N] = alpha · op(a) · op(b) + beta · c, where op(t) is t or t^T. 2-D tensors,
// row-major; c may be f32 when a and b are f16/bf16.
void matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, const Tensor& c, float alpha = 1.0f,
            float beta = 0.0f, const Stream& stream = Stream());

}  // namespace tutti::kernels
