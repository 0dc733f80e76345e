// CUDA launchers of causal self-attention (cuBLAS strided-batched GEMMs and a fused causal
// softmax; see attention.cu for why). Inputs are validated by kernels/attention.cc; launches
// are ordered on `stream`. No CUDA types here.
#pragma once

#include <cstdint>

#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"

namespace tutti::kernels::cuda {

void attention_forward(const Tensor& qkv, std::int64_t heads, const Tensor& out, const Tensor& probs,
                       const Stream& stream);
void attention_backward(const Tensor& qkv, const Tensor& probs, const Tensor& dout, std::int64_t heads,
                        const Tensor& dqkv, const Stream& stream);

}  // namespace tutti::kernels::cuda
