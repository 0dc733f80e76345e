// CUDA launchers of softmax cross-entropy and the accuracy count. Inputs are validated by
// kernels/cross_entropy.cc; launches are ordered on `stream`. No CUDA types here.
#pragma once

#include <cstdint>

#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"
#include "tutti/kernels/cross_entropy.h"

namespace tutti::kernels::cuda {

// A label neither in [0, C) nor ignore_index makes the loss nan (checked on the device).
void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& loss, const Tensor& dlogits,
                           std::int64_t ignore_index, float grad_scale, const Stream& stream);
// The classes split across ranks (kernels/cross_entropy.h): a label outside [0, columns.total)
// makes sums[1] of its row nan, so the loss.
void cross_entropy_local_max(const Tensor& logits, const Tensor& row_max, const Stream& stream);
void cross_entropy_local_sums(const Tensor& logits, const Tensor& labels, const Tensor& row_max, const Tensor& sums,
                              const ClassColumns& columns, std::int64_t ignore_index, const Stream& stream);
void cross_entropy_from_sums(const Tensor& logits, const Tensor& labels, const Tensor& row_max, const Tensor& sums,
                             const Tensor& loss, const Tensor& dlogits, const ClassColumns& columns,
                             std::int64_t ignore_index, float grad_scale, const Stream& stream);
// Labels out of range are never correct (as on the CPU).
void count_correct(const Tensor& logits, const Tensor& labels, const Tensor& correct, bool accumulate,
                   std::int64_t ignore_index, const Stream& stream);

}  // namespace tutti::kernels::cuda
