#include "tutti/nn/loss.h"

#include "nn/reuse_or_make.h"
#include "tutti/kernels/cross_entropy.h"

namespace tutti::nn {

void CrossEntropyLoss::prepare(const Tensor& logits, const Tensor& labels) {
  TUTTI_CHECK_ARG(logits.defined() && logits.ndim() >= 2, "CrossEntropyLoss: logits must be [..., C], got ",
                  logits.str());
  TUTTI_CHECK_ARG(labels.defined(), "CrossEntropyLoss: the labels are undefined");
  const Shape rows_shape(logits.shape().begin(), logits.shape().end() - 1);
  TUTTI_CHECK_ARG(labels.shape() == rows_shape, "CrossEntropyLoss: labels ", labels.str(), " must have the shape of ",
                  "the logits ", logits.str(), " without their last dimension");
  reuse_or_make(loss_, {1}, DType::f32, logits.device());
  reuse_or_make(dlogits_, logits.shape(), logits.dtype(), logits.device());
}

const Tensor& CrossEntropyLoss::forward(const Tensor& logits, const Tensor& labels, float grad_scale,
                                        const Stream& stream) {
  prepare(logits, labels);
  kernels::CrossEntropyOptions options;
  options.ignore_index = ignore_index_;
  options.grad_scale = grad_scale;
  // [..., C] as [N, C] rows: views of the same storage.
  const std::int64_t C = logits.dim(-1);
  const std::int64_t N = labels.numel();
  kernels::softmax_cross_entropy(logits.reshape({N, C}), labels.reshape({N}), loss_, dlogits_.reshape({N, C}), options,
                                 stream);
  return loss_;
}

std::int64_t CrossEntropyLoss::buffer_bytes(const Shape& logits, DType dtype) const {
  return numel_of(logits) * static_cast<std::int64_t>(size_of(dtype));
}

double item(const Tensor& scalar, const Stream& stream) {
  TUTTI_CHECK_ARG(scalar.defined() && scalar.numel() == 1, "item: needs a one-element tensor, got ", scalar.str());
  stream.synchronize();
  if (is_floating(scalar.dtype())) return scalar.to_floats()[0];
  return static_cast<double>(scalar.to_ints()[0]);
}

std::int64_t count_correct(const Tensor& logits, const Tensor& labels, const Stream& stream) {
  Tensor correct = Tensor::empty({1}, DType::i64, logits.device());
  kernels::count_correct(logits, labels, correct, /*accumulate=*/false, -100, stream);
  stream.synchronize();
  return correct.to_ints()[0];
}

}  // namespace tutti::nn
