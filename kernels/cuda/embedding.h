// CUDA launchers of the token + position embedding (see embedding.cu). Inputs are validated
// by kernels/embedding.cc; launches are ordered on `stream`. No CUDA types here.
#pragma once

#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"
#include "tutti/kernels/embedding.h"

namespace tutti::kernels::cuda {

void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& out,
                       const EmbeddingRows& rows, const Stream& stream);
void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dwte, const Tensor& dwpe,
                        bool accumulate_params, const EmbeddingRows& rows, const Stream& stream);

}  // namespace tutti::kernels::cuda
