// Global gradient-norm clipping. The norm is computed in fp32 over all gradients together.
// Under data parallelism, compute it after the gradients were summed across ranks: every
// rank then holds the same gradients and gets the same norm without extra communication.
#pragma once

#include <vector>

#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"
#include "tutti/nn/parameter.h"

namespace tutti::optim {

// The sum of squares of every defined gradient, accumulated in fp32 into a [1] f32 tensor
// on the gradients' device. Issued on `stream`; no host sync. A non-finite gradient makes
// it inf or nan, so it doubles as the found-inf check of a step.
Tensor grad_norm_squared(const std::vector<nn::Parameter*>& params, const Stream& stream = Stream());

// min(1, max_norm / (norm + 1e-6)), PyTorch's clip_grad_norm_ coefficient; 1 for a
// non-finite norm (such a step is skipped anyway).
float clip_coefficient(double norm, double max_norm);

struct GradNorm {
  double norm = 0;        // the global L2 norm
  float coefficient = 1;  // what to pass to Optimizer::step
  bool finite = true;     // false when some gradient holds inf or nan
};

// Computes the global norm and reads it (one host sync), without touching the gradients:
// pass .coefficient to Optimizer::step(grad_scale), which folds it into the update.
GradNorm compute_grad_norm(const std::vector<nn::Parameter*>& params, double max_norm, const Stream& stream = Stream());

// As PyTorch's clip_grad_norm_: also scales the gradients in place when the coefficient is
// below 1. Returns the norm. One host sync.
double clip_grad_norm(const std::vector<nn::Parameter*>& params, double max_norm, const Stream& stream = Stream());

}  // namespace tutti::optim
