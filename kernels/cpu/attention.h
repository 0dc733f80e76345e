// CPU causal self-attention: per (batch, head), OpenBLAS GEMMs straight on the packed qkv
// (leading dimension 3C, no copies) and a fused, numerically stable causal softmax.
// Internal header; inputs are validated by kernels/attention.cc.
#pragma once

#include <cstdint>

#include "tutti/core/tensor.h"

namespace tutti::kernels::cpu {

void attention_forward(const Tensor& qkv, std::int64_t heads, const Tensor& out, const Tensor& probs);
void attention_backward(const Tensor& qkv, const Tensor& probs, const Tensor& dout, std::int64_t heads,
                        const Tensor& dqkv);

}  // namespace tutti::kernels::cpu
