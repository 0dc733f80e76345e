#include "tutti/kernels/compress.h"

#include "kernels/cpu/compress.h"
#include "kernels/cuda/compress.h"
#include "kernels/validate.h"

namespace tutti::kernels {
namespace {

// bits is 8 or 4; block >= 1, and even for 4 bits.
void check_format(const char* op, int bits, std::int64_t block) {
  TUTTI_CHECK_ARG(bits == 8 || bits == 4, op, ": bits must be 8 or 4, got ", bits);
  TUTTI_CHECK_ARG(block >= 1, op, ": block must be at least 1, got ", block);
  TUTTI_CHECK_ARG(bits == 8 || block % 2 == 0, op, ": block must be even for 4 bits (a byte holds two values of ",
                  "one block), got ", block);
}

// q and scales hold exactly the words and scales of n values.
void check_payload(const char* op, std::int64_t n, int bits, std::int64_t block, const Tensor& q,
                   const Tensor& scales) {
  detail::require_dtype(op, "q", q, DType::i32);
  detail::require_dtype(op, "scales", scales, DType::f32);
  TUTTI_CHECK_ARG(q.numel() == quantized_words(n, bits), op, ": q must hold quantized_words(", n, ", ", bits,
                  ") = ", quantized_words(n, bits), " i32 elements, got ", q.str());
  TUTTI_CHECK_ARG(scales.numel() == quantized_blocks(n, block), op, ": scales must hold quantized_blocks(", n, ", ",
                  block, ") = ", quantized_blocks(n, block), " f32 elements, got ", scales.str());
}

}  // namespace

std::int64_t quantized_words(std::int64_t n, int bits) {
  TUTTI_CHECK_ARG(bits == 8 || bits == 4, "quantized_words: bits must be 8 or 4, got ", bits);
  TUTTI_CHECK_ARG(n >= 0, "quantized_words: n must be non-negative, got ", n);
  const std::int64_t bytes = bits == 8 ? n : (n + 1) / 2;
  return (bytes + 3) / 4;
}

std::int64_t quantized_blocks(std::int64_t n, std::int64_t block) {
  TUTTI_CHECK_ARG(block >= 1, "quantized_blocks: block must be at least 1, got ", block);
  TUTTI_CHECK_ARG(n >= 0, "quantized_blocks: n must be non-negative, got ", n);
  return (n + block - 1) / block;
}

void quantize_blocks(const Tensor& x, int bits, std::int64_t block, const Tensor& q, const Tensor& scales,
                     const Tensor& residual, const Stream& stream) {
  const char* op = "quantize_blocks";
  check_format(op, bits, block);
  detail::require_dtype(op, "x", x, DType::f32);
  check_payload(op, x.numel(), bits, block, q, scales);
  if (residual.defined()) {
    detail::require_dtype(op, "residual", residual, DType::f32);
    detail::require_same_numel(op, "x", x, "residual", residual);
    TUTTI_CHECK_ARG(x.numel() == 0 || residual.data() != x.data(), op, ": residual may not alias x");
  }
  const Device device = detail::require_same_device(op, {&x, &q, &scales, &residual}, stream);
  if (x.numel() == 0) return;
  if (device.is_cuda()) {
    cuda::quantize_blocks(x, bits, block, q, scales, residual, stream);
  } else {
    cpu::quantize_blocks(x, bits, block, q, scales, residual);
  }
}

void dequantize_blocks(const Tensor& q, const Tensor& scales, int bits, std::int64_t block, const Tensor& out,
                       bool accumulate, const Stream& stream) {
  const char* op = "dequantize_blocks";
  check_format(op, bits, block);
  detail::require_dtype(op, "out", out, DType::f32);
  check_payload(op, out.numel(), bits, block, q, scales);
  const Device device = detail::require_same_device(op, {&q, &scales, &out}, stream);
  if (out.numel() == 0) return;
  if (device.is_cuda()) {
    cuda::dequantize_blocks(q, scales, bits, block, out, accumulate, stream);
  } else {
    cpu::dequantize_blocks(q, scales, bits, block, out, accumulate);
  }
}

}  // namespace tutti::kernels
