#include "kernels/cpu/fixed_point.h"

#include <cmath>
#include <cstdint>

#include "kernels/cpu/common.h"
#include "kernels/validate.h"

namespace tutti::kernels::cpu {
namespace {

using std::int64_t;

// x · scale in double (one IEEE multiply, as on the GPU), rounded to nearest, ties to even
// (std::nearbyint in the default rounding mode, like CUDA's __double2ll_rn).
template <typename T>
void accumulate(const T* x, int64_t n, double scale, double limit, int64_t* acc, int64_t* status) {
  bool nonfinite = false, out_of_range = false;
  for (int64_t i = 0; i < n; ++i) {
    const float f = load_f32(x[i]);
    if (!std::isfinite(f)) {
      nonfinite = true;
      continue;
    }
    const double v = std::nearbyint(static_cast<double>(f) * scale);
    if (std::fabs(v) > limit) {
      out_of_range = true;
      continue;
    }
    acc[i] += static_cast<int64_t>(v);
  }
  if (nonfinite) status[0] = 1;
  if (out_of_range) status[1] = 1;
}

template <typename T>
void to_float(const int64_t* acc, int64_t n, double scale, T* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = store_as<T>(static_cast<float>(static_cast<double>(acc[i]) * scale));
}

}  // namespace

void fixed_point_accumulate(const Tensor& x, double scale, double limit, const Tensor& acc, const Tensor& status) {
  detail::dispatch_floating("fixed_point_accumulate", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    accumulate(x.data_as<T>(), x.numel(), scale, limit, acc.data_as<int64_t>(), status.data_as<int64_t>());
  });
}

void fixed_point_to_float(const Tensor& acc, double scale, const Tensor& out) {
  detail::dispatch_floating("fixed_point_to_float", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    to_float(acc.data_as<int64_t>(), acc.numel(), scale, out.data_as<T>());
  });
}

}  // namespace tutti::kernels::cpu
