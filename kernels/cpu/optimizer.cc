#include "kernels/cpu/optimizer.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/common.h"
#include "kernels/validate.h"

namespace tutti::kernels::cpu {
namespace {

using std::int64_t;

// The half copy is optional: H is void when absent, so the loop has no branch for it. The
// momentum, Nesterov and first-step choices are compile-time flags, so each loop is one straight
// vectorizable body (a branch inside the loop, even an invariant one, kept GCC from vectorizing
// most of the variants).
template <bool kMomentum, bool kNesterov, bool kFirstStep, typename G, typename H>
[[gnu::always_inline]] inline void sgd_loop(float* __restrict w, const G* __restrict grad, float* __restrict buf,
                                            H* __restrict half, int64_t n, const SgdParams& p) {
  const float lr = p.lr, mu = p.momentum, wd = p.weight_decay, gs = p.grad_scale;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gs * load_f32(grad[i]) + wd * w[i];
    float d = g;
    if constexpr (kMomentum) {
      const float b = kFirstStep ? g : mu * buf[i] + g;
      buf[i] = b;
      d = kNesterov ? g + mu * b : b;
    }
    const float updated = w[i] - lr * d;
    w[i] = updated;
    if constexpr (!std::is_void_v<H>) half[i] = store_as<H>(updated);
  }
}

template <typename G, typename H>
[[gnu::always_inline]] inline void sgd_impl(float* w, const G* grad, float* buf, H* half, int64_t n, const SgdParams& p,
                                            bool first_step) {
  if (p.momentum == 0.0f) return sgd_loop<false, false, false>(w, grad, buf, half, n, p);
  if (p.nesterov) {
    if (first_step) return sgd_loop<true, true, true>(w, grad, buf, half, n, p);
    return sgd_loop<true, true, false>(w, grad, buf, half, n, p);
  }
  if (first_step) return sgd_loop<true, false, true>(w, grad, buf, half, n, p);
  sgd_loop<true, false, false>(w, grad, buf, half, n, p);
}

template <typename G, typename H>
[[gnu::always_inline]] inline void adamw_impl(float* __restrict w, const G* __restrict grad, float* __restrict m,
                                              float* __restrict v, H* __restrict half, int64_t n,
                                              const AdamWParams& p) {
  // Bias corrections in double on the host, once per call.
  const double bc1 = 1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step));
  const float step_size = static_cast<float>(p.lr / bc1);
  const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float b1 = p.beta1, b2 = p.beta2, eps = p.eps, gs = p.grad_scale;
  const float decay = p.lr * p.weight_decay;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gs * load_f32(grad[i]);
    const float mi = b1 * m[i] + (1.0f - b1) * g;
    const float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) * inv_sqrt_bc2 + eps;
    const float updated = w[i] - decay * w[i] - step_size * mi / denom;
    w[i] = updated;
    if constexpr (!std::is_void_v<H>) half[i] = store_as<H>(updated);
  }
}

// The common case (fp32 gradients, no half copy) is compiled for wider vector units too
// (common.h): AdamW's sqrt and divide make it compute-bound on SSE2. The loops above are forced
// inline so that each clone gets its own copy (GCC otherwise shares one baseline body).
TUTTI_CPU_SIMD_CLONES void sgd_f32(float* w, const float* grad, float* buf, int64_t n, const SgdParams& p,
                                   bool first_step) {
  sgd_impl<float, void>(w, grad, buf, nullptr, n, p, first_step);
}
TUTTI_CPU_SIMD_CLONES void adamw_f32(float* w, const float* grad, float* m, float* v, int64_t n, const AdamWParams& p) {
  adamw_impl<float, void>(w, grad, m, v, nullptr, n, p);
}

// Calls f(G{}, H*) for the grad's element type and the half copy's (void when absent).
template <typename F>
void dispatch_grad_and_half(const char* op, const Tensor& grad, const Tensor& weights_half, F&& f) {
  detail::dispatch_floating(op, grad.dtype(), [&](auto gtag) {
    using G = decltype(gtag);
    if (!weights_half.defined()) {
      f(grad.data_as<G>(), static_cast<void*>(nullptr));
    } else if (weights_half.dtype() == DType::f16) {
      f(grad.data_as<G>(), weights_half.data_as<Half>());
    } else {
      f(grad.data_as<G>(), weights_half.data_as<BFloat16>());
    }
  });
}

}  // namespace

void sgd_update(const Tensor& w, const Tensor& grad, const Tensor& momentum_buf, const Tensor& weights_half,
                const SgdParams& params, bool first_step) {
  float* buf = params.momentum != 0.0f ? momentum_buf.data_as<float>() : nullptr;
  if (grad.dtype() == DType::f32 && !weights_half.defined())
    return sgd_f32(w.data_as<float>(), grad.data_as<float>(), buf, w.numel(), params, first_step);
  dispatch_grad_and_half("sgd_update", grad, weights_half, [&](auto* g, auto* h) {
    using H = std::remove_pointer_t<decltype(h)>;
    sgd_impl<std::remove_const_t<std::remove_pointer_t<decltype(g)>>, H>(w.data_as<float>(), g, buf, h, w.numel(),
                                                                         params, first_step);
  });
}

void adamw_update(const Tensor& w, const Tensor& grad, const Tensor& m, const Tensor& v, const Tensor& weights_half,
                  const AdamWParams& params) {
  if (grad.dtype() == DType::f32 && !weights_half.defined())
    return adamw_f32(w.data_as<float>(), grad.data_as<float>(), m.data_as<float>(), v.data_as<float>(), w.numel(),
                     params);
  dispatch_grad_and_half("adamw_update", grad, weights_half, [&](auto* g, auto* h) {
    using H = std::remove_pointer_t<decltype(h)>;
    adamw_impl<std::remove_const_t<std::remove_pointer_t<decltype(g)>>, H>(w.data_as<float>(), g, m.data_as<float>(),
                                                                           v.data_as<float>(), h, w.numel(), params);
  });
}

}  // namespace tutti::kernels::cpu
