// Conversions between f32, f16 and bf16 (round to nearest even; inf and nan kept), and the
// fused unscale-and-check pass of mixed precision. See linear.h for the conventions.
#pragma once

#include "tutti/core/tensor.h"

namespace tutti::kernels {

// out = x converted to out's dtype (same number of elements; any pair of float dtypes).
void cast(const Tensor& x, const Tensor& out, const Stream& stream = Stream());

// One pass over a gradient buffer: grad *= inv_scale (in place), and found [1] i32 is set to
// 1 if any element (before or after scaling) is inf or nan, else left as it is. No host sync.
void unscale_and_check(const Tensor& grad, float inv_scale, const Tensor& found, const Stream& stream = Stream());

}  // namespace tutti::kernels
