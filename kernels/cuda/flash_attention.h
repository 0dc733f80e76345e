// CUDA launchers of tiled causal self-attention (cuBLAS GEMMs on tiles and fused online-softmax
// kernels; see flash_attention.cu). Inputs are validated by kernels/flash_attention.cc; launches
// are ordered on `stream`. No CUDA types here.
#pragma once

#include "kernels/flash_tiles.h"
#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"

namespace tutti::kernels::cuda {

void flash_attention_forward(const Tensor& qkv, const FlashShape& shape, const Tensor& out, const Tensor& lse,
                             const Stream& stream);
void flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                              const FlashShape& shape, const Tensor& dqkv, const Stream& stream);

}  // namespace tutti::kernels::cuda
