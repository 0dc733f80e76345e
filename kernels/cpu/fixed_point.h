// CPU fixed-point sums. Internal header; inputs are validated by kernels/fixed_point.cc.
#pragma once

#include "tutti/core/tensor.h"

namespace tutti::kernels::cpu {

void fixed_point_accumulate(const Tensor& x, double scale, double limit, const Tensor& acc, const Tensor& status,
                            bool zero_x);
void fixed_point_to_float(const Tensor& acc, double scale, const Tensor& out);

}  // namespace tutti::kernels::cpu
