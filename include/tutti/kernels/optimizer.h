// Fused optimizer updates over flat buffers: one pass reads the gradient, updates the fp32
// master weights and the optimizer state, and optionally writes the half-precision compute
// copy of the weights. See linear.h for the conventions.
#pragma once

#include <cstdint>

#include "tutti/core/tensor.h"

namespace tutti::kernels {

struct SgdParams {
  float lr = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;  // L2, added to the gradient: g += weight_decay · w
  bool nesterov = false;
  float grad_scale = 1.0f;  // g is multiplied by this first (clipping coefficient)
};

// w [n] f32 master weights; grad [n] f32/f16/bf16; momentum_buf [n] f32 (required when
// momentum != 0; first_step says it holds nothing yet, as in PyTorch where the first step
// sets buf = g); weights_half [n] f16/bf16 (optional) receives the updated w.
//   g = grad_scale · grad + weight_decay · w
//   buf = first_step ? g : momentum · buf + g;  d = nesterov ? g + momentum · buf : buf
//   w -= lr · d
void sgd_update(const Tensor& w, const Tensor& grad, const Tensor& momentum_buf, const Tensor& weights_half,
                const SgdParams& params, bool first_step, const Stream& stream = Stream());

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;  // decoupled: w -= lr · weight_decay · w
  std::int64_t step = 1;       // 1-based, for the bias corrections 1 - beta^step
  float grad_scale = 1.0f;     // g is multiplied by this first (clipping coefficient)
};

// w, m, v [n] f32; grad [n] f32/f16/bf16; weights_half optional (f16/bf16):
//   g = grad_scale · grad;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g²
//   w -= lr · (weight_decay · w + (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps))
void adamw_update(const Tensor& w, const Tensor& grad, const Tensor& m, const Tensor& v, const Tensor& weights_half,
                  const AdamWParams& params, const Stream& stream = Stream());

}  // namespace tutti::kernels
