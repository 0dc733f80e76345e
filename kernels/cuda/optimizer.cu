// CUDA fused optimizer updates: one pass reads the gradient (f32/f16/bf16), updates the fp32
// master weights and state, and writes the optional half copy of the weights. Four elements
// per thread-iteration: one 16-byte access for each fp32 array when every buffer is aligned.
// The half copy's dtype is a run-time switch (uniform across the grid) rather than a template,
// to keep the instantiations few.
#include "kernels/cuda/optimizer.h"

#include <cmath>
#include <initializer_list>
#include <utility>

#include "kernels/cuda/common.cuh"
#include "kernels/validate.h"

namespace tutti::kernels::cuda {
namespace {

using std::int64_t;

constexpr int kBlock = 256;
constexpr int kVec = 4;

enum HalfCopy : int { kNoHalf = 0, kF16 = 1, kBF16 = 2 };

__device__ __forceinline__ void write_half(void* half, int kind, int64_t i, float w) {
  if (kind == kF16) static_cast<__half*>(half)[i] = __float2half_rn(w);
  if (kind == kBF16) static_cast<__nv_bfloat16*>(half)[i] = __float2bfloat16_rn(w);
}

template <int VEC>
__device__ __forceinline__ void write_half_pack(void* half, int kind, int64_t pack, const float (&w)[VEC]) {
  if (kind == kF16) {
    Pack<__half, VEC> h;
#pragma unroll
    for (int j = 0; j < VEC; ++j) h.v[j] = __float2half_rn(w[j]);
    reinterpret_cast<Pack<__half, VEC>*>(half)[pack] = h;
  } else if (kind == kBF16) {
    Pack<__nv_bfloat16, VEC> h;
#pragma unroll
    for (int j = 0; j < VEC; ++j) h.v[j] = __float2bfloat16_rn(w[j]);
    reinterpret_cast<Pack<__nv_bfloat16, VEC>*>(half)[pack] = h;
  }
}

struct SgdArgs {
  float lr, momentum, weight_decay, grad_scale;
  bool use_momentum, nesterov, first_step;
};

// The update of one element, in the order the header writes it (and the CPU computes it).
__device__ __forceinline__ float sgd_one(float w, float grad, float* buf, const SgdArgs& a) {
  const float g = a.grad_scale * grad + a.weight_decay * w;
  float d = g;
  if (a.use_momentum) {
    const float b = a.first_step ? g : a.momentum * *buf + g;
    *buf = b;
    d = a.nesterov ? g + a.momentum * b : b;
  }
  return w - a.lr * d;
}

template <typename G, int VEC>
__global__ void sgd_kernel(float* __restrict__ w, const G* __restrict__ grad, float* __restrict__ buf, void* half,
                           int half_kind, int64_t n, SgdArgs a) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = n / VEC;
  for (int64_t i = tid; i < packs; i += stride) {
    Pack<float, VEC> wp = reinterpret_cast<Pack<float, VEC>*>(w)[i];
    const Pack<G, VEC> gp = reinterpret_cast<const Pack<G, VEC>*>(grad)[i];
    Pack<float, VEC> bp;
    if (a.use_momentum && !a.first_step) bp = reinterpret_cast<Pack<float, VEC>*>(buf)[i];
    float out[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = wp.v[j] = sgd_one(wp.v[j], load_f32(gp.v[j]), &bp.v[j], a);
    reinterpret_cast<Pack<float, VEC>*>(w)[i] = wp;
    if (a.use_momentum) reinterpret_cast<Pack<float, VEC>*>(buf)[i] = bp;
    write_half_pack<VEC>(half, half_kind, i, out);
  }
  for (int64_t i = packs * VEC + tid; i < n; i += stride) {
    float b = a.use_momentum && !a.first_step ? buf[i] : 0.0f;
    const float wi = sgd_one(w[i], load_f32(grad[i]), &b, a);
    w[i] = wi;
    if (a.use_momentum) buf[i] = b;
    write_half(half, half_kind, i, wi);
  }
}

struct AdamArgs {
  float beta1, beta2, eps, grad_scale;
  float decay;         // lr · weight_decay
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
};

__device__ __forceinline__ float adam_one(float w, float grad, float& m, float& v, const AdamArgs& a) {
  const float g = a.grad_scale * grad;
  m = a.beta1 * m + (1.0f - a.beta1) * g;
  v = a.beta2 * v + (1.0f - a.beta2) * g * g;
  const float denom = sqrtf(v) * a.inv_sqrt_bc2 + a.eps;
  return w - a.decay * w - a.step_size * m / denom;
}

template <typename G, int VEC>
__global__ void adamw_kernel(float* __restrict__ w, const G* __restrict__ grad, float* __restrict__ m,
                             float* __restrict__ v, void* half, int half_kind, int64_t n, AdamArgs a) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = n / VEC;
  for (int64_t i = tid; i < packs; i += stride) {
    Pack<float, VEC> wp = reinterpret_cast<Pack<float, VEC>*>(w)[i];
    Pack<float, VEC> mp = reinterpret_cast<Pack<float, VEC>*>(m)[i];
    Pack<float, VEC> vp = reinterpret_cast<Pack<float, VEC>*>(v)[i];
    const Pack<G, VEC> gp = reinterpret_cast<const Pack<G, VEC>*>(grad)[i];
    float out[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) out[j] = wp.v[j] = adam_one(wp.v[j], load_f32(gp.v[j]), mp.v[j], vp.v[j], a);
    reinterpret_cast<Pack<float, VEC>*>(w)[i] = wp;
    reinterpret_cast<Pack<float, VEC>*>(m)[i] = mp;
    reinterpret_cast<Pack<float, VEC>*>(v)[i] = vp;
    write_half_pack<VEC>(half, half_kind, i, out);
  }
  for (int64_t i = packs * VEC + tid; i < n; i += stride) {
    float mi = m[i], vi = v[i];
    const float wi = adam_one(w[i], load_f32(grad[i]), mi, vi, a);
    w[i] = wi;
    m[i] = mi;
    v[i] = vi;
    write_half(half, half_kind, i, wi);
  }
}

int half_kind_of(const Tensor& weights_half) {
  if (!weights_half.defined()) return kNoHalf;
  return weights_half.dtype() == DType::f16 ? kF16 : kBF16;
}

// True when every given pointer allows kVec-element accesses of its element size.
bool vector_ok(std::initializer_list<std::pair<const void*, std::size_t>> buffers) {
  for (const auto& [p, elem] : buffers) {
    if (p != nullptr && !is_aligned(p, elem * kVec)) return false;
  }
  return true;
}

}  // namespace

void sgd_update(const Tensor& w, const Tensor& grad, const Tensor& momentum_buf, const Tensor& weights_half,
                const SgdParams& params, bool first_step, const Stream& stream) {
  DeviceGuard guard(w.device());
  const cudaStream_t s = native(stream);
  const int64_t n = w.numel();
  const bool use_momentum = params.momentum != 0.0f;
  const SgdArgs args{params.lr,    params.momentum, params.weight_decay, params.grad_scale,
                     use_momentum, params.nesterov, first_step};
  float* buf = use_momentum ? momentum_buf.data_as<float>() : nullptr;
  void* half = weights_half.defined() ? weights_half.data() : nullptr;
  const int kind = half_kind_of(weights_half);
  detail::dispatch_floating("sgd_update", grad.dtype(), [&](auto tag) {
    using G = device_t<decltype(tag)>;
    const G* g = ptr<decltype(tag)>(grad);
    float* wp = w.data_as<float>();
    if (vector_ok({{wp, 4}, {g, sizeof(G)}, {buf, 4}, {half, 2}})) {
      sgd_kernel<G, kVec><<<grid_for(n / kVec, kBlock), kBlock, 0, s>>>(wp, g, buf, half, kind, n, args);
    } else {
      sgd_kernel<G, 1><<<grid_for(n, kBlock), kBlock, 0, s>>>(wp, g, buf, half, kind, n, args);
    }
    TUTTI_CUDA_CHECK_LAUNCH("sgd_kernel");
  });
}

void adamw_update(const Tensor& w, const Tensor& grad, const Tensor& m, const Tensor& v, const Tensor& weights_half,
                  const AdamWParams& params, const Stream& stream) {
  DeviceGuard guard(w.device());
  const cudaStream_t s = native(stream);
  const int64_t n = w.numel();
  // Bias corrections in double on the host, as the CPU computes them.
  const double bc1 = 1.0 - std::pow(static_cast<double>(params.beta1), static_cast<double>(params.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(params.beta2), static_cast<double>(params.step));
  const AdamArgs args{params.beta1,
                      params.beta2,
                      params.eps,
                      params.grad_scale,
                      params.lr * params.weight_decay,
                      static_cast<float>(params.lr / bc1),
                      static_cast<float>(1.0 / std::sqrt(bc2))};
  void* half = weights_half.defined() ? weights_half.data() : nullptr;
  const int kind = half_kind_of(weights_half);
  detail::dispatch_floating("adamw_update", grad.dtype(), [&](auto tag) {
    using G = device_t<decltype(tag)>;
    const G* g = ptr<decltype(tag)>(grad);
    float *wp = w.data_as<float>(), *mp = m.data_as<float>(), *vp = v.data_as<float>();
    if (vector_ok({{wp, 4}, {g, sizeof(G)}, {mp, 4}, {vp, 4}, {half, 2}})) {
      adamw_kernel<G, kVec><<<grid_for(n / kVec, kBlock), kBlock, 0, s>>>(wp, g, mp, vp, half, kind, n, args);
    } else {
      adamw_kernel<G, 1><<<grid_for(n, kBlock), kBlock, 0, s>>>(wp, g, mp, vp, half, kind, n, args);
    }
    TUTTI_CUDA_CHECK_LAUNCH("adamw_kernel");
  });
}

}  // namespace tutti::kernels::cuda
