// CPU fused optimizer updates. Internal header; inputs are validated by kernels/optimizer.cc.
#pragma once

#include "tutti/core/tensor.h"
#include "tutti/kernels/optimizer.h"

namespace tutti::kernels::cpu {

void sgd_update(const Tensor& w, const Tensor& grad, const Tensor& momentum_buf, const Tensor& weights_half,
                const SgdParams& params, bool first_step);
void adamw_update(const Tensor& w, const Tensor& grad, const Tensor& m, const Tensor& v, const Tensor& weights_half,
                  const AdamWParams& params);

}  // namespace tutti::kernels::cpu
