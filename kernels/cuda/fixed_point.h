// CUDA fixed-point sums: launchers only (tutti types). Inputs are validated by
// kernels/fixed_point.cc; ordered on `stream`, no host sync.
#pragma once

#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"

namespace tutti::kernels::cuda {

void fixed_point_accumulate(const Tensor& x, double scale, double limit, const Tensor& acc, const Tensor& status,
                            bool zero_x, const Stream& stream);
void fixed_point_to_float(const Tensor& acc, double scale, const Tensor& out, const Stream& stream);

}  // namespace tutti::kernels::cuda
