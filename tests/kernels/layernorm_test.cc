// LayerNorm family: CPU against a naive double-precision layer norm and finite
// differences; the CUDA twin against the CPU (skipped where no GPU is visible).
#include "tutti/kernels/layernorm.h"

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

struct NaiveForward {
  std::vector<double> y, mean, rstd;
};
NaiveForward naive_forward(const std::vector<float>& x, const std::vector<float>& g, const std::vector<float>& b,
                           int64_t D, double eps) {
  const int64_t N = static_cast<int64_t>(x.size()) / D;
  NaiveForward f;
  f.y.resize(x.size());
  for (int64_t r = 0; r < N; ++r) {
    double mu = 0, var = 0;
    for (int64_t i = 0; i < D; ++i) mu += x[static_cast<std::size_t>(r * D + i)];
    mu /= double(D);
    for (int64_t i = 0; i < D; ++i) var += std::pow(x[static_cast<std::size_t>(r * D + i)] - mu, 2);
    var /= double(D);
    const double rs = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < D; ++i) {
      const std::size_t k = static_cast<std::size_t>(r * D + i);
      f.y[k] = (x[k] - mu) * rs * g[static_cast<std::size_t>(i)] + b[static_cast<std::size_t>(i)];
    }
    f.mean.push_back(mu);
    f.rstd.push_back(rs);
  }
  return f;
}

struct NaiveBackward {
  std::vector<double> dx, dgamma, dbeta;
};
NaiveBackward naive_backward(const std::vector<float>& x, const std::vector<float>& g, const std::vector<float>& dy,
                             int64_t D, double eps) {
  const int64_t N = static_cast<int64_t>(x.size()) / D;
  const NaiveForward f = naive_forward(x, g, std::vector<float>(static_cast<std::size_t>(D), 0.0f), D, eps);
  NaiveBackward out;
  out.dx.resize(x.size());
  out.dgamma.assign(static_cast<std::size_t>(D), 0.0);
  out.dbeta.assign(static_cast<std::size_t>(D), 0.0);
  for (int64_t r = 0; r < N; ++r) {
    const double mu = f.mean[static_cast<std::size_t>(r)], rs = f.rstd[static_cast<std::size_t>(r)];
    double sg = 0, sgx = 0;
    for (int64_t i = 0; i < D; ++i) {
      const std::size_t k = static_cast<std::size_t>(r * D + i);
      const double xhat = (x[k] - mu) * rs, gi = double(dy[k]) * g[static_cast<std::size_t>(i)];
      sg += gi;
      sgx += gi * xhat;
      out.dgamma[static_cast<std::size_t>(i)] += dy[k] * xhat;
      out.dbeta[static_cast<std::size_t>(i)] += dy[k];
    }
    for (int64_t i = 0; i < D; ++i) {
      const std::size_t k = static_cast<std::size_t>(r * D + i);
      const double xhat = (x[k] - mu) * rs, gi = double(dy[k]) * g[static_cast<std::size_t>(i)];
      out.dx[k] = rs * (gi - sg / double(D) - xhat * sgx / double(D));
    }
  }
  return out;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}
double rtol_of(DType d) { return d == DType::f32 ? 1e-5 : default_rtol(d); }
// Absolute floor relative to the largest value (gradients cancel, so small elements carry
// the rounding error of large intermediate terms).
double atol_of(DType d, double scale) { return (d == DType::f32 ? 1e-5 : default_rtol(d)) * std::max(1.0, scale); }

Shape rows_of(const Shape& s) { return Shape(s.begin(), s.end() - 1); }

TEST(LayerNormCpu, ForwardMatchesNaive) {
  std::uint32_t seed = 1;
  for (DType d : kFloatDtypes)
    for (const Shape& s : kShapes) {
      const int64_t D = s.back();
      const Tensor x = random_tensor(s, d, seed++, -2.f, 3.f), g = random_tensor({D}, d, seed++, 0.5f, 1.5f),
                   b = random_tensor({D}, d, seed++);
      const Tensor y = testing::poisoned(s, d), mean = testing::poisoned(rows_of(s), DType::f32),
                   rstd = testing::poisoned(rows_of(s), DType::f32);
      layernorm_forward(x, g, b, kEps, y, mean, rstd);
      const NaiveForward want = naive_forward(x.to_floats(), g.to_floats(), b.to_floats(), D, kEps);
      const std::string what = std::string(name_of(d)) + " " + shape_str(s);
      expect_close(y.to_floats(), to_f(want.y), rtol_of(d), rtol_of(d) * 0.1, "y " + what);
      expect_close(mean.to_floats(), to_f(want.mean), 1e-5, 1e-6, "mean " + what);
      // D = 1: var = 0, rstd = 1/sqrt(eps) = 316, where fp32 sums still agree to 1e-5.
      expect_close(rstd.to_floats(), to_f(want.rstd), 1e-5, 1e-6, "rstd " + what);
    }
}

TEST(LayerNormCpu, BackwardMatchesNaiveAndAccumulates) {
  std::uint32_t seed = 100;
  for (DType d : kFloatDtypes)
    for (DType gd : {d, DType::f32})
      for (const Shape& s : kShapes) {
        if (d == DType::f32 && gd != d) continue;
        const int64_t D = s.back();
        const Tensor x = random_tensor(s, d, seed++, -2.f, 3.f), g = random_tensor({D}, d, seed++, 0.5f, 1.5f),
                     b = random_tensor({D}, d, seed++), dy = random_tensor(s, d, seed++);
        const Tensor y = Tensor::empty(s, d), mean = Tensor::empty(rows_of(s), DType::f32),
                     rstd = Tensor::empty(rows_of(s), DType::f32);
        layernorm_forward(x, g, b, kEps, y, mean, rstd);
        const NaiveBackward want = naive_backward(x.to_floats(), g.to_floats(), dy.to_floats(), D, kEps);
        const std::string what = std::string(name_of(d)) + " " + shape_str(s) + " grads " + std::string(name_of(gd));
        const Tensor dx = testing::poisoned(s, d), dgamma = testing::poisoned({D}, gd),
                     dbeta = testing::poisoned({D}, gd);
        layernorm_backward(x, g, mean, rstd, dy, dx, dgamma, dbeta, false);
        expect_close(dx.to_floats(), to_f(want.dx), rtol_of(d), atol_of(d, 0.1 * max_abs(want.dx)), "dx " + what);
        expect_close(dgamma.to_floats(), to_f(want.dgamma), rtol_of(gd), atol_of(gd, 0.1 * max_abs(want.dgamma)),
                     "dgamma " + what);
        expect_close(dbeta.to_floats(), to_f(want.dbeta), rtol_of(gd), atol_of(gd, 0.1 * max_abs(want.dbeta)),
                     "dbeta " + what);
        // accumulate_params: old + new.
        const Tensor g_old = random_tensor({D}, gd, seed++), b_old = random_tensor({D}, gd, seed++);
        const Tensor dgamma2 = g_old.clone(), dbeta2 = b_old.clone();
        layernorm_backward(x, g, mean, rstd, dy, dx, dgamma2, dbeta2, true);
        std::vector<double> wg = want.dgamma, wb = want.dbeta;
        const std::vector<float> og = g_old.to_floats(), ob = b_old.to_floats();
        for (std::size_t i = 0; i < wg.size(); ++i) wg[i] += og[i], wb[i] += ob[i];
        expect_close(dgamma2.to_floats(), to_f(wg), rtol_of(gd), atol_of(gd, 0.1 * max_abs(wg)),
                     "dgamma accumulated " + what);
        expect_close(dbeta2.to_floats(), to_f(wb), rtol_of(gd), atol_of(gd, 0.1 * max_abs(wb)),
                     "dbeta accumulated " + what);
      }
}

TEST(LayerNormCpu, BackwardMatchesFiniteDifferences) {
  // loss = sum(y · r) in double; its gradients are layernorm_backward(dy = r).
  const int64_t N = 3, D = 6;
  const Tensor x = random_tensor({N, D}, DType::f32, 7, -2.f, 2.f), g = random_tensor({D}, DType::f32, 8, 0.5f, 1.5f),
               b = random_tensor({D}, DType::f32, 9), r = random_tensor({N, D}, DType::f32, 10);
  const std::vector<float> rv = r.to_floats();
  auto loss = [&] {
    const NaiveForward f = naive_forward(x.to_floats(), g.to_floats(), b.to_floats(), D, kEps);
    double s = 0;
    for (std::size_t i = 0; i < f.y.size(); ++i) s += f.y[i] * rv[i];
    return s;
  };
  const Tensor y = Tensor::empty({N, D}, DType::f32), mean = Tensor::empty({N}, DType::f32),
               rstd = Tensor::empty({N}, DType::f32);
  layernorm_forward(x, g, b, kEps, y, mean, rstd);
  const Tensor dx = testing::poisoned({N, D}, DType::f32), dg = testing::poisoned({D}, DType::f32),
               db = testing::poisoned({D}, DType::f32);
  layernorm_backward(x, g, mean, rstd, r, dx, dg, db, false);
  expect_close(dx.to_floats(), to_f(testing::numeric_gradient(x, loss)), 2e-3, 2e-3, "dx vs finite differences");
  expect_close(dg.to_floats(), to_f(testing::numeric_gradient(g, loss)), 2e-3, 2e-3, "dgamma vs finite differences");
  expect_close(db.to_floats(), to_f(testing::numeric_gradient(b, loss)), 2e-3, 2e-3, "dbeta vs finite differences");
}

TEST(LayerNormCpu, ParameterGradientsAreOptional) {
  const Tensor x = random_tensor({5, 8}, DType::f32, 1), g = random_tensor({8}, DType::f32, 2),
               b = random_tensor({8}, DType::f32, 3), dy = random_tensor({5, 8}, DType::f32, 4);
  const Tensor y = Tensor::empty({5, 8}, DType::f32), mean = Tensor::empty({5}, DType::f32),
               rstd = Tensor::empty({5}, DType::f32);
  layernorm_forward(x, g, b, kEps, y, mean, rstd);
  const Tensor dx = testing::poisoned({5, 8}, DType::f32);
  layernorm_backward(x, g, mean, rstd, dy, dx, Tensor(), Tensor(), false);
  const NaiveBackward want = naive_backward(x.to_floats(), g.to_floats(), dy.to_floats(), 8, kEps);
  expect_close(dx.to_floats(), to_f(want.dx), 1e-5, 1e-5, "dx without parameter gradients");
}

TEST(LayerNormCpu, EmptyBatch) {
  const Tensor x = Tensor::empty({0, 4}, DType::f32), g = random_tensor({4}, DType::f32, 1),
               b = random_tensor({4}, DType::f32, 2);
  const Tensor y = Tensor::empty({0, 4}, DType::f32), mean = Tensor::empty({0}, DType::f32),
               rstd = Tensor::empty({0}, DType::f32);
  layernorm_forward(x, g, b, kEps, y, mean, rstd);
  const Tensor dg = testing::poisoned({4}, DType::f32), db = testing::poisoned({4}, DType::f32);
  layernorm_backward(x, g, mean, rstd, y, Tensor::empty({0, 4}, DType::f32), dg, db, false);
  expect_close(dg.to_floats(), std::vector<float>(4, 0.0f), 0, 0, "dgamma of an empty batch");
  expect_close(db.to_floats(), std::vector<float>(4, 0.0f), 0, 0, "dbeta of an empty batch");
}

TEST(LayerNormCpu, BadInputsThrowNamingTheOp) {
  using testing::expect_invalid_argument;
  const Tensor x = random_tensor({4, 3}, DType::f32, 1), g = random_tensor({3}, DType::f32, 2),
               b = random_tensor({3}, DType::f32, 3);
  const Tensor y = Tensor::zeros({4, 3}, DType::f32), mean = Tensor::zeros({4}, DType::f32),
               rstd = Tensor::zeros({4}, DType::f32);
  const char* fwd = "layernorm_forward";
  expect_invalid_argument([&] { layernorm_forward(x, random_tensor({4}, DType::f32, 4), b, kEps, y, mean, rstd); },
                          fwd);
  expect_invalid_argument([&] { layernorm_forward(x, g, random_tensor({3}, DType::f16, 4), kEps, y, mean, rstd); },
                          fwd);
  expect_invalid_argument(
      [&] {
        layernorm_forward(x, g, b, kEps, Tensor::zeros({3, 4}, DType::f32), mean, rstd);
      },
      fwd);
  expect_invalid_argument([&] { layernorm_forward(x, g, b, kEps, y, Tensor::zeros({3}, DType::f32), rstd); }, fwd);
  expect_invalid_argument([&] { layernorm_forward(x, g, b, kEps, y, mean, Tensor::zeros({4}, DType::f16)); }, fwd);
  expect_invalid_argument([&] { layernorm_forward(x, g, b, -1.0f, y, mean, rstd); }, fwd);
  expect_invalid_argument([&] { layernorm_forward(x, g, b, kEps, y, mean, Tensor()); }, fwd);
  expect_invalid_argument([&] { layernorm_forward(x, testing::fake_gpu_tensor(g), b, kEps, y, mean, rstd); }, fwd);
  const char* bwd = "layernorm_backward";
  const Tensor dx = Tensor::zeros({4, 3}, DType::f32);
  expect_invalid_argument(
      [&] {
        layernorm_backward(x, g, mean, rstd, Tensor::zeros({4, 4}, DType::f32), dx, Tensor(), Tensor(), false);
      },
      bwd);
  expect_invalid_argument([&] { layernorm_backward(x, g, mean, rstd, y, Tensor(), Tensor(), Tensor(), false); }, bwd);
  expect_invalid_argument(
      [&] { layernorm_backward(x, g, mean, rstd, y, dx, Tensor::zeros({3}, DType::f16), Tensor(), false); }, bwd);
  expect_invalid_argument(
      [&] { layernorm_backward(x, g, mean, rstd, y, dx, Tensor(), Tensor::zeros({4}, DType::f32), false); }, bwd);
  for (float v : y.to_floats()) EXPECT_EQ(v, 0.0f);
  for (float v : dx.to_floats()) EXPECT_EQ(v, 0.0f);
}

// ---- CUDA twin: the GPU result against the CPU one ------------------------------------

Tensor gpu(const Tensor& t) { return t.to(Device::cuda(0)); }
Tensor gpu_poisoned(const Shape& s, DType d) { return testing::poisoned(s, d, Device::cuda(0)); }
std::vector<double> to_d(const std::vector<float>& v) { return {v.begin(), v.end()}; }

const Shape kGpuShapes[] = {{1, 1},     {7, 33},     {33, 129},  {129, 7},  {4, 1024},
                            {2, 3, 17}, {2048, 768}, {64, 4097}, {1, 12288}};

TEST(LayerNormCuda, ForwardAndBackwardMatchCpu) {
  TUTTI_REQUIRE_GPU();
  std::uint32_t seed = 1000;
  for (DType d : kFloatDtypes)
    for (const Shape& s : kGpuShapes) {
      const int64_t D = s.back();
      const Tensor x = random_tensor(s, d, seed++, -2.f, 3.f), g = random_tensor({D}, d, seed++, 0.5f, 1.5f),
                   b = random_tensor({D}, d, seed++), dy = random_tensor(s, d, seed++);
      const std::string what = std::string(name_of(d)) + " " + shape_str(s);
      const Tensor y_c = testing::poisoned(s, d), m_c = testing::poisoned(rows_of(s), DType::f32),
                   r_c = testing::poisoned(rows_of(s), DType::f32);
      layernorm_forward(x, g, b, kEps, y_c, m_c, r_c);
      const Stream st = Stream::create(Device::cuda(0));
      const Tensor y_g = gpu_poisoned(s, d), m_g = gpu_poisoned(rows_of(s), DType::f32),
                   r_g = gpu_poisoned(rows_of(s), DType::f32);
      layernorm_forward(gpu(x), gpu(g), gpu(b), kEps, y_g, m_g, r_g, st);
      st.synchronize();
      expect_close(y_g.to_floats(), y_c.to_floats(), rtol_of(d), rtol_of(d) * 0.1, "cuda y " + what);
      expect_close(m_g.to_floats(), m_c.to_floats(), 1e-5, 1e-6, "cuda mean " + what);
      expect_close(r_g.to_floats(), r_c.to_floats(), 1e-5, 1e-6, "cuda rstd " + what);
      for (DType gd : {d, DType::f32})
        for (bool accumulate : {false, true}) {
          if (d == DType::f32 && gd != d) continue;
          const Tensor g_old = random_tensor({D}, gd, seed++), b_old = random_tensor({D}, gd, seed++);
          const Tensor dx_c = testing::poisoned(s, d), dg_c = accumulate ? g_old.clone() : testing::poisoned({D}, gd),
                       db_c = accumulate ? b_old.clone() : testing::poisoned({D}, gd);
          layernorm_backward(x, g, m_c, r_c, dy, dx_c, dg_c, db_c, accumulate);
          const Tensor dx_g = gpu_poisoned(s, d), dg_g = accumulate ? gpu(g_old) : gpu_poisoned({D}, gd),
                       db_g = accumulate ? gpu(b_old) : gpu_poisoned({D}, gd);
          layernorm_backward(gpu(x), gpu(g), gpu(m_c), gpu(r_c), gpu(dy), dx_g, dg_g, db_g, accumulate,
                             Stream::default_for(Device::cuda(0)));
          const std::string w2 = what + " grads " + std::string(name_of(gd)) + (accumulate ? " accumulate" : "");
          const std::vector<float> dxc = dx_c.to_floats(), dgc = dg_c.to_floats(), dbc = db_c.to_floats();
          // Column sums over many rows in another order: scale the floor with sqrt(rows).
          const double rows_scale = std::sqrt(double(x.numel() / D));
          expect_close(dx_g.to_floats(), dxc, rtol_of(d), atol_of(d, 0.1 * max_abs(to_d(dxc))), "cuda dx " + w2);
          expect_close(dg_g.to_floats(), dgc, rtol_of(gd) * rows_scale, atol_of(gd, 0.1 * max_abs(to_d(dgc))),
                       "cuda dgamma " + w2);
          expect_close(db_g.to_floats(), dbc, rtol_of(gd) * rows_scale, atol_of(gd, 0.1 * max_abs(to_d(dbc))),
                       "cuda dbeta " + w2);
        }
    }
}

}  // namespace
}  // namespace tutti::kernels
