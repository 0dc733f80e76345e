// CUDA fused optimizer updates: launchers only (tutti types). Inputs are validated by
// kernels/optimizer.cc; one pass, ordered on `stream`, no host sync.
#pragma once

#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"
#include "tutti/kernels/optimizer.h"

namespace tutti::kernels::cuda {

void sgd_update(const Tensor& w, const Tensor& grad, const Tensor& momentum_buf, const Tensor& weights_half,
                const SgdParams& params, bool first_step, const Stream& stream);
void adamw_update(const Tensor& w, const Tensor& grad, const Tensor& m, const Tensor& v, const Tensor& weights_half,
                  const AdamWParams& params, const Stream& stream);

}  // namespace tutti::kernels::cuda
