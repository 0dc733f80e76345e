// Elementwise family: CPU against naive double-precision formulas and finite differences;
// the CUDA twin against the CPU (skipped where no GPU is visible).
#include "tutti/kernels/elementwise.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
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

const Shape kShapes[] = {{1}, {7}, {33}, {129}, {3, 5, 7}, {1000}};

double rtol_of(DType d) { return d == DType::f32 ? 1e-6 : default_rtol(d); }
double atol_of(DType d) { return d == DType::f32 ? 1e-6 : default_rtol(d) * 1e-2; }
std::string label(const std::string& op, DType d, const Shape& s) {
  return op + " " + std::string(name_of(d)) + " " + shape_str(s);
}

double gelu_ref(double x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}
double gelu_grad_ref(double x) {
  const double c = std::sqrt(2.0 / M_PI);
  const double t = std::tanh(c * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

// out[i] = f(in[i]) in double, as floats.
std::vector<float> map_ref(const std::vector<float>& in, const std::function<double(double)>& f) {
  std::vector<float> out(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) out[i] = static_cast<float>(f(in[i]));
  return out;
}
std::vector<float> map_ref(const std::vector<float>& a, const std::vector<float>& b,
                           const std::function<double(double, double)>& f) {
  std::vector<float> out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) out[i] = static_cast<float>(f(a[i], b[i]));
  return out;
}

TEST(ElementwiseCpu, ActivationsMatchNaive) {
  std::uint32_t seed = 1;
  for (DType d : kFloatDtypes)
    for (const Shape& s : kShapes) {
      const Tensor x = random_tensor(s, d, seed++, -3.f, 3.f), dy = random_tensor(s, d, seed++);
      const std::vector<float> xv = x.to_floats(), dyv = dy.to_floats();
      Tensor y = testing::poisoned(s, d);
      relu_forward(x, y);
      expect_close(y.to_floats(), map_ref(xv, [](double v) { return v > 0 ? v : 0.0; }), rtol_of(d), atol_of(d),
                   label("relu_forward", d, s));
      relu_backward(x, dy, y);
      expect_close(y.to_floats(), map_ref(xv, dyv, [](double v, double g) { return v > 0 ? g : 0.0; }), rtol_of(d),
                   atol_of(d), label("relu_backward", d, s));
      gelu_forward(x, y);
      expect_close(y.to_floats(), map_ref(xv, gelu_ref), rtol_of(d), atol_of(d), label("gelu_forward", d, s));
      gelu_backward(x, dy, y);
      expect_close(y.to_floats(), map_ref(xv, dyv, [](double v, double g) { return g * gelu_grad_ref(v); }), rtol_of(d),
                   atol_of(d), label("gelu_backward", d, s));
    }
}

TEST(ElementwiseCpu, ArithmeticMatchesNaive) {
  std::uint32_t seed = 50;
  for (DType d : kFloatDtypes)
    for (const Shape& s : kShapes) {
      const Tensor a = random_tensor(s, d, seed++), b = random_tensor(s, d, seed++);
      const std::vector<float> av = a.to_floats(), bv = b.to_floats();
      Tensor out = testing::poisoned(s, d);
      add(a, b, out);
      expect_close(out.to_floats(), map_ref(av, bv, [](double u, double v) { return u + v; }), rtol_of(d), atol_of(d),
                   label("add", d, s));
      scale(a, -2.5f, out);
      expect_close(out.to_floats(), map_ref(av, [](double u) { return -2.5 * u; }), rtol_of(d), atol_of(d),
                   label("scale", d, s));
      const Tensor acc = b.clone();
      add_scaled(a, 0.375f, acc);
      expect_close(acc.to_floats(), map_ref(av, bv, [](double u, double v) { return v + 0.375 * u; }), rtol_of(d),
                   atol_of(d), label("add_scaled", d, s));
      fill(out, 1.75f);
      expect_close(out.to_floats(), std::vector<float>(av.size(), 1.75f), 0, 0, label("fill", d, s));
    }
}

TEST(ElementwiseCpu, InPlaceAliasing) {
  const Tensor x = random_tensor({33}, DType::f32, 3), y = random_tensor({33}, DType::f32, 4);
  const std::vector<float> xv = x.to_floats(), yv = y.to_floats();
  Tensor t = x.clone();
  relu_forward(t, t);
  expect_close(t.to_floats(), map_ref(xv, [](double v) { return v > 0 ? v : 0.0; }), 0, 0, "relu in place");
  t = x.clone();
  add(t, y, t);
  expect_close(t.to_floats(), map_ref(xv, yv, [](double u, double v) { return u + v; }), 1e-6, 1e-6, "add in place");
  t = x.clone();
  scale(t, 3.0f, t);
  expect_close(t.to_floats(), map_ref(xv, [](double u) { return 3 * u; }), 1e-6, 1e-6, "scale in place");
  t = y.clone();
  relu_backward(x, t, t);
  expect_close(t.to_floats(), map_ref(xv, yv, [](double v, double g) { return v > 0 ? g : 0.0; }), 0, 0,
               "relu_backward in place");
}

// loss = sum(f(x) · r) in double: d loss / dx = backward(x, dy = r).
TEST(ElementwiseCpu, ActivationBackwardMatchesFiniteDifferences) {
  const Tensor x = random_tensor({4, 5}, DType::f32, 7, -2.f, 2.f), r = random_tensor({4, 5}, DType::f32, 8);
  // relu is not differentiable at 0: keep the samples away from it.
  float* xp = x.data_as<float>();
  for (int i = 0; i < 20; ++i)
    if (std::fabs(xp[i]) < 0.05f) xp[i] = 0.5f;
  const std::vector<float> rv = r.to_floats();
  for (bool is_gelu : {false, true}) {
    auto loss = [&] {
      double s = 0;
      for (int i = 0; i < 20; ++i)
        s += (is_gelu ? gelu_ref(xp[i]) : std::max(0.0, double(xp[i]))) * rv[static_cast<std::size_t>(i)];
      return s;
    };
    const Tensor dx = testing::poisoned({4, 5}, DType::f32);
    if (is_gelu)
      gelu_backward(x, r, dx);
    else
      relu_backward(x, r, dx);
    const std::vector<double> num = testing::numeric_gradient(x, loss);
    expect_close(dx.to_floats(), std::vector<float>(num.begin(), num.end()), 1e-3, 1e-3,
                 is_gelu ? "gelu_backward vs finite differences" : "relu_backward vs finite differences");
  }
}

struct BiasCase {
  Shape shape;
  int channel_dim;
  int64_t outer, channels, inner;
};
const BiasCase kBiasCases[] = {{{7, 5}, 1, 7, 5, 1},
                               {{1, 33}, 1, 1, 33, 1},
                               {{3, 4, 5, 6}, 1, 3, 4, 30},
                               {{2, 3, 129}, -1, 6, 129, 1},
                               {{5, 3, 2}, 0, 1, 5, 6}};

TEST(ElementwiseCpu, BiasAddAndBackwardMatchNaive) {
  std::uint32_t seed = 100;
  for (DType d : kFloatDtypes)
    for (const BiasCase& c : kBiasCases) {
      const Tensor x = random_tensor(c.shape, d, seed++), bias = random_tensor({c.channels}, d, seed++);
      const std::vector<float> xv = x.to_floats(), bv = bias.to_floats();
      std::vector<float> want(xv.size());
      std::vector<double> sums(static_cast<std::size_t>(c.channels), 0.0);
      for (int64_t n = 0; n < c.outer; ++n)
        for (int64_t ch = 0; ch < c.channels; ++ch)
          for (int64_t i = 0; i < c.inner; ++i) {
            const std::size_t k = static_cast<std::size_t>((n * c.channels + ch) * c.inner + i);
            want[k] = static_cast<float>(double(xv[k]) + bv[static_cast<std::size_t>(ch)]);
            sums[static_cast<std::size_t>(ch)] += xv[k];
          }
      const std::string what =
          std::string(name_of(d)) + " " + shape_str(c.shape) + " dim " + std::to_string(c.channel_dim);
      const Tensor y = testing::poisoned(c.shape, d);
      bias_add(x, bias, c.channel_dim, y);
      expect_close(y.to_floats(), want, rtol_of(d), atol_of(d), "bias_add " + what);
      // bias_backward of x as dy: fresh, in the value dtype and in f32; then accumulated.
      for (DType gd : {d, DType::f32}) {
        const double tol = gd == DType::f32 ? 1e-5 : default_rtol(gd);
        const Tensor db = testing::poisoned({c.channels}, gd);
        bias_backward(x, c.channel_dim, db, false);
        expect_close(db.to_floats(), std::vector<float>(sums.begin(), sums.end()), tol, tol, "bias_backward " + what);
        const Tensor old = random_tensor({c.channels}, gd, seed++);
        const Tensor acc = old.clone();
        bias_backward(x, c.channel_dim, acc, true);
        std::vector<float> want_acc = old.to_floats();
        for (std::size_t i = 0; i < want_acc.size(); ++i) want_acc[i] = static_cast<float>(want_acc[i] + sums[i]);
        expect_close(acc.to_floats(), want_acc, tol, tol, "bias_backward accumulate " + what);
      }
    }
  // In place.
  const Tensor x = random_tensor({4, 3}, DType::f32, 9), b = random_tensor({3}, DType::f32, 10);
  const Tensor y = x.clone(), t = x.clone();
  bias_add(x, b, 1, y);
  bias_add(t, b, 1, t);
  expect_close(t.to_floats(), y.to_floats(), 0, 0, "bias_add in place");
}

TEST(ElementwiseCpu, BiasBackwardMatchesFiniteDifferences) {
  // loss = sum((x + bias) · r): d loss / d bias = bias_backward(r).
  const Tensor x = random_tensor({3, 4, 5}, DType::f32, 11), bias = random_tensor({4}, DType::f32, 12);
  const Tensor r = random_tensor({3, 4, 5}, DType::f32, 13);
  const std::vector<float> xv = x.to_floats(), rv = r.to_floats();
  const float* bp = bias.data_as<float>();
  auto loss = [&] {
    double s = 0;
    for (std::size_t k = 0; k < xv.size(); ++k) s += (double(xv[k]) + bp[(k / 5) % 4]) * rv[k];
    return s;
  };
  const Tensor db = testing::poisoned({4}, DType::f32);
  bias_backward(r, 1, db, false);
  const std::vector<double> num = testing::numeric_gradient(bias, loss);
  expect_close(db.to_floats(), std::vector<float>(num.begin(), num.end()), 1e-3, 1e-3,
               "bias_backward vs finite differences");
}

TEST(DropoutCpu, UniformIsUniformAndSeeded) {
  const int n = 100000;
  double sum = 0;
  int same_other_seed = 0;
  for (int i = 0; i < n; ++i) {
    const float u = dropout_uniform(42, static_cast<std::uint64_t>(i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    if (u == dropout_uniform(43, static_cast<std::uint64_t>(i))) ++same_other_seed;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
  EXPECT_LT(same_other_seed, 50);  // 2^-24 chance per element of a collision
  EXPECT_EQ(dropout_uniform(7, 123), dropout_uniform(7, 123));
  EXPECT_NE(dropout_uniform(7, 123), dropout_uniform(7, 124));
}

// y[i] = (uniform(seed, offset + i) >= p) ? x[i] / (1 - p) : 0, with the same fp32 scale.
std::vector<float> dropout_ref(const std::vector<float>& x, float p, std::uint64_t seed, std::uint64_t offset) {
  const float s = 1.0f / (1.0f - p);
  std::vector<float> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = dropout_uniform(seed, offset + i) >= p ? x[i] * s : 0.0f;
  return y;
}

TEST(DropoutCpu, ForwardAndBackwardFollowTheMask) {
  std::uint32_t seed = 200;
  for (DType d : kFloatDtypes)
    for (const Shape& s : kShapes)
      for (float p : {0.0f, 0.1f, 0.5f}) {
        const Tensor x = random_tensor(s, d, seed++);
        const Tensor y = testing::poisoned(s, d);
        dropout_forward(x, p, 1234, 77, y);
        const std::vector<float> want = dropout_ref(x.to_floats(), p, 1234, 77);
        const std::string what = label("dropout", d, s) + " p=" + std::to_string(p);
        expect_close(y.to_floats(), want, rtol_of(d), 0, what + " forward");
        // Backward applies the same mask and scale to dy.
        const Tensor dx = testing::poisoned(s, d);
        dropout_backward(x, p, 1234, 77, dx);
        expect_close(dx.to_floats(), y.to_floats(), 0, 0, what + " backward");
      }
}

TEST(DropoutCpu, DropsAboutPAndOffsetsContinueTheStream) {
  const int64_t n = 50000;
  const Tensor x = random_tensor({n}, DType::f32, 5, 0.5f, 1.5f);  // never 0, so a 0 out means dropped
  const Tensor y = Tensor::empty({n}, DType::f32);
  dropout_forward(x, 0.3f, 99, 0, y);
  const std::vector<float> yv = y.to_floats();
  int64_t dropped = 0;
  for (float v : yv) dropped += v == 0.0f;
  EXPECT_NEAR(double(dropped) / n, 0.3, 0.01);
  // The second half with offset n/2 is the second half of the whole.
  const Tensor half_y = Tensor::empty({n / 2}, DType::f32);
  dropout_forward(x.view(n / 2, {n / 2}), 0.3f, 99, n / 2, half_y);
  expect_close(half_y.to_floats(), std::vector<float>(yv.begin() + n / 2, yv.end()), 0, 0,
               "offset continues the stream");
  // Another seed, another mask.
  const Tensor y2 = Tensor::empty({n}, DType::f32);
  dropout_forward(x, 0.3f, 100, 0, y2);
  const std::vector<float> y2v = y2.to_floats();
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i)
    differ += (yv[static_cast<std::size_t>(i)] == 0.0f) != (y2v[static_cast<std::size_t>(i)] == 0.0f);
  EXPECT_GT(differ, n / 10);
}

TEST(DropoutCpu, BackwardMatchesFiniteDifferences) {
  // loss = sum(dropout(x) · r) is linear in x: d loss / dx = dropout_backward(r).
  const Tensor x = random_tensor({6, 5}, DType::f32, 21), r = random_tensor({6, 5}, DType::f32, 22);
  const std::vector<float> rv = r.to_floats();
  const float* xp = x.data_as<float>();
  auto loss = [&] {
    const std::vector<float> y = dropout_ref(std::vector<float>(xp, xp + 30), 0.4f, 5, 3);
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += double(y[i]) * rv[i];
    return s;
  };
  const Tensor dx = testing::poisoned({6, 5}, DType::f32);
  dropout_backward(r, 0.4f, 5, 3, dx);
  const std::vector<double> num = testing::numeric_gradient(x, loss);
  expect_close(dx.to_floats(), std::vector<float>(num.begin(), num.end()), 1e-3, 1e-3,
               "dropout_backward vs finite differences");
}

TEST(ElementwiseCpu, BadInputsThrowNamingTheOp) {
  using testing::expect_invalid_argument;
  const Tensor x = random_tensor({4, 3}, DType::f32, 1);
  const Tensor y = Tensor::zeros({4, 3}, DType::f32);
  const Tensor short_y = Tensor::zeros({11}, DType::f32), half_y = Tensor::zeros({4, 3}, DType::f16);
  expect_invalid_argument([&] { relu_forward(x, short_y); }, "relu_forward");
  expect_invalid_argument([&] { relu_forward(x, half_y); }, "relu_forward");
  expect_invalid_argument([&] { relu_backward(x, short_y, y); }, "relu_backward");
  expect_invalid_argument([&] { gelu_forward(x, Tensor()); }, "gelu_forward");
  expect_invalid_argument([&] { gelu_backward(x, x, half_y); }, "gelu_backward");
  expect_invalid_argument([&] { add(x, half_y, y); }, "add");
  expect_invalid_argument([&] { scale(x, 2.0f, short_y); }, "scale");
  expect_invalid_argument([&] { add_scaled(x, 2.0f, short_y); }, "add_scaled");
  expect_invalid_argument([&] { fill(Tensor::zeros({3}, DType::i32), 1.0f); }, "fill");
  expect_invalid_argument([&] { bias_add(x, Tensor::zeros({4}, DType::f32), 1, y); }, "bias_add");
  expect_invalid_argument([&] { bias_add(x, Tensor::zeros({3}, DType::f32), 2, y); }, "bias_add");
  expect_invalid_argument([&] { bias_backward(x, 1, Tensor::zeros({3}, DType::i64), false); }, "bias_backward");
  expect_invalid_argument([&] { bias_backward(x, 0, Tensor::zeros({3}, DType::f32), false); }, "bias_backward");
  expect_invalid_argument([&] { dropout_forward(x, 1.0f, 1, 0, y); }, "dropout_forward");
  expect_invalid_argument([&] { dropout_forward(x, -0.1f, 1, 0, y); }, "dropout_forward");
  expect_invalid_argument([&] { dropout_backward(x, std::nanf(""), 1, 0, y); }, "dropout_backward");
  expect_invalid_argument([&] { add(x, testing::fake_gpu_tensor(x), y); }, "add");
  expect_invalid_argument([&] { relu_forward(x, testing::fake_gpu_tensor(y)); }, "relu_forward");
  for (float v : y.to_floats()) EXPECT_EQ(v, 0.0f);
}

// ---- CUDA twin: the GPU result against the CPU one ------------------------------------

Tensor gpu(const Tensor& t) { return t.to(Device::cuda(0)); }
Tensor gpu_poisoned(const Shape& s, DType d) { return testing::poisoned(s, d, Device::cuda(0)); }

// GPU shapes: vector bodies, scalar tails, and a view one element into its storage so the
// 16-byte path must fall back (misaligned).
const Shape kGpuShapes[] = {{1}, {7}, {33}, {129}, {3, 5, 7}, {4096}, {100003}};

// Runs op on the CPU tensors and on GPU copies of them (outputs poisoned on both), and
// compares. `misaligned` makes every GPU tensor a view at element offset 1.
void twin(const std::string& what, DType d, const Shape& s, bool misaligned, int n_in,
          const std::function<void(const std::vector<Tensor>&, const Tensor&, const Stream&)>& op, double rtol,
          double atol, std::uint32_t seed) {
  std::vector<Tensor> in_cpu, in_gpu;
  auto place = [&](const Tensor& cpu_t) {
    if (!misaligned) return gpu(cpu_t);
    const Tensor big = testing::poisoned({cpu_t.numel() + 1}, d, Device::cuda(0));
    Tensor v = big.view(1, cpu_t.shape());
    v.copy_from(cpu_t);
    return v;
  };
  for (int i = 0; i < n_in; ++i) {
    in_cpu.push_back(random_tensor(s, d, seed + static_cast<std::uint32_t>(i), -2.f, 2.f));
    in_gpu.push_back(place(in_cpu.back()));
  }
  const Tensor out_cpu = testing::poisoned(s, d);
  const Tensor out_gpu = place(testing::poisoned(s, d));
  op(in_cpu, out_cpu, Stream());
  const Stream stream = Stream::create(Device::cuda(0));
  op(in_gpu, out_gpu, stream);
  stream.synchronize();
  expect_close(out_gpu.to_floats(), out_cpu.to_floats(), rtol, atol,
               "cuda " + label(what, d, s) + (misaligned ? " misaligned" : ""));
}

// ---- SwiGLU: x = [g | u] per row -> silu(g) · u ----

double silu_ref(double g) { return g / (1.0 + std::exp(-g)); }
double silu_grad_ref(double g) {
  const double s = 1.0 / (1.0 + std::exp(-g));
  return s * (1.0 + g * (1.0 - s));
}
const Shape kSwigluShapes[] = {{1, 2}, {7, 10}, {3, 5, 66}, {4, 1024}};

// y = silu(g) · u and dx = [dy · u · silu'(g) | dy · silu(g)] in double.
std::pair<std::vector<float>, std::vector<float>> swiglu_ref(const std::vector<float>& x, const std::vector<float>& dy,
                                                             int64_t F) {
  const std::size_t rows = x.size() / static_cast<std::size_t>(2 * F);
  std::vector<float> y(rows * static_cast<std::size_t>(F)), dx(x.size());
  for (std::size_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < F; ++i) {
      const std::size_t gi = r * 2 * F + i, ui = gi + F, yi = r * F + i;
      const double g = x[gi], u = x[ui], d = dy[yi];
      y[yi] = static_cast<float>(silu_ref(g) * u);
      dx[gi] = static_cast<float>(d * u * silu_grad_ref(g));
      dx[ui] = static_cast<float>(d * silu_ref(g));
    }
  return {y, dx};
}

TEST(SwigluCpu, MatchesNaive) {
  std::uint32_t seed = 600;
  for (DType d : kFloatDtypes)
    for (const Shape& s : kSwigluShapes) {
      Shape half = s;
      half.back() /= 2;
      const Tensor x = random_tensor(s, d, seed++, -6.f, 6.f), dy = random_tensor(half, d, seed++);
      const Tensor y = testing::poisoned(half, d), dx = testing::poisoned(s, d);
      swiglu_forward(x, y);
      swiglu_backward(x, dy, dx);
      const auto [y_ref, dx_ref] = swiglu_ref(x.to_floats(), dy.to_floats(), s.back() / 2);
      expect_close(y.to_floats(), y_ref, rtol_of(d) * 4, atol_of(d) * 4, label("swiglu_forward", d, s));
      expect_close(dx.to_floats(), dx_ref, rtol_of(d) * 4, atol_of(d) * 4, label("swiglu_backward", d, s));
    }
}

TEST(SwigluCpu, BackwardMatchesFiniteDifferencesAndSaturates) {
  const Tensor x = random_tensor({3, 8}, DType::f32, 5, -3.f, 3.f), r = random_tensor({3, 4}, DType::f32, 6);
  const std::vector<float> rv = r.to_floats();
  auto loss = [&] {
    const auto [y, unused] = swiglu_ref(x.to_floats(), rv, 4);
    double sum = 0;
    for (std::size_t i = 0; i < y.size(); ++i) sum += double(y[i]) * rv[i];
    return sum;
  };
  const Tensor dx = Tensor::empty({3, 8}, DType::f32);
  swiglu_backward(x, r, dx);
  const std::vector<double> numeric = testing::numeric_gradient(x, loss);
  expect_close(dx.to_floats(), std::vector<float>(numeric.begin(), numeric.end()), 2e-3, 2e-3,
               "swiglu dx vs finite differences");
  // Far out on both sides: finite; where the sigmoid underflows the gate's gradient is about 0
  // (the true one, -199 e^-200, is 1e-85; the capped e^-g leaves 1e-28 or less).
  const Tensor big = Tensor::from_floats({-200.f, 200.f, 1.f, 1.f}, {1, 4});
  const Tensor yb = Tensor::empty({1, 2}, DType::f32), db = Tensor::empty({1, 4}, DType::f32);
  swiglu_forward(big, yb);
  swiglu_backward(big, Tensor::from_floats({1.f, 1.f}, {1, 2}), db);
  const std::vector<float> yv = yb.to_floats(), dv = db.to_floats();
  EXPECT_EQ(yv[0], 0.0f);
  EXPECT_FLOAT_EQ(yv[1], 200.0f);
  EXPECT_LT(std::fabs(dv[0]), 1e-20f);
  EXPECT_FLOAT_EQ(dv[1], 1.0f);
  for (float v : dv) EXPECT_TRUE(std::isfinite(v));
}

TEST(SwigluCpu, BadInputsThrowNamingTheOp) {
  using testing::expect_invalid_argument;
  const Tensor x = random_tensor({2, 6}, DType::f32, 1);
  expect_invalid_argument(
      [&] {
        swiglu_forward(random_tensor({2, 5}, DType::f32, 2), Tensor::zeros({2, 2}, DType::f32));
      },
      "swiglu_forward");
  expect_invalid_argument([&] { swiglu_forward(x, Tensor::zeros({2, 6}, DType::f32)); }, "swiglu_forward");
  expect_invalid_argument(
      [&] {
        swiglu_backward(x, Tensor::zeros({2, 3}, DType::f32), Tensor::zeros({2, 3}, DType::f32));
      },
      "swiglu_backward");
}

TEST(SwigluCuda, MatchesCpu) {
  TUTTI_REQUIRE_GPU();
  std::uint32_t seed = 700;
  const Device g = Device::cuda(0);
  for (DType d : kFloatDtypes)
    for (const Shape& s : kSwigluShapes) {
      Shape half = s;
      half.back() /= 2;
      const Tensor x = random_tensor(s, d, seed++, -6.f, 6.f), dy = random_tensor(half, d, seed++);
      const Tensor y = Tensor::empty(half, d), dx = Tensor::empty(s, d);
      swiglu_forward(x, y);
      swiglu_backward(x, dy, dx);
      const Stream st = Stream::create(g);
      const Tensor yg = testing::poisoned(half, d, g), dxg = testing::poisoned(s, d, g);
      swiglu_forward(x.to(g), yg, st);
      swiglu_backward(x.to(g), dy.to(g), dxg, st);
      st.synchronize();
      // One ulp of the dtype: the GPU's expf may differ from the host's polynomial in the last bit.
      const double rt = d == DType::f32 ? 4e-6 : default_rtol(d), at = d == DType::f32 ? 1e-6 : default_rtol(d) * 1e-2;
      expect_close(yg.to_floats(), y.to_floats(), rt, at, label("cuda swiglu_forward", d, s));
      expect_close(dxg.to_floats(), dx.to_floats(), rt, at, label("cuda swiglu_backward", d, s));
    }
}

TEST(ElementwiseCuda, EveryOpMatchesCpu) {
  TUTTI_REQUIRE_GPU();
  using Ins = std::vector<Tensor>;
  std::uint32_t seed = 1000;
  for (DType d : kFloatDtypes)
    for (const Shape& s : kGpuShapes)
      for (bool mis : {false, true}) {
        // One ulp of the dtype: the GPU's tanhf/expf may differ from the host's in the last bit.
        const double rt = d == DType::f32 ? 2e-6 : default_rtol(d),
                     at = d == DType::f32 ? 1e-6 : default_rtol(d) * 1e-2;
        twin(
            "relu_forward", d, s, mis, 1,
            [](const Ins& in, const Tensor& o, const Stream& st) { relu_forward(in[0], o, st); }, 0, 0, seed++);
        twin(
            "relu_backward", d, s, mis, 2,
            [](const Ins& in, const Tensor& o, const Stream& st) { relu_backward(in[0], in[1], o, st); }, 0, 0, seed++);
        twin(
            "gelu_forward", d, s, mis, 1,
            [](const Ins& in, const Tensor& o, const Stream& st) { gelu_forward(in[0], o, st); }, rt, at, seed++);
        twin(
            "gelu_backward", d, s, mis, 2,
            [](const Ins& in, const Tensor& o, const Stream& st) { gelu_backward(in[0], in[1], o, st); }, rt, at,
            seed++);
        twin(
            "add", d, s, mis, 2, [](const Ins& in, const Tensor& o, const Stream& st) { add(in[0], in[1], o, st); }, 0,
            0, seed++);
        twin(
            "scale", d, s, mis, 1, [](const Ins& in, const Tensor& o, const Stream& st) { scale(in[0], 0.3f, o, st); },
            0, 0, seed++);
        twin(
            "add_scaled", d, s, mis, 2,
            [](const Ins& in, const Tensor& o, const Stream& st) {
              Tensor(o).copy_from(in[1], st);
              add_scaled(in[0], -1.5f, o, st);
            },
            rt, at, seed++);
        twin(
            "fill", d, s, mis, 0, [](const Ins&, const Tensor& o, const Stream& st) { fill(o, -0.625f, st); }, 0, 0,
            seed++);
        // Dropout: the same mask on both sides, hence (up to fp32 rounding) the same values.
        twin(
            "dropout_forward", d, s, mis, 1,
            [](const Ins& in, const Tensor& o, const Stream& st) { dropout_forward(in[0], 0.25f, 2024, 17, o, st); }, 0,
            0, seed++);
        twin(
            "dropout_backward", d, s, mis, 1,
            [](const Ins& in, const Tensor& o, const Stream& st) {
              dropout_backward(in[0], 0.6f, 7, 1ULL << 40, o, st);
            },
            0, 0, seed++);
      }
}

TEST(ElementwiseCuda, BiasAddAndBackwardMatchCpu) {
  TUTTI_REQUIRE_GPU();
  std::uint32_t seed = 2000;
  const BiasCase cases[] = {
      {{7, 5}, 1, 7, 5, 1},         {{64, 1024}, 1, 64, 1024, 1},      {{3, 4, 5, 6}, 1, 3, 4, 30},
      {{2, 3, 129}, -1, 6, 129, 1}, {{8, 16, 32, 32}, 1, 8, 16, 1024}, {{4097, 3}, 1, 4097, 3, 1}};
  for (DType d : kFloatDtypes)
    for (const BiasCase& c : cases) {
      const std::string what =
          std::string(name_of(d)) + " " + shape_str(c.shape) + " dim " + std::to_string(c.channel_dim);
      const Tensor x = random_tensor(c.shape, d, seed++), bias = random_tensor({c.channels}, d, seed++);
      const Tensor y_cpu = testing::poisoned(c.shape, d), y_gpu = gpu_poisoned(c.shape, d);
      bias_add(x, bias, c.channel_dim, y_cpu);
      bias_add(gpu(x), gpu(bias), c.channel_dim, y_gpu, Stream::default_for(Device::cuda(0)));
      expect_close(y_gpu.to_floats(), y_cpu.to_floats(), 0, 0, "cuda bias_add " + what);
      for (DType gd : {d, DType::f32})
        for (bool accumulate : {false, true}) {
          const Tensor old = random_tensor({c.channels}, gd, seed++);
          const Tensor db_cpu = accumulate ? old.clone() : testing::poisoned({c.channels}, gd);
          const Tensor db_gpu = accumulate ? gpu(old) : gpu_poisoned({c.channels}, gd);
          bias_backward(x, c.channel_dim, db_cpu, accumulate);
          bias_backward(gpu(x), c.channel_dim, db_gpu, accumulate, Stream::default_for(Device::cuda(0)));
          // Sums in another order: fp32 rounding, relative to sqrt(count) terms.
          const double tol = gd == DType::f32 ? 1e-5 * std::sqrt(double(c.outer * c.inner)) : default_rtol(gd);
          expect_close(
              db_gpu.to_floats(), db_cpu.to_floats(), tol, tol,
              "cuda bias_backward " + what + " into " + std::string(name_of(gd)) + (accumulate ? " accumulate" : ""));
        }
    }
}

TEST(DropoutCuda, MaskIdenticalToCpu) {
  TUTTI_REQUIRE_GPU();
  const int64_t n = 1 << 20;
  const Tensor x = random_tensor({n}, DType::f32, 3, 0.5f, 1.5f);  // never 0
  const Tensor y_cpu = Tensor::empty({n}, DType::f32), y_gpu = gpu_poisoned({n}, DType::f32);
  dropout_forward(x, 0.37f, 0xdeadbeefULL, 123456789ULL, y_cpu);
  dropout_forward(gpu(x), 0.37f, 0xdeadbeefULL, 123456789ULL, y_gpu, Stream::default_for(Device::cuda(0)));
  const std::vector<float> a = y_cpu.to_floats(), b = y_gpu.to_floats();
  int64_t mask_differs = 0, value_differs = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    mask_differs += (a[i] == 0.0f) != (b[i] == 0.0f);
    value_differs += a[i] != b[i];
  }
  EXPECT_EQ(mask_differs, 0);
  EXPECT_EQ(value_differs, 0);
}

}  // namespace
}  // namespace tutti::kernels
