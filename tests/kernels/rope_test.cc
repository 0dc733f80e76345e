// Rotary embedding family: CPU against a naive double-precision "rotate half" rotation, its
// backward as the rotation's transpose (finite differences), the value heads untouched; the CUDA
// twin against the CPU (on a GPU, and on the emulated device in kernels_rope_test_emu).
#include "tutti/kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/kernel_test_util.h"

namespace tutti::kernels {
namespace {

using std::int64_t;
using testing::default_rtol;
using testing::expect_close;
using testing::kFloatDtypes;
using testing::random_tensor;

struct Case {
  int64_t B, T, H, G, hs;
  int64_t width() const { return (H + 2 * G) * hs; }
};
const Case kCases[] = {{1, 1, 1, 1, 2}, {2, 5, 4, 2, 8}, {3, 17, 6, 3, 16}, {1, 33, 2, 1, 64}};

std::string name_of(const Case& c, DType d) {
  return std::string(tutti::name_of(d)) + " B" + std::to_string(c.B) + " T" + std::to_string(c.T) + " H" +
         std::to_string(c.H) + " G" + std::to_string(c.G) + " hs" + std::to_string(c.hs);
}

// Hugging Face's default frequencies: theta^(-2i / hs).
std::vector<float> inv_freq(int64_t hs, double theta) {
  std::vector<float> f;
  for (int64_t i = 0; i < hs / 2; ++i) f.push_back(static_cast<float>(1.0 / std::pow(theta, 2.0 * i / double(hs))));
  return f;
}

// The rotation in double: q and k heads turned by +angle (sign 1) or -angle (sign -1).
std::vector<double> naive(const std::vector<float>& x, const Case& c, const std::vector<float>& freq, double sign) {
  std::vector<double> y(x.begin(), x.end());
  const int64_t half = c.hs / 2;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t h = 0; h < c.H + c.G; ++h)
        for (int64_t i = 0; i < half; ++i) {
          const std::size_t a = static_cast<std::size_t>((b * c.T + t) * c.width() + h * c.hs + i), bb = a + half;
          const double angle = double(static_cast<float>(t) * freq[static_cast<std::size_t>(i)]);
          const double cs = std::cos(angle), sn = sign * std::sin(angle);
          y[a] = x[a] * cs - x[bb] * sn;
          y[bb] = x[bb] * cs + x[a] * sn;
        }
  return y;
}

std::vector<float> to_f(const std::vector<double>& v) { return {v.begin(), v.end()}; }

TEST(RopeCpu, TableIsHuggingFacesAngles) {
  const std::vector<float> f = inv_freq(8, 10000.0);
  const Tensor table = rope_table(f, 5);
  ASSERT_EQ(table.shape(), (Shape{5, 4, 2}));
  const float* p = table.data_as<float>();
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t i = 0; i < 4; ++i) {
      const float angle = static_cast<float>(t) * f[static_cast<std::size_t>(i)];  // f32, as torch
      EXPECT_FLOAT_EQ(p[(t * 4 + i) * 2], static_cast<float>(std::cos(double(angle))));
      EXPECT_FLOAT_EQ(p[(t * 4 + i) * 2 + 1], static_cast<float>(std::sin(double(angle))));
    }
}

TEST(RopeCpu, ForwardMatchesNaiveAndLeavesValues) {
  std::uint32_t seed = 1;
  for (DType d : kFloatDtypes)
    for (const Case& c : kCases) {
      const std::vector<float> f = inv_freq(c.hs, 10000.0);
      const Tensor table = rope_table(f, c.T + 3);  // longer than needed: positions start at 0
      const Tensor x = random_tensor({c.B, c.T, c.width()}, d, seed++, -2.f, 2.f);
      const std::vector<float> before = x.to_floats();
      rope_forward(x, c.H, c.G, table);
      const double tol = d == DType::f32 ? 1e-6 : default_rtol(d);
      expect_close(x.to_floats(), to_f(naive(before, c, f, 1.0)), tol, tol, "rope " + name_of(c, d));
      const std::vector<float> after = x.to_floats();
      for (int64_t row = 0; row < c.B * c.T; ++row)
        for (int64_t col = (c.H + c.G) * c.hs; col < c.width(); ++col) {
          const std::size_t k = static_cast<std::size_t>(row * c.width() + col);
          ASSERT_EQ(after[k], before[k]) << "value head changed at " << k << ", " << name_of(c, d);
        }
    }
}

TEST(RopeCpu, BackwardIsTheTransposeOfForward) {
  // loss = sum(rope(x) · r): its gradient with respect to x is rope_backward(r), by finite
  // differences; and rope_backward undoes rope_forward.
  const Case c{2, 6, 4, 2, 4};
  const std::vector<float> f = inv_freq(c.hs, 500000.0);
  const Tensor table = rope_table(f, c.T);
  const Tensor x = random_tensor({c.B, c.T, c.width()}, DType::f32, 3);
  const Tensor r = random_tensor({c.B, c.T, c.width()}, DType::f32, 4);
  const std::vector<float> rv = r.to_floats();
  auto loss = [&] {
    const std::vector<double> y = naive(x.to_floats(), c, f, 1.0);
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += y[i] * rv[i];
    return s;
  };
  const std::vector<double> numeric = testing::numeric_gradient(x, loss);
  const Tensor g = r.clone();
  rope_backward(g, c.H, c.G, table);
  expect_close(g.to_floats(), to_f(numeric), 1e-3, 1e-3, "rope_backward vs finite differences");
  const std::vector<float> before = x.to_floats();
  rope_forward(x, c.H, c.G, table);
  rope_backward(x, c.H, c.G, table);
  expect_close(x.to_floats(), before, 1e-6, 1e-6, "rope_backward(rope_forward(x))");
}

TEST(RopeCpu, BadInputsThrowNamingTheOp) {
  using testing::expect_invalid_argument;
  const Tensor table = rope_table(inv_freq(4, 10000.0), 3);
  const Tensor x = random_tensor({2, 3, 32}, DType::f32, 1);  // (4 + 2·2) x 4
  expect_invalid_argument([&] { rope_forward(x, 4, 3, table); }, "rope_forward");
  expect_invalid_argument([&] { rope_forward(random_tensor({2, 3, 30}, DType::f32, 2), 4, 2, table); }, "rope_forward");
  expect_invalid_argument([&] { rope_forward(random_tensor({2, 4, 32}, DType::f32, 2), 4, 2, table); }, "T_max");
  expect_invalid_argument([&] { rope_forward(random_tensor({2, 3, 24}, DType::f32, 2), 4, 2, table); }, "rope_forward");
  expect_invalid_argument([&] { rope_backward(x, 4, 2, Tensor::zeros({3, 2, 2}, DType::bf16)); }, "rope_backward");
  expect_invalid_argument([&] { rope_table({}, 3); }, "rope_table");
}

TEST(RopeCuda, MatchesCpu) {
  TUTTI_REQUIRE_GPU();
  std::uint32_t seed = 100;
  const Device g = Device::cuda(0);
  for (DType d : kFloatDtypes)
    for (const Case& c : kCases) {
      const Tensor table = rope_table(inv_freq(c.hs, 10000.0), c.T);
      const Tensor x = random_tensor({c.B, c.T, c.width()}, d, seed++, -2.f, 2.f);
      const Tensor xg = x.to(g), tg = table.to(g);
      const Stream st = Stream::create(g);
      // Halves: the same fp32 arithmetic rounded once, but the GPU may contract a multiply-add.
      const double tol = d == DType::f32 ? 1e-6 : default_rtol(d);
      rope_forward(x, c.H, c.G, table);
      rope_forward(xg, c.H, c.G, tg, st);
      st.synchronize();
      expect_close(xg.to_floats(), x.to_floats(), tol, tol, "cuda rope " + name_of(c, d));
      rope_backward(x, c.H, c.G, table);
      rope_backward(xg, c.H, c.G, tg, st);
      st.synchronize();
      expect_close(xg.to_floats(), x.to_floats(), tol, tol, "cuda rope_backward " + name_of(c, d));
    }
}

}  // namespace
}  // namespace tutti::kernels
