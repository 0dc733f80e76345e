#include "kernels/cpu/elementwise.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/dropout_rng.h"
#include "kernels/validate.h"

namespace tutti::kernels::cpu {
namespace {

using std::int64_t;

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

// out[i] = f(in[i]) in fp32. Element i is read before it is written, so out may be in.
template <typename F>
void map1(const Tensor& in, const Tensor& out, F f) {
  detail::dispatch_floating("cpu elementwise", in.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* a = static_cast<const T*>(in.data());
    T* o = static_cast<T*>(out.data());
    for (int64_t i = 0, n = in.numel(); i < n; ++i) o[i] = store_as<T>(f(load_f32(a[i])));
  });
}
template <typename F>
void map2(const Tensor& in0, const Tensor& in1, const Tensor& out, F f) {
  detail::dispatch_floating("cpu elementwise", in0.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* a = static_cast<const T*>(in0.data());
    const T* b = static_cast<const T*>(in1.data());
    T* o = static_cast<T*>(out.data());
    for (int64_t i = 0, n = in0.numel(); i < n; ++i) o[i] = store_as<T>(f(load_f32(a[i]), load_f32(b[i])));
  });
}

// GELU (tanh form) rewritten through 0.5 · (1 + tanh(u)) = 1 / (1 + e^(-2u)) = s, a sigmoid:
// gelu(v) = v · s, with u = c (v + a v^3). No cancellation (unlike 1 + tanh(u) near u = -inf), and
// exp_f32 vectorizes where std::tanh does not. -2u is computed as v (k1 + k2 v^2), three
// operations. Inf and nan behave as in the tanh form: gelu(inf) = inf,
// gelu(-inf) = -inf / inf = nan, gelu(nan) = nan.
constexpr float kMinus2C = -2.0f * kGeluC, kMinus2CA = -2.0f * kGeluC * kGeluA;
inline float gelu(float v, ExpBounds bounds) {
  const float minus_2u = v * (kMinus2C + kMinus2CA * (v * v));
  return v / (1.0f + exp_f32(minus_2u, bounds));
}
// d/dv [v · s(2u)] = s + 2 v s (1 - s) u' = s (1 + v (1 - s) 2u'), with 1 - s = e · s
// (e = e^(-2u)), which keeps its relative accuracy where s is near 1. The caller's bounds cap e
// at e^kGradExpMax (finite, so e · s stays 1 where s underflows; v < -9.5 there, where the true
// derivative is below 1e-28 and this one is too). For v = ±inf the result is not finite.
constexpr float kGradExpMax = 69.0f;  // e^69 ~ 9e29: 1 + e keeps 1/(1 + e) normal
inline float gelu_grad(float v, float g, ExpBounds bounds) {
  constexpr float k2C = 2.0f * kGeluC, k6CA = 6.0f * kGeluC * kGeluA;
  const float v2 = v * v;
  const float e = exp_f32(v * (kMinus2C + kMinus2CA * v2), bounds);
  const float s = 1.0f / (1.0f + e);
  const float two_du = k2C + k6CA * v2;
  return g * (s * (1.0f + v * (e * s) * two_du));
}

// The f32 loops, compute-bound on exp_f32: compiled for wider vector units too (common.h).
TUTTI_CPU_SIMD_CLONES void gelu_forward_f32(const float* x, float* y, int64_t n) {
  const ExpBounds bounds = exp_bounds();
  TUTTI_IVDEP
  for (int64_t i = 0; i < n; ++i) y[i] = gelu(x[i], bounds);
}
TUTTI_CPU_SIMD_CLONES void gelu_backward_f32(const float* x, const float* dy, float* dx, int64_t n) {
  const ExpBounds bounds = exp_bounds(kGradExpMax);
  TUTTI_IVDEP
  for (int64_t i = 0; i < n; ++i) dx[i] = gelu_grad(x[i], dy[i], bounds);
}

// SwiGLU: silu(g) · u with silu(g) = g · s, s = sigmoid(g) = 1 / (1 + e), e = e^-g. Backward:
// d/dg = u · s · (1 + g · (1 - s)), with 1 - s = e · s (accurate where s is near 1); the caller's
// bounds cap e at e^kGradExpMax so that e · s stays finite (1) where s underflows.
inline float silu(float g, ExpBounds bounds) { return g / (1.0f + exp_f32(-g, bounds)); }

TUTTI_CPU_SIMD_CLONES void swiglu_forward_rows(const float* x, float* y, int64_t rows, int64_t F) {
  const ExpBounds bounds = exp_bounds();
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = x + r * 2 * F;
    const float* u = g + F;
    float* out = y + r * F;
    TUTTI_IVDEP
    for (int64_t i = 0; i < F; ++i) out[i] = silu(g[i], bounds) * u[i];
  }
}
TUTTI_CPU_SIMD_CLONES void swiglu_backward_rows(const float* x, const float* dy, float* dx, int64_t rows, int64_t F) {
  const ExpBounds bounds = exp_bounds(kGradExpMax);
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = x + r * 2 * F;
    const float* u = g + F;
    const float* d = dy + r * F;
    float* dg = dx + r * 2 * F;
    float* du = dg + F;
    TUTTI_IVDEP
    for (int64_t i = 0; i < F; ++i) {
      const float e = exp_f32(-g[i], bounds);
      const float sg = 1.0f / (1.0f + e);
      dg[i] = d[i] * u[i] * (sg * (1.0f + g[i] * (e * sg)));
      du[i] = d[i] * (g[i] * sg);
    }
  }
}

}  // namespace

void swiglu_forward(const Tensor& x, const Tensor& y) {
  const F32Buffer X(x, true), Y(y, false);
  const int64_t F = x.dim(-1) / 2;
  swiglu_forward_rows(X.data(), Y.data(), leading_rows(x), F);
  Y.store();
}
void swiglu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const F32Buffer X(x, true), DY(dy, true), DX(dx, false);
  const int64_t F = x.dim(-1) / 2;
  swiglu_backward_rows(X.data(), DY.data(), DX.data(), leading_rows(x), F);
  DX.store();
}

void relu_forward(const Tensor& x, const Tensor& y) {
  map1(x, y, [](float v) { return v > 0.0f ? v : 0.0f; });
}
void relu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  map2(x, dy, dx, [](float v, float g) { return v > 0.0f ? g : 0.0f; });
}

void gelu_forward(const Tensor& x, const Tensor& y) {
  if (x.dtype() == DType::f32) return gelu_forward_f32(x.data_as<float>(), y.data_as<float>(), x.numel());
  const ExpBounds bounds = exp_bounds();
  map1(x, y, [bounds](float v) { return gelu(v, bounds); });
}
void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  if (x.dtype() == DType::f32)
    return gelu_backward_f32(x.data_as<float>(), dy.data_as<float>(), dx.data_as<float>(), x.numel());
  const ExpBounds bounds = exp_bounds(kGradExpMax);
  map2(x, dy, dx, [bounds](float v, float g) { return gelu_grad(v, g, bounds); });
}

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  map2(a, b, out, [](float u, float v) { return u + v; });
}
void scale(const Tensor& x, float alpha, const Tensor& out) {
  map1(x, out, [alpha](float v) { return alpha * v; });
}
void add_scaled(const Tensor& x, float alpha, const Tensor& out) {
  map2(x, out, out, [alpha](float v, float o) { return o + alpha * v; });
}
void fill(const Tensor& out, float value) {
  map1(out, out, [value](float) { return value; });
}

void bias_add(const Tensor& x, const Tensor& bias, int64_t outer, int64_t channels, int64_t inner, const Tensor& out) {
  detail::dispatch_floating("bias_add", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = static_cast<const T*>(x.data());
    const T* b = static_cast<const T*>(bias.data());
    T* o = static_cast<T*>(out.data());
    if (inner == 1) {
      // [outer, channels] (a Linear's output): the loop runs along the channels, so it
      // vectorizes; a loop over `inner` would be one element long.
      for (int64_t n = 0; n < outer; ++n) {
        const int64_t base = n * channels;
        TUTTI_IVDEP
        for (int64_t c = 0; c < channels; ++c) o[base + c] = store_as<T>(load_f32(in[base + c]) + load_f32(b[c]));
      }
      return;
    }
    for (int64_t n = 0; n < outer; ++n)
      for (int64_t c = 0; c < channels; ++c) {
        const float bc = load_f32(b[c]);
        const int64_t base = (n * channels + c) * inner;
        TUTTI_IVDEP
        for (int64_t i = 0; i < inner; ++i) o[base + i] = store_as<T>(load_f32(in[base + i]) + bc);
      }
  });
}

void bias_backward(const Tensor& dy, int64_t outer, int64_t channels, int64_t inner, const Tensor& dbias,
                   bool accumulate) {
  const F32Buffer db(dbias, accumulate);
  float* acc = db.data();
  if (!accumulate)
    for (int64_t c = 0; c < channels; ++c) acc[c] = 0.0f;
  detail::dispatch_floating("bias_backward", dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* g = static_cast<const T*>(dy.data());
    if (inner == 1) {
      // [outer, channels]: rows are added into one fp32 row of sums (contiguous, vectorizes)
      // instead of walking each channel's column with a stride.
      std::vector<float> sums(static_cast<std::size_t>(channels), 0.0f);
      float* sp = sums.data();
      for (int64_t n = 0; n < outer; ++n) {
        const T* row = g + n * channels;
        for (int64_t c = 0; c < channels; ++c) sp[c] += load_f32(row[c]);
      }
      for (int64_t c = 0; c < channels; ++c) acc[c] += sp[c];
      return;
    }
    for (int64_t c = 0; c < channels; ++c) {
      float sum = 0.0f;
      for (int64_t n = 0; n < outer; ++n) {
        const int64_t base = (n * channels + c) * inner;
        sum += sum_lanes(inner, [&](int64_t i) { return load_f32(g[base + i]); });
      }
      acc[c] += sum;
    }
  });
  db.store();
}

namespace {

// Dropout's loop, one body for every dtype. It costs two 64-bit multiplies per element
// (rng::uniform), which only AVX-512 has as a vector instruction, so the f32 case is also
// compiled for it (common.h); forced inline so that the clone gets its own copy.
template <typename T>
[[gnu::always_inline]] inline void dropout_loop(const T* in, T* out, int64_t n, float p, float scale, std::uint64_t key,
                                                std::uint64_t offset) {
  TUTTI_IVDEP
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = rng::uniform(key, offset + static_cast<std::uint64_t>(i)) >= p;
    out[i] = store_as<T>(keep ? load_f32(in[i]) * scale : 0.0f);
  }
}
TUTTI_CPU_SIMD_CLONES void dropout_f32(const float* in, float* out, int64_t n, float p, float scale, std::uint64_t key,
                                       std::uint64_t offset) {
  dropout_loop(in, out, n, p, scale, key, offset);
}

}  // namespace

void dropout(const Tensor& x, float p, float scale, std::uint64_t seed, std::uint64_t offset, const Tensor& y) {
  const std::uint64_t key = rng::key_of(seed);
  if (x.dtype() == DType::f32)
    return dropout_f32(x.data_as<float>(), y.data_as<float>(), x.numel(), p, scale, key, offset);
  detail::dispatch_floating("dropout", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dropout_loop(static_cast<const T*>(x.data()), static_cast<T*>(y.data()), x.numel(), p, scale, key, offset);
  });
}

}  // namespace tutti::kernels::cpu
