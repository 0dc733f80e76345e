// Shared pieces of the CPU kernels: typed element access and fp32 staging of half tensors.
// Internal header (kernels/cpu/*.cc).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "tutti/core/dtype.h"
#include "tutti/core/tensor.h"

namespace tutti::kernels::cpu {

// Product of every dimension but the last: the rows of a tensor seen as [rows, last].
inline std::int64_t leading_rows(const Tensor& t) {
  std::int64_t rows = 1;
  for (int i = 0; i + 1 < t.ndim(); ++i) rows *= t.shape()[static_cast<std::size_t>(i)];
  return rows;
}

inline std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }
inline float float_of(std::uint32_t u) { return std::bit_cast<float>(u); }

// Inline, branch-free twins of core/dtype.cc's scalar conversions (bit for bit the same results:
// round to nearest even, inf kept, nan kept as a quiet nan with its sign). Those are out-of-line
// calls with branches, so a loop over them runs at a few hundred MB/s; these are plain integer
// selects that the compiler vectorizes.
inline std::uint16_t bf16_bits_from(float value) {
  const std::uint32_t x = bits_of(value);
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (x >> 16) | 0x0040u;
  return static_cast<std::uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
inline float float_from_bf16(std::uint16_t bits) { return float_of(static_cast<std::uint32_t>(bits) << 16); }

inline std::uint16_t half_bits_from(float value) {
  const std::uint32_t x = bits_of(value);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  // Every case is computed and the right one selected (no branch per element).
  const std::uint32_t inf_or_nan = 0x7c00u | (abs > 0x7f800000u ? 0x0200u | ((abs >> 13) & 0x3ffu) : 0u);
  // Below 2^-14: adding 0.5 lets the float adder round to nearest even at the 2^-24 quantum.
  const std::uint32_t subnormal = bits_of(float_of(abs) + 0.5f) - 0x3f000000u;
  const std::uint32_t normal = (abs + 0xc8000fffu + ((abs >> 13) & 1u)) >> 13;  // rebias 127 -> 15, round
  std::uint32_t out = abs < 0x38800000u ? subnormal : normal;
  out = abs >= 0x477ff000u ? 0x7c00u : out;  // rounds to >= 65520: inf
  out = abs >= 0x7f800000u ? inf_or_nan : out;
  return static_cast<std::uint16_t>(sign | out);
}
inline float float_from_half(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  const std::uint32_t inf_or_nan = 0x7f800000u | (mant << 13);
  // Zero or subnormal: mant · 2^-24, exact in float.
  const std::uint32_t subnormal = bits_of(static_cast<float>(static_cast<std::int32_t>(mant)) * 5.9604644775390625e-8f);
  const std::uint32_t normal = ((exp + 112u) << 23) | (mant << 13);
  const std::uint32_t out = exp == 0x1fu ? inf_or_nan : exp == 0u ? subnormal : normal;
  return float_of(sign | out);
}

// Element conversions for the CPU kernels' typed loops (vectorizable, same results as
// to_float / from_float<T> of core/dtype.h).
inline float load_f32(float x) { return x; }
inline float load_f32(BFloat16 x) { return float_from_bf16(x.bits); }
inline float load_f32(Half x) { return float_from_half(x.bits); }
template <typename T>
inline T store_as(float v);
template <>
inline float store_as<float>(float v) { return v; }
template <>
inline BFloat16 store_as<BFloat16>(float v) { return BFloat16::from_bits(bf16_bits_from(v)); }
template <>
inline Half store_as<Half>(float v) { return Half::from_bits(half_bits_from(v)); }

// Converts n elements to and from fp32 (the type every CPU kernel computes in).
template <typename T>
void to_f32(const T* __restrict src, float* __restrict dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = load_f32(src[i]);
}
template <typename T>
void from_f32(const float* __restrict src, T* __restrict dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = store_as<T>(src[i]);
}

// For the few compute-bound loops (the ones built on exp_f32): GCC function multiversioning
// compiles the function once per listed target and picks the best one the running CPU supports
// when the library loads (x86-64-v3 = AVX2 + FMA, AVX alone, or the baseline SSE2 build). These
// loops run 2-3x faster on 8-wide vectors; one binary still runs everywhere.
// TUTTI_IVDEP: the loop after it has no dependence between iterations even if the output is the
// input (exact aliasing, as in-place ops do), so GCC need not fall back to a scalar loop.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define TUTTI_CPU_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v3", "avx", "default")))
#define TUTTI_IVDEP _Pragma("GCC ivdep")
#else
#define TUTTI_CPU_SIMD_CLONES
#define TUTTI_IVDEP
#endif

// Sum of term(i) for i in [0, n) with 8 interleaved partial sums: the compiler vectorizes it (a
// single running sum is a serial chain of dependent adds that it may not reorder without
// -ffast-math), and it is no less accurate.
template <typename Term>
inline float sum_lanes(std::int64_t n, Term term) {
  float acc[8] = {};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += term(i + j);
  for (; i < n; ++i) acc[i % 8] += term(i);
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}
inline float sum_f32(const float* p, std::int64_t n) {
  return sum_lanes(n, [p](std::int64_t i) { return p[i]; });
}

// Largest of n >= 1 floats, 8 lanes at a time (vectorizes, like sum_f32). A nan is skipped
// unless it comes first in its lane; either way a row holding a nan gives a nan loss downstream.
inline float max_f32(const float* p, std::int64_t n) {
  float acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = p[0];
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] = p[i + j] > acc[j] ? p[i + j] : acc[j];
  for (; i < n; ++i) acc[0] = p[i] > acc[0] ? p[i] : acc[0];
  float m = acc[0];
  for (int j = 1; j < 8; ++j) m = acc[j] > m ? acc[j] : m;
  return m;
}

// e^x in fp32 as a branch-free polynomial (Cephes' expf: Cody-Waite range reduction by ln 2,
// degree-7 polynomial, within ~1 ulp of the true value) that the compiler vectorizes; the libm
// call does not vectorize without -ffast-math, which tutti does not use (nan/inf must survive).
// Outside the range of normal results: x > 88.72 gives inf, x < -87.33 gives 0 (the true value
// is below the smallest normal float, 1.2e-38), and x in (88.37, 88.72] gives e^88.37 (callers
// use it where only "huge next to 1" matters there). nan gives nan.
inline float exp_f32(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f;  // 1.5 · 2^23: adding it rounds a float to an integer
  const float xc = x > 88.37626f ? 88.37626f : (x < -87.33654f ? -87.33654f : x);
  const float n = (xc * kLog2e + kRound) - kRound;  // round(x / ln 2), in [-126, 127]
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;   // |r| <= ln 2 / 2
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float scale = float_of(static_cast<std::uint32_t>(static_cast<std::int32_t>(n) + 127) << 23);  // 2^n
  const float e = p * scale;
  const float out = x < -87.33654f ? 0.0f : e;
  return x > 88.72283f ? std::numeric_limits<float>::infinity() : (x != x ? x : out);
}

// A floating tensor seen as fp32 memory: an f32 tensor's own data, or for f16/bf16 an fp32
// scratch copy (filled from the tensor when `load`), written back by store(). Lets BLAS and
// other fp32-only code run on every dtype.
class F32Buffer {
 public:
  // An undefined tensor gives a null buffer (for optional outputs).
  F32Buffer(const Tensor& t, bool load) : tensor_(t) {
    if (!t.defined()) return;
    if (t.dtype() == DType::f32) {
      data_ = static_cast<float*>(t.data());
      return;
    }
    scratch_.resize(static_cast<std::size_t>(t.numel()));
    data_ = scratch_.data();
    if (!load) return;
    if (t.dtype() == DType::f16) to_f32(static_cast<const Half*>(t.data()), data_, t.numel());
    else to_f32(static_cast<const BFloat16*>(t.data()), data_, t.numel());
  }
  float* data() const { return data_; }
  // Writes the fp32 values back into the tensor (rounding to nearest even); no-op for f32.
  void store() const {
    if (!tensor_.defined()) return;
    if (tensor_.dtype() == DType::f16) from_f32(data_, static_cast<Half*>(tensor_.data()), tensor_.numel());
    else if (tensor_.dtype() == DType::bf16) from_f32(data_, static_cast<BFloat16*>(tensor_.data()), tensor_.numel());
  }

 private:
  Tensor tensor_;
  std::vector<float> scratch_;
  float* data_ = nullptr;
};

}  // namespace tutti::kernels::cpu
