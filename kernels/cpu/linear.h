// CPU linear algebra: OpenBLAS sgemm, with f16/bf16 staged through fp32 scratch.
// Internal header; inputs are validated by kernels/linear.cc.
#pragma once

#include "tutti/core/tensor.h"

namespace tutti::kernels::cpu {

// Row-major c[M, N] = alpha · op(a) · op(b) + beta · c. a and b share a dtype; c has it or
// is f32. With beta = 0, c is not read (nan in it does not propagate).
void matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, const Tensor& c, float alpha,
            float beta);
// x is [rows, I] (leading dimensions flattened), w [O, I], y [rows, O], bias [O] or undefined.
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y);
void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw,
                     const Tensor& db, bool accumulate_params);

}  // namespace tutti::kernels::cpu
