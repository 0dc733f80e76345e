// CPU token + position embedding. Internal header; inputs are validated by
// kernels/embedding.cc (the token range is checked here, where the tokens can be read).
#pragma once

#include "tutti/core/tensor.h"

namespace tutti::kernels::cpu {

void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& out);
void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dwte, const Tensor& dwpe,
                        bool accumulate_params);

}  // namespace tutti::kernels::cpu
