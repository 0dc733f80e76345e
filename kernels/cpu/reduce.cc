#include "kernels/cpu/reduce.h"

#include <cstdint>
#include <cstring>

#include "kernels/validate.h"

namespace tutti::kernels::cpu {
namespace {

using std::int64_t;

// Sums f(x[i]) with 16 independent fp32 lanes per chunk (so the compiler vectorizes it and
// rounding error stays that of short sums), and the chunks in double.
template <bool Square, typename T>
double chunked_sum(const T* x, int64_t n) {
  constexpr int64_t kLanes = 16;
  constexpr int64_t kChunk = 4096;
  double total = 0.0;
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t end = start + kChunk < n ? start + kChunk : n;
    float lanes[kLanes] = {};
    int64_t i = start;
    for (; i + kLanes <= end; i += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) {
        const float v = to_float(x[i + l]);
        lanes[l] += Square ? v * v : v;
      }
    }
    float chunk = 0.0f;
    for (; i < end; ++i) {
      const float v = to_float(x[i]);
      chunk += Square ? v * v : v;
    }
    for (int64_t l = 0; l < kLanes; ++l) chunk += lanes[l];
    total += chunk;
  }
  return total;
}

template <bool Square>
void reduce_into(const char* op, const Tensor& x, const Tensor& out, bool accumulate) {
  const double s = detail::dispatch_floating(op, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return chunked_sum<Square>(x.data_as<T>(), x.numel());
  });
  float* o = out.data_as<float>();
  *o = accumulate ? static_cast<float>(static_cast<double>(*o) + s) : static_cast<float>(s);
}

// Non-finite test on the bit patterns: the exponent field is all ones. The exponent field e
// is at most kExp, and e + kExpLsb carries into the sign bit exactly when e == kExp, so OR-ing
// those sums over a chunk and testing the sign bit finds any inf/nan with three plain integer
// ops per element (and, add, or), which vectorize on any SIMD level (an unsigned max does not
// exist before SSE4.1).
struct F32Bits {
  using U = std::uint32_t;
  static constexpr U kExp = 0x7f800000u, kExpLsb = 0x00800000u, kSign = 0x80000000u;
  static U exp(float v) {
    U u;
    std::memcpy(&u, &v, 4);
    return u & kExp;
  }
};
struct F16Bits {
  using U = std::uint16_t;
  static constexpr U kExp = 0x7c00u, kExpLsb = 0x0400u, kSign = 0x8000u;
  static U exp(Half v) { return static_cast<U>(v.bits & kExp); }
};
struct BF16Bits {
  using U = std::uint16_t;
  static constexpr U kExp = 0x7f80u, kExpLsb = 0x0080u, kSign = 0x8000u;
  static U exp(BFloat16 v) { return static_cast<U>(v.bits & kExp); }
};
template <typename T>
struct BitsOf;
template <>
struct BitsOf<float> {
  using type = F32Bits;
};
template <>
struct BitsOf<Half> {
  using type = F16Bits;
};
template <>
struct BitsOf<BFloat16> {
  using type = BF16Bits;
};

template <typename T>
bool any_nonfinite(const T* x, int64_t n) {
  using B = typename BitsOf<T>::type;
  using U = typename B::U;
  constexpr int64_t kChunk = 4096;
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t end = start + kChunk < n ? start + kChunk : n;
    U carries = 0;  // no early exit inside a chunk, so the loop vectorizes
    for (int64_t i = start; i < end; ++i) carries |= static_cast<U>(B::exp(x[i]) + B::kExpLsb);
    if ((carries & B::kSign) != 0) return true;
  }
  return false;
}

}  // namespace

void sum(const Tensor& x, const Tensor& out, bool accumulate) { reduce_into<false>("sum", x, out, accumulate); }

void sum_squares(const Tensor& x, const Tensor& out, bool accumulate) {
  reduce_into<true>("sum_squares", x, out, accumulate);
}

void check_finite(const Tensor& x, const Tensor& found) {
  const bool bad = detail::dispatch_floating("check_finite", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return any_nonfinite(x.data_as<T>(), x.numel());
  });
  if (bad) *found.data_as<std::int32_t>() = 1;
}

}  // namespace tutti::kernels::cpu
