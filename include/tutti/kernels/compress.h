// Block-scaled quantization of f32 tensors to int8 or packed 4-bit, for sending pseudo-gradients
// over thin links (issue 23), with optional error feedback. See linear.h for the conventions.
//
// Format. x (n f32 values) is cut into blocks of `block` consecutive elements (the last one may
// be shorter). Each block b has one f32 scale s_b = absmax_b / qmax, qmax = 127 (8 bits) or
// 7 (4 bits), and each element the integer q_i = round(x_i / s_b) (f32 division, round to
// nearest, ties to even), clamped to [-qmax, qmax]: symmetric, so -qmax..qmax and no other code.
// An all-zero block has s_b = 0 and every q_i = 0. Dequantized, x_i ≈ q_i · s_b (one f32
// multiplication); for finite inputs |x_i - q_i · s_b| <= s_b / 2 plus a rounding of an ulp.
// The bytes (`q`, an i32 tensor used as a byte buffer, quantized_words(n, bits) elements): 8 bits:
// byte i = q_i as a two's complement int8. 4 bits: byte i holds q_2i in its low nibble and
// q_2i+1 in its high nibble (two's complement nibbles); for odd n the last high nibble is 0.
// Bytes past the last value (up to the next 4-byte word) are 0. The results are the same bits on
// the CPU and on a GPU. Inputs are assumed finite: an inf or nan makes its block meaningless.
#pragma once

#include <cstdint>

#include "tutti/core/tensor.h"

namespace tutti::kernels {

// The i32 elements that hold n values of `bits` (8 or 4) bits: ceil(ceil(n · bits / 8) / 4).
std::int64_t quantized_words(std::int64_t n, int bits);
// The number of blocks (and scales) of n values in blocks of `block`: ceil(n / block).
std::int64_t quantized_blocks(std::int64_t n, std::int64_t block);

// Quantizes x (f32) into q (i32, quantized_words(x.numel(), bits) elements) and scales (f32,
// quantized_blocks(x.numel(), block) elements), in the format above. bits: 8 or 4; block >= 1,
// and even for 4 bits (so that no byte straddles two blocks). Error feedback when `residual` is
// defined (f32, as many elements as x): the values quantized are v = x + residual (one f32
// addition), and afterwards residual = v - q · s (what was not sent, carried to the next call).
// x is not written; residual may not alias x. Ordered on `stream`, no host sync.
void quantize_blocks(const Tensor& x, int bits, std::int64_t block, const Tensor& q, const Tensor& scales,
                     const Tensor& residual = Tensor(), const Stream& stream = Stream());

// out (f32, n elements) = q · s, the dequantized values of quantize_blocks's q and scales (same
// n, bits and block). accumulate: out += q · s instead (one f32 addition per element), to sum
// several nodes' contributions into one buffer. Ordered on `stream`, no host sync.
void dequantize_blocks(const Tensor& q, const Tensor& scales, int bits, std::int64_t block, const Tensor& out,
                       bool accumulate = false, const Stream& stream = Stream());

}  // namespace tutti::kernels
