// Public attention ops: validate, then run on the tensors' device.
#include "tutti/kernels/attention.h"

#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/validate.h"

namespace tutti::kernels {
namespace {

// B, T, C of qkv [B, T, 3C], checked against `heads`.
struct AttentionShape {
  std::int64_t B, T, C;
};

AttentionShape attention_shape(const char* op, const Tensor& qkv, std::int64_t heads) {
  detail::require_floating(op, "qkv", qkv);
  TUTTI_CHECK_ARG(qkv.ndim() == 3 && qkv.dim(2) % 3 == 0 && qkv.dim(1) >= 1, op,
                  ": qkv must be [B, T, 3C] with T >= 1, got ", qkv.str());
  const std::int64_t C = qkv.dim(2) / 3;
  TUTTI_CHECK_ARG(heads >= 1 && C % heads == 0 && C > 0, op, ": ", heads, " heads do not divide the width C = ", C,
                  " of qkv ", qkv.str());
  return {qkv.dim(0), qkv.dim(1), C};
}

}  // namespace

void attention_forward(const Tensor& qkv, std::int64_t heads, const Tensor& out, const Tensor& probs,
                       const Stream& stream) {
  constexpr const char* op = "attention_forward";
  const AttentionShape s = attention_shape(op, qkv, heads);
  detail::require_dtype(op, "out", out, qkv.dtype());
  detail::require_shape(op, "out", out, {s.B, s.T, s.C});
  detail::require_dtype(op, "probs", probs, qkv.dtype());
  detail::require_shape(op, "probs", probs, {s.B, heads, s.T, s.T});
  const Device device = detail::require_same_device(op, {&qkv, &out, &probs}, stream);
  if (device.is_cuda())
    cuda::attention_forward(qkv, heads, out, probs, stream);
  else
    cpu::attention_forward(qkv, heads, out, probs);
}

void attention_backward(const Tensor& qkv, const Tensor& probs, const Tensor& dout, std::int64_t heads,
                        const Tensor& dqkv, const Stream& stream) {
  constexpr const char* op = "attention_backward";
  const AttentionShape s = attention_shape(op, qkv, heads);
  detail::require_dtype(op, "probs", probs, qkv.dtype());
  detail::require_shape(op, "probs", probs, {s.B, heads, s.T, s.T});
  detail::require_dtype(op, "dout", dout, qkv.dtype());
  detail::require_shape(op, "dout", dout, {s.B, s.T, s.C});
  detail::require_dtype(op, "dqkv", dqkv, qkv.dtype());
  detail::require_shape(op, "dqkv", dqkv, qkv.shape());
  const Device device = detail::require_same_device(op, {&qkv, &probs, &dout, &dqkv}, stream);
  if (device.is_cuda())
    cuda::attention_backward(qkv, probs, dout, heads, dqkv, stream);
  else
    cpu::attention_backward(qkv, probs, dout, heads, dqkv);
}

}  // namespace tutti::kernels
