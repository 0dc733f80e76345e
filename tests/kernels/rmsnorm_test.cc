// RMSNorm family: CPU against a naive double-precision RMS norm and finite differences; the CUDA
// twin against the CPU (on a GPU, and on the emulated device in kernels_rmsnorm_test_emu).
#include "tutti/kernels/rmsnorm.h"

#include <gtest/gtest.h>

#include <algorithm>
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

const Shape kShapes[] = {{1, 1}, {7, 33}, {33, 129}, {129, 7}, {4, 1024}, {2, 3, 17}};
constexpr float kEps = 1e-5f;

std::vector<float> to_f(const std::vector<double>& v) { return {v.begin(), v.end()}; }
std::string name_of(const Shape& s, DType d) { return std::string(tutti::name_of(d)) + " " + shape_str(s); }

struct Naive {
  std::vector<double> y, rstd, dx, dw;
};
// y = x · rstd · w and the gradients of sum(y · dy) in double.
Naive naive(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& dy, int64_t D) {
  const int64_t N = static_cast<int64_t>(x.size()) / D;
  Naive n;
  n.y.resize(x.size());
  n.dx.resize(x.size());
  n.dw.assign(static_cast<std::size_t>(D), 0.0);
  for (int64_t r = 0; r < N; ++r) {
    const auto at = [&](int64_t i) { return double(x[static_cast<std::size_t>(r * D + i)]); };
    double sq = 0;
    for (int64_t i = 0; i < D; ++i) sq += at(i) * at(i);
    const double rs = 1.0 / std::sqrt(sq / double(D) + kEps);
    n.rstd.push_back(rs);
    double gx = 0;
    for (int64_t i = 0; i < D; ++i) {
      const std::size_t k = static_cast<std::size_t>(r * D + i);
      n.y[k] = at(i) * rs * w[static_cast<std::size_t>(i)];
      gx += double(dy[k]) * w[static_cast<std::size_t>(i)] * at(i) * rs;
      n.dw[static_cast<std::size_t>(i)] += double(dy[k]) * at(i) * rs;
    }
    for (int64_t i = 0; i < D; ++i) {
      const std::size_t k = static_cast<std::size_t>(r * D + i);
      n.dx[k] = rs * (double(dy[k]) * w[static_cast<std::size_t>(i)] - at(i) * rs * gx / double(D));
    }
  }
  return n;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

TEST(RmsNormCpu, MatchesNaive) {
  std::uint32_t seed = 1;
  for (DType d : kFloatDtypes)
    for (const Shape& shape : kShapes) {
      const int64_t D = shape.back(), N = numel_of(shape) / D;
      const Tensor x = random_tensor(shape, d, seed++, -2.f, 2.f), w = random_tensor({D}, d, seed++, 0.5f, 1.5f);
      const Tensor dy = random_tensor(shape, d, seed++);
      const Tensor y = testing::poisoned(shape, d), rstd = testing::poisoned({N}, DType::f32);
      rmsnorm_forward(x, w, kEps, y, rstd);
      const Tensor dx = testing::poisoned(shape, d);
      const Tensor dw = Tensor::from_floats(std::vector<float>(static_cast<std::size_t>(D), 0.25f), {D});
      rmsnorm_backward(x, w, rstd, dy, dx, dw, /*accumulate_params=*/true);
      const Naive want = naive(x.to_floats(), w.to_floats(), dy.to_floats(), D);
      const double tol = d == DType::f32 ? 1e-5 : 2 * default_rtol(d);
      expect_close(y.to_floats(), to_f(want.y), tol, tol, "y " + name_of(shape, d));
      expect_close(rstd.to_floats(), to_f(want.rstd), 1e-5, 1e-6, "rstd " + name_of(shape, d));
      expect_close(dx.to_floats(), to_f(want.dx), tol, tol * std::max(1.0, max_abs(want.dx)),
                   "dx " + name_of(shape, d));
      std::vector<double> dw_want = want.dw;
      for (double& v : dw_want) v += 0.25;  // accumulated onto what was there
      expect_close(dw.to_floats(), to_f(dw_want), tol, tol * std::max(1.0, max_abs(dw_want)),
                   "dw " + name_of(shape, d));
    }
}

TEST(RmsNormCpu, BackwardMatchesFiniteDifferences) {
  const Shape shape{3, 5};
  const Tensor x = random_tensor(shape, DType::f32, 7, -2.f, 2.f), w = random_tensor({5}, DType::f32, 8, 0.5f, 1.5f);
  const Tensor r = random_tensor(shape, DType::f32, 9);
  const std::vector<float> rv = r.to_floats();
  auto loss = [&] {
    const Naive n = naive(x.to_floats(), w.to_floats(), rv, 5);
    double s = 0;
    for (std::size_t i = 0; i < n.y.size(); ++i) s += n.y[i] * rv[i];
    return s;
  };
  const Tensor y = Tensor::empty(shape, DType::f32), rstd = Tensor::empty({3}, DType::f32);
  rmsnorm_forward(x, w, kEps, y, rstd);
  const Tensor dx = Tensor::empty(shape, DType::f32), dw = Tensor::empty({5}, DType::f32);
  rmsnorm_backward(x, w, rstd, r, dx, dw, /*accumulate_params=*/false);
  expect_close(dx.to_floats(), to_f(testing::numeric_gradient(x, loss)), 2e-3, 2e-3, "dx vs finite differences");
  expect_close(dw.to_floats(), to_f(testing::numeric_gradient(w, loss)), 2e-3, 2e-3, "dw vs finite differences");
}

TEST(RmsNormCpu, BadInputsThrowNamingTheOp) {
  using testing::expect_invalid_argument;
  const Tensor x = random_tensor({2, 4}, DType::f32, 1), w = random_tensor({4}, DType::f32, 2);
  const Tensor y = Tensor::zeros({2, 4}, DType::f32), rstd = Tensor::zeros({2}, DType::f32);
  expect_invalid_argument([&] { rmsnorm_forward(x, random_tensor({3}, DType::f32, 3), kEps, y, rstd); },
                          "rmsnorm_forward");
  expect_invalid_argument([&] { rmsnorm_forward(x, w, kEps, y, Tensor::zeros({3}, DType::f32)); }, "rmsnorm_forward");
  expect_invalid_argument([&] { rmsnorm_forward(x, w, -1.0f, y, rstd); }, "eps");
  expect_invalid_argument([&] { rmsnorm_forward(x, random_tensor({4}, DType::bf16, 4), kEps, y, rstd); },
                          "rmsnorm_forward");
  expect_invalid_argument(
      [&] {
        rmsnorm_backward(x, w, rstd, y, Tensor::zeros({2, 5}, DType::f32), Tensor(), false);
      },
      "rmsnorm_backward");
  expect_invalid_argument([&] { rmsnorm_backward(x, w, rstd, y, y, Tensor::zeros({4}, DType::bf16), false); },
                          "rmsnorm_backward");
  for (float v : y.to_floats()) EXPECT_EQ(v, 0.0f);
}

TEST(RmsNormCuda, MatchesCpu) {
  TUTTI_REQUIRE_GPU();
  std::uint32_t seed = 100;
  for (DType d : kFloatDtypes)
    for (const Shape& shape : kShapes)
      for (bool accumulate : {false, true}) {
        const int64_t D = shape.back(), N = numel_of(shape) / D;
        const Tensor x = random_tensor(shape, d, seed++, -2.f, 2.f), w = random_tensor({D}, d, seed++, 0.5f, 1.5f);
        const Tensor dy = random_tensor(shape, d, seed++), dw0 = random_tensor({D}, DType::f32, seed++);
        const Tensor y = Tensor::empty(shape, d), rstd = Tensor::empty({N}, DType::f32), dx = Tensor::empty(shape, d);
        const Tensor dw_c = dw0.clone();
        rmsnorm_forward(x, w, kEps, y, rstd);
        rmsnorm_backward(x, w, rstd, dy, dx, dw_c, accumulate);
        const Device g = Device::cuda(0);
        const Stream st = Stream::create(g);
        const Tensor yg = testing::poisoned(shape, d, g), rg = testing::poisoned({N}, DType::f32, g);
        const Tensor dxg = testing::poisoned(shape, d, g), dwg = dw0.to(g);
        rmsnorm_forward(x.to(g), w.to(g), kEps, yg, rg, st);
        rmsnorm_backward(x.to(g), w.to(g), rg, dy.to(g), dxg, dwg, accumulate, st);
        st.synchronize();
        const double tol = d == DType::f32 ? 1e-5 : 2 * default_rtol(d);
        expect_close(yg.to_floats(), y.to_floats(), tol, tol, "cuda y " + name_of(shape, d));
        expect_close(rg.to_floats(), rstd.to_floats(), 1e-5, 1e-6, "cuda rstd " + name_of(shape, d));
        expect_close(dxg.to_floats(), dx.to_floats(), tol, tol * 4, "cuda dx " + name_of(shape, d));
        expect_close(dwg.to_floats(), dw_c.to_floats(), tol, tol * 8, "cuda dw " + name_of(shape, d));
      }
}

}  // namespace
}  // namespace tutti::kernels
