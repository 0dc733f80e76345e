// sum, sum_squares and check_finite: CPU against sums in double; the CUDA twins against the CPU.
#include "tutti/kernels/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/kernel_test_util.h"
#include "tutti/core/device.h"

namespace tutti::kernels {
namespace {

using testing::random_tensor;

const std::vector<std::int64_t> kSizes = {1, 7, 16, 33, 1000, 4097, 100003};

double naive_sum(const std::vector<float>& v, bool square) {
  double acc = 0;
  for (float x : v) acc += square ? static_cast<double>(x) * x : x;
  return acc;
}

// fp32 accumulation of n terms of magnitude up to 1: allow n·2^-24 relative to the sum of |terms|.
double sum_tol(const std::vector<float>& v) {
  double abs_sum = 0;
  for (float x : v) abs_sum += std::fabs(x);
  return 1e-6 * abs_sum + 1e-6;
}

class ReduceDtypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(ReduceDtypeTest, SumsMatchDoubleReference) {
  const DType dt = GetParam();
  std::uint32_t seed = 1;
  for (std::int64_t n : kSizes) {
    // Shifted range, so the sum does not cancel to near zero.
    Tensor x = random_tensor({n}, dt, seed++, -0.5f, 1.0f);
    const auto v = x.to_floats();
    Tensor out = Tensor::from_floats({123.f}, {1});
    sum(x, out);
    EXPECT_NEAR(out.to_floats()[0], naive_sum(v, false), sum_tol(v)) << "sum n=" << n << " " << name_of(dt);
    sum_squares(x, out);
    EXPECT_NEAR(out.to_floats()[0], naive_sum(v, true), sum_tol(v)) << "sum_squares n=" << n;
    // Accumulate over two buffers, as global-norm clipping does.
    Tensor x2 = random_tensor({n + 3}, dt, seed++);
    sum_squares(x2, out, /*accumulate=*/true);
    EXPECT_NEAR(out.to_floats()[0], naive_sum(v, true) + naive_sum(x2.to_floats(), true), 2 * sum_tol(v) + 1e-5)
        << "sum_squares accumulate n=" << n;
    Tensor total = Tensor::from_floats({2.5f}, {1});
    sum(x, total, true);
    EXPECT_NEAR(total.to_floats()[0], 2.5 + naive_sum(v, false), sum_tol(v)) << "sum accumulate n=" << n;
  }
  // A multi-dimensional input is summed over every element; an empty one sums to zero.
  Tensor x3 = random_tensor({3, 5, 7}, dt, 77);
  Tensor out = Tensor::from_floats({9.f}, {1});
  sum(x3, out);
  EXPECT_NEAR(out.to_floats()[0], naive_sum(x3.to_floats(), false), 1e-4);
  sum(Tensor::empty({0}, dt), out);
  EXPECT_EQ(out.to_floats()[0], 0.f);
}

TEST_P(ReduceDtypeTest, CheckFiniteSetsButNeverClears) {
  const DType dt = GetParam();
  const float bad_values[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN()};
  for (std::int64_t n : kSizes) {
    Tensor clean = random_tensor({n}, dt, static_cast<std::uint32_t>(n));
    Tensor found = Tensor::from_ints({0}, {1});
    check_finite(clean, found);
    EXPECT_EQ(found.to_ints()[0], 0) << "clean buffer n=" << n;
    for (float bad : bad_values) {
      for (std::int64_t pos : {std::int64_t{0}, n / 2, n - 1}) {
        auto v = clean.to_floats();
        v[static_cast<std::size_t>(pos)] = bad;
        Tensor dirty = Tensor::from_floats(v, {n}, dt);
        Tensor f = Tensor::from_ints({0}, {1});
        check_finite(dirty, f);
        EXPECT_EQ(f.to_ints()[0], 1) << bad << " at " << pos << " of " << n << " " << name_of(dt);
      }
    }
    // A flag already set stays set on a clean buffer.
    Tensor set = Tensor::from_ints({1}, {1});
    check_finite(clean, set);
    EXPECT_EQ(set.to_ints()[0], 1);
  }
  // 70000 overflows f16 (to inf) but not f32 or bf16: the check reads the stored values.
  Tensor big = Tensor::from_floats({1.f, 70000.f}, {2}, dt);
  Tensor f = Tensor::from_ints({0}, {1});
  check_finite(big, f);
  EXPECT_EQ(f.to_ints()[0], dt == DType::f16 ? 1 : 0);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ReduceDtypeTest, ::testing::ValuesIn(testing::kFloatDtypes),
                         [](const auto& info) { return std::string(name_of(info.param)); });

TEST(Reduce, BadInputThrowsBeforeWriting) {
  Tensor x = random_tensor({10}, DType::f32, 1);
  Tensor out2 = Tensor::from_floats({5.f, 5.f}, {2});
  testing::expect_invalid_argument([&] { sum(x, out2); }, "sum");
  EXPECT_EQ(out2.to_floats()[0], 5.f);
  Tensor out_half = Tensor::from_floats({5.f}, {1}, DType::f16);
  testing::expect_invalid_argument([&] { sum_squares(x, out_half); }, "sum_squares");
  Tensor found_f32 = Tensor::from_floats({0.f}, {1});
  testing::expect_invalid_argument([&] { check_finite(x, found_f32); }, "check_finite");
  Tensor labels = Tensor::from_ints({1, 2}, {2});
  Tensor out = Tensor::from_floats({5.f}, {1});
  testing::expect_invalid_argument([&] { sum(labels, out); }, "sum");
  testing::expect_invalid_argument([&] { sum(Tensor(), out); }, "sum");
}

TEST_P(ReduceDtypeTest, CudaMatchesCpu) {
  TUTTI_REQUIRE_GPU();
  const DType dt = GetParam();
  const Device gpu = Device::cuda(0);
  Stream stream = Stream::create(gpu);
  std::uint32_t seed = 300;
  std::vector<std::int64_t> sizes = kSizes;
  sizes.push_back(0);
  sizes.push_back(5'000'011);  // many blocks, and a tail after the vector loads
  for (std::int64_t n : sizes) {
    Tensor x = random_tensor({n}, dt, seed++, -0.5f, 1.0f);
    const auto v = x.to_floats();
    Tensor xg = x.to(gpu);
    // Unaligned view: one element in, so the vector loads need their scalar head/tail.
    Tensor xo = n > 1 ? x.view(1, {n - 1}) : x;
    Tensor xog = n > 1 ? xg.view(1, {n - 1}) : xg;
    for (bool square : {false, true}) {
      for (bool accumulate : {false, true}) {
        for (bool offset : {false, true}) {
          Tensor out = Tensor::from_floats({1.5f}, {1});
          Tensor out_gpu = Tensor::from_floats({1.5f}, {1}).to(gpu);
          const Tensor& in = offset ? xo : x;
          const Tensor& in_gpu = offset ? xog : xg;
          if (square) {
            sum_squares(in, out, accumulate);
            sum_squares(in_gpu, out_gpu, accumulate, stream);
          } else {
            sum(in, out, accumulate);
            sum(in_gpu, out_gpu, accumulate, stream);
          }
          stream.synchronize();
          EXPECT_NEAR(out_gpu.to_floats()[0], out.to_floats()[0], sum_tol(v) + 1e-5)
              << (square ? "sum_squares" : "sum") << " n=" << n << (accumulate ? " accumulate" : "")
              << (offset ? " offset" : "") << " " << name_of(dt);
        }
      }
    }
    if (n == 0) continue;
    for (std::int64_t pos : {std::int64_t{-1}, std::int64_t{0}, n / 3, n - 1}) {
      auto w = v;
      if (pos >= 0) w[static_cast<std::size_t>(pos)] = std::numeric_limits<float>::quiet_NaN();
      Tensor f_gpu = Tensor::from_ints({0}, {1}).to(gpu);
      check_finite(Tensor::from_floats(w, {n}, dt).to(gpu), f_gpu, stream);
      stream.synchronize();
      EXPECT_EQ(f_gpu.to_ints()[0], pos >= 0 ? 1 : 0) << "check_finite nan at " << pos << " of " << n;
    }
    {
      // Non-finite values in every block: the blocks' stores of the flag must not race (the
      // emulated device's hazard detector reports plain stores to one address from two blocks).
      Tensor f_gpu = Tensor::from_ints({0}, {1}).to(gpu);
      const std::vector<float> nans(static_cast<std::size_t>(n), std::numeric_limits<float>::quiet_NaN());
      check_finite(Tensor::from_floats(nans, {n}, dt).to(gpu), f_gpu, stream);
      stream.synchronize();
      EXPECT_EQ(f_gpu.to_ints()[0], 1) << "check_finite all nan, n=" << n;
    }
    Tensor set = Tensor::from_ints({1}, {1}).to(gpu);
    check_finite(xg, set, stream);
    stream.synchronize();
    EXPECT_EQ(set.to_ints()[0], 1) << "check_finite cleared a set flag";
  }
}

}  // namespace
}  // namespace tutti::kernels
