// CPU tiled causal self-attention with an online softmax (tutti/kernels/flash_attention.h):
// register-tiled GEMMs (cpu/tile_gemm.h) on tiles read straight from the packed qkv, the
// key/value heads shared by their query heads in place; only k^T (and in backward v^T) of one
// key/value head at a time is packed, once for all its query tiles. Internal header; inputs are validated by
// kernels/flash_attention.cc.
#pragma once

#include "kernels/flash_tiles.h"
#include "tutti/core/tensor.h"

namespace tutti::kernels::cpu {

void flash_attention_forward(const Tensor& qkv, const FlashShape& shape, const Tensor& out, const Tensor& lse);
void flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                              const FlashShape& shape, const Tensor& dqkv);

}  // namespace tutti::kernels::cpu
