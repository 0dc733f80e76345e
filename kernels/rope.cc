// Public rotary position embedding: validate, then run on the tensors' device.
#include "tutti/kernels/rope.h"

#include <cmath>

#include "kernels/cpu/rope.h"
#include "kernels/cuda/rope.h"
#include "kernels/validate.h"

namespace tutti::kernels {
namespace {

// qkv [B, T, (H + 2G)·hs] with hs even, and the table covering T positions of hs/2 pairs.
RopeShape rope_shape(const char* op, const Tensor& qkv, std::int64_t heads, std::int64_t kv_heads, const Tensor& table,
                     const Stream& stream) {
  detail::require_floating(op, "qkv", qkv);
  TUTTI_CHECK_ARG(heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0, op, ": ", kv_heads, " kv_heads must divide ",
                  heads, " heads");
  const std::int64_t parts = heads + 2 * kv_heads;
  TUTTI_CHECK_ARG(qkv.ndim() == 3 && qkv.dim(2) % parts == 0 && qkv.dim(2) > 0 && (qkv.dim(2) / parts) % 2 == 0, op,
                  ": qkv must be [B, T, (", heads, " heads + 2 x ", kv_heads, " kv_heads) x head_size] with an even ",
                  "head_size, got ", qkv.str());
  const std::int64_t hs = qkv.dim(2) / parts;
  detail::require_dtype(op, "table", table, DType::f32);
  TUTTI_CHECK_ARG(table.ndim() == 3 && table.dim(0) >= qkv.dim(1) && table.dim(1) == hs / 2 && table.dim(2) == 2, op,
                  ": table must be [T_max >= ", qkv.dim(1), ", ", hs / 2, ", 2] for qkv ", qkv.str(), ", got ",
                  table.str());
  const Device device = detail::require_same_device(op, {&qkv, &table}, stream);
  (void)device;
  return RopeShape{qkv.dim(0), qkv.dim(1), heads + kv_heads, hs, parts * hs};
}

}  // namespace

Tensor rope_table(const std::vector<float>& inv_freq, std::int64_t T) {
  TUTTI_CHECK_ARG(!inv_freq.empty() && T >= 1, "rope_table: needs frequencies and T >= 1, got ", inv_freq.size(),
                  " and ", T);
  const auto half = static_cast<std::int64_t>(inv_freq.size());
  Tensor table = Tensor::empty({T, half, 2}, DType::f32);
  float* p = table.data_as<float>();
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t i = 0; i < half; ++i) {
      // f32 product as torch computes position_ids.float() @ inv_freq; cos and sin of that f32
      // angle, correctly rounded (torch's f32 cos/sin are within an ulp of it).
      const float angle = static_cast<float>(t) * inv_freq[static_cast<std::size_t>(i)];
      p[(t * half + i) * 2] = static_cast<float>(std::cos(static_cast<double>(angle)));
      p[(t * half + i) * 2 + 1] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  return table;
}

void rope_forward(const Tensor& qkv, std::int64_t heads, std::int64_t kv_heads, const Tensor& table,
                  const Stream& stream) {
  const RopeShape s = rope_shape("rope_forward", qkv, heads, kv_heads, table, stream);
  if (qkv.device().is_cuda())
    cuda::rope_rotate(qkv, s, table, false, stream);
  else
    cpu::rope_rotate(qkv, s, table, false);
}

void rope_backward(const Tensor& dqkv, std::int64_t heads, std::int64_t kv_heads, const Tensor& table,
                   const Stream& stream) {
  const RopeShape s = rope_shape("rope_backward", dqkv, heads, kv_heads, table, stream);
  if (dqkv.device().is_cuda())
    cuda::rope_rotate(dqkv, s, table, true, stream);
  else
    cpu::rope_rotate(dqkv, s, table, true);
}

}  // namespace tutti::kernels
