// Public tiled attention ops: validate, then run on the tensors' device.
#include "tutti/kernels/flash_attention.h"

#include "kernels/cpu/flash_attention.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/validate.h"

namespace tutti::kernels {
namespace {

// qkv [B, T, (H + 2G)·hs] checked against the heads; tiles filled in.
FlashShape flash_shape(const char* op, const Tensor& qkv, const FlashAttentionParams& p) {
  detail::require_floating(op, "qkv", qkv);
  TUTTI_CHECK_ARG(qkv.ndim() == 3 && qkv.dim(1) >= 1, op, ": qkv must be [B, T, (heads + 2 kv_heads) x head_size]",
                  " with T >= 1, got ", qkv.str());
  const std::int64_t H = p.heads, G = p.kv_heads == 0 ? p.heads : p.kv_heads;
  TUTTI_CHECK_ARG(H >= 1 && G >= 1 && H % G == 0, op, ": ", G, " kv_heads must divide ", H, " heads");
  TUTTI_CHECK_ARG(qkv.dim(2) % (H + 2 * G) == 0 && qkv.dim(2) > 0, op, ": the width ", qkv.dim(2), " of qkv ",
                  qkv.str(), " is not (", H, " heads + 2 x ", G, " kv_heads) x head_size");
  TUTTI_CHECK_ARG(p.query_tile >= 0 && p.key_tile >= 0, op, ": tiles must be >= 0 (0: the kernel's choice), got ",
                  p.query_tile, " x ", p.key_tile);
  return FlashShape{qkv.dim(0), qkv.dim(1), H, G, qkv.dim(2) / (H + 2 * G), p.query_tile, p.key_tile};
}

void require_lse(const char* op, const Tensor& lse, const FlashShape& s) {
  detail::require_dtype(op, "lse", lse, DType::f32);
  detail::require_shape(op, "lse", lse, {s.B, s.H, s.T});
}

}  // namespace

void flash_attention_forward(const Tensor& qkv, const FlashAttentionParams& params, const Tensor& out,
                             const Tensor& lse, const Stream& stream) {
  constexpr const char* op = "flash_attention_forward";
  const FlashShape s = flash_shape(op, qkv, params);
  detail::require_dtype(op, "out", out, qkv.dtype());
  detail::require_shape(op, "out", out, {s.B, s.T, s.H * s.hs});
  require_lse(op, lse, s);
  const Device device = detail::require_same_device(op, {&qkv, &out, &lse}, stream);
  if (device.is_cuda())
    cuda::flash_attention_forward(qkv, s, out, lse, stream);
  else
    cpu::flash_attention_forward(qkv, s, out, lse);
}

void flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                              const FlashAttentionParams& params, const Tensor& dqkv, const Stream& stream) {
  constexpr const char* op = "flash_attention_backward";
  const FlashShape s = flash_shape(op, qkv, params);
  detail::require_dtype(op, "out", out, qkv.dtype());
  detail::require_shape(op, "out", out, {s.B, s.T, s.H * s.hs});
  require_lse(op, lse, s);
  detail::require_dtype(op, "dout", dout, qkv.dtype());
  detail::require_shape(op, "dout", dout, {s.B, s.T, s.H * s.hs});
  detail::require_dtype(op, "dqkv", dqkv, qkv.dtype());
  detail::require_shape(op, "dqkv", dqkv, qkv.shape());
  const Device device = detail::require_same_device(op, {&qkv, &out, &lse, &dout, &dqkv}, stream);
  if (device.is_cuda())
    cuda::flash_attention_backward(qkv, out, lse, dout, s, dqkv, stream);
  else
    cpu::flash_attention_backward(qkv, out, lse, dout, s, dqkv);
}

std::int64_t flash_attention_gpu_scratch_bytes(std::int64_t B, std::int64_t T, std::int64_t head_size,
                                               const FlashAttentionParams& params, DType dtype, bool backward) {
  const std::int64_t G = params.kv_heads == 0 ? params.heads : params.kv_heads;
  const FlashShape s{B, T, params.heads, G, head_size, params.query_tile, params.key_tile};
  return flash_gpu_scratch_bytes(s, size_of(dtype), backward);
}

}  // namespace tutti::kernels
