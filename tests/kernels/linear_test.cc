// Linear family: CPU against a naive double-precision GEMM and central finite differences;
// the CUDA twin against the CPU (skipped where no GPU is visible).
#include "tutti/kernels/linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/kernel_test_util.h"

namespace tutti::kernels {
namespace {

using std::int64_t;
using testing::default_rtol;
using testing::expect_close;
using testing::kFloatDtypes;
using testing::random_tensor;

// Row-major C[M, N] = op(A) · op(B) in double; A is [M, K] or (transposed) [K, M].
std::vector<double> naive_matmul(const std::vector<float>& A, bool ta, const std::vector<float>& B, bool tb, int64_t M,
                                 int64_t N, int64_t K) {
  std::vector<double> C(static_cast<std::size_t>(M * N), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = A[static_cast<std::size_t>(ta ? k * M + m : m * K + k)];
        const double b = B[static_cast<std::size_t>(tb ? n * K + k : k * N + n)];
        acc += a * b;
      }
      C[static_cast<std::size_t>(m * N + n)] = acc;
    }
  return C;
}

std::vector<float> to_f(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// Tolerances for a GEMM with K-term sums: the dtype's rounding, plus an absolute floor that
// grows with the length of the sums (values are O(1)).
double gemm_rtol(DType d) { return d == DType::f32 ? 1e-5 : default_rtol(d); }
double gemm_atol(DType d, int64_t K) {
  return (d == DType::f32 ? 1e-5 : default_rtol(d) * 0.1) * std::sqrt(double(K + 1));
}

std::string label(DType d, int64_t N, int64_t I, int64_t O) {
  return std::string(name_of(d)) + " N=" + std::to_string(N) + " I=" + std::to_string(I) + " O=" + std::to_string(O);
}

// y = x w^T + b in double, from the stored (rounded) values.
std::vector<double> naive_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t O = w.dim(0), I = w.dim(1), N = x.numel() / I;
  std::vector<double> y = naive_matmul(x.to_floats(), false, w.to_floats(), true, N, O, I);
  if (b.defined()) {
    const std::vector<float> bv = b.to_floats();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o) y[static_cast<std::size_t>(n * O + o)] += bv[static_cast<std::size_t>(o)];
  }
  return y;
}

const std::tuple<int64_t, int64_t, int64_t> kShapes[] = {
    {1, 1, 1}, {7, 33, 5}, {33, 7, 129}, {129, 17, 3}, {4, 64, 32}};

TEST(LinearCpu, ForwardMatchesNaive) {
  std::uint32_t seed = 1;
  for (DType d : kFloatDtypes)
    for (auto [N, I, O] : kShapes)
      for (bool with_bias : {false, true}) {
        const Tensor x = random_tensor({N, I}, d, seed++), w = random_tensor({O, I}, d, seed++);
        const Tensor b = with_bias ? random_tensor({O}, d, seed++) : Tensor();
        const Tensor y = testing::poisoned({N, O}, d);
        linear_forward(x, w, b, y);
        expect_close(y.to_floats(), to_f(naive_linear(x, w, b)), gemm_rtol(d), gemm_atol(d, I),
                     "linear_forward " + label(d, N, I, O) + (with_bias ? " bias" : ""));
      }
}

TEST(LinearCpu, ForwardFlattensLeadingDimensions) {
  const Tensor x = random_tensor({2, 3, 5}, DType::f32, 7), w = random_tensor({4, 5}, DType::f32, 8);
  const Tensor b = random_tensor({4}, DType::f32, 9);
  const Tensor y = testing::poisoned({2, 3, 4}, DType::f32);
  linear_forward(x, w, b, y);
  expect_close(y.to_floats(), to_f(naive_linear(x, w, b)), 1e-5, 1e-5, "linear_forward [2, 3, 5]");
}

// Naive gradients of linear: dx = dy w, dw = dy^T x, db = column sums of dy.
struct NaiveGrads {
  std::vector<double> dx, dw, db;
};
NaiveGrads naive_linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy) {
  const int64_t O = w.dim(0), I = w.dim(1), N = x.numel() / I;
  const std::vector<float> dyv = dy.to_floats();
  NaiveGrads g;
  g.dx = naive_matmul(dyv, false, w.to_floats(), false, N, I, O);
  g.dw = naive_matmul(dyv, true, x.to_floats(), false, O, I, N);
  g.db.assign(static_cast<std::size_t>(O), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) g.db[static_cast<std::size_t>(o)] += dyv[static_cast<std::size_t>(n * O + o)];
  return g;
}

TEST(LinearCpu, BackwardMatchesNaive) {
  std::uint32_t seed = 100;
  for (DType d : kFloatDtypes)
    for (DType gd : {d, DType::f32}) {
      if (d == DType::f32 && gd != d) continue;
      for (auto [N, I, O] : kShapes) {
        const Tensor x = random_tensor({N, I}, d, seed++), w = random_tensor({O, I}, d, seed++);
        const Tensor dy = random_tensor({N, O}, d, seed++);
        const Tensor dx = testing::poisoned({N, I}, d), dw = testing::poisoned({O, I}, gd),
                     db = testing::poisoned({O}, gd);
        linear_backward(x, w, dy, dx, dw, db, /*accumulate_params=*/false);
        const NaiveGrads g = naive_linear_backward(x, w, dy);
        const std::string what = label(d, N, I, O) + " grads " + std::string(name_of(gd));
        expect_close(dx.to_floats(), to_f(g.dx), gemm_rtol(d), gemm_atol(d, O), "dx " + what);
        expect_close(dw.to_floats(), to_f(g.dw), gemm_rtol(gd), gemm_atol(gd, N), "dw " + what);
        expect_close(db.to_floats(), to_f(g.db), gemm_rtol(gd), gemm_atol(gd, N), "db " + what);
      }
    }
}

TEST(LinearCpu, BackwardOptionalOutputsAreSkipped) {
  const Tensor x = random_tensor({5, 3}, DType::f32, 1), w = random_tensor({2, 3}, DType::f32, 2);
  const Tensor dy = random_tensor({5, 2}, DType::f32, 3), dw = testing::poisoned({2, 3}, DType::f32);
  linear_backward(x, w, dy, Tensor(), dw, Tensor(), false);
  expect_close(dw.to_floats(), to_f(naive_linear_backward(x, w, dy).dw), 1e-5, 1e-5, "dw alone");
}

TEST(LinearCpu, AccumulateParamsAddsToOldGradients) {
  std::uint32_t seed = 200;
  for (DType d : kFloatDtypes)
    for (DType gd : {d, DType::f32}) {
      const int64_t N = 9, I = 6, O = 5;
      const Tensor x = random_tensor({N, I}, d, seed++), w = random_tensor({O, I}, d, seed++);
      const Tensor dy = random_tensor({N, O}, d, seed++);
      const Tensor dw_old = random_tensor({O, I}, gd, seed++), db_old = random_tensor({O}, gd, seed++);
      const Tensor dw = dw_old.clone(), db = db_old.clone();
      linear_backward(x, w, dy, Tensor(), dw, db, /*accumulate_params=*/true);
      const NaiveGrads g = naive_linear_backward(x, w, dy);
      std::vector<double> want_dw = g.dw, want_db = g.db;
      const std::vector<float> ow = dw_old.to_floats(), ob = db_old.to_floats();
      for (std::size_t i = 0; i < want_dw.size(); ++i) want_dw[i] += ow[i];
      for (std::size_t i = 0; i < want_db.size(); ++i) want_db[i] += ob[i];
      const std::string what = std::string(name_of(d)) + " grads " + std::string(name_of(gd));
      expect_close(dw.to_floats(), to_f(want_dw), gemm_rtol(gd), gemm_atol(gd, N), "accumulated dw " + what);
      expect_close(db.to_floats(), to_f(want_db), gemm_rtol(gd), gemm_atol(gd, N), "accumulated db " + what);
    }
}

// loss = sum(y · r) with y = x w^T + b, in double; its gradients are linear_backward(dy = r).
TEST(LinearCpu, BackwardMatchesFiniteDifferences) {
  const int64_t N = 3, I = 4, O = 5;
  const Tensor x = random_tensor({N, I}, DType::f32, 11), w = random_tensor({O, I}, DType::f32, 12);
  const Tensor b = random_tensor({O}, DType::f32, 13), r = random_tensor({N, O}, DType::f32, 14);
  const std::vector<float> rv = r.to_floats();
  auto loss = [&] {
    const std::vector<double> y = naive_linear(x, w, b);
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += y[i] * rv[i];
    return s;
  };
  const Tensor dx = testing::poisoned({N, I}, DType::f32), dw = testing::poisoned({O, I}, DType::f32),
               db = testing::poisoned({O}, DType::f32);
  linear_backward(x, w, r, dx, dw, db, false);
  auto as_f = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  expect_close(dx.to_floats(), as_f(testing::numeric_gradient(x, loss)), 1e-3, 1e-3, "dx vs finite differences");
  expect_close(dw.to_floats(), as_f(testing::numeric_gradient(w, loss)), 1e-3, 1e-3, "dw vs finite differences");
  expect_close(db.to_floats(), as_f(testing::numeric_gradient(b, loss)), 1e-3, 1e-3, "db vs finite differences");
}

TEST(LinearCpu, EmptyBatch) {
  // No rows: y is empty, and the parameter gradients of an empty batch are 0.
  const Tensor x = Tensor::empty({0, 3}, DType::f32), w = random_tensor({2, 3}, DType::f32, 1);
  const Tensor y = Tensor::empty({0, 2}, DType::f32), dy = Tensor::empty({0, 2}, DType::f32);
  linear_forward(x, w, random_tensor({2}, DType::f32, 2), y);
  const Tensor dw = testing::poisoned({2, 3}, DType::f32), db = testing::poisoned({2}, DType::f32);
  linear_backward(x, w, dy, Tensor::empty({0, 3}, DType::f32), dw, db, false);
  expect_close(dw.to_floats(), std::vector<float>(6, 0.0f), 0, 0, "dw of an empty batch");
  expect_close(db.to_floats(), std::vector<float>(2, 0.0f), 0, 0, "db of an empty batch");
}

TEST(MatmulCpu, AllTransposesAlphaBeta) {
  std::uint32_t seed = 300;
  const std::tuple<int64_t, int64_t, int64_t> shapes[] = {{1, 1, 1}, {7, 5, 33}, {33, 129, 7}, {16, 8, 1}};
  for (DType d : kFloatDtypes)
    for (DType cd : {d, DType::f32})
      for (auto [M, N, K] : shapes)
        for (int t = 0; t < 4; ++t) {
          const bool ta = t & 1, tb = t & 2;
          const Tensor a = ta ? random_tensor({K, M}, d, seed++) : random_tensor({M, K}, d, seed++);
          const Tensor b = tb ? random_tensor({N, K}, d, seed++) : random_tensor({K, N}, d, seed++);
          const std::vector<double> ab = naive_matmul(a.to_floats(), ta, b.to_floats(), tb, M, N, K);
          const std::string what = std::string(name_of(d)) + "->" + std::string(name_of(cd)) +
                                   " M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                                   " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb);
          // beta = 0 must ignore what c held (nan here).
          const Tensor c0 = testing::poisoned({M, N}, cd);
          matmul(a, ta, b, tb, c0, 0.5f, 0.0f);
          std::vector<double> want(ab.size());
          for (std::size_t i = 0; i < ab.size(); ++i) want[i] = 0.5 * ab[i];
          expect_close(c0.to_floats(), to_f(want), gemm_rtol(cd), gemm_atol(cd, K), "beta=0 " + what);
          // beta != 0 reads c.
          const Tensor c_old = random_tensor({M, N}, cd, seed++);
          const Tensor c1 = c_old.clone();
          matmul(a, ta, b, tb, c1, -1.25f, 0.75f);
          const std::vector<float> ov = c_old.to_floats();
          for (std::size_t i = 0; i < ab.size(); ++i) want[i] = -1.25 * ab[i] + 0.75 * ov[i];
          expect_close(c1.to_floats(), to_f(want), gemm_rtol(cd), gemm_atol(cd, K), "beta=0.75 " + what);
        }
}

TEST(LinearCpu, BadInputsThrowNamingTheOp) {
  const Tensor x = random_tensor({4, 3}, DType::f32, 1), w = random_tensor({2, 3}, DType::f32, 2);
  const Tensor y = Tensor::zeros({4, 2}, DType::f32), dy = random_tensor({4, 2}, DType::f32, 3);
  const Tensor dw = Tensor::zeros({2, 3}, DType::f32);
  using testing::expect_invalid_argument;
  // Wrong inner dimension, wrong output shape, wrong bias shape, mixed dtypes.
  expect_invalid_argument(
      [&] {
        linear_forward(x, random_tensor({2, 4}, DType::f32, 4), Tensor(), y);
      },
      "linear_forward");
  expect_invalid_argument([&] { linear_forward(x, w, Tensor(), Tensor::zeros({4, 3}, DType::f32)); }, "linear_forward");
  expect_invalid_argument([&] { linear_forward(x, w, Tensor::zeros({3}, DType::f32), y); }, "linear_forward");
  expect_invalid_argument(
      [&] {
        linear_forward(x, random_tensor({2, 3}, DType::f16, 5), Tensor(), y);
      },
      "linear_forward");
  expect_invalid_argument([&] { linear_forward(Tensor(), w, Tensor(), y); }, "linear_forward");
  // A 1-D x has no rows; integer values are not accepted.
  expect_invalid_argument([&] { linear_forward(random_tensor({3}, DType::f32, 6), w, Tensor(), y); }, "linear_forward");
  expect_invalid_argument(
      [&] {
        linear_forward(Tensor::zeros({4, 3}, DType::i32), Tensor::zeros({2, 3}, DType::i32), Tensor(),
                       Tensor::zeros({4, 2}, DType::i32));
      },
      "linear_forward");
  // Backward: dw is required; dw of the wrong shape; half gradient for f32 values.
  expect_invalid_argument([&] { linear_backward(x, w, dy, Tensor(), Tensor(), Tensor(), false); }, "linear_backward");
  expect_invalid_argument(
      [&] {
        linear_backward(x, w, dy, Tensor(), Tensor::zeros({3, 2}, DType::f32), Tensor(), false);
      },
      "linear_backward");
  expect_invalid_argument(
      [&] {
        linear_backward(x, w, dy, Tensor(), Tensor::zeros({2, 3}, DType::f16), Tensor(), false);
      },
      "linear_backward");
  expect_invalid_argument(
      [&] {
        linear_backward(x, w, random_tensor({4, 3}, DType::f32, 7), Tensor(), dw, Tensor(), false);
      },
      "linear_backward");
  // Matmul: inner dimensions, c's shape.
  expect_invalid_argument([&] { matmul(x, false, w, false, Tensor::zeros({4, 3}, DType::f32)); }, "matmul");
  expect_invalid_argument([&] { matmul(x, false, w, true, Tensor::zeros({4, 3}, DType::f32)); }, "matmul");
  // Devices: a (fake) GPU weight with CPU activations.
  const Tensor w_gpu = testing::fake_gpu_tensor(w);
  expect_invalid_argument([&] { linear_forward(x, w_gpu, Tensor(), y); }, "linear_forward");
  expect_invalid_argument([&] { linear_backward(x, w, dy, Tensor(), testing::fake_gpu_tensor(dw), Tensor(), false); },
                          "linear_backward");
  // Nothing was written by the refused calls.
  for (float v : y.to_floats()) EXPECT_EQ(v, 0.0f);
  for (float v : dw.to_floats()) EXPECT_EQ(v, 0.0f);
}

// ---- CUDA twin: the GPU result against the CPU one ------------------------------------

Tensor gpu(const Tensor& t) { return t.defined() ? t.to(Device::cuda(0)) : Tensor(); }
Tensor gpu_poisoned(const Shape& s, DType d) { return testing::poisoned(s, d, Device::cuda(0)); }

TEST(LinearCuda, ForwardMatchesCpu) {
  TUTTI_REQUIRE_GPU();
  std::uint32_t seed = 500;
  for (DType d : kFloatDtypes)
    for (auto [N, I, O] : kShapes)
      for (bool with_bias : {false, true}) {
        const Tensor x = random_tensor({N, I}, d, seed++), w = random_tensor({O, I}, d, seed++);
        const Tensor b = with_bias ? random_tensor({O}, d, seed++) : Tensor();
        const Tensor y_cpu = testing::poisoned({N, O}, d), y_gpu = gpu_poisoned({N, O}, d);
        linear_forward(x, w, b, y_cpu);
        const Stream s = Stream::create(Device::cuda(0));
        linear_forward(gpu(x), gpu(w), gpu(b), y_gpu, s);
        s.synchronize();
        expect_close(y_gpu.to_floats(), y_cpu.to_floats(), gemm_rtol(d), gemm_atol(d, I),
                     "cuda linear_forward " + label(d, N, I, O) + (with_bias ? " bias" : ""));
        if (!with_bias) continue;
        // A bias view that is not 16-byte aligned takes the path without cuBLASLt's epilogue.
        const Tensor big = gpu_poisoned({O + 1}, d);
        Tensor b_view = big.view(1, {O});
        b_view.copy_from(b);
        const Tensor y_gpu2 = gpu_poisoned({N, O}, d);
        linear_forward(gpu(x), gpu(w), b_view, y_gpu2, s);
        s.synchronize();
        expect_close(y_gpu2.to_floats(), y_cpu.to_floats(), gemm_rtol(d), gemm_atol(d, I),
                     "cuda linear_forward misaligned bias " + label(d, N, I, O));
      }
}

TEST(LinearCuda, BackwardMatchesCpu) {
  TUTTI_REQUIRE_GPU();
  std::uint32_t seed = 600;
  for (DType d : kFloatDtypes)
    for (DType gd : {d, DType::f32})
      for (bool accumulate : {false, true}) {
        if (d == DType::f32 && gd != d) continue;
        for (auto [N, I, O] : kShapes) {
          const Tensor x = random_tensor({N, I}, d, seed++), w = random_tensor({O, I}, d, seed++);
          const Tensor dy = random_tensor({N, O}, d, seed++);
          const Tensor dw_old = random_tensor({O, I}, gd, seed++), db_old = random_tensor({O}, gd, seed++);
          const Tensor dx_c = testing::poisoned({N, I}, d),
                       dw_c = accumulate ? dw_old.clone() : testing::poisoned({O, I}, gd),
                       db_c = accumulate ? db_old.clone() : testing::poisoned({O}, gd);
          const Tensor dx_g = gpu_poisoned({N, I}, d), dw_g = accumulate ? gpu(dw_old) : gpu_poisoned({O, I}, gd),
                       db_g = accumulate ? gpu(db_old) : gpu_poisoned({O}, gd);
          linear_backward(x, w, dy, dx_c, dw_c, db_c, accumulate);
          linear_backward(gpu(x), gpu(w), gpu(dy), dx_g, dw_g, db_g, accumulate, Stream::default_for(Device::cuda(0)));
          const std::string what =
              "cuda " + label(d, N, I, O) + " grads " + std::string(name_of(gd)) + (accumulate ? " accumulate" : "");
          expect_close(dx_g.to_floats(), dx_c.to_floats(), gemm_rtol(d), gemm_atol(d, O), "dx " + what);
          expect_close(dw_g.to_floats(), dw_c.to_floats(), gemm_rtol(gd), gemm_atol(gd, N), "dw " + what);
          expect_close(db_g.to_floats(), db_c.to_floats(), gemm_rtol(gd), gemm_atol(gd, N), "db " + what);
        }
      }
}

TEST(MatmulCuda, AllTransposesMatchCpu) {
  TUTTI_REQUIRE_GPU();
  std::uint32_t seed = 700;
  const std::tuple<int64_t, int64_t, int64_t> shapes[] = {{1, 1, 1}, {7, 5, 33}, {33, 129, 7}, {256, 128, 64}};
  for (DType d : kFloatDtypes)
    for (DType cd : {d, DType::f32})
      for (auto [M, N, K] : shapes)
        for (int t = 0; t < 4; ++t) {
          const bool ta = t & 1, tb = t & 2;
          const Tensor a = ta ? random_tensor({K, M}, d, seed++) : random_tensor({M, K}, d, seed++);
          const Tensor b = tb ? random_tensor({N, K}, d, seed++) : random_tensor({K, N}, d, seed++);
          const Tensor c_old = random_tensor({M, N}, cd, seed++);
          const std::string what = std::string(name_of(d)) + "->" + std::string(name_of(cd)) +
                                   " M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                                   " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb);
          for (float beta : {0.0f, 0.5f}) {
            const Tensor c_cpu = beta == 0.0f ? testing::poisoned({M, N}, cd) : c_old.clone();
            const Tensor c_gpu = beta == 0.0f ? gpu_poisoned({M, N}, cd) : gpu(c_old);
            matmul(a, ta, b, tb, c_cpu, 1.5f, beta);
            matmul(gpu(a), ta, gpu(b), tb, c_gpu, 1.5f, beta, Stream::default_for(Device::cuda(0)));
            expect_close(c_gpu.to_floats(), c_cpu.to_floats(), gemm_rtol(cd), gemm_atol(cd, K),
                         "cuda matmul beta=" + std::to_string(beta) + " " + what);
          }
        }
}

}  // namespace
}  // namespace tutti::kernels
