// Shared pieces of the CPU kernels: typed element access and fp32 staging of half tensors.
// Internal header (kernels/cpu/*.cc).
#pragma once

#include <algorithm>
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
inline float store_as<float>(float v) {
  return v;
}
template <>
inline BFloat16 store_as<BFloat16>(float v) {
  return BFloat16::from_bits(bf16_bits_from(v));
}
template <>
inline Half store_as<Half>(float v) {
  return Half::from_bits(half_bits_from(v));
}

// Converts n elements to and from fp32 (the type every CPU kernel computes in).
template <typename T>
void to_f32(const T* __restrict src, float* __restrict dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = load_f32(src[i]);
}
template <typename T>
void from_f32(const float* __restrict src, T* __restrict dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = store_as<T>(src[i]);
}

// For the loops that are compute-bound on SSE2 (the ones built on exp_f32, the casts, AdamW's
// sqrt and divide, LayerNorm's short passes over rows in L1): GCC function multiversioning
// compiles the function once per listed target and picks the best one the running CPU supports
// when the library loads (x86-64-v4 = AVX-512, x86-64-v3 = AVX2 + FMA, AVX alone, or the
// baseline SSE2 build). These loops run 2-3x faster on 8-wide vectors and faster again on
// 16-wide ones (masked selects, fewer instructions); one binary still runs everywhere. The
// helpers such a function calls must be inlined into it to get the clone's code (GCC may share
// one baseline copy of a non-inline template otherwise: see kernels/cpu/optimizer.cc).
// TUTTI_IVDEP: the loop after it has no dependence between iterations even if the output is the
// input (exact aliasing, as in-place ops do), so GCC need not fall back to a scalar loop.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define TUTTI_CPU_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "avx", "default")))
#define TUTTI_IVDEP _Pragma("GCC ivdep")
#else
#define TUTTI_CPU_SIMD_CLONES
#define TUTTI_IVDEP
#endif

// Sum of term(i) for i in [0, n) with 16 interleaved partial sums: the compiler vectorizes it (a
// single running sum is a serial chain of dependent adds that it may not reorder without
// -ffast-math), and it is no less accurate. The lanes are always 16, whatever the vector unit,
// so the result is the same on every CPU. The tail goes to its own sum: indexing the lanes with
// i % 16 there would force them into memory and keep the main loop scalar.
template <typename Term>
inline float sum_lanes(std::int64_t n, Term term) {
  constexpr int kLanes = 16;
  float acc[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += term(i + j);
  float tail = 0.0f;
  for (; i < n; ++i) tail += term(i);
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  return acc[0] + tail;
}
inline float sum_f32(const float* p, std::int64_t n) {
  return sum_lanes(n, [p](std::int64_t i) { return p[i]; });
}

// Largest of n >= 1 floats. GCC does not vectorize a max over plain floats without
// -ffinite-math-only (x86's max is not IEEE's on nan), so this one is written with 4-lane vector
// types (GCC/Clang vector extensions), 4 of them in flight: native on every x86-64 target.
// A nan is skipped unless it comes first in its lane or is p[0]; either way a row holding a nan
// gives a nan loss downstream.
inline float max_f32(const float* p, std::int64_t n) {
  using f32x4 = float __attribute__((vector_size(16)));
  f32x4 acc[4];
  for (f32x4& a : acc) a = f32x4{} + p[0];
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 4; ++k) {
      f32x4 v;
      std::memcpy(&v, p + i + 4 * k, sizeof v);
      acc[k] = v > acc[k] ? v : acc[k];
    }
  float m = p[0];
  for (; i < n; ++i) m = p[i] > m ? p[i] : m;
  for (const f32x4& a : acc)
    for (int j = 0; j < 4; ++j) m = a[j] > m ? a[j] : m;
  return m;
}

// Asks for the next row (into L2) while this one is worked on, for row-wise kernels that make a
// few passes over each row in L1: the hardware prefetchers stop at 4 KiB page boundaries, about
// one such row, so without this each row can start with a wait on DRAM. It pays for
// LayerNorm's forward pass; softmax cross-entropy measured no gain (1 row ahead) or a loss
// (4 rows ahead), so it has none.
inline void prefetch_row(const float* row, std::int64_t n) {
  for (std::int64_t i = 0; i < n; i += 64 / static_cast<std::int64_t>(sizeof(float))) __builtin_prefetch(row + i, 0, 2);
}

// The clamp bounds of exp_f32, as values the optimizer cannot see through. With the bounds as
// constants GCC folds the clamp into the later selects and emits compare/blend chains instead
// of one max and one min: measured 25% slower for GELU. A vectorized loop reads them once,
// before the loop (exp_bounds()), and passes them in. A caller may lower `hi` to make e^x
// saturate at e^hi instead of reaching inf (GELU's derivative does, to need no inf check).
struct ExpBounds {
  float lo = -87.33654f;   // e^lo is the smallest normal float
  float hi = 88.7228394f;  // rounds to n = 128, whose 2^n bit pattern is inf
};
inline ExpBounds exp_bounds(float hi = ExpBounds{}.hi) {
  ExpBounds b;
  b.hi = hi;
#if defined(__GNUC__)
  asm("" : "+m"(b));  // an empty statement that "may change" b: its values are unknown from here on
#endif
  return b;
}

// e^x in fp32 as a branch-free polynomial that the compiler vectorizes (the libm call does not
// vectorize without -ffast-math, which tutti does not use: nan/inf must survive). Cody-Waite
// range reduction by ln 2 as in Cephes' expf, then a degree-6 polynomial fitted to e^r over
// |r| <= ln 2 / 2 (minimax by Lawson's method, coefficients rounded to float): within 1.6 ulp of
// the true value over the normal range. Cheap on purpose, since GELU and softmax are
// compute-bound on it: 2^n comes straight from the bits of the rounding sum (no float-to-int
// conversion), and the only range checks are one max, one min and the underflow select.
// Outside the range of normal results: x > 88.376 gives inf (the true value, finite up to 88.72,
// is then "huge next to 1" everywhere tutti uses it) and x < -87.337 gives 0 (the true value is
// below the smallest normal float); nan gives nan. `bounds` comes from exp_bounds() (see above).
inline float exp_f32(float x, ExpBounds bounds) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  // 1.5 · 2^23 + 127: adding it rounds x / ln 2 to an integer n and leaves n + 127 (the biased
  // exponent of 2^n) in the low mantissa bits, so shifting the sum's bits left by 23 gives 2^n.
  constexpr float kRoundBias = 12582912.0f + 127.0f;
  // The clamp keeps n in [-126, 128] and lets nan through (x86's max and min, which these
  // compile to, return their second operand x when it is nan).
  float xc = bounds.lo > x ? bounds.lo : x;
  xc = bounds.hi < xc ? bounds.hi : xc;
  const float t = xc * kLog2e + kRoundBias;
  const float n = t - kRoundBias;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;  // |r| <= ln 2 / 2, exact to ~1 ulp
  float p = 1.3843653724e-03f;
  p = p * r + 8.3741554990e-03f;
  p = p * r + 4.1668001562e-02f;
  p = p * r + 1.6666431725e-01f;
  p = p * r + 4.9999994040e-01f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const float e = p * float_of(bits_of(t) << 23);
  return x < ExpBounds{}.lo ? 0.0f : e;
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
    if (t.dtype() == DType::f16)
      to_f32(static_cast<const Half*>(t.data()), data_, t.numel());
    else
      to_f32(static_cast<const BFloat16*>(t.data()), data_, t.numel());
  }
  float* data() const { return data_; }
  // Writes the fp32 values back into the tensor (rounding to nearest even); no-op for f32.
  void store() const {
    if (!tensor_.defined()) return;
    if (tensor_.dtype() == DType::f16)
      from_f32(data_, static_cast<Half*>(tensor_.data()), tensor_.numel());
    else if (tensor_.dtype() == DType::bf16)
      from_f32(data_, static_cast<BFloat16*>(tensor_.data()), tensor_.numel());
  }

 private:
  Tensor tensor_;
  std::vector<float> scratch_;
  float* data_ = nullptr;
};

}  // namespace tutti::kernels::cpu
