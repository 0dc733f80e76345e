#include "kernels/cpu/fixed_point.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/common.h"
#include "kernels/validate.h"

namespace tutti::kernels::cpu {
namespace {

using std::int64_t;

// x · scale in double (one IEEE multiply, as on the GPU), rounded to nearest, ties to even
// (std::nearbyint in the default rounding mode, like CUDA's nearbyint). Branch-free, so that
// the SIMD clones vectorize it (nearbyint is one instruction from SSE4.1 on); every clone gives
// the same integers, since no step rounds but the multiply and nearbyint.
template <typename T>
[[gnu::always_inline]] inline void accumulate(T* __restrict x, int64_t n, double scale, double limit,
                                              int64_t* __restrict acc, int64_t* status, bool zero_x) {
  int nonfinite = 0, out_of_range = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float f = load_f32(x[i]);
    const int finite = std::isfinite(f) ? 1 : 0;
    const double v = std::nearbyint(static_cast<double>(f) * scale);
    const int in_range = std::fabs(v) <= limit ? 1 : 0;  // false for inf and nan
    acc[i] += static_cast<int64_t>(finite & in_range ? v : 0.0);
    nonfinite |= 1 - finite;
    out_of_range |= finite & (1 - in_range);
  }
  if (zero_x) std::memset(static_cast<void*>(x), 0, static_cast<std::size_t>(n) * sizeof(T));
  if (nonfinite) status[0] = 1;
  if (out_of_range) status[1] = 1;
}

// fp32 gradients, the common case, compiled for wider vector units too (common.h).
TUTTI_CPU_SIMD_CLONES void accumulate_f32(float* __restrict x, int64_t n, double scale, double limit,
                                          int64_t* __restrict acc, int64_t* status, bool zero_x) {
  accumulate(x, n, scale, limit, acc, status, zero_x);
}

template <typename T>
[[gnu::always_inline]] inline void to_float(const int64_t* __restrict acc, int64_t n, double scale, T* __restrict out) {
  for (int64_t i = 0; i < n; ++i) out[i] = store_as<T>(static_cast<float>(static_cast<double>(acc[i]) * scale));
}

// fp32 out: wider vector units convert int64 to double in one instruction (AVX-512DQ).
TUTTI_CPU_SIMD_CLONES void to_f32(const int64_t* __restrict acc, int64_t n, double scale, float* __restrict out) {
  to_float(acc, n, scale, out);
}

}  // namespace

void fixed_point_accumulate(const Tensor& x, double scale, double limit, const Tensor& acc, const Tensor& status,
                            bool zero_x) {
  detail::dispatch_floating("fixed_point_accumulate", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float>) {
      accumulate_f32(x.data_as<T>(), x.numel(), scale, limit, acc.data_as<int64_t>(), status.data_as<int64_t>(),
                     zero_x);
    } else {
      accumulate(x.data_as<T>(), x.numel(), scale, limit, acc.data_as<int64_t>(), status.data_as<int64_t>(), zero_x);
    }
  });
}

void fixed_point_to_float(const Tensor& acc, double scale, const Tensor& out) {
  detail::dispatch_floating("fixed_point_to_float", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float>) {
      to_f32(acc.data_as<int64_t>(), acc.numel(), scale, out.data_as<T>());
    } else {
      to_float(acc.data_as<int64_t>(), acc.numel(), scale, out.data_as<T>());
    }
  });
}

}  // namespace tutti::kernels::cpu
