// CPU token + position embedding. Internal header; inputs are validated by
// kernels/embedding.cc (the token range is checked here, where the tokens can be read).
#pragma once

#include "tutti/core/tensor.h"
#include "tutti/kernels/embedding.h"

namespace tutti::kernels::cpu {

void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& out,
                       const EmbeddingRows& rows);
void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dwte, const Tensor& dwpe,
                        bool accumulate_params, const EmbeddingRows& rows);

}  // namespace tutti::kernels::cpu
