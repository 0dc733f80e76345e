#include "kernels/cpu/cast.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/common.h"
#include "kernels/validate.h"

namespace tutti::kernels::cpu {
namespace {

using std::int64_t;

// Element conversions through fp32 (exact for every f16 and bf16 value), then rounding to
// nearest even into the target: the inline, vectorizable twins of core/dtype.h's conversions
// (kernels/cpu/common.h), bit for bit the same.
template <typename From, typename To>
void convert(const From* __restrict x, To* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = store_as<To>(load_f32(x[i]));
}

// The casts between fp32 and the halves (the ones mixed precision runs every step), compiled for
// wider vector units too (common.h): SSE4.1 and later narrow 32-bit lanes to 16 bits with one
// pack instruction, where baseline SSE2 needs a shuffle sequence.
TUTTI_CPU_SIMD_CLONES void f32_to_bf16(const float* __restrict x, BFloat16* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = store_as<BFloat16>(x[i]);
}
TUTTI_CPU_SIMD_CLONES void f32_to_f16(const float* __restrict x, Half* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = store_as<Half>(x[i]);
}
TUTTI_CPU_SIMD_CLONES void bf16_to_f32(const BFloat16* __restrict x, float* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = load_f32(x[i]);
}
TUTTI_CPU_SIMD_CLONES void f16_to_f32(const Half* __restrict x, float* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = load_f32(x[i]);
}

template <typename T>
bool unscale_in_place(T* __restrict g, float inv_scale, int64_t n) {
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) {
    const float v = load_f32(g[i]);
    const T scaled = store_as<T>(v * inv_scale);
    // Checked before scaling (a nan or inf input) and after (a half that overflows).
    bad |= !std::isfinite(v) || !std::isfinite(load_f32(scaled));
    g[i] = scaled;
  }
  return bad;
}

// The f32 case, written so that it vectorizes: the largest exponent field of the inputs and
// of the results says whether any was inf or nan.
bool unscale_in_place(float* g, float inv_scale, int64_t n) {
  constexpr std::uint32_t kExp = 0x7f800000u;
  std::uint32_t largest = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = g[i];
    const float scaled = v * inv_scale;
    g[i] = scaled;
    std::uint32_t a, b;
    std::memcpy(&a, &v, 4);
    std::memcpy(&b, &scaled, 4);
    a &= kExp;
    b &= kExp;
    largest = a > largest ? a : largest;
    largest = b > largest ? b : largest;
  }
  return largest == kExp;
}

}  // namespace

void cast(const Tensor& x, const Tensor& out) {
  if (x.dtype() == out.dtype()) {
    if (x.data() != out.data()) std::memmove(out.data(), x.data(), x.nbytes());
    return;
  }
  const DType from = x.dtype(), to = out.dtype();
  const int64_t n = x.numel();
  if (from == DType::f32 && to == DType::bf16) return f32_to_bf16(x.data_as<float>(), out.data_as<BFloat16>(), n);
  if (from == DType::f32 && to == DType::f16) return f32_to_f16(x.data_as<float>(), out.data_as<Half>(), n);
  if (from == DType::bf16 && to == DType::f32) return bf16_to_f32(x.data_as<BFloat16>(), out.data_as<float>(), n);
  if (from == DType::f16 && to == DType::f32) return f16_to_f32(x.data_as<Half>(), out.data_as<float>(), n);
  detail::dispatch_floating("cast", x.dtype(), [&](auto from_tag) {
    using From = decltype(from_tag);
    detail::dispatch_floating("cast", out.dtype(), [&](auto to_tag) {
      using To = decltype(to_tag);
      convert(x.data_as<From>(), out.data_as<To>(), x.numel());
    });
  });
}

void unscale_and_check(const Tensor& grad, float inv_scale, const Tensor& found) {
  const bool bad = detail::dispatch_floating("unscale_and_check", grad.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return unscale_in_place(grad.data_as<T>(), inv_scale, grad.numel());
  });
  if (bad) *found.data_as<std::int32_t>() = 1;
}

}  // namespace tutti::kernels::cpu
