// CPU block quantization. Internal header; inputs are validated by kernels/compress.cc.
#pragma once

#include <cstdint>

#include "tutti/core/tensor.h"

namespace tutti::kernels::cpu {

void quantize_blocks(const Tensor& x, int bits, std::int64_t block, const Tensor& q, const Tensor& scales,
                     const Tensor& residual);
void dequantize_blocks(const Tensor& q, const Tensor& scales, int bits, std::int64_t block, const Tensor& out,
                       bool accumulate);

}  // namespace tutti::kernels::cpu
