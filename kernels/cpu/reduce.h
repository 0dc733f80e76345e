// CPU reductions. Internal header; inputs are validated by kernels/reduce.cc.
#pragma once

#include "tutti/core/tensor.h"

namespace tutti::kernels::cpu {

// out[0] (+)= sum of x (or of x²), fp32 lanes per chunk, chunks summed in double.
void sum(const Tensor& x, const Tensor& out, bool accumulate);
void sum_squares(const Tensor& x, const Tensor& out, bool accumulate);
// found[0] = 1 when any element of x is inf or nan; untouched otherwise.
void check_finite(const Tensor& x, const Tensor& found);

}  // namespace tutti::kernels::cpu
