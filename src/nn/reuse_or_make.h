// A tensor kept across calls and remade only when it no longer fits: the losses' outputs
// (nn::CrossEntropyLoss, parallel::VocabParallelCrossEntropy). Internal to src.
#pragma once

#include "tutti/core/tensor.h"

namespace tutti::nn {

// `t` of shape/dtype/device: reused when it already is, else released first and then made anew
// (so the old and the new are never both alive).
inline void reuse_or_make(Tensor& t, const Shape& shape, DType dtype, Device device) {
  if (!t.defined() || t.shape() != shape || t.dtype() != dtype || t.device() != device) {
    t = Tensor();
    t = Tensor::empty(shape, dtype, device);
  }
}

}  // namespace tutti::nn
