// CUDA casts and the fused unscale-and-check: launchers only (tutti types). Inputs are
// validated by kernels/cast.cc; ordered on `stream`, no host sync.
#pragma once

#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"

namespace tutti::kernels::cuda {

void cast(const Tensor& x, const Tensor& out, const Stream& stream);
void unscale_and_check(const Tensor& grad, float inv_scale, const Tensor& found, const Stream& stream);

}  // namespace tutti::kernels::cuda
