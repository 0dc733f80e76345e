#include "kernels/cpu/cast.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/validate.h"

namespace tutti::kernels::cpu {
namespace {

using std::int64_t;

// Element conversions through fp32 (exact for every f16 and bf16 value), then rounding to
// nearest even into the target with tutti's own scalar conversions (core/dtype.h).
template <typename From, typename To>
void convert(const From* x, To* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = from_float<To>(to_float(x[i]));
}

template <typename T>
bool unscale_in_place(T* __restrict g, float inv_scale, int64_t n) {
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) {
    const float v = to_float(g[i]);
    const T scaled = from_float<T>(v * inv_scale);
    // Checked before scaling (a nan or inf input) and after (a half that overflows).
    bad |= !std::isfinite(v) || !std::isfinite(to_float(scaled));
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
