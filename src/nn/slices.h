// Internal: shapes and slices of tensors shared by the layers (nn/) and the layers split over
// ranks (parallel/).
#pragma once

#include <cstdint>

#include "tutti/core/tensor.h"

namespace tutti::nn {

// x viewed as [rows, last] (a 2-D matrix over the last dimension).
inline Tensor as_rows(const Tensor& x, std::int64_t last) { return x.reshape({x.numel() / last, last}); }

// `shape` with its last dimension replaced.
inline Shape with_last(Shape shape, std::int64_t last) {
  shape.back() = last;
  return shape;
}

// part = the elements [begin, begin + part's size along dim) of `whole` along `dim` (fp32, CPU;
// whole's other dimensions equal part's). With blocks > 1, whole's `dim` is that many equal
// blocks and part takes part's size / blocks elements from `begin` of each (Parameter::InitSlice).
// InvalidArgument when it does not fit.
void take_slice(const Tensor& whole, int dim, std::int64_t begin, const Tensor& part, int blocks = 1);
// The converse: those elements of `whole` = part.
void put_slice(const Tensor& part, int dim, std::int64_t begin, const Tensor& whole, int blocks = 1);

}  // namespace tutti::nn
