// CPU rotary position embedding (the reference). Internal header; inputs are validated by
// kernels/rope.cc.
#pragma once

#include "kernels/rope_shape.h"
#include "tutti/core/tensor.h"

namespace tutti::kernels::cpu {

// In place: the first shape.rotated_heads heads of every row turn by +θ (inverse false) or -θ.
void rope_rotate(const Tensor& qkv, const RopeShape& shape, const Tensor& table, bool inverse);

}  // namespace tutti::kernels::cpu
