// CPU softmax cross-entropy and accuracy count (the reference). Internal header; inputs are
// validated by kernels/cross_entropy.cc, except label ranges, which only the data shows.
#pragma once

#include <cstdint>

#include "tutti/core/tensor.h"
#include "tutti/kernels/cross_entropy.h"

namespace tutti::kernels::cpu {

// Throws InvalidArgument (naming the row and the label) before writing anything when a
// label is neither in [0, C) nor ignore_index.
void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& loss, const Tensor& dlogits,
                           std::int64_t ignore_index, float grad_scale);
// The classes split across ranks (kernels/cross_entropy.h); columns.total is the whole logits'
// width. Labels are checked (InvalidArgument) by the last two.
void cross_entropy_local_max(const Tensor& logits, const Tensor& row_max);
void cross_entropy_local_sums(const Tensor& logits, const Tensor& labels, const Tensor& row_max, const Tensor& sums,
                              const ClassColumns& columns, std::int64_t ignore_index);
void cross_entropy_from_sums(const Tensor& logits, const Tensor& labels, const Tensor& row_max, const Tensor& sums,
                             const Tensor& loss, const Tensor& dlogits, const ClassColumns& columns,
                             std::int64_t ignore_index, float grad_scale);
// Labels out of range are never correct (as on the GPU).
void count_correct(const Tensor& logits, const Tensor& labels, const Tensor& correct, bool accumulate,
                   std::int64_t ignore_index);

}  // namespace tutti::kernels::cpu
