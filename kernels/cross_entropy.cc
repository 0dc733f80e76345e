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

// loss [1] f32, and dlogits (when given) of the logits' shape and dtype.
void require_loss_outputs(const char* op, const Tensor& logits, const Tensor& loss, const Tensor& dlogits) {
  detail::require_dtype(op, "loss", loss, DType::f32);
  detail::require_shape(op, "loss", loss, {1});
  if (dlogits.defined()) {
    detail::require_dtype(op, "dlogits", dlogits, logits.dtype());
    detail::require_shape(op, "dlogits", dlogits, logits.shape());
  }
}

}  // namespace

void softmax_cross_entropy(const Tensor& logits, const Tensor& labels, const Tensor& loss, const Tensor& dlogits,
                           const CrossEntropyOptions& options, const Stream& stream) {
  constexpr const char* op = "softmax_cross_entropy";
  require_logits_and_labels(op, logits, labels);
  require_loss_outputs(op, logits, loss, dlogits);
  const Device device = detail::require_same_device(op, {&logits, &labels, &loss, &dlogits}, stream);
  if (device.is_cuda())
    cuda::softmax_cross_entropy(logits, labels, loss, dlogits, options.ignore_index, options.grad_scale, stream);
  else
    cpu::softmax_cross_entropy(logits, labels, loss, dlogits, options.ignore_index, options.grad_scale);
}

namespace {

// The checks the split pieces share: row_max [N] f32, sums [2, N] f32 (when given), and the
// columns within the whole width (when given).
void require_split(const char* op, const Tensor& logits, const Tensor& row_max, const Tensor* sums,
                   const ClassColumns* columns) {
  detail::require_floating(op, "logits", logits);
  TUTTI_CHECK_ARG(logits.ndim() == 2, op, ": logits must be [N, C], got ", logits.str());
  detail::require_dtype(op, "row_max", row_max, DType::f32);
  detail::require_shape(op, "row_max", row_max, {logits.dim(0)});
  if (sums != nullptr) {
    detail::require_dtype(op, "sums", *sums, DType::f32);
    detail::require_shape(op, "sums", *sums, {2, logits.dim(0)});
  }
  if (columns != nullptr) {
    TUTTI_CHECK_ARG(columns->first >= 0 && columns->first + logits.dim(1) <= columns->total, op, ": the logits' ",
                    logits.dim(1), " columns from class ", columns->first, " are not within the ", columns->total,
                    " classes");
  }
}

}  // namespace

void cross_entropy_local_max(const Tensor& logits, const Tensor& row_max, const Stream& stream) {
  constexpr const char* op = "cross_entropy_local_max";
  require_split(op, logits, row_max, nullptr, nullptr);
  const Device device = detail::require_same_device(op, {&logits, &row_max}, stream);
  if (device.is_cuda())
    cuda::cross_entropy_local_max(logits, row_max, stream);
  else
    cpu::cross_entropy_local_max(logits, row_max);
}

void cross_entropy_local_sums(const Tensor& logits, const Tensor& labels, const Tensor& row_max, const Tensor& sums,
                              const ClassColumns& columns, std::int64_t ignore_index, const Stream& stream) {
  constexpr const char* op = "cross_entropy_local_sums";
  require_logits_and_labels(op, logits, labels);
  require_split(op, logits, row_max, &sums, &columns);
  const Device device = detail::require_same_device(op, {&logits, &labels, &row_max, &sums}, stream);
  if (device.is_cuda())
    cuda::cross_entropy_local_sums(logits, labels, row_max, sums, columns, ignore_index, stream);
  else
    cpu::cross_entropy_local_sums(logits, labels, row_max, sums, columns, ignore_index);
}

void cross_entropy_from_sums(const Tensor& logits, const Tensor& labels, const Tensor& row_max, const Tensor& sums,
                             const Tensor& loss, const Tensor& dlogits, const ClassColumns& columns,
                             const CrossEntropyOptions& options, const Stream& stream) {
  constexpr const char* op = "cross_entropy_from_sums";
  require_logits_and_labels(op, logits, labels);
  require_loss_outputs(op, logits, loss, dlogits);
  require_split(op, logits, row_max, &sums, &columns);
  const Device device = detail::require_same_device(op, {&logits, &labels, &row_max, &sums, &loss, &dlogits}, stream);
  if (device.is_cuda())
    cuda::cross_entropy_from_sums(logits, labels, row_max, sums, loss, dlogits, columns, options.ignore_index,
                                  options.grad_scale, stream);
  else
    cpu::cross_entropy_from_sums(logits, labels, row_max, sums, loss, dlogits, columns, options.ignore_index,
                                 options.grad_scale);
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
