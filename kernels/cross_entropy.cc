// Public cross-entropy ops: validate, then run on the tensors' device.
#include "tutti/kernels/cross_entropy.h"

#include "kernels/cpu/cross_entropy.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/validate.h"

namespace tutti::kernels {
namespace {

void require_logits_and_labels(const char* op, const Tensor& logits, const Tensor& labels) {
  detail::require_floating(op, "logits", logits);
  TUTTI_CHECK_ARG(logits.ndim() == 2, op, ": logits must be [N, C], got ", logits.str());
  detail::require_defined(op, "labels", labels);
  TUTTI_CHECK_ARG(labels.dtype() == DType::i32 || labels.dtype() == DType::i64, op, ": labels must be i32 or i64, got ",
                  labels.str());
  detail::require_shape(op, "labels", labels, {logits.dim(0)});
}

}  // namespace

void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& loss, const Tensor& dlogits,
                           const CrossEntropyOptions& options, const Stream& stream) {
  constexpr const char* op = "softmax_cross_entropy";
  require_logits_and_labels(op, logits, labels);
  detail::require_dtype(op, "loss", loss, DType::f32);
  detail::require_shape(op, "loss", loss, {1});
  if (dlogits.defined()) {
    detail::require_dtype(op, "dlogits", dlogits, logits.dtype());
    detail::require_shape(op, "dlogits", dlogits, logits.shape());
  }
  const Device device = detail::require_same_device(op, {&logits, &labels, &loss, &dlogits}, stream);
  if (device.is_cuda())
    cuda::softmax_cross_entropy(logits, labels, loss, dlogits, options.ignore_index, options.grad_scale, stream);
  else
    cpu::softmax_cross_entropy(logits, labels, loss, dlogits, options.ignore_index, options.grad_scale);
}

void count_correct(const Tensor& logits, const Tensor& labels, const Tensor& correct, bool accumulate,
                   std::int64_t ignore_index, const Stream& stream) {
  constexpr const char* op = "count_correct";
  require_logits_and_labels(op, logits, labels);
  detail::require_dtype(op, "correct", correct, DType::i64);
  detail::require_shape(op, "correct", correct, {1});
  const Device device = detail::require_same_device(op, {&logits, &labels, &correct}, stream);
  if (device.is_cuda())
    cuda::count_correct(logits, labels, correct, accumulate, ignore_index, stream);
  else
    cpu::count_correct(logits, labels, correct, accumulate, ignore_index);
}

}  // namespace tutti::kernels
