// CUDA block quantization: launchers only (tutti types). Inputs are validated by
// kernels/compress.cc; ordered on `stream`, no host sync.
#pragma once

#include <cstdint>

#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"

namespace tutti::kernels::cuda {

void quantize_blocks(const Tensor& x, int bits, std::int64_t block, const Tensor& q, const Tensor& scales,
                     const Tensor& residual, const Stream& stream);
void dequantize_blocks(const Tensor& q, const Tensor& scales, int bits, std::int64_t block, const Tensor& out,
                       bool accumulate, const Stream& stream);

}  // namespace tutti::kernels::cuda
