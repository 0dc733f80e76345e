// CUDA launcher of the rotary position embedding (see rope.cu). Inputs are validated by
// kernels/rope.cc; the launch is ordered on `stream`. No CUDA types here.
#pragma once

#include "kernels/rope_shape.h"
#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"

namespace tutti::kernels::cuda {

void rope_rotate(const Tensor& qkv, const RopeShape& shape, const Tensor& table, bool inverse, const Stream& stream);

}  // namespace tutti::kernels::cuda
