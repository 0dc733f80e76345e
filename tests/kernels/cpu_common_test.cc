// The CPU kernels' shared building blocks (kernels/cpu/common.h): exp_f32 against std::exp in
// double, and the lane-wise sum and max against plain loops, at sizes around the lane counts.
#include "kernels/cpu/common.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace tutti::kernels::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(ExpF32, WithinTwoUlpOfTheTrueValueOverTheNormalRange) {
  const ExpBounds bounds = exp_bounds();
  double worst = 0.0;
  float worst_at = 0.0f;
  // A dense, irregular grid over the whole range where e^x is a normal float below the
  // saturation point.
  for (float x = -87.33f; x < 88.37f; x += 0.000731f) {
    const double truth = std::exp(static_cast<double>(x));
    const double rel = std::fabs(static_cast<double>(exp_f32(x, bounds)) - truth) / truth;
    if (rel > worst) {
      worst = rel;
      worst_at = x;
    }
  }
  // One ulp of a float is 2^-23 ~ 1.19e-7 relative at most; the polynomial is within ~1.6 ulp.
  EXPECT_LT(worst, 2.0 * 1.19e-7) << "worst at x = " << worst_at;
}

TEST(ExpF32, ExactAtZeroAndRightAtTheEdges) {
  const ExpBounds bounds = exp_bounds();
  EXPECT_EQ(exp_f32(0.0f, bounds), 1.0f);
  EXPECT_EQ(exp_f32(-0.0f, bounds), 1.0f);
  EXPECT_EQ(exp_f32(kInf, bounds), kInf);
  EXPECT_EQ(exp_f32(-kInf, bounds), 0.0f);
  EXPECT_TRUE(std::isnan(exp_f32(std::nanf(""), bounds)));
  // Documented saturation: inf from 88.376 on (the true value is finite up to 88.72), 0 below
  // the smallest normal result.
  EXPECT_EQ(exp_f32(88.5f, bounds), kInf);
  EXPECT_EQ(exp_f32(-90.0f, bounds), 0.0f);
  const float near_edge = -87.33f;
  const double truth = std::exp(static_cast<double>(near_edge));
  const float smallest = exp_f32(near_edge, bounds);
  EXPECT_GE(smallest, std::numeric_limits<float>::min());
  EXPECT_NEAR(smallest, truth, 2.4e-7 * truth);
}

TEST(ExpF32, LoweredUpperBoundSaturatesInsteadOfOverflowing) {
  const ExpBounds capped = exp_bounds(69.0f);
  const float at_cap = exp_f32(69.0f, capped);
  EXPECT_TRUE(std::isfinite(at_cap));
  EXPECT_NEAR(at_cap, std::exp(69.0), 2e-7 * std::exp(69.0));
  EXPECT_EQ(exp_f32(1000.0f, capped), at_cap);
  EXPECT_EQ(exp_f32(kInf, capped), at_cap);
  EXPECT_EQ(exp_f32(1.0f, capped), exp_f32(1.0f, exp_bounds()));  // below the cap: unchanged
  EXPECT_TRUE(std::isnan(exp_f32(std::nanf(""), capped)));
}

// Sizes below, at and past the 16 lanes of sum_lanes and the 16-float blocks of max_f32.
const std::vector<std::int64_t> kSizes = {1, 2, 15, 16, 17, 31, 32, 33, 1000, 1003};

std::vector<float> random_floats(std::int64_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-3.0f, 5.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

TEST(SumLanes, MatchesADoubleSumAtEverySize) {
  std::uint32_t seed = 7;
  EXPECT_EQ(sum_f32(nullptr, 0), 0.0f);
  for (std::int64_t n : kSizes) {
    const std::vector<float> v = random_floats(n, seed++);
    double truth = 0.0, magnitude = 0.0;
    for (float x : v) {
      truth += x;
      magnitude += std::fabs(x);
    }
    EXPECT_NEAR(sum_f32(v.data(), n), truth, 1e-6 * magnitude + 1e-6) << "n = " << n;
    // With a computed term: every index is visited exactly once.
    const float weighted =
        sum_lanes(n, [&](std::int64_t i) { return v[static_cast<std::size_t>(i)] * static_cast<float>(i); });
    double weighted_truth = 0.0, weighted_magnitude = 0.0;
    for (std::int64_t i = 0; i < n; ++i) {
      weighted_truth += static_cast<double>(v[static_cast<std::size_t>(i)]) * static_cast<double>(i);
      weighted_magnitude += std::fabs(static_cast<double>(v[static_cast<std::size_t>(i)]) * static_cast<double>(i));
    }
    EXPECT_NEAR(weighted, weighted_truth, 1e-6 * weighted_magnitude + 1e-6) << "n = " << n;
  }
}

TEST(MaxF32, FindsTheMaximumWhereverItIs) {
  std::uint32_t seed = 11;
  for (std::int64_t n : kSizes) {
    std::vector<float> v = random_floats(n, seed++);
    // The largest value at every position in turn: first, inside a block, in the tail, last.
    for (std::int64_t at : {std::int64_t{0}, n / 2, n - 1, std::max<std::int64_t>(0, n - 3)}) {
      std::vector<float> w = v;
      w[static_cast<std::size_t>(at)] = 100.0f + static_cast<float>(at);
      EXPECT_EQ(max_f32(w.data(), n), *std::max_element(w.begin(), w.end())) << "n = " << n << ", max at " << at;
    }
  }
  const std::vector<float> negative = {-5.0f, -7.0f, -1.5f, -9.0f};
  EXPECT_EQ(max_f32(negative.data(), 4), -1.5f);
  const std::vector<float> with_inf(40, 1.0f);
  std::vector<float> w = with_inf;
  w[37] = kInf;
  EXPECT_EQ(max_f32(w.data(), 40), kInf);
}

}  // namespace
}  // namespace tutti::kernels::cpu
