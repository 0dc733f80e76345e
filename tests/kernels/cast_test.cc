// cast and unscale_and_check: CPU against an independent round-to-nearest-even reference
// (nearest representable value found by search, ties to the even bit pattern); the CUDA
// twins against the CPU.
#include "tutti/kernels/cast.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernel_test_util.h"
#include "tutti/core/device.h"

namespace tutti::kernels {
namespace {

using testing::kFloatDtypes;
using testing::random_tensor;

const float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

// ---- the reference: exact decoding, and rounding by search over the representable values ----

double decode_half(std::uint16_t h) {
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exp == 0x1f)
    return mant ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}
double decode_bf16(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Rounds v to nearest even among the finite non-negative codes 0..max_code of a 16-bit
// format (magnitudes increase with the code), overflowing to inf_code past the midpoint
// between the largest value and the next power step.
std::uint16_t round_by_search(double v, double (*decode)(std::uint16_t), std::uint16_t max_code, std::uint16_t inf_code,
                              std::uint16_t nan_code) {
  if (std::isnan(v)) return nan_code;
  const std::uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(v);
  // Binary search for the largest code with value <= a.
  std::uint32_t lo = 0, hi = max_code;
  while (lo < hi) {
    const std::uint32_t mid = (lo + hi + 1) / 2;
    if (decode(static_cast<std::uint16_t>(mid)) <= a)
      lo = mid;
    else
      hi = mid - 1;
  }
  const double below = decode(static_cast<std::uint16_t>(lo));
  // Above the largest finite value, the next step would be one ulp more (same exponent).
  const double above = lo < max_code ? decode(static_cast<std::uint16_t>(lo + 1))
                                     : below + (below - decode(static_cast<std::uint16_t>(lo - 1)));
  std::uint32_t code;
  if (a - below < above - a)
    code = lo;
  else if (a - below > above - a)
    code = lo + 1;
  else
    code = (lo % 2 == 0) ? lo : lo + 1;  // tie: the even code
  if (code > max_code) return sign | inf_code;
  return static_cast<std::uint16_t>(sign | code);
}
std::uint16_t ref_half(double v) { return round_by_search(v, decode_half, 0x7bff, 0x7c00, 0x7e00); }
std::uint16_t ref_bf16(double v) { return round_by_search(v, decode_bf16, 0x7f7f, 0x7f80, 0x7fc0); }

// The expected value of v rounded into `dt`, as a float (nan stays nan).
float ref_round(double v, DType dt) {
  switch (dt) {
    case DType::f16: return static_cast<float>(decode_half(ref_half(v)));
    case DType::bf16: return static_cast<float>(decode_bf16(ref_bf16(v)));
    default: return static_cast<float>(v);
  }
}

// Values that stress rounding: ties in each format, subnormals, the edges of overflow,
// inf and nan of both signs, and random values across many binades.
std::vector<float> tricky_values() {
  std::vector<float> v = {0.f,
                          -0.f,
                          1.f,
                          -1.f,
                          1.f + std::ldexp(1.f, -11),
                          1.f + 3 * std::ldexp(1.f, -11),
                          1.f + std::ldexp(1.f, -8),
                          1.f + 3 * std::ldexp(1.f, -8),
                          65504.f,
                          65519.f,
                          65520.f,
                          -65520.f,
                          1e6f,
                          std::ldexp(1.f, -24),
                          std::ldexp(1.f, -25),
                          std::ldexp(3.f, -26),
                          std::ldexp(1.f, -14),
                          std::ldexp(1.f, -15) * 1.5f,
                          3e38f,
                          -3.4e38f,
                          1e-40f,
                          kInf,
                          -kInf,
                          kNan,
                          -kNan,
                          0.1f,
                          -2.7182818f,
                          3.14159265f};
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> mant(1.f, 2.f);
  std::uniform_int_distribution<int> expo(-30, 20);
  for (int i = 0; i < 2000; ++i) v.push_back((i % 2 ? -1.f : 1.f) * std::ldexp(mant(rng), expo(rng)));
  return v;
}

// A tensor of `dt` holding the values of `v` rounded by the reference (the exact codes).
Tensor ref_tensor(const std::vector<float>& v, DType dt) {
  const auto n = static_cast<std::int64_t>(v.size());
  Tensor t = Tensor::empty({n}, dt);
  for (std::int64_t i = 0; i < n; ++i) {
    const double x = v[static_cast<std::size_t>(i)];
    if (dt == DType::f32) t.data_as<float>()[i] = static_cast<float>(x);
    if (dt == DType::f16) t.data_as<Half>()[i] = Half::from_bits(ref_half(x));
    if (dt == DType::bf16) t.data_as<BFloat16>()[i] = BFloat16::from_bits(ref_bf16(x));
  }
  return t;
}

// Compares floats exactly, with nan matching nan and the sign of zero and inf checked.
void expect_same_values(const std::vector<float>& actual, const std::vector<float>& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size());
  int reported = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const float a = actual[i], e = expected[i];
    const bool ok = std::isnan(e) ? std::isnan(a) : (a == e && std::signbit(a) == std::signbit(e));
    if (!ok && reported++ < 5) ADD_FAILURE() << what << ": element " << i << " is " << a << ", expected " << e;
  }
}

TEST(Cast, EveryPairRoundsToNearestEvenAndKeepsInfNan) {
  const auto values = tricky_values();
  for (DType from : kFloatDtypes) {
    // The source holds exactly representable values of `from`.
    Tensor x = ref_tensor(values, from);
    const auto xv = x.to_floats();
    for (DType to : kFloatDtypes) {
      Tensor out = testing::poisoned({x.numel()}, to);
      cast(x, out);
      std::vector<float> expected(xv.size());
      for (std::size_t i = 0; i < xv.size(); ++i) expected[i] = ref_round(xv[i], to);
      expect_same_values(out.to_floats(), expected,
                         "cast " + std::string(name_of(from)) + " -> " + std::string(name_of(to)));
    }
  }
  // The reference itself: a few codes known from the formats' definitions.
  EXPECT_EQ(ref_half(1.0), 0x3c00);
  EXPECT_EQ(ref_half(65520.0), 0x7c00);
  EXPECT_EQ(ref_half(1.0 + std::ldexp(1.0, -11)), 0x3c00);      // tie to even
  EXPECT_EQ(ref_half(1.0 + 3 * std::ldexp(1.0, -11)), 0x3c02);  // tie to even (up)
  EXPECT_EQ(ref_bf16(1.0 + std::ldexp(1.0, -8)), 0x3f80);
  EXPECT_EQ(ref_bf16(1.0 + 3 * std::ldexp(1.0, -8)), 0x3f82);
}

TEST(Cast, ShapesMayDifferWithTheSameCount) {
  Tensor x = random_tensor({3, 4}, DType::f32, 1);
  Tensor out = testing::poisoned({12}, DType::bf16);
  cast(x, out);
  const auto xv = x.to_floats();
  std::vector<float> expected(xv.size());
  for (std::size_t i = 0; i < xv.size(); ++i) expected[i] = ref_round(xv[i], DType::bf16);
  expect_same_values(out.to_floats(), expected, "cast [3, 4] -> [12]");
}

class UnscaleTest : public ::testing::TestWithParam<DType> {};

TEST_P(UnscaleTest, ScalesInPlaceAndFlagsNonFinite) {
  const DType dt = GetParam();
  for (std::int64_t n : {1, 5, 64, 1001, 65537}) {
    const float scale = 1024.f;
    Tensor g = random_tensor({n}, dt, static_cast<std::uint32_t>(n), -scale, scale);
    const auto before = g.to_floats();
    Tensor found = Tensor::from_ints({0}, {1});
    unscale_and_check(g, 1.f / scale, found);
    std::vector<float> expected(before.size());
    for (std::size_t i = 0; i < before.size(); ++i)
      expected[i] = ref_round(static_cast<double>(before[i] * (1.f / scale)), dt);
    expect_same_values(g.to_floats(), expected, "unscale " + std::string(name_of(dt)) + " n=" + std::to_string(n));
    EXPECT_EQ(found.to_ints()[0], 0) << "clean buffer flagged, n=" << n;
    for (float bad : {kInf, -kInf, kNan}) {
      auto v = before;
      v[static_cast<std::size_t>(n / 2)] = bad;
      Tensor dirty = Tensor::from_floats(v, {n}, dt);
      Tensor f = Tensor::from_ints({0}, {1});
      unscale_and_check(dirty, 0.5f, f);
      EXPECT_EQ(f.to_ints()[0], 1) << bad << " not flagged, n=" << n << " " << name_of(dt);
      EXPECT_EQ(
          dirty.to_floats()[static_cast<std::size_t>(n / 2)] == dirty.to_floats()[static_cast<std::size_t>(n / 2)],
          !std::isnan(bad));
    }
    // The flag is never cleared.
    Tensor set = Tensor::from_ints({1}, {1});
    unscale_and_check(Tensor::from_floats(before, {n}, dt), 1.f, set);
    EXPECT_EQ(set.to_ints()[0], 1);
  }
  // Overflow after scaling (inv_scale > 1 happens when the scale drops below one): 40000·4
  // is finite in f32 and bf16 but inf in f16.
  Tensor g = Tensor::from_floats({40000.f, 1.f}, {2}, dt);
  Tensor f = Tensor::from_ints({0}, {1});
  unscale_and_check(g, 4.f, f);
  EXPECT_EQ(f.to_ints()[0], dt == DType::f16 ? 1 : 0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, UnscaleTest, ::testing::ValuesIn(kFloatDtypes),
                         [](const auto& info) { return std::string(name_of(info.param)); });

TEST(Cast, BadInputThrowsBeforeWriting) {
  Tensor x = random_tensor({10}, DType::f32, 1);
  Tensor out = testing::poisoned({9}, DType::f16);
  testing::expect_invalid_argument([&] { cast(x, out); }, "cast");
  for (float v : out.to_floats()) ASSERT_TRUE(std::isnan(v));
  Tensor ints = Tensor::from_ints({1, 2}, {2});
  testing::expect_invalid_argument([&] { cast(ints, Tensor::empty({2}, DType::f32)); }, "cast");
  Tensor found_f32 = Tensor::from_floats({0.f}, {1});
  testing::expect_invalid_argument([&] { unscale_and_check(x, 0.5f, found_f32); }, "unscale_and_check");
  const auto before = x.to_floats();
  testing::expect_invalid_argument(
      [&] {
        unscale_and_check(x, 0.5f, Tensor::from_ints({0, 0}, {2}));
      },
      "unscale_and_check");
  EXPECT_EQ(x.to_floats(), before) << "grad was scaled before the check";
}

// ---- CUDA twins ----

TEST(Cast, CudaMatchesCpu) {
  TUTTI_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Stream stream = Stream::create(gpu);
  auto values = tricky_values();
  // Long enough for many blocks and the vector path, with an odd tail.
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-70000.f, 70000.f);
  for (int i = 0; i < 300001; ++i) values.push_back(dist(rng));
  for (DType from : kFloatDtypes) {
    Tensor x = ref_tensor(values, from);
    for (DType to : kFloatDtypes) {
      for (std::int64_t offset : {0, 1, 3}) {
        const std::int64_t n = x.numel() - offset;
        Tensor xs = x.view(offset, {n});
        Tensor out = Tensor::empty({n}, to);
        cast(xs, out);
        Tensor out_gpu = testing::poisoned({n + offset}, to, gpu).view(offset, {n});
        cast(xs.to(gpu), out_gpu, stream);
        stream.synchronize();
        expect_same_values(out_gpu.to_floats(), out.to_floats(),
                           "cuda cast " + std::string(name_of(from)) + " -> " + std::string(name_of(to)) + " offset " +
                               std::to_string(offset));
      }
    }
  }
}

TEST_P(UnscaleTest, CudaMatchesCpu) {
  TUTTI_REQUIRE_GPU();
  const DType dt = GetParam();
  const Device gpu = Device::cuda(0);
  Stream stream = Stream::create(gpu);
  for (std::int64_t n : {1, 7, 1001, 2'000'003}) {
    for (std::int64_t bad_pos : {std::int64_t{-1}, std::int64_t{0}, n - 1}) {
      for (std::int64_t offset : {0, 1}) {
        if (offset >= n) continue;
        Tensor g = random_tensor({n}, dt, static_cast<std::uint32_t>(n + bad_pos), -1000.f, 1000.f);
        if (bad_pos >= 0) {
          auto v = g.to_floats();
          v[static_cast<std::size_t>(bad_pos)] = bad_pos == 0 ? kInf : kNan;
          g = Tensor::from_floats(v, {n}, dt);
        }
        Tensor g_gpu = g.to(gpu).view(offset, {n - offset});
        Tensor gc = g.view(offset, {n - offset});
        Tensor f = Tensor::from_ints({0}, {1});
        Tensor f_gpu = Tensor::from_ints({0}, {1}).to(gpu);
        unscale_and_check(gc, 1.f / 512.f, f);
        unscale_and_check(g_gpu, 1.f / 512.f, f_gpu, stream);
        stream.synchronize();
        const std::string what = "cuda unscale n=" + std::to_string(n) + " bad at " + std::to_string(bad_pos) +
                                 " offset " + std::to_string(offset);
        expect_same_values(g_gpu.to_floats(), gc.to_floats(), what);
        EXPECT_EQ(f_gpu.to_ints()[0], f.to_ints()[0]) << what;
      }
    }
    // Non-finite values in every block: the blocks' stores of the flag must not race (the
    // emulated device's hazard detector reports plain stores to one address from two blocks).
    Tensor f_gpu = Tensor::from_ints({0}, {1}).to(gpu);
    unscale_and_check(Tensor::from_floats(std::vector<float>(static_cast<std::size_t>(n), kNan), {n}, dt).to(gpu),
                      1.f / 512.f, f_gpu, stream);
    stream.synchronize();
    EXPECT_EQ(f_gpu.to_ints()[0], 1) << "cuda unscale all nan, n=" << n;
  }
}

}  // namespace
}  // namespace tutti::kernels
