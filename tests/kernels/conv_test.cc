// conv2d and maxpool2x2: CPU against direct loops in double and central finite differences;
// the CUDA twins against the CPU.
#include "tutti/kernels/conv.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/conv.h"
#include "kernels/cpu/conv_onednn.h"
#include "kernels/kernel_test_util.h"
#include "tutti/core/device.h"

namespace tutti::kernels {
namespace {

using testing::default_rtol;
using testing::expect_close;
using testing::numeric_gradient;
using testing::poisoned;
using testing::random_tensor;

struct ConvCase {
  std::int64_t n, c, h, w, k, r, s;
  int stride, pad;
  std::string str() const {
    return "x[" + std::to_string(n) + "," + std::to_string(c) + "," + std::to_string(h) + "," + std::to_string(w) +
           "] w[" + std::to_string(k) + "," + std::to_string(c) + "," + std::to_string(r) + "," + std::to_string(s) +
           "] stride " + std::to_string(stride) + " pad " + std::to_string(pad);
  }
  std::int64_t p() const { return (h + 2 * pad - r) / stride + 1; }
  std::int64_t q() const { return (w + 2 * pad - s) / stride + 1; }
  Shape x_shape() const { return {n, c, h, w}; }
  Shape w_shape() const { return {k, c, r, s}; }
  Shape y_shape() const { return {n, k, p(), q()}; }
  Conv2dParams params() const { return {stride, pad}; }
};

const std::vector<ConvCase> kCases = {
    {2, 3, 7, 5, 4, 3, 3, 1, 1},      // odd sizes, padding 1
    {3, 2, 9, 8, 5, 3, 2, 2, 0},      // stride 2, no padding, non-square kernel
    {1, 3, 5, 7, 2, 3, 3, 2, 1},      // stride 2 and padding 1
    {2, 4, 6, 6, 3, 1, 1, 1, 0},      // 1x1 (im2col is the identity)
    {1, 1, 12, 12, 8, 3, 3, 1, 1},    // first layer of a small CNN
    {2, 5, 4, 6, 3, 4, 4, 1, 0},      // kernel nearly as large as the input
    {2, 2, 8, 7, 3, 3, 3, 2, 0},      // stride 2 leaves the last row and column unread
    {1, 32, 28, 28, 64, 3, 3, 1, 1},  // second layer of a small CNN on 28x28 images
};

// Direct loops in double over the values the kernel sees (after rounding to the dtype).
std::vector<double> naive_forward(const std::vector<float>& x, const std::vector<float>& w,
                                  const std::vector<float>* bias, const ConvCase& cc) {
  const auto P = cc.p(), Q = cc.q();
  std::vector<double> y(static_cast<std::size_t>(cc.n * cc.k * P * Q));
  for (std::int64_t n = 0; n < cc.n; ++n)
    for (std::int64_t k = 0; k < cc.k; ++k)
      for (std::int64_t p = 0; p < P; ++p)
        for (std::int64_t q = 0; q < Q; ++q) {
          double acc = bias ? (*bias)[static_cast<std::size_t>(k)] : 0.0;
          for (std::int64_t c = 0; c < cc.c; ++c)
            for (std::int64_t r = 0; r < cc.r; ++r)
              for (std::int64_t s = 0; s < cc.s; ++s) {
                const std::int64_t ih = p * cc.stride - cc.pad + r, iw = q * cc.stride - cc.pad + s;
                if (ih < 0 || ih >= cc.h || iw < 0 || iw >= cc.w) continue;
                acc += static_cast<double>(x[static_cast<std::size_t>(((n * cc.c + c) * cc.h + ih) * cc.w + iw)]) *
                       w[static_cast<std::size_t>(((k * cc.c + c) * cc.r + r) * cc.s + s)];
              }
          y[static_cast<std::size_t>(((n * cc.k + k) * P + p) * Q + q)] = acc;
        }
  return y;
}

struct NaiveGrads {
  std::vector<double> dx, dw, db;
};
NaiveGrads naive_backward(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& dy,
                          const ConvCase& cc) {
  const auto P = cc.p(), Q = cc.q();
  NaiveGrads g;
  g.dx.assign(x.size(), 0.0);
  g.dw.assign(w.size(), 0.0);
  g.db.assign(static_cast<std::size_t>(cc.k), 0.0);
  for (std::int64_t n = 0; n < cc.n; ++n)
    for (std::int64_t k = 0; k < cc.k; ++k)
      for (std::int64_t p = 0; p < P; ++p)
        for (std::int64_t q = 0; q < Q; ++q) {
          const double d = dy[static_cast<std::size_t>(((n * cc.k + k) * P + p) * Q + q)];
          g.db[static_cast<std::size_t>(k)] += d;
          for (std::int64_t c = 0; c < cc.c; ++c)
            for (std::int64_t r = 0; r < cc.r; ++r)
              for (std::int64_t s = 0; s < cc.s; ++s) {
                const std::int64_t ih = p * cc.stride - cc.pad + r, iw = q * cc.stride - cc.pad + s;
                if (ih < 0 || ih >= cc.h || iw < 0 || iw >= cc.w) continue;
                const auto xi = static_cast<std::size_t>(((n * cc.c + c) * cc.h + ih) * cc.w + iw);
                const auto wi = static_cast<std::size_t>(((k * cc.c + c) * cc.r + r) * cc.s + s);
                g.dx[xi] += w[wi] * d;
                g.dw[wi] += x[xi] * d;
              }
        }
  return g;
}

std::vector<float> to_f(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// Tolerances for a sum of `terms` products of values in [-1, 1), stored in `dtype`.
double conv_atol(DType dtype, std::int64_t terms) {
  return default_rtol(dtype) * std::sqrt(static_cast<double>(terms)) + (dtype == DType::f32 ? 1e-5 : 0.0);
}

class ConvDtypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(ConvDtypeTest, ForwardMatchesNaiveLoops) {
  const DType dt = GetParam();
  std::uint32_t seed = 1;
  for (const ConvCase& cc : kCases) {
    for (bool with_bias : {true, false}) {
      Tensor x = random_tensor(cc.x_shape(), dt, seed++);
      Tensor w = random_tensor(cc.w_shape(), dt, seed++);
      Tensor b = with_bias ? random_tensor({cc.k}, dt, seed++) : Tensor();
      Tensor y = poisoned(cc.y_shape(), dt);
      conv2d_forward(x, w, b, y, cc.params());
      const auto bf = with_bias ? b.to_floats() : std::vector<float>();
      const auto ref = naive_forward(x.to_floats(), w.to_floats(), with_bias ? &bf : nullptr, cc);
      expect_close(y.to_floats(), to_f(ref), default_rtol(dt), conv_atol(dt, cc.c * cc.r * cc.s),
                   "conv2d_forward " + std::string(name_of(dt)) + " " + cc.str() + (with_bias ? " bias" : ""));
    }
  }
}

TEST_P(ConvDtypeTest, BackwardMatchesNaiveLoops) {
  const DType dt = GetParam();
  std::uint32_t seed = 100;
  for (const ConvCase& cc : kCases) {
    Tensor x = random_tensor(cc.x_shape(), dt, seed++);
    Tensor w = random_tensor(cc.w_shape(), dt, seed++);
    Tensor dy = random_tensor(cc.y_shape(), dt, seed++);
    const auto ref = naive_backward(x.to_floats(), w.to_floats(), dy.to_floats(), cc);
    const double rtol = default_rtol(dt);
    // dw/db in the input dtype, overwritten.
    Tensor dx = poisoned(cc.x_shape(), dt), dw = poisoned(cc.w_shape(), dt), db = poisoned({cc.k}, dt);
    conv2d_backward(x, w, dy, dx, dw, db, /*accumulate_params=*/false, cc.params());
    expect_close(dx.to_floats(), to_f(ref.dx), rtol, conv_atol(dt, cc.k * cc.r * cc.s), "dx " + cc.str());
    expect_close(dw.to_floats(), to_f(ref.dw), rtol, conv_atol(dt, cc.n * cc.p() * cc.q()), "dw " + cc.str());
    expect_close(db.to_floats(), to_f(ref.db), rtol, conv_atol(dt, cc.n * cc.p() * cc.q()), "db " + cc.str());
    // f32 gradient buffers, accumulated onto earlier values; no dx.
    Tensor dw32 = random_tensor(cc.w_shape(), DType::f32, seed++), db32 = random_tensor({cc.k}, DType::f32, seed++);
    auto dw_expect = dw32.to_floats(), db_expect = db32.to_floats();
    for (std::size_t i = 0; i < dw_expect.size(); ++i) dw_expect[i] += static_cast<float>(ref.dw[i]);
    for (std::size_t i = 0; i < db_expect.size(); ++i) db_expect[i] += static_cast<float>(ref.db[i]);
    conv2d_backward(x, w, dy, Tensor(), dw32, db32, /*accumulate_params=*/true, cc.params());
    // Only the inputs were rounded to dt: the fp32 sums are accurate.
    expect_close(dw32.to_floats(), dw_expect, 1e-5, conv_atol(DType::f32, cc.n * cc.p() * cc.q()),
                 "dw f32 accumulate " + cc.str());
    expect_close(db32.to_floats(), db_expect, 1e-5, conv_atol(DType::f32, cc.n * cc.p() * cc.q()),
                 "db f32 accumulate " + cc.str());
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ConvDtypeTest, ::testing::ValuesIn(testing::kFloatDtypes),
                         [](const auto& info) { return std::string(name_of(info.param)); });

// loss = sum(y · r) for a fixed random r, so dL/dy = r.
TEST(Conv2d, BackwardMatchesFiniteDifferences) {
  const std::vector<ConvCase> cases = {
      {2, 2, 5, 6, 3, 3, 3, 2, 1}, {1, 3, 4, 5, 2, 2, 3, 1, 0}, {2, 2, 4, 4, 2, 1, 1, 1, 0}};
  std::uint32_t seed = 500;
  for (const ConvCase& cc : cases) {
    Tensor x = random_tensor(cc.x_shape(), DType::f32, seed++);
    Tensor w = random_tensor(cc.w_shape(), DType::f32, seed++);
    Tensor b = random_tensor({cc.k}, DType::f32, seed++);
    Tensor r = random_tensor(cc.y_shape(), DType::f32, seed++);
    Tensor y = Tensor::empty(cc.y_shape(), DType::f32);
    const auto rv = r.to_floats();
    auto loss = [&] {
      conv2d_forward(x, w, b, y, cc.params());
      const float* yp = y.data_as<float>();
      double acc = 0;
      for (std::size_t i = 0; i < rv.size(); ++i) acc += static_cast<double>(yp[i]) * rv[i];
      return acc;
    };
    Tensor dx = poisoned(cc.x_shape(), DType::f32), dw = poisoned(cc.w_shape(), DType::f32),
           db = poisoned({cc.k}, DType::f32);
    conv2d_backward(x, w, r, dx, dw, db, false, cc.params());
    const double h = 1e-2;  // the loss is linear in each input, so a large step costs nothing
    expect_close(dx.to_floats(), to_f(numeric_gradient(x, loss, h)), 1e-3, 1e-3, "dx finite differences " + cc.str());
    expect_close(dw.to_floats(), to_f(numeric_gradient(w, loss, h)), 1e-3, 1e-3, "dw finite differences " + cc.str());
    expect_close(db.to_floats(), to_f(numeric_gradient(b, loss, h)), 1e-3, 1e-3, "db finite differences " + cc.str());
  }
}

// ---- the CPU's two f32 paths: oneDNN (where built with it) against im2col + OpenBLAS ----

// Every case, the CNN's two layers at its per-rank batch, and weights and gradients that are
// views one element into flat buffers (as a model's parameters are): oneDNN's forward, backward
// data and backward weights (overwriting and accumulating) against the im2col path and the
// naive loops.
TEST(Conv2dCpu, OneDnnMatchesIm2colAndNaiveLoops) {
  if (!cpu::onednn::available()) {
    EXPECT_EQ(cpu::conv2d_backend(), "im2col + OpenBLAS");  // conv2d runs im2col only
    return;
  }
  EXPECT_NE(cpu::conv2d_backend().find("oneDNN"), std::string::npos) << cpu::conv2d_backend();
  std::vector<ConvCase> cases = kCases;
  cases.push_back({64, 1, 28, 28, 16, 3, 3, 1, 1});
  cases.push_back({64, 16, 14, 14, 32, 3, 3, 1, 1});
  std::uint32_t seed = 2000;
  const DType f32 = DType::f32;
  for (const ConvCase& cc : cases) {
    const std::int64_t wn = cc.k * cc.c * cc.r * cc.s;
    Tensor x = random_tensor(cc.x_shape(), f32, seed++), dy = random_tensor(cc.y_shape(), f32, seed++);
    Tensor w_flat = random_tensor({1 + wn + cc.k}, f32, seed++);
    Tensor w = w_flat.view(1, cc.w_shape()), b = w_flat.view(1 + wn, {cc.k});
    const auto bv = b.to_floats();
    const auto ref_y = naive_forward(x.to_floats(), w.to_floats(), &bv, cc);
    const auto ref = naive_backward(x.to_floats(), w.to_floats(), dy.to_floats(), cc);
    const double y_atol = conv_atol(f32, cc.c * cc.r * cc.s), dx_atol = conv_atol(f32, cc.k * cc.r * cc.s);
    const double dw_atol = conv_atol(f32, cc.n * cc.p() * cc.q());

    Tensor y = poisoned(cc.y_shape(), f32), y_im2col = poisoned(cc.y_shape(), f32);
    cpu::onednn::conv2d_forward(x, w, b, y, cc.params());
    cpu::conv2d_forward_im2col(x, w, b, y_im2col, cc.params());
    expect_close(y.to_floats(), to_f(ref_y), 1e-5, y_atol, "oneDNN forward vs naive " + cc.str());
    expect_close(y, y_im2col, 1e-5, y_atol, "oneDNN forward vs im2col " + cc.str());

    for (bool accumulate : {false, true}) {
      const std::string what = cc.str() + (accumulate ? " accumulate" : "");
      Tensor start = random_tensor({1 + wn + cc.k}, f32, seed++);
      Tensor grads = start.clone(), grads_im2col = start.clone();
      Tensor dx = poisoned(cc.x_shape(), f32), dx_im2col = poisoned(cc.x_shape(), f32);
      cpu::onednn::conv2d_backward(x, w, dy, dx, grads.view(1, cc.w_shape()), grads.view(1 + wn, {cc.k}), accumulate,
                                   cc.params());
      cpu::conv2d_backward_im2col(x, w, dy, dx_im2col, grads_im2col.view(1, cc.w_shape()),
                                  grads_im2col.view(1 + wn, {cc.k}), accumulate, cc.params());
      std::vector<float> expect = start.to_floats();
      for (std::int64_t i = 0; i < wn + cc.k; ++i) {
        const double g = i < wn ? ref.dw[static_cast<std::size_t>(i)] : ref.db[static_cast<std::size_t>(i - wn)];
        auto& e = expect[static_cast<std::size_t>(1 + i)];
        e = static_cast<float>((accumulate ? e : 0.0) + g);
      }
      expect_close(dx.to_floats(), to_f(ref.dx), 1e-5, dx_atol, "oneDNN dx vs naive " + what);
      expect_close(dx, dx_im2col, 1e-5, dx_atol, "oneDNN dx vs im2col " + what);
      expect_close(grads.to_floats(), expect, 1e-5, dw_atol, "oneDNN dw, db vs naive " + what);
      expect_close(grads, grads_im2col, 1e-5, dw_atol, "oneDNN dw, db vs im2col " + what);
      EXPECT_EQ(grads.to_floats()[0], start.to_floats()[0]) << "wrote before dw's view " << what;
    }
    // No dx and no db (the first layer of a model); no bias.
    Tensor dw = poisoned(cc.w_shape(), f32), dw_im2col = poisoned(cc.w_shape(), f32);
    cpu::onednn::conv2d_backward(x, w, dy, Tensor(), dw, Tensor(), false, cc.params());
    cpu::conv2d_backward_im2col(x, w, dy, Tensor(), dw_im2col, Tensor(), false, cc.params());
    expect_close(dw, dw_im2col, 1e-5, dw_atol, "oneDNN dw alone vs im2col " + cc.str());
    cpu::onednn::conv2d_forward(x, w, Tensor(), y, cc.params());
    cpu::conv2d_forward_im2col(x, w, Tensor(), y_im2col, cc.params());
    expect_close(y, y_im2col, 1e-5, y_atol, "oneDNN forward without bias vs im2col " + cc.str());
  }
}

// A training step creates oneDNN primitives on its first run only: the second step of the
// CNN's layers (forward, backward with and without dx) creates none.
TEST(Conv2dCpu, OneDnnCreatesPrimitivesOnTheFirstStepOnly) {
  const std::vector<ConvCase> layers = {{8, 1, 28, 28, 16, 3, 3, 1, 1}, {8, 16, 14, 14, 32, 3, 3, 1, 1}};
  auto step = [&](std::uint32_t seed) {
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const ConvCase& cc = layers[i];
      Tensor x = random_tensor(cc.x_shape(), DType::f32, seed++), w = random_tensor(cc.w_shape(), DType::f32, seed++);
      Tensor b = random_tensor({cc.k}, DType::f32, seed++), dy = random_tensor(cc.y_shape(), DType::f32, seed++);
      Tensor y = Tensor::empty(cc.y_shape(), DType::f32),
             dx = i > 0 ? Tensor::empty(cc.x_shape(), DType::f32) : Tensor();
      Tensor dw = Tensor::zeros(cc.w_shape(), DType::f32), db = Tensor::zeros({cc.k}, DType::f32);
      conv2d_forward(x, w, b, y, cc.params());
      conv2d_backward(x, w, dy, dx, dw, db, true, cc.params());
    }
  };
  const std::int64_t before = cpu::onednn::primitives_created();
  step(1);
  const std::int64_t after_first = cpu::onednn::primitives_created();
  step(100);
  EXPECT_EQ(cpu::onednn::primitives_created(), after_first) << "the second step created primitives";
  if (cpu::onednn::available()) EXPECT_GT(after_first, before) << "the first step ran no oneDNN primitive";
}

TEST(Conv2d, OutputSize) {
  EXPECT_EQ(conv2d_output_size(28, 3, {1, 1}), 28);
  EXPECT_EQ(conv2d_output_size(28, 3, {2, 1}), 14);
  EXPECT_EQ(conv2d_output_size(7, 3, {2, 0}), 3);
  EXPECT_EQ(conv2d_output_size(5, 5, {1, 0}), 1);
  EXPECT_THROW(conv2d_output_size(2, 5, {1, 1}), InvalidArgument);
  EXPECT_THROW(conv2d_output_size(8, 3, {0, 1}), InvalidArgument);
}

TEST(Conv2d, BadInputThrowsBeforeWriting) {
  Tensor x = random_tensor({2, 3, 6, 6}, DType::f32, 1);
  Tensor w = random_tensor({4, 2, 3, 3}, DType::f32, 2);  // 2 input channels, x has 3
  Tensor y = poisoned({2, 4, 6, 6}, DType::f32);
  testing::expect_invalid_argument([&] { conv2d_forward(x, w, Tensor(), y, {1, 1}); }, "conv2d_forward");
  for (float v : y.to_floats()) ASSERT_TRUE(std::isnan(v)) << "y was written before the check";
  Tensor w_ok = random_tensor({4, 3, 3, 3}, DType::f32, 3);
  Tensor y_bad = poisoned({2, 4, 5, 5}, DType::f32);  // wrong output size for padding 1
  testing::expect_invalid_argument([&] { conv2d_forward(x, w_ok, Tensor(), y_bad, {1, 1}); }, "conv2d_forward");
  Tensor w_half = random_tensor({4, 3, 3, 3}, DType::f16, 3);
  testing::expect_invalid_argument([&] { conv2d_forward(x, w_half, Tensor(), y, {1, 1}); }, "conv2d_forward");
  Tensor dy = random_tensor({2, 4, 6, 6}, DType::f32, 4);
  Tensor dw_bad = Tensor::zeros({4, 3, 3, 2}, DType::f32);
  testing::expect_invalid_argument(
      [&] {
        conv2d_backward(x, w_ok, dy, Tensor(), dw_bad, Tensor(), false, {1, 1});
      },
      "conv2d_backward");
  testing::expect_invalid_argument(
      [&] {
        conv2d_backward(x, w_ok, dy, Tensor(), Tensor(), Tensor(), false, {1, 1});
      },
      "conv2d_backward");
  Tensor odd = random_tensor({1, 2, 5, 4}, DType::f32, 5);
  Tensor pooled = poisoned({1, 2, 2, 2}, DType::f32);
  testing::expect_invalid_argument([&] { maxpool2x2_forward(odd, pooled); }, "maxpool2x2_forward");
  Tensor x4 = random_tensor({1, 2, 4, 4}, DType::f32, 6);
  Tensor dx_bad = poisoned({1, 2, 4, 2}, DType::f32);
  testing::expect_invalid_argument([&] { maxpool2x2_backward(x4, pooled, dx_bad); }, "maxpool2x2_backward");
}

// ---- maxpool ----

struct PoolRef {
  std::vector<float> y, dx;
};
// The first max of each window in row-major order (strict >), as the header promises.
PoolRef naive_pool(const std::vector<float>& x, const std::vector<float>& dy, const Shape& s) {
  const auto planes = s[0] * s[1], H = s[2], W = s[3];
  PoolRef r;
  r.y.assign(static_cast<std::size_t>(planes * H * W / 4), 0.f);
  r.dx.assign(x.size(), 0.f);
  for (std::int64_t pl = 0; pl < planes; ++pl)
    for (std::int64_t i = 0; i < H / 2; ++i)
      for (std::int64_t j = 0; j < W / 2; ++j) {
        std::size_t best = 0;
        bool have = false;
        for (int di = 0; di < 2; ++di)
          for (int dj = 0; dj < 2; ++dj) {
            const auto idx = static_cast<std::size_t>((pl * H + 2 * i + di) * W + 2 * j + dj);
            if (!have || x[idx] > x[best]) best = idx, have = true;
          }
        const auto o = static_cast<std::size_t>((pl * (H / 2) + i) * (W / 2) + j);
        r.y[o] = x[best];
        if (!dy.empty()) r.dx[best] = dy[o];
      }
  return r;
}

// Values drawn from a few levels, so that many windows hold ties.
Tensor tie_heavy(const Shape& shape, DType dt, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> level(-3, 3);
  std::vector<float> v(static_cast<std::size_t>(numel_of(shape)));
  for (auto& e : v) e = 0.25f * static_cast<float>(level(rng));
  return Tensor::from_floats(v, shape, dt);
}

TEST_P(ConvDtypeTest, MaxpoolMatchesNaiveWithTies) {
  const DType dt = GetParam();
  std::uint32_t seed = 900;
  // Widths: 2-8 and 14 (one partial 16-column chunk of the AVX-512 path), 28 and 34 (a full chunk
  // and a partial one), 32 (two full chunks).
  const std::vector<Shape> shapes = {{2, 3, 6, 8},  {1, 1, 2, 2},  {3, 5, 10, 4}, {1, 2, 28, 28},
                                     {2, 3, 4, 14}, {1, 2, 6, 34}, {1, 1, 4, 32}};
  for (const Shape& s : shapes) {
    for (bool ties : {false, true}) {
      Tensor x = ties ? tie_heavy(s, dt, seed++) : random_tensor(s, dt, seed++);
      const Shape ys = {s[0], s[1], s[2] / 2, s[3] / 2};
      Tensor dy = random_tensor(ys, dt, seed++);
      Tensor y = poisoned(ys, dt), dx = poisoned(s, dt);
      maxpool2x2_forward(x, y);
      maxpool2x2_backward(x, dy, dx);
      const PoolRef ref = naive_pool(x.to_floats(), dy.to_floats(), s);
      expect_close(y.to_floats(), ref.y, 0, 0, "maxpool forward " + shape_str(s));
      expect_close(dx.to_floats(), ref.dx, 0, 0, "maxpool backward " + shape_str(s) + (ties ? " ties" : ""));
    }
  }
}

// A nan in a window wins (it shows up in y, as in PyTorch), and backward sends dy to the first
// nan; windows without nan are unaffected.
TEST(Maxpool2x2, NanPropagates) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType dt : {DType::f32, DType::bf16}) {
    // Two windows side by side: [1, nan; nan, 5] and [2, 3; 4, 0].
    Tensor x = Tensor::from_floats({1.f, nan, 2.f, 3.f, nan, 5.f, 4.f, 0.f}, {1, 1, 2, 4}, dt);
    Tensor dy = Tensor::from_floats({10.f, 20.f}, {1, 1, 1, 2}, dt);
    Tensor y = poisoned({1, 1, 1, 2}, dt), dx = poisoned({1, 1, 2, 4}, dt);
    maxpool2x2_forward(x, y);
    maxpool2x2_backward(x, dy, dx);
    const auto yv = y.to_floats(), dxv = dx.to_floats();
    EXPECT_TRUE(std::isnan(yv[0])) << name_of(dt);
    EXPECT_EQ(yv[1], 4.f);
    const std::vector<float> expected_dx = {0.f, 10.f, 0.f, 0.f, 0.f, 0.f, 20.f, 0.f};
    expect_close(dxv, expected_dx, 0, 0, "maxpool backward with nan " + std::string(name_of(dt)));
  }
}

TEST(Maxpool2x2, CudaNanPropagates) {
  TUTTI_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType dt : {DType::f32, DType::f16}) {
    Tensor x = Tensor::from_floats({1.f, nan, 2.f, 3.f, nan, 5.f, 4.f, 0.f}, {1, 1, 2, 4}, dt).to(gpu);
    Tensor dy = Tensor::from_floats({10.f, 20.f}, {1, 1, 1, 2}, dt).to(gpu);
    Tensor y = poisoned({1, 1, 1, 2}, dt, gpu), dx = poisoned({1, 1, 2, 4}, dt, gpu);
    maxpool2x2_forward(x, y);
    maxpool2x2_backward(x, dy, dx);
    const auto yv = y.to_floats();
    EXPECT_TRUE(std::isnan(yv[0])) << name_of(dt);
    EXPECT_EQ(yv[1], 4.f);
    expect_close(dx.to_floats(), {0.f, 10.f, 0.f, 0.f, 0.f, 0.f, 20.f, 0.f}, 0, 0, "cuda maxpool backward with nan");
  }
}

TEST(Maxpool2x2, BackwardMatchesFiniteDifferences) {
  const Shape s = {2, 2, 4, 6};
  // Distinct values at least 0.01 apart, so a step of 1e-3 never changes a window's argmax.
  std::vector<float> v(static_cast<std::size_t>(numel_of(s)));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.01f * static_cast<float>(i) - 0.4f;
  std::shuffle(v.begin(), v.end(), std::mt19937(3));
  Tensor x = Tensor::from_floats(v, s, DType::f32);
  const Shape ys = {2, 2, 2, 3};
  Tensor r = random_tensor(ys, DType::f32, 4);
  const auto rv = r.to_floats();
  Tensor y = Tensor::empty(ys, DType::f32);
  auto loss = [&] {
    maxpool2x2_forward(x, y);
    const float* yp = y.data_as<float>();
    double acc = 0;
    for (std::size_t i = 0; i < rv.size(); ++i) acc += static_cast<double>(yp[i]) * rv[i];
    return acc;
  };
  Tensor dx = poisoned(s, DType::f32);
  maxpool2x2_backward(x, r, dx);
  expect_close(dx.to_floats(), to_f(numeric_gradient(x, loss, 1e-3)), 1e-3, 1e-4, "maxpool dx finite differences");
}

// ---- CUDA twins: each op on the GPU against the CPU, outputs poisoned first ----

TEST_P(ConvDtypeTest, CudaMatchesCpu) {
  TUTTI_REQUIRE_GPU();
  const DType dt = GetParam();
  const Device gpu = Device::cuda(0);
  Stream stream = Stream::create(gpu);
  std::uint32_t seed = 1300;
  std::vector<ConvCase> cases = kCases;
  cases.push_back({4, 32, 28, 28, 64, 3, 3, 1, 1});  // the second layer of a small CNN
  const double rtol = dt == DType::f32 ? 1e-4 : default_rtol(dt);
  for (const ConvCase& cc : cases) {
    Tensor x = random_tensor(cc.x_shape(), dt, seed++), w = random_tensor(cc.w_shape(), dt, seed++);
    Tensor b = random_tensor({cc.k}, dt, seed++), dy = random_tensor(cc.y_shape(), dt, seed++);
    Tensor y = Tensor::empty(cc.y_shape(), dt);
    conv2d_forward(x, w, b, y, cc.params());
    Tensor y_gpu = poisoned(cc.y_shape(), dt, gpu);
    conv2d_forward(x.to(gpu), w.to(gpu), b.to(gpu), y_gpu, cc.params(), stream);
    stream.synchronize();
    const double terms = static_cast<double>(cc.c * cc.r * cc.s);
    expect_close(y_gpu.to_floats(), y.to_floats(), rtol, conv_atol(dt, cc.c * cc.r * cc.s) + rtol * std::sqrt(terms),
                 "cuda conv2d_forward " + cc.str());
    for (bool accumulate : {false, true}) {
      Tensor dx = Tensor::empty(cc.x_shape(), dt), dw = random_tensor(cc.w_shape(), DType::f32, seed),
             db = random_tensor({cc.k}, DType::f32, seed + 1);
      Tensor dx_gpu = poisoned(cc.x_shape(), dt, gpu), dw_gpu = dw.to(gpu), db_gpu = db.to(gpu);
      seed += 2;
      conv2d_backward(x, w, dy, dx, dw, db, accumulate, cc.params());
      conv2d_backward(x.to(gpu), w.to(gpu), dy.to(gpu), dx_gpu, dw_gpu, db_gpu, accumulate, cc.params(), stream);
      stream.synchronize();
      const std::string what = cc.str() + (accumulate ? " accumulate" : "");
      expect_close(dx_gpu.to_floats(), dx.to_floats(), rtol, conv_atol(dt, cc.k * cc.r * cc.s) * 2, "cuda dx " + what);
      // For half inputs cuDNN rounds dw to the input dtype before it is added into the f32
      // buffer (the CPU keeps fp32): allow that rounding. db is summed in fp32 on both sides.
      const double dw_rtol = dt == DType::f32 ? 1e-4 : rtol;
      const double dw_atol = dt == DType::f32 ? conv_atol(DType::f32, cc.n * cc.p() * cc.q()) * 4
                                              : conv_atol(dt, cc.n * cc.p() * cc.q()) * 2;
      expect_close(dw_gpu.to_floats(), dw.to_floats(), dw_rtol, dw_atol, "cuda dw " + what);
      expect_close(db_gpu.to_floats(), db.to_floats(), 1e-4, conv_atol(DType::f32, cc.n * cc.p() * cc.q()) * 4,
                   "cuda db " + what);
    }
    // dw in the input dtype, no bias gradient, no dx.
    Tensor dw_same = Tensor::empty(cc.w_shape(), dt), dw_same_gpu = poisoned(cc.w_shape(), dt, gpu);
    conv2d_backward(x, w, dy, Tensor(), dw_same, Tensor(), false, cc.params());
    conv2d_backward(x.to(gpu), w.to(gpu), dy.to(gpu), Tensor(), dw_same_gpu, Tensor(), false, cc.params(), stream);
    stream.synchronize();
    expect_close(dw_same_gpu.to_floats(), dw_same.to_floats(), rtol, conv_atol(dt, cc.n * cc.p() * cc.q()) * 2,
                 "cuda dw " + std::string(name_of(dt)) + " " + cc.str());
  }
  for (const Shape& s : std::vector<Shape>{{2, 3, 6, 8}, {3, 5, 10, 4}, {8, 32, 28, 28}}) {
    for (bool ties : {false, true}) {
      Tensor x = ties ? tie_heavy(s, dt, seed++) : random_tensor(s, dt, seed++);
      const Shape ys = {s[0], s[1], s[2] / 2, s[3] / 2};
      Tensor dy = random_tensor(ys, dt, seed++);
      Tensor y = Tensor::empty(ys, dt), dx = Tensor::empty(s, dt);
      maxpool2x2_forward(x, y);
      maxpool2x2_backward(x, dy, dx);
      Tensor y_gpu = poisoned(ys, dt, gpu), dx_gpu = poisoned(s, dt, gpu);
      maxpool2x2_forward(x.to(gpu), y_gpu, stream);
      maxpool2x2_backward(x.to(gpu), dy.to(gpu), dx_gpu, stream);
      stream.synchronize();
      expect_close(y_gpu.to_floats(), y.to_floats(), 0, 0, "cuda maxpool forward " + shape_str(s));
      expect_close(dx_gpu.to_floats(), dx.to_floats(), 0, 0, "cuda maxpool backward " + shape_str(s));
    }
  }
}

// Parameters are views into flat buffers, so a weight or its gradient may start at any
// element: the CUDA path must give the same results as for an aligned tensor.
TEST(Conv2d, CudaUnalignedViewsMatchCpu) {
  TUTTI_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Stream stream = Stream::create(gpu);
  const ConvCase cc{2, 3, 9, 7, 5, 3, 3, 1, 1};
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor x = random_tensor(cc.x_shape(), dt, 1), w = random_tensor(cc.w_shape(), dt, 2);
    Tensor b = random_tensor({cc.k}, dt, 3), dy = random_tensor(cc.y_shape(), dt, 4);
    // Weight, bias and their gradients packed one element apart in flat GPU buffers.
    const std::int64_t wn = w.numel();
    Tensor flat = Tensor::empty({1 + wn + cc.k}, dt, gpu);
    Tensor w_gpu = flat.view(1, cc.w_shape()), b_gpu = flat.view(1 + wn, {cc.k});
    w_gpu.copy_from(w);
    b_gpu.copy_from(b);
    Tensor grads = testing::poisoned({1 + wn + cc.k}, dt, gpu);
    Tensor dw_gpu = grads.view(1, cc.w_shape()), db_gpu = grads.view(1 + wn, {cc.k});
    Tensor y = Tensor::empty(cc.y_shape(), dt), dx = Tensor::empty(cc.x_shape(), dt);
    Tensor dw = Tensor::empty(cc.w_shape(), dt), db = Tensor::empty({cc.k}, dt);
    conv2d_forward(x, w, b, y, cc.params());
    conv2d_backward(x, w, dy, dx, dw, db, false, cc.params());
    Tensor y_room = testing::poisoned({1 + y.numel()}, dt, gpu);
    Tensor y_gpu = y_room.view(1, cc.y_shape());
    Tensor dx_gpu = poisoned(cc.x_shape(), dt, gpu);
    conv2d_forward(x.to(gpu), w_gpu, b_gpu, y_gpu, cc.params(), stream);
    conv2d_backward(x.to(gpu), w_gpu, dy.to(gpu), dx_gpu, dw_gpu, db_gpu, false, cc.params(), stream);
    stream.synchronize();
    const double rtol = dt == DType::f32 ? 1e-4 : default_rtol(dt);
    expect_close(y_gpu.to_floats(), y.to_floats(), rtol, conv_atol(dt, cc.c * cc.r * cc.s) * 2, "unaligned y");
    expect_close(dx_gpu.to_floats(), dx.to_floats(), rtol, conv_atol(dt, cc.k * cc.r * cc.s) * 2, "unaligned dx");
    expect_close(dw_gpu.to_floats(), dw.to_floats(), rtol, conv_atol(dt, cc.n * cc.p() * cc.q()) * 2, "unaligned dw");
    expect_close(db_gpu.to_floats(), db.to_floats(), rtol, conv_atol(dt, cc.n * cc.p() * cc.q()) * 2, "unaligned db");
    EXPECT_TRUE(std::isnan(y_room.to_floats()[0])) << "wrote before y's view";
  }
}

}  // namespace
}  // namespace tutti::kernels
