// Softmax cross-entropy over class logits with integer labels, fused: one pass computes the
// loss and dlogits, numerically stable (max subtracted). See linear.h for the conventions.
#pragma once

#include <cstdint>

#include "tutti/core/tensor.h"

namespace tutti::kernels {

struct CrossEntropyOptions {
  // Rows whose label equals this are skipped: no loss, zero gradient, not counted.
  std::int64_t ignore_index = -100;
  // dlogits is multiplied by this (fold the loss scale of mixed precision in here).
  float grad_scale = 1.0f;
};

// logits [N, C] (f32/f16/bf16), labels [N] (i32 or i64, each in [0, C) or ignore_index):
//   loss [1] f32     = mean over counted rows of -log softmax(logits)[label]   (0 if none)
//   dlogits [N, C]   = grad_scale · (softmax(logits) - onehot(label)) / counted rows
//                      (optional; same dtype as logits)
// A label out of range is an InvalidArgument on the CPU; on the GPU such rows set loss to
// nan, since the host cannot check device labels without a sync.
void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& loss, const Tensor& dlogits,
                           const CrossEntropyOptions& options = {}, const Stream& stream = Stream());

// correct [1] i64 (+)= number of rows whose argmax over logits equals the label (rows with
// ignore_index are not counted). For accuracy without copying logits to the host.
void count_correct(const Tensor& logits, const Tensor& labels, const Tensor& correct, bool accumulate,
                   std::int64_t ignore_index = -100, const Stream& stream = Stream());

}  // namespace tutti::kernels
