// Attention family: CPU against a naive double-precision causal attention and finite
// differences; the CUDA twin against the CPU (on a GPU, and on the emulated device in
// kernels_attention_test_emu).
#include "tutti/kernels/attention.h"

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

struct Case {
  int64_t B, T, C, heads;
};
const Case kCases[] = {{1, 1, 4, 1}, {2, 5, 8, 2}, {3, 17, 12, 3}, {2, 40, 32, 4}};

std::string name_of(const Case& c, DType d) {
  return std::string(tutti::name_of(d)) + " B" + std::to_string(c.B) + " T" + std::to_string(c.T) + " C" +
         std::to_string(c.C) + " heads " + std::to_string(c.heads);
}

// The naive forward in double: out [B, T, C] and probs [B, heads, T, T].
struct Naive {
  std::vector<double> out, probs;
};
Naive naive_forward(const std::vector<float>& qkv, const Case& c) {
  const int64_t hs = c.C / c.heads, C3 = 3 * c.C;
  Naive n;
  n.out.assign(static_cast<std::size_t>(c.B * c.T * c.C), 0.0);
  n.probs.assign(static_cast<std::size_t>(c.B * c.heads * c.T * c.T), 0.0);
  auto at = [&](int64_t b, int64_t t, int64_t col) {
    return double(qkv[static_cast<std::size_t>((b * c.T + t) * C3 + col)]);
  };
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t t = 0; t < c.T; ++t) {
        std::vector<double> s(static_cast<std::size_t>(t + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < hs; ++i) dot += at(b, t, h * hs + i) * at(b, j, c.C + h * hs + i);
          s[static_cast<std::size_t>(j)] = dot / std::sqrt(double(hs));
          mx = std::max(mx, s[static_cast<std::size_t>(j)]);
        }
        double sum = 0;
        for (double& v : s) sum += (v = std::exp(v - mx));
        for (int64_t j = 0; j <= t; ++j) {
          const double p = s[static_cast<std::size_t>(j)] / sum;
          n.probs[static_cast<std::size_t>(((b * c.heads + h) * c.T + t) * c.T + j)] = p;
          for (int64_t i = 0; i < hs; ++i)
            n.out[static_cast<std::size_t>((b * c.T + t) * c.C + h * hs + i)] += p * at(b, j, 2 * c.C + h * hs + i);
        }
      }
  return n;
}

// The naive backward in double (from the naive probabilities): dqkv [B, T, 3C].
std::vector<double> naive_backward(const std::vector<float>& qkv, const std::vector<float>& dout, const Case& c) {
  const Naive f = naive_forward(qkv, c);
  const int64_t hs = c.C / c.heads, C3 = 3 * c.C;
  const double scale = 1.0 / std::sqrt(double(hs));
  std::vector<double> g(qkv.size(), 0.0);
  auto at = [&](int64_t b, int64_t t, int64_t col) {
    return double(qkv[static_cast<std::size_t>((b * c.T + t) * C3 + col)]);
  };
  auto dy = [&](int64_t b, int64_t t, int64_t col) {
    return double(dout[static_cast<std::size_t>((b * c.T + t) * c.C + col)]);
  };
  auto grad = [&](int64_t b, int64_t t, int64_t col) -> double& {
    return g[static_cast<std::size_t>((b * c.T + t) * C3 + col)];
  };
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t t = 0; t < c.T; ++t) {
        const double* p = &f.probs[static_cast<std::size_t>(((b * c.heads + h) * c.T + t) * c.T)];
        std::vector<double> dp(static_cast<std::size_t>(t + 1));
        double dot = 0;
        for (int64_t j = 0; j <= t; ++j) {
          double v = 0;
          for (int64_t i = 0; i < hs; ++i) {
            v += dy(b, t, h * hs + i) * at(b, j, 2 * c.C + h * hs + i);
            grad(b, j, 2 * c.C + h * hs + i) += p[j] * dy(b, t, h * hs + i);  // dv
          }
          dp[static_cast<std::size_t>(j)] = v;
          dot += p[j] * v;
        }
        for (int64_t j = 0; j <= t; ++j) {
          const double ds = p[j] * (dp[static_cast<std::size_t>(j)] - dot) * scale;
          for (int64_t i = 0; i < hs; ++i) {
            grad(b, t, h * hs + i) += ds * at(b, j, c.C + h * hs + i);  // dq
            grad(b, j, c.C + h * hs + i) += ds * at(b, t, h * hs + i);  // dk
          }
        }
      }
  return g;
}

std::vector<float> to_f(const std::vector<double>& v) { return {v.begin(), v.end()}; }
double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}
double rtol_of(DType d) { return d == DType::f32 ? 1e-4 : 4 * default_rtol(d); }

TEST(AttentionCpu, ForwardMatchesNaive) {
  std::uint32_t seed = 1;
  for (DType d : kFloatDtypes)
    for (const Case& c : kCases) {
      const Tensor qkv = random_tensor({c.B, c.T, 3 * c.C}, d, seed++, -2.f, 2.f);
      const Tensor out = testing::poisoned({c.B, c.T, c.C}, d), probs = testing::poisoned({c.B, c.heads, c.T, c.T}, d);
      attention_forward(qkv, c.heads, out, probs);
      const Naive want = naive_forward(qkv.to_floats(), c);
      expect_close(out.to_floats(), to_f(want.out), rtol_of(d), rtol_of(d), "out " + name_of(c, d));
      // The masked upper triangle is exactly 0.
      expect_close(probs.to_floats(), to_f(want.probs), rtol_of(d), rtol_of(d) * 0.1, "probs " + name_of(c, d));
    }
}

TEST(AttentionCpu, BackwardMatchesNaive) {
  std::uint32_t seed = 100;
  for (DType d : kFloatDtypes)
    for (const Case& c : kCases) {
      const Tensor qkv = random_tensor({c.B, c.T, 3 * c.C}, d, seed++, -2.f, 2.f);
      const Tensor dout = random_tensor({c.B, c.T, c.C}, d, seed++);
      const Tensor out = Tensor::empty({c.B, c.T, c.C}, d), probs = Tensor::empty({c.B, c.heads, c.T, c.T}, d);
      attention_forward(qkv, c.heads, out, probs);
      const Tensor dqkv = testing::poisoned(qkv.shape(), d);
      attention_backward(qkv, probs, dout, c.heads, dqkv);
      const std::vector<float> want = to_f(naive_backward(qkv.to_floats(), dout.to_floats(), c));
      expect_close(dqkv.to_floats(), want, rtol_of(d), rtol_of(d) * std::max(1.0, max_abs(want)),
                   "dqkv " + name_of(c, d));
    }
}

TEST(AttentionCpu, BackwardMatchesFiniteDifferences) {
  // loss = sum(out · r) in double; its gradient is attention_backward(dout = r).
  const Case c{2, 4, 6, 2};
  const Tensor qkv = random_tensor({c.B, c.T, 3 * c.C}, DType::f32, 7, -1.5f, 1.5f);
  const Tensor r = random_tensor({c.B, c.T, c.C}, DType::f32, 8);
  const std::vector<float> rv = r.to_floats();
  auto loss = [&] {
    const Naive f = naive_forward(qkv.to_floats(), c);
    double s = 0;
    for (std::size_t i = 0; i < f.out.size(); ++i) s += f.out[i] * rv[i];
    return s;
  };
  const Tensor out = Tensor::empty({c.B, c.T, c.C}, DType::f32),
               probs = Tensor::empty({c.B, c.heads, c.T, c.T}, DType::f32);
  attention_forward(qkv, c.heads, out, probs);
  const Tensor dqkv = testing::poisoned(qkv.shape(), DType::f32);
  attention_backward(qkv, probs, r, c.heads, dqkv);
  expect_close(dqkv.to_floats(), to_f(testing::numeric_gradient(qkv, loss)), 2e-3, 2e-3, "dqkv vs finite differences");
}

TEST(AttentionCpu, EachQueryIgnoresLaterPositions) {
  // Changing the last position's q, k, v changes no output before it (the causal mask).
  const Case c{1, 6, 8, 2};
  const Tensor qkv = random_tensor({c.B, c.T, 3 * c.C}, DType::f32, 11);
  const Tensor out1 = Tensor::empty({1, c.T, c.C}, DType::f32), out2 = Tensor::empty({1, c.T, c.C}, DType::f32);
  const Tensor probs = Tensor::empty({1, c.heads, c.T, c.T}, DType::f32);
  attention_forward(qkv, c.heads, out1, probs);
  float* x = qkv.data_as<float>();
  for (int64_t i = 0; i < 3 * c.C; ++i) x[(c.T - 1) * 3 * c.C + i] += 5.0f;
  attention_forward(qkv, c.heads, out2, probs);
  const std::vector<float> a = out1.to_floats(), b = out2.to_floats();
  for (int64_t i = 0; i < (c.T - 1) * c.C; ++i)
    EXPECT_EQ(a[static_cast<std::size_t>(i)], b[static_cast<std::size_t>(i)]) << i;
  bool last_changed = false;
  for (int64_t i = (c.T - 1) * c.C; i < c.T * c.C; ++i)
    last_changed |= a[static_cast<std::size_t>(i)] != b[static_cast<std::size_t>(i)];
  EXPECT_TRUE(last_changed);
}

TEST(AttentionCpu, BadInputsThrowNamingTheOp) {
  using testing::expect_invalid_argument;
  const Tensor qkv = random_tensor({2, 3, 12}, DType::f32, 1);
  const Tensor out = Tensor::zeros({2, 3, 4}, DType::f32), probs = Tensor::zeros({2, 2, 3, 3}, DType::f32);
  const char* fwd = "attention_forward";
  expect_invalid_argument([&] { attention_forward(random_tensor({2, 3, 13}, DType::f32, 2), 2, out, probs); }, fwd);
  expect_invalid_argument([&] { attention_forward(qkv, 3, out, probs); }, fwd);  // 3 heads do not divide 4
  expect_invalid_argument([&] { attention_forward(qkv, 2, Tensor::zeros({2, 3, 5}, DType::f32), probs); }, fwd);
  expect_invalid_argument([&] { attention_forward(qkv, 2, out, Tensor::zeros({2, 1, 3, 3}, DType::f32)); }, fwd);
  expect_invalid_argument([&] { attention_forward(qkv, 2, out, Tensor::zeros({2, 2, 3, 3}, DType::bf16)); }, fwd);
  expect_invalid_argument([&] { attention_forward(qkv, 2, testing::fake_gpu_tensor(out), probs); }, fwd);
  const char* bwd = "attention_backward";
  const Tensor dqkv = Tensor::zeros({2, 3, 12}, DType::f32);
  expect_invalid_argument([&] { attention_backward(qkv, probs, Tensor::zeros({2, 3, 12}, DType::f32), 2, dqkv); }, bwd);
  expect_invalid_argument([&] { attention_backward(qkv, probs, out, 2, Tensor::zeros({2, 3, 4}, DType::f32)); }, bwd);
  expect_invalid_argument([&] { attention_backward(qkv, probs, out, 2, Tensor()); }, bwd);
  for (float v : out.to_floats()) EXPECT_EQ(v, 0.0f);
  for (float v : dqkv.to_floats()) EXPECT_EQ(v, 0.0f);
}

// ---- CUDA twin: the GPU result against the CPU one ------------------------------------

Tensor gpu(const Tensor& t) { return t.to(Device::cuda(0)); }

const Case kGpuCases[] = {{1, 1, 4, 1}, {2, 5, 8, 2}, {2, 33, 16, 2}, {1, 70, 64, 4}};

TEST(AttentionCuda, ForwardAndBackwardMatchCpu) {
  TUTTI_REQUIRE_GPU();
  std::uint32_t seed = 1000;
  for (DType d : kFloatDtypes)
    for (const Case& c : kGpuCases) {
      const Tensor qkv = random_tensor({c.B, c.T, 3 * c.C}, d, seed++, -2.f, 2.f);
      const Tensor dout = random_tensor({c.B, c.T, c.C}, d, seed++);
      const Tensor out_c = Tensor::empty({c.B, c.T, c.C}, d), probs_c = Tensor::empty({c.B, c.heads, c.T, c.T}, d);
      attention_forward(qkv, c.heads, out_c, probs_c);
      const Tensor dqkv_c = Tensor::empty(qkv.shape(), d);
      attention_backward(qkv, probs_c, dout, c.heads, dqkv_c);

      const Stream st = Stream::create(Device::cuda(0));
      const Tensor out_g = testing::poisoned({c.B, c.T, c.C}, d, Device::cuda(0));
      const Tensor probs_g = testing::poisoned({c.B, c.heads, c.T, c.T}, d, Device::cuda(0));
      attention_forward(gpu(qkv), c.heads, out_g, probs_g, st);
      const Tensor dqkv_g = testing::poisoned(qkv.shape(), d, Device::cuda(0));
      attention_backward(gpu(qkv), probs_g, gpu(dout), c.heads, dqkv_g, st);
      st.synchronize();
      // Half dtypes: the GPU rounds the scores to the dtype before the softmax (and dP before
      // the softmax backward), the CPU computes them in fp32: a few roundings apart.
      const double tol = d == DType::f32 ? 1e-4 : 4 * default_rtol(d);
      const std::vector<float> dq = dqkv_c.to_floats();
      expect_close(out_g.to_floats(), out_c.to_floats(), tol, tol, "cuda out " + name_of(c, d));
      expect_close(probs_g.to_floats(), probs_c.to_floats(), tol, tol * 0.1, "cuda probs " + name_of(c, d));
      expect_close(dqkv_g.to_floats(), dq, tol, tol * std::max(1.0, max_abs(dq)), "cuda dqkv " + name_of(c, d));
    }
}

}  // namespace
}  // namespace tutti::kernels
