// CUDA launchers of softmax cross-entropy and the accuracy count. Inputs are validated by
// kernels/cross_entropy.cc; launches are ordered on `stream`. No CUDA types here.
#pragma once

#include <cstdint>

#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"

namespace tutti::kernels::cuda {

// A label neither in [0, C) nor ignore_index makes the loss nan (checked on the device).
void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& loss, const Tensor& dlogits,
                           std::int64_t ignore_index, float grad_scale, const Stream& stream);
// Labels out of range are never correct (as on the CPU).
void count_correct(const Tensor& logits, const Tensor& labels, const Tensor& correct, bool accumulate,
                   std::int64_t ignore_index, const Stream& stream);

}  // namespace tutti::kernels::cuda
