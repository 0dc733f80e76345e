// fixed_point_accumulate and fixed_point_to_float: CPU against a rounding written out by hand
// (ties to even) and against sums in double; the CUDA twins against the CPU, bit for bit.
#include "tutti/kernels/fixed_point.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/kernel_test_util.h"
#include "tutti/core/device.h"

namespace tutti::kernels {
namespace {

using testing::random_tensor;

const double kScale = std::ldexp(1.0, 40);
const double kLimit = std::ldexp(1.0, 60);

// Round to nearest, ties to even, by hand: floor, then look at the remainder.
std::int64_t round_half_even(long double v) {
  const long double f = std::floor(v);
  const long double r = v - f;
  auto i = static_cast<std::int64_t>(f);
  if (r > 0.5L || (r == 0.5L && (i % 2 != 0))) ++i;
  return i;
}

Tensor zeros_i64(std::int64_t n, Device device = Device::cpu()) { return Tensor::zeros({n}, DType::i64, device); }

TEST(FixedPoint, AddsEachElementRoundedToNearestTiesToEven) {
  const float tiny = std::ldexp(1.0f, -41);  // half a unit of 2^-40
  const std::vector<float> x = {tiny, 3 * tiny, 5 * tiny, -tiny, -3 * tiny, 1.25f, -7.5f, std::ldexp(1.f, -60), 0.f};
  const std::vector<std::int64_t> expected_units = {0, 2, 2, 0, -2, 5 * (1LL << 38), -15 * (1LL << 39), 0, 0};
  Tensor acc =
      Tensor::from_ints(std::vector<std::int64_t>(x.size(), 10), {static_cast<std::int64_t>(x.size())}, DType::i64);
  Tensor status = zeros_i64(2);
  fixed_point_accumulate(Tensor::from_floats(x, {static_cast<std::int64_t>(x.size())}), kScale, kLimit, acc, status);
  const std::vector<std::int64_t> got = acc.to_ints();
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_EQ(got[i], 10 + expected_units[i]) << "x = " << x[i];
  EXPECT_EQ(status.to_ints(), (std::vector<std::int64_t>{0, 0}));
}

TEST(FixedPoint, RandomSlicesSumToTheDoubleSumWithinOneUnitEach) {
  for (DType dt : testing::kFloatDtypes) {
    const std::int64_t n = 4097;
    Tensor acc = zeros_i64(n), status = zeros_i64(2);
    std::vector<long double> exact(n, 0.0L);
    for (std::uint32_t slice = 0; slice < 5; ++slice) {
      Tensor x = random_tensor({n}, dt, 10 + slice, -3.f, 3.f);
      const std::vector<float> v = x.to_floats();
      for (std::int64_t i = 0; i < n; ++i) exact[i] += static_cast<long double>(v[i]) * kScale;
      std::vector<std::int64_t> before = acc.to_ints();
      fixed_point_accumulate(x, kScale, kLimit, acc, status);
      const std::vector<std::int64_t> after = acc.to_ints();
      for (std::int64_t i = 0; i < n; i += 97) {
        ASSERT_EQ(after[i] - before[i], round_half_even(static_cast<long double>(v[i]) * kScale)) << name_of(dt);
      }
    }
    Tensor out = Tensor::empty({n}, DType::f32);
    fixed_point_to_float(acc, 1.0 / kScale / 5, out);
    const std::vector<std::int64_t> q = acc.to_ints();
    const std::vector<float> mean = out.to_floats();
    for (std::int64_t i = 0; i < n; ++i) {
      ASSERT_LE(std::fabs(static_cast<long double>(q[i]) - exact[i]), 5 * 0.5L) << i;
      ASSERT_EQ(mean[i], static_cast<float>(static_cast<double>(q[i]) / kScale / 5)) << i;
    }
    EXPECT_EQ(status.to_ints(), (std::vector<std::int64_t>{0, 0})) << name_of(dt);
  }
}

TEST(FixedPoint, ZeroXClearsTheInputAfterAddingIt) {
  for (DType dt : testing::kFloatDtypes) {
    Tensor x = Tensor::from_floats({1.5f, -2.f, 0.25f}, {3}, dt);
    Tensor acc = zeros_i64(3), status = zeros_i64(2);
    fixed_point_accumulate(x, 4.0, 100.0, acc, status, /*zero_x=*/true);
    EXPECT_EQ(acc.to_ints(), (std::vector<std::int64_t>{6, -8, 1})) << name_of(dt);
    EXPECT_EQ(x.to_floats(), (std::vector<float>{0.f, 0.f, 0.f})) << name_of(dt);
  }
}

TEST(FixedPoint, NonFiniteAndOutOfRangeElementsSetTheirFlagAndAreNotAdded) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  Tensor acc = Tensor::from_ints({1, 2, 3, 4}, {4}, DType::i64);
  Tensor status = zeros_i64(2);
  fixed_point_accumulate(Tensor::from_floats({1.f, inf, 2.f, 3.f}, {4}), 4.0, 100.0, acc, status);
  EXPECT_EQ(acc.to_ints(), (std::vector<std::int64_t>{5, 2, 11, 16}));
  EXPECT_EQ(status.to_ints(), (std::vector<std::int64_t>{1, 0}));
  status = zeros_i64(2);
  fixed_point_accumulate(Tensor::from_floats({26.f, -nan, -25.f, 0.f}, {4}), 4.0, 100.0, acc, status);
  EXPECT_EQ(acc.to_ints(), (std::vector<std::int64_t>{5, 2, -89, 16}));  // 104 > 100 left out, -100 in
  EXPECT_EQ(status.to_ints(), (std::vector<std::int64_t>{1, 1}));
}

TEST(FixedPoint, ConvertsToEveryFloatingDtypeRoundingOnce) {
  const std::vector<std::int64_t> q = {0, 1, -3, (1LL << 50) + 1, -(1LL << 40) * 3};
  Tensor acc = Tensor::from_ints(q, {5}, DType::i64);
  for (DType dt : testing::kFloatDtypes) {
    Tensor out = Tensor::empty({5}, dt);
    fixed_point_to_float(acc, 1.0 / kScale, out);
    std::vector<float> expected;
    for (std::int64_t v : q) expected.push_back(static_cast<float>(static_cast<double>(v) / kScale));
    // The host conversion of the same f32 values to dt, then back, is what the kernel stores.
    EXPECT_EQ(out.to_floats(), Tensor::from_floats(expected, {5}, dt).to_floats()) << name_of(dt);
  }
}

TEST(FixedPoint, RefusesBadArguments) {
  Tensor x = Tensor::from_floats({1.f, 2.f}, {2});
  Tensor acc = zeros_i64(2), status = zeros_i64(2);
  testing::expect_invalid_argument([&] { fixed_point_accumulate(x, kScale, kLimit, zeros_i64(3), status); },
                                   "fixed_point_accumulate");
  testing::expect_invalid_argument([&] { fixed_point_accumulate(x, kScale, kLimit, acc, zeros_i64(1)); },
                                   "fixed_point_accumulate");
  testing::expect_invalid_argument([&] { fixed_point_accumulate(x, kScale, kLimit, x, status); },
                                   "fixed_point_accumulate");
  testing::expect_invalid_argument([&] { fixed_point_accumulate(x, -1.0, kLimit, acc, status); },
                                   "fixed_point_accumulate");
  testing::expect_invalid_argument([&] { fixed_point_to_float(x, 1.0, x); }, "fixed_point_to_float");
}

TEST(FixedPoint, CudaMatchesCpuBitForBit) {
  TUTTI_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Stream stream = Stream::create(gpu);
  const std::int64_t big = testing::on_emulated_device() ? 20'011 : 3'000'017;
  for (DType dt : testing::kFloatDtypes) {
    for (std::int64_t n : {std::int64_t{1}, std::int64_t{33}, big}) {
      Tensor acc = zeros_i64(n), status = zeros_i64(2);
      Tensor acc_gpu = zeros_i64(n, gpu), status_gpu = zeros_i64(2, gpu);
      for (std::uint32_t slice = 0; slice < 3; ++slice) {
        // Large values in slice 2 overflow a limit of 2^40 units (|x| > 1): the flag, on both.
        Tensor x = random_tensor({n}, dt, 50 + slice, -1.5f, 1.5f);
        const double limit = slice == 2 ? std::ldexp(1.0, 40) : kLimit;
        Tensor x_gpu = x.to(gpu);
        fixed_point_accumulate(x, kScale, limit, acc, status);
        fixed_point_accumulate(x_gpu, kScale, limit, acc_gpu, status_gpu, /*zero_x=*/true, stream);
        stream.synchronize();
        EXPECT_EQ(x_gpu.to(Device::cpu()).to_floats(), std::vector<float>(n, 0.f)) << "zero_x " << name_of(dt);
      }
      Tensor inf = Tensor::from_floats({std::numeric_limits<float>::infinity()}, {1}, dt);
      fixed_point_accumulate(inf, kScale, kLimit, acc.view(0, {1}), status);
      fixed_point_accumulate(inf.to(gpu), kScale, kLimit, acc_gpu.view(0, {1}), status_gpu, false, stream);
      Tensor out = Tensor::empty({n}, dt), out_gpu = Tensor::empty({n}, dt, gpu);
      fixed_point_to_float(acc, 1.0 / kScale / 3, out);
      fixed_point_to_float(acc_gpu, 1.0 / kScale / 3, out_gpu, stream);
      stream.synchronize();
      EXPECT_EQ(acc_gpu.to(Device::cpu()).to_ints(), acc.to_ints()) << name_of(dt) << " n=" << n;
      EXPECT_EQ(status_gpu.to(Device::cpu()).to_ints(), status.to_ints()) << name_of(dt) << " n=" << n;
      EXPECT_EQ(out_gpu.to(Device::cpu()).to_floats(), out.to_floats()) << name_of(dt) << " n=" << n;
    }
  }
}

}  // namespace
}  // namespace tutti::kernels
