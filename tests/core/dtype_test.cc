#include "tutti/core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "tutti/core/error.h"

namespace tutti {
namespace {

float f_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The exact nearest-even rounding, by search: of the two representable neighbours of v, the
// closer one, ties to the one with an even last bit. Works on the decoded values in double.
template <typename Decode>
std::uint16_t reference_round(float v, Decode decode, std::uint16_t max_finite_bits) {
  // Find the largest non-negative pattern whose value is <= |v| by binary search.
  const double a = std::fabs(static_cast<double>(v));
  std::uint32_t lo = 0, hi = max_finite_bits;
  while (lo < hi) {
    const std::uint32_t mid = (lo + hi + 1) / 2;
    if (decode(static_cast<std::uint16_t>(mid)) <= a)
      lo = mid;
    else
      hi = mid - 1;
  }
  std::uint32_t pick = lo;
  const double below = decode(static_cast<std::uint16_t>(lo));
  // One past the largest finite is infinity; its "value" for rounding is the next step.
  const double above = lo == max_finite_bits ? below + (below - decode(static_cast<std::uint16_t>(lo - 1)))
                                             : decode(static_cast<std::uint16_t>(lo + 1));
  if (a - below > above - a || (a - below == above - a && (lo & 1u))) pick = lo + 1;
  const std::uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  return static_cast<std::uint16_t>(sign | pick);  // pick == max+1 is the infinity pattern
}

TEST(DType, SizesAndNames) {
  EXPECT_EQ(size_of(DType::f32), 4u);
  EXPECT_EQ(size_of(DType::f16), 2u);
  EXPECT_EQ(size_of(DType::bf16), 2u);
  EXPECT_EQ(size_of(DType::i32), 4u);
  EXPECT_EQ(size_of(DType::i64), 8u);
  for (DType d : {DType::f32, DType::f16, DType::bf16, DType::i32, DType::i64}) {
    EXPECT_EQ(parse_dtype(name_of(d)), d);
  }
  EXPECT_EQ(parse_dtype("fp16"), DType::f16);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_THROW(parse_dtype("f8"), InvalidArgument);
  EXPECT_TRUE(is_floating(DType::bf16));
  EXPECT_FALSE(is_floating(DType::i64));
}

TEST(Half, EveryPatternRoundTrips) {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = half_bits_to_float(static_cast<std::uint16_t>(b));
    const bool is_nan = (b & 0x7c00u) == 0x7c00u && (b & 0x3ffu) != 0;
    if (is_nan) {
      EXPECT_TRUE(std::isnan(f)) << b;
      const std::uint16_t back = float_to_half_bits(f);
      EXPECT_EQ(back & 0x7c00u, 0x7c00u);
      EXPECT_NE(back & 0x3ffu, 0u) << "nan must stay nan, pattern " << b;
    } else {
      ASSERT_EQ(float_to_half_bits(f), b) << "pattern " << b << " value " << f;
    }
  }
}

TEST(Half, RoundsToNearestEven) {
  // Halfway between 1 and the next half (1 + 2^-10) goes to the even one, 1.
  EXPECT_EQ(float_to_half_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00u);
  // Halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even) goes up.
  EXPECT_EQ(float_to_half_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02u);
  // Just above halfway goes up.
  EXPECT_EQ(float_to_half_bits(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01u);
  // Largest finite and overflow.
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7bffu);
  EXPECT_EQ(float_to_half_bits(65519.0f), 0x7bffu);
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7c00u);
  EXPECT_EQ(float_to_half_bits(-1e6f), 0xfc00u);
  // Subnormals: 2^-24 is the smallest; 2^-25 ties to even (zero); 1.5 * 2^-24 ties to 2.
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -24)), 0x0001u);
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -25)), 0x0000u);
  EXPECT_EQ(float_to_half_bits(1.5f * std::ldexp(1.0f, -24)), 0x0002u);
  EXPECT_EQ(float_to_half_bits(-0.0f), 0x8000u);
  // Infinities and nan.
  EXPECT_EQ(float_to_half_bits(std::numeric_limits<float>::infinity()), 0x7c00u);
  EXPECT_EQ(float_to_half_bits(-std::numeric_limits<float>::infinity()), 0xfc00u);
  EXPECT_TRUE(std::isnan(half_bits_to_float(float_to_half_bits(std::nanf("")))));
  EXPECT_TRUE(std::isinf(static_cast<float>(Half(1e30f))));
}

TEST(Half, MatchesExactRoundingOnRandomFloats) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> exponent(-30.f, 16.5f);
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  auto decode = [](std::uint16_t b) { return static_cast<double>(half_bits_to_float(b)); };
  for (int i = 0; i < 200000; ++i) {
    float v = std::ldexp(mant(rng), static_cast<int>(exponent(rng)));
    if (i & 1) v = -v;
    ASSERT_EQ(float_to_half_bits(v), reference_round(v, decode, 0x7bff)) << "value " << v;
  }
}

TEST(BFloat16, EveryPatternRoundTrips) {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = bf16_bits_to_float(static_cast<std::uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(f))));
    } else {
      ASSERT_EQ(float_to_bf16_bits(f), b) << "pattern " << b;
    }
  }
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80u);        // tie -> even (1)
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82u);    // tie -> even (up)
  EXPECT_EQ(float_to_bf16_bits(f_of(0x3f808001u)), 0x3f81u);                  // above tie -> up
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80u);  // rounds to inf
  EXPECT_EQ(float_to_bf16_bits(-std::numeric_limits<float>::infinity()), 0xff80u);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::nanf("")))));
  // A nan whose payload sits in the low bits only must not become inf.
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(f_of(0x7f800001u)))));
}

TEST(BFloat16, MatchesExactRoundingOnRandomFloats) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint32_t> bits(0, 0x7f7fffffu);
  auto decode = [](std::uint16_t b) { return static_cast<double>(bf16_bits_to_float(b)); };
  for (int i = 0; i < 200000; ++i) {
    float v = f_of(bits(rng));
    if (i & 1) v = -v;
    ASSERT_EQ(float_to_bf16_bits(v), reference_round(v, decode, 0x7f7f)) << "value " << v;
  }
}

TEST(DType, GenericConversions) {
  EXPECT_EQ(dtype_of<Half>(), DType::f16);
  EXPECT_EQ(dtype_of<std::int64_t>(), DType::i64);
  EXPECT_FLOAT_EQ(to_float(from_float<BFloat16>(3.0f)), 3.0f);
  EXPECT_FLOAT_EQ(to_float(from_float<Half>(-2.5f)), -2.5f);
  EXPECT_EQ(sizeof(Half), 2u);
  EXPECT_EQ(sizeof(BFloat16), 2u);
}

}  // namespace
}  // namespace tutti
