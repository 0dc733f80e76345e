#include "tutti/optim/clip.h"

#include <cmath>

#include "tutti/kernels/elementwise.h"
#include "tutti/kernels/reduce.h"

namespace tutti::optim {

namespace {
std::vector<Tensor> grads_of(const std::vector<nn::Parameter*>& params) {
  std::vector<Tensor> grads;
  for (nn::Parameter* p : params) {
    if (p->grad.defined()) grads.push_back(p->grad);
  }
  return nn::coalesce_views(grads);
}
}  // namespace

Tensor grad_norm_squared(const std::vector<nn::Parameter*>& params, const Stream& stream) {
  const std::vector<Tensor> grads = grads_of(params);
  const Device device =
      grads.empty() ? (params.empty() ? Device::cpu() : params.front()->device()) : grads.front().device();
  Tensor out = Tensor::empty({1}, DType::f32, device);
  if (grads.empty()) {
    kernels::fill(out, 0.0f, stream);
    return out;
  }
  for (std::size_t i = 0; i < grads.size(); ++i) kernels::sum_squares(grads[i], out, /*accumulate=*/i > 0, stream);
  return out;
}

float clip_coefficient(double norm, double max_norm) {
  if (!std::isfinite(norm)) return 1.0f;
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? static_cast<float>(c) : 1.0f;
}

GradNorm compute_grad_norm(const std::vector<nn::Parameter*>& params, double max_norm, const Stream& stream) {
  TUTTI_CHECK_ARG(max_norm > 0, "clip: max_norm must be positive, got ", max_norm);
  const Tensor sq = grad_norm_squared(params, stream);
  stream.synchronize();
  GradNorm out;
  out.norm = std::sqrt(static_cast<double>(sq.to_floats()[0]));
  out.finite = std::isfinite(out.norm);
  out.coefficient = clip_coefficient(out.norm, max_norm);
  return out;
}

double clip_grad_norm(const std::vector<nn::Parameter*>& params, double max_norm, const Stream& stream) {
  const GradNorm n = compute_grad_norm(params, max_norm, stream);
  if (n.coefficient < 1.0f) {
    for (const Tensor& g : grads_of(params)) kernels::scale(g, n.coefficient, g, stream);
  }
  return n.norm;
}

}  // namespace tutti::optim
