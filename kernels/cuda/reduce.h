// CUDA reductions: launchers only (tutti types). Inputs are validated by kernels/reduce.cc;
// results stay on the device, ordered on `stream` (no host sync).
#pragma once

#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"

namespace tutti::kernels::cuda {

void sum(const Tensor& x, const Tensor& out, bool accumulate, const Stream& stream);
void sum_squares(const Tensor& x, const Tensor& out, bool accumulate, const Stream& stream);
void check_finite(const Tensor& x, const Tensor& found, const Stream& stream);

}  // namespace tutti::kernels::cuda
