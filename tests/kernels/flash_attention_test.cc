// Tiled attention: CPU against a naive double-precision causal attention with grouped heads and
// finite differences, against the reference kernel that keeps the probabilities (attention.h),
// across many tiles; the CUDA twin against the CPU (on a GPU, and on the emulated device in
// kernels_flash_attention_test_emu).
#include "tutti/kernels/flash_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/kernel_test_util.h"
#include "tutti/kernels/attention.h"

namespace tutti::kernels {
namespace {

using std::int64_t;
using testing::default_rtol;
using testing::expect_close;
using testing::kFloatDtypes;
using testing::random_tensor;

struct Case {
  int64_t B, T, H, G, hs, query_tile, key_tile;
  int64_t width() const { return (H + 2 * G) * hs; }
  FlashAttentionParams params() const { return {H, G, query_tile, key_tile}; }
};
// Multi-head and grouped, one tile and many (tiles that do not divide T, a query tile larger and
// smaller than the key tile), T = 1.
const Case kCases[] = {{1, 1, 1, 1, 4, 0, 0},   {2, 5, 2, 2, 4, 0, 0},    {2, 9, 4, 2, 4, 2, 3},
                       {1, 17, 6, 3, 8, 4, 5},  {2, 23, 4, 1, 6, 8, 4},   {3, 12, 2, 1, 4, 3, 3},
                       {1, 40, 4, 4, 8, 16, 8}, {1, 33, 8, 2, 16, 7, 11}, {2, 70, 2, 1, 8, 0, 0}};

std::string name_of(const Case& c, DType d) {
  return std::string(tutti::name_of(d)) + " B" + std::to_string(c.B) + " T" + std::to_string(c.T) + " H" +
         std::to_string(c.H) + " G" + std::to_string(c.G) + " hs" + std::to_string(c.hs) + " tiles " +
         std::to_string(c.query_tile) + "x" + std::to_string(c.key_tile);
}

// The naive forward in double: out [B, T, H·hs], lse [B, H, T] and the probabilities.
struct Naive {
  std::vector<double> out, lse, probs;  // probs [B, H, T, T]
};
Naive naive_forward(const std::vector<float>& qkv, const Case& c) {
  const int64_t W = c.width(), R = c.H / c.G;
  Naive n;
  n.out.assign(static_cast<std::size_t>(c.B * c.T * c.H * c.hs), 0.0);
  n.lse.assign(static_cast<std::size_t>(c.B * c.H * c.T), 0.0);
  n.probs.assign(static_cast<std::size_t>(c.B * c.H * c.T * c.T), 0.0);
  auto at = [&](int64_t b, int64_t t, int64_t col) {
    return double(qkv[static_cast<std::size_t>((b * c.T + t) * W + col)]);
  };
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t kc = (c.H + h / R) * c.hs, vc = (c.H + c.G + h / R) * c.hs;
      for (int64_t t = 0; t < c.T; ++t) {
        std::vector<double> s(static_cast<std::size_t>(t + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int64_t i = 0; i < c.hs; ++i) dot += at(b, t, h * c.hs + i) * at(b, j, kc + i);
          s[static_cast<std::size_t>(j)] = dot / std::sqrt(double(c.hs));
          mx = std::max(mx, s[static_cast<std::size_t>(j)]);
        }
        double sum = 0;
        for (double v : s) sum += std::exp(v - mx);
        n.lse[static_cast<std::size_t>((b * c.H + h) * c.T + t)] = mx + std::log(sum);
        for (int64_t j = 0; j <= t; ++j) {
          const double p = std::exp(s[static_cast<std::size_t>(j)] - mx) / sum;
          n.probs[static_cast<std::size_t>(((b * c.H + h) * c.T + t) * c.T + j)] = p;
          for (int64_t i = 0; i < c.hs; ++i)
            n.out[static_cast<std::size_t>((b * c.T + t) * c.H * c.hs + h * c.hs + i)] += p * at(b, j, vc + i);
        }
      }
    }
  return n;
}

// The naive backward in double: dqkv [B, T, W], the key/value heads' gradients summed over their
// query heads.
std::vector<double> naive_backward(const std::vector<float>& qkv, const std::vector<float>& dout, const Case& c) {
  const Naive f = naive_forward(qkv, c);
  const int64_t W = c.width(), R = c.H / c.G, HC = c.H * c.hs;
  const double scale = 1.0 / std::sqrt(double(c.hs));
  std::vector<double> g(qkv.size(), 0.0);
  auto at = [&](int64_t b, int64_t t, int64_t col) {
    return double(qkv[static_cast<std::size_t>((b * c.T + t) * W + col)]);
  };
  auto dy = [&](int64_t b, int64_t t, int64_t col) {
    return double(dout[static_cast<std::size_t>((b * c.T + t) * HC + col)]);
  };
  auto grad = [&](int64_t b, int64_t t, int64_t col) -> double& {
    return g[static_cast<std::size_t>((b * c.T + t) * W + col)];
  };
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t qc = h * c.hs, kc = (c.H + h / R) * c.hs, vc = (c.H + c.G + h / R) * c.hs;
      for (int64_t t = 0; t < c.T; ++t) {
        const double* p = &f.probs[static_cast<std::size_t>(((b * c.H + h) * c.T + t) * c.T)];
        std::vector<double> dp(static_cast<std::size_t>(t + 1));
        double dot = 0;
        for (int64_t j = 0; j <= t; ++j) {
          double v = 0;
          for (int64_t i = 0; i < c.hs; ++i) {
            v += dy(b, t, qc + i) * at(b, j, vc + i);
            grad(b, j, vc + i) += p[j] * dy(b, t, qc + i);
          }
          dp[static_cast<std::size_t>(j)] = v;
          dot += p[j] * v;
        }
        for (int64_t j = 0; j <= t; ++j) {
          const double ds = p[j] * (dp[static_cast<std::size_t>(j)] - dot) * scale;
          for (int64_t i = 0; i < c.hs; ++i) {
            grad(b, t, qc + i) += ds * at(b, j, kc + i);
            grad(b, j, kc + i) += ds * at(b, t, qc + i);
          }
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

struct Result {
  Tensor out, lse, dqkv;
};
Result run(const Tensor& qkv, const Tensor& dout, const Case& c, Device device = Device::cpu()) {
  const DType d = qkv.dtype();
  const Stream st = device.is_cuda() ? Stream::create(device) : Stream();
  Result r{testing::poisoned({c.B, c.T, c.H * c.hs}, d, device), testing::poisoned({c.B, c.H, c.T}, DType::f32, device),
           testing::poisoned(qkv.shape(), d, device)};
  const Tensor x = qkv.to(device), dy = dout.to(device);
  flash_attention_forward(x, c.params(), r.out, r.lse, st);
  flash_attention_backward(x, r.out, r.lse, dy, c.params(), r.dqkv, st);
  st.synchronize();
  return {r.out.to(Device::cpu()), r.lse.to(Device::cpu()), r.dqkv.to(Device::cpu())};
}

TEST(FlashAttentionCpu, MatchesNaiveForwardAndBackward) {
  std::uint32_t seed = 1;
  for (DType d : kFloatDtypes)
    for (const Case& c : kCases) {
      const Tensor qkv = random_tensor({c.B, c.T, c.width()}, d, seed++, -2.f, 2.f);
      const Tensor dout = random_tensor({c.B, c.T, c.H * c.hs}, d, seed++);
      const Result r = run(qkv, dout, c);
      const Naive want = naive_forward(qkv.to_floats(), c);
      const double tol = d == DType::f32 ? 1e-5 : 4 * default_rtol(d);
      expect_close(r.out.to_floats(), to_f(want.out), tol, tol, "out " + name_of(c, d));
      expect_close(r.lse.to_floats(), to_f(want.lse), 1e-5, 1e-5, "lse " + name_of(c, d));
      const std::vector<float> g = to_f(naive_backward(qkv.to_floats(), dout.to_floats(), c));
      expect_close(r.dqkv.to_floats(), g, tol, tol * std::max(1.0, max_abs(g)), "dqkv " + name_of(c, d));
    }
}

// The target: within 1e-5 (f32) of the reference kernel, forward and gradients. The
// reference has no grouped heads: each key/value head is repeated for its query heads
// (materialized, as a user of a multi-head kernel would), and the repeated heads' gradients summed.
TEST(FlashAttentionCpu, MatchesReferenceKernelWithin1e5) {
  const Case cases[] = {{2, 64, 4, 4, 16, 16, 32}, {1, 100, 6, 2, 8, 32, 16}, {2, 48, 8, 1, 8, 0, 0}};
  std::uint32_t seed = 500;
  for (const Case& c : cases) {
    const int64_t R = c.H / c.G, C = c.H * c.hs;
    const Tensor qkv = random_tensor({c.B, c.T, c.width()}, DType::f32, seed++, -2.f, 2.f);
    const Tensor dout = random_tensor({c.B, c.T, C}, DType::f32, seed++);
    const Result r = run(qkv, dout, c);
    // The multi-head input: q as is, key/value head h / R repeated for query head h.
    Tensor mha = Tensor::empty({c.B, c.T, 3 * C}, DType::f32);
    const float* x = qkv.data_as<float>();
    float* m = mha.data_as<float>();
    for (int64_t row = 0; row < c.B * c.T; ++row)
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t i = 0; i < c.hs; ++i) {
          const float* src = x + row * c.width();
          m[row * 3 * C + h * c.hs + i] = src[h * c.hs + i];
          m[row * 3 * C + C + h * c.hs + i] = src[(c.H + h / R) * c.hs + i];
          m[row * 3 * C + 2 * C + h * c.hs + i] = src[(c.H + c.G + h / R) * c.hs + i];
        }
    const Tensor out = Tensor::empty({c.B, c.T, C}, DType::f32),
                 probs = Tensor::empty({c.B, c.H, c.T, c.T}, DType::f32);
    const Tensor dmha = Tensor::empty(mha.shape(), DType::f32);
    attention_forward(mha, c.H, out, probs);
    attention_backward(mha, probs, dout, c.H, dmha);
    std::vector<float> want(static_cast<std::size_t>(qkv.numel()), 0.0f);
    const float* dm = dmha.data_as<float>();
    for (int64_t row = 0; row < c.B * c.T; ++row)
      for (int64_t h = 0; h < c.H; ++h)
        for (int64_t i = 0; i < c.hs; ++i) {
          float* dst = want.data() + row * c.width();
          dst[h * c.hs + i] = dm[row * 3 * C + h * c.hs + i];
          dst[(c.H + h / R) * c.hs + i] += dm[row * 3 * C + C + h * c.hs + i];
          dst[(c.H + c.G + h / R) * c.hs + i] += dm[row * 3 * C + 2 * C + h * c.hs + i];
        }
    const std::string what = name_of(c, DType::f32);
    expect_close(r.out.to_floats(), out.to_floats(), 1e-5, 1e-5, "out vs attention_forward " + what);
    expect_close(r.dqkv.to_floats(), want, 1e-5, 1e-5 * std::max(1.0, max_abs(want)),
                 "dqkv vs attention_backward " + what);
  }
}

TEST(FlashAttentionCpu, BackwardMatchesFiniteDifferences) {
  // loss = sum(out · r) in double; its gradient is flash_attention_backward(dout = r).
  const Case c{2, 7, 4, 2, 4, 2, 3};
  const Tensor qkv = random_tensor({c.B, c.T, c.width()}, DType::f32, 7, -1.5f, 1.5f);
  const Tensor r = random_tensor({c.B, c.T, c.H * c.hs}, DType::f32, 8);
  const std::vector<float> rv = r.to_floats();
  auto loss = [&] {
    const Naive f = naive_forward(qkv.to_floats(), c);
    double s = 0;
    for (std::size_t i = 0; i < f.out.size(); ++i) s += f.out[i] * rv[i];
    return s;
  };
  const Result got = run(qkv, r, c);
  expect_close(got.dqkv.to_floats(), to_f(testing::numeric_gradient(qkv, loss)), 2e-3, 2e-3,
               "dqkv vs finite differences");
}

TEST(FlashAttentionCpu, EachQueryIgnoresLaterPositions) {
  // Changing the last position's q, k, v changes no output before it (the causal mask), across
  // tiles.
  const Case c{1, 9, 4, 2, 4, 2, 4};
  const Tensor qkv = random_tensor({c.B, c.T, c.width()}, DType::f32, 11);
  const Tensor dout = random_tensor({c.B, c.T, c.H * c.hs}, DType::f32, 12);
  const Result a = run(qkv, dout, c);
  float* x = qkv.data_as<float>();
  for (int64_t i = 0; i < c.width(); ++i) x[(c.T - 1) * c.width() + i] += 5.0f;
  const Result b = run(qkv, dout, c);
  const std::vector<float> oa = a.out.to_floats(), ob = b.out.to_floats();
  const int64_t C = c.H * c.hs;
  for (int64_t i = 0; i < (c.T - 1) * C; ++i)
    EXPECT_EQ(oa[static_cast<std::size_t>(i)], ob[static_cast<std::size_t>(i)]) << i;
  bool last_changed = false;
  for (int64_t i = (c.T - 1) * C; i < c.T * C; ++i)
    last_changed |= oa[static_cast<std::size_t>(i)] != ob[static_cast<std::size_t>(i)];
  EXPECT_TRUE(last_changed);
}

TEST(FlashAttentionCpu, TilesChangeOnlyTheRounding) {
  // The same inputs through one tile and through tiles of 1 x 1 (the online softmax's every step):
  // the same result within f32 rounding, and run twice the same bits (deterministic).
  Case one{2, 31, 4, 2, 8, 0, 0}, many = one;
  many.query_tile = many.key_tile = 1;
  const Tensor qkv = random_tensor({one.B, one.T, one.width()}, DType::f32, 21, -3.f, 3.f);
  const Tensor dout = random_tensor({one.B, one.T, one.H * one.hs}, DType::f32, 22);
  const Result a = run(qkv, dout, one), b = run(qkv, dout, many), b2 = run(qkv, dout, many);
  expect_close(b.out.to_floats(), a.out.to_floats(), 1e-5, 1e-6, "out");
  expect_close(b.dqkv.to_floats(), a.dqkv.to_floats(), 1e-5, 1e-5, "dqkv");
  EXPECT_EQ(b.out.to_floats(), b2.out.to_floats());
  EXPECT_EQ(b.dqkv.to_floats(), b2.dqkv.to_floats());
}

TEST(FlashAttentionCpu, BadInputsThrowNamingTheOp) {
  using testing::expect_invalid_argument;
  const Case c{2, 3, 4, 2, 2, 0, 0};  // width (4 + 4) x 2 = 16
  const Tensor qkv = random_tensor({2, 3, 16}, DType::f32, 1);
  const Tensor out = Tensor::zeros({2, 3, 8}, DType::f32), lse = Tensor::zeros({2, 4, 3}, DType::f32);
  const char* fwd = "flash_attention_forward";
  expect_invalid_argument(
      [&] {
        flash_attention_forward(random_tensor({2, 3, 15}, DType::f32, 2), c.params(), out, lse);
      },
      fwd);
  expect_invalid_argument([&] { flash_attention_forward(qkv, {4, 3}, out, lse); }, "kv_heads must divide");
  expect_invalid_argument([&] { flash_attention_forward(qkv, {0, 0}, out, lse); }, fwd);
  expect_invalid_argument([&] { flash_attention_forward(qkv, {4, 2, -1, 0}, out, lse); }, fwd);
  expect_invalid_argument(
      [&] {
        flash_attention_forward(qkv, c.params(), Tensor::zeros({2, 3, 4}, DType::f32), lse);
      },
      fwd);
  expect_invalid_argument(
      [&] {
        flash_attention_forward(qkv, c.params(), out, Tensor::zeros({2, 4, 3}, DType::bf16));
      },
      fwd);
  expect_invalid_argument(
      [&] {
        flash_attention_forward(qkv, c.params(), out, Tensor::zeros({2, 2, 3}, DType::f32));
      },
      fwd);
  expect_invalid_argument([&] { flash_attention_forward(qkv, c.params(), testing::fake_gpu_tensor(out), lse); }, fwd);
  const char* bwd = "flash_attention_backward";
  const Tensor dqkv = Tensor::zeros({2, 3, 16}, DType::f32);
  expect_invalid_argument(
      [&] {
        flash_attention_backward(qkv, out, lse, Tensor::zeros({2, 3, 16}, DType::f32), c.params(), dqkv);
      },
      bwd);
  expect_invalid_argument(
      [&] {
        flash_attention_backward(qkv, out, lse, out, c.params(), Tensor::zeros({2, 3, 8}, DType::f32));
      },
      bwd);
  expect_invalid_argument([&] { flash_attention_backward(qkv, out, lse, out, c.params(), Tensor()); }, bwd);
  for (float v : out.to_floats()) EXPECT_EQ(v, 0.0f);
  for (float v : dqkv.to_floats()) EXPECT_EQ(v, 0.0f);
}

TEST(FlashAttentionCpu, GpuScratchIsLinearInT) {
  // What the planner counts for the GPU path: doubling T at fixed tiles doubles the per-T parts
  // and leaves the tiles' alone (never T x T).
  const FlashAttentionParams p{12, 4, 256, 256};
  for (bool backward : {false, true}) {
    const double a = double(flash_attention_gpu_scratch_bytes(1, 4096, 64, p, DType::bf16, backward));
    const double b = double(flash_attention_gpu_scratch_bytes(1, 8192, 64, p, DType::bf16, backward));
    const double c = double(flash_attention_gpu_scratch_bytes(1, 16384, 64, p, DType::bf16, backward));
    EXPECT_NEAR(c - b, 2 * (b - a), 1.0) << "backward " << backward;
    EXPECT_LT(c, 2.1 * b) << "backward " << backward;
  }
}

// ---- CUDA twin: the GPU result against the CPU one ------------------------------------

TEST(FlashAttentionCuda, ForwardAndBackwardMatchCpu) {
  TUTTI_REQUIRE_GPU();
  // Small shapes on the emulated device (every path: groups, several tiles each way, partial
  // tiles), larger ones on a GPU.
  std::vector<Case> cases = {
      {1, 1, 1, 1, 4, 0, 0}, {2, 9, 4, 2, 4, 2, 3}, {1, 17, 6, 3, 8, 4, 5}, {2, 23, 4, 1, 6, 8, 4}};
  if (!testing::on_emulated_device()) {
    cases.push_back({2, 300, 8, 2, 64, 0, 0});
    cases.push_back({1, 1100, 4, 4, 64, 0, 0});
  }
  std::uint32_t seed = 1000;
  for (DType d : kFloatDtypes)
    for (const Case& c : cases) {
      const Tensor qkv = random_tensor({c.B, c.T, c.width()}, d, seed++, -2.f, 2.f);
      const Tensor dout = random_tensor({c.B, c.T, c.H * c.hs}, d, seed++);
      const Result cpu = run(qkv, dout, c);
      const Result gpu = run(qkv, dout, c, Device::cuda(0));
      // Half dtypes: the GPU rounds P and dS to the dtype for their GEMMs (as FlashAttention
      // does), the CPU keeps them in fp32: a few roundings apart.
      const double tol = d == DType::f32 ? 1e-4 : 4 * default_rtol(d);
      const std::vector<float> g = cpu.dqkv.to_floats();
      expect_close(gpu.out.to_floats(), cpu.out.to_floats(), tol, tol, "cuda out " + name_of(c, d));
      expect_close(gpu.lse.to_floats(), cpu.lse.to_floats(), tol, tol, "cuda lse " + name_of(c, d));
      expect_close(gpu.dqkv.to_floats(), g, tol, tol * std::max(1.0, max_abs(g)), "cuda dqkv " + name_of(c, d));
    }
}

}  // namespace
}  // namespace tutti::kernels
