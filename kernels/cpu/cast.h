// CPU casts and the fused unscale-and-check. Internal header; inputs are validated by
// kernels/cast.cc.
#pragma once

#include "tutti/core/tensor.h"

namespace tutti::kernels::cpu {

void cast(const Tensor& x, const Tensor& out);
void unscale_and_check(const Tensor& grad, float inv_scale, const Tensor& found);

}  // namespace tutti::kernels::cpu
