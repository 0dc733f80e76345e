// Softmax cross-entropy loss (mean over the rows), fused with its gradient.
#pragma once

#include <cstdint>

#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"

namespace tutti::nn {

class CrossEntropyLoss {
 public:
  // Rows whose label is ignore_index count neither in the loss nor in the mean.
  explicit CrossEntropyLoss(std::int64_t ignore_index = -100) : ignore_index_(ignore_index) {}
  virtual ~CrossEntropyLoss() = default;

  // logits [..., C] (f32/f16/bf16; [N, C], or a transformer's [B, T, C]) and labels of the
  // leading shape [...] (i32/i64) on one device: as PyTorch's, the leading dimensions are
  // rows (a view, no copy). One fused pass computes the mean loss over the rows into a [1] f32
  // tensor on that device (returned; no host sync: read it with item() when you want it) and
  // grad() = grad_scale · dLoss/dlogits, of the logits' shape and dtype: what model.backward
  // takes for the output that gave these logits (Module::backward checks the shape).
  // grad_scale: the loss scale of mixed precision (LossScaler::scale()); who divides by it, by
  // the accumulation steps and by the ranks is said once, in ddp/ddp.h ("Gradient scaling").
  // Both results are reused buffers, valid until the next forward. Throws InvalidArgument
  // when the labels' shape is not the logits' without its last dimension.
  // Virtual: parallel::VocabParallelCrossEntropy takes logits whose classes are split across a
  // tensor-parallel group (a model's whose vocabulary is; CausalLm::make_loss picks).
  virtual const Tensor& forward(const Tensor& logits, const Tensor& labels, float grad_scale = 1.0f,
                                const Stream& stream = Stream());
  const Tensor& loss() const { return loss_; }
  const Tensor& grad() const { return dlogits_; }
  // The bytes forward keeps for logits of this shape and dtype: grad() (and, in
  // VocabParallelCrossEntropy, its row statistics), what train::memory_plan counts. The [1] f32
  // loss is not: it is one of a step's scalars.
  virtual std::int64_t buffer_bytes(const Shape& logits, DType dtype) const;

 protected:
  // labels' shape checked against the logits' (InvalidArgument); loss_ and dlogits_ made to fit.
  void prepare(const Tensor& logits, const Tensor& labels);
  std::int64_t ignore_index_;
  Tensor loss_, dlogits_;
};

// Reads a one-element tensor on the host (the host sync point, for a GPU tensor: waits for
// the work on `stream` that produces it).
double item(const Tensor& scalar, const Stream& stream = Stream());

// Number of rows whose argmax equals the label, computed on the device and read back
// (synchronizes). For evaluating accuracy.
std::int64_t count_correct(const Tensor& logits, const Tensor& labels, const Stream& stream = Stream());

}  // namespace tutti::nn
