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

// ---- The classes split across ranks ---------------------------------------------------------
// Softmax cross-entropy over logits whose classes are split across the ranks of a group
// (parallel::VocabParallelCrossEntropy, Megatron's vocabulary-parallel loss): this rank's logits
// [N, Cr] are columns [columns.first, columns.first + Cr) of the whole [N, columns.total]. Three
// steps, every rank alike, with a reduction over the ranks after each of the first two:
//   1. cross_entropy_local_max:  row_max [N] f32 = each row's max over these columns;
//                                then the max over the ranks: the whole row's max
//   2. cross_entropy_local_sums: sums [2, N] f32: sums[0, r] = the sum over these columns of
//                                exp(logit - row_max[r]); sums[1, r] = the label's logit where
//                                the label is one of these columns, else 0 (0 and 0 for ignored
//                                rows); then the sum over the ranks
//   3. cross_entropy_from_sums:  loss [1] = the mean over counted rows of
//                                log(sums[0]) + row_max - sums[1], and dlogits for these columns,
//                                grad_scale · (exp(logit - row_max) / sums[0] - onehot) / counted
//                                rows: softmax_cross_entropy's results, up to the order of the sums
// Labels are checked against [0, columns.total) as softmax_cross_entropy checks them (CPU:
// InvalidArgument in steps 2 and 3; GPU: nan in sums[1], so in the loss).
struct ClassColumns {
  std::int64_t first = 0;  // the class of these logits' column 0
  std::int64_t total = 0;  // classes of the whole logits (>= first + the logits' columns)
};

void cross_entropy_local_max(const Tensor& logits, const Tensor& row_max, const Stream& stream = Stream());
void cross_entropy_local_sums(const Tensor& logits, const Tensor& labels, const Tensor& row_max, const Tensor& sums,
                              const ClassColumns& columns, std::int64_t ignore_index = -100,
                              const Stream& stream = Stream());
void cross_entropy_from_sums(const Tensor& logits, const Tensor& labels, const Tensor& row_max, const Tensor& sums,
                             const Tensor& loss, const Tensor& dlogits, const ClassColumns& columns,
                             const CrossEntropyOptions& options = {}, const Stream& stream = Stream());

// correct [1] i64 (+)= number of rows whose argmax over logits equals the label (rows with
// ignore_index are not counted). For accuracy without copying logits to the host.
void count_correct(const Tensor& logits, const Tensor& labels, const Tensor& correct, bool accumulate,
                   std::int64_t ignore_index = -100, const Stream& stream = Stream());

}  // namespace tutti::kernels
