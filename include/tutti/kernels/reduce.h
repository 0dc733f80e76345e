// Reductions that training needs: sums, sums of squares (global-norm clipping) and the
// "any non-finite?" check of mixed precision. Results stay on the device (no host sync):
// read them with Tensor::to_floats() / to_ints() when needed. See linear.h for conventions.
#pragma once

#include "tutti/core/tensor.h"

namespace tutti::kernels {

// out [1] f32 (+)= sum of x (accumulated in fp32; with accumulate, added to out).
void sum(const Tensor& x, const Tensor& out, bool accumulate = false, const Stream& stream = Stream());
// out [1] f32 (+)= sum of x² — call it with accumulate over many buffers for a global norm.
void sum_squares(const Tensor& x, const Tensor& out, bool accumulate = false, const Stream& stream = Stream());
// found [1] i32 is set to 1 if any element of x is inf or nan, and left as it is otherwise
// (so one flag can collect several buffers; zero it first).
void check_finite(const Tensor& x, const Tensor& found, const Stream& stream = Stream());

}  // namespace tutti::kernels
