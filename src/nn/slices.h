// Internal: shapes and slices of tensors shared by the layers (nn/) and the layers split over
// ranks (parallel/).
#pragma once

#include <cstdint>

#include "tutti/core/tensor.h"
#include "tutti/nn/parameter.h"

namespace tutti::nn {

// x viewed as [rows, last] (a 2-D matrix over the last dimension).
inline Tensor as_rows(const Tensor& x, std::int64_t last) { return x.reshape({x.numel() / last, last}); }

// `shape` with its last dimension replaced.
inline Shape with_last(Shape shape, std::int64_t last) {
  shape.back() = last;
  return shape;
}

// part = the elements of `whole` that `slice` (Parameter::InitSlice) names, fp32 on the CPU: along
// slice.dim, part slice.part of slice.parts of each block, the blocks' parts end to end; whole's
// shape is slice.full and part's the same but along dim. InvalidArgument when they do not fit.
void take_slice(const Tensor& whole, const Parameter::InitSlice& slice, const Tensor& part);
// The converse: those elements of `whole` = part.
void put_slice(const Tensor& part, const Parameter::InitSlice& slice, const Tensor& whole);

}  // namespace tutti::nn
