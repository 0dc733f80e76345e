// Embedding family: CPU against a naive double-precision gather and scatter-add; the CUDA
// twin against the CPU, and its scatter-add run twice for the same bits (deterministic). A table
// split by rows (the vocabulary-parallel case) against the whole one, on both.
#include "tutti/kernels/embedding.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
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

// Tokens in [0, V): with few distinct values, so that tokens repeat (the scatter-add's case).
Tensor random_tokens(int64_t B, int64_t T, int64_t V, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> dist(0, V - 1);
  std::vector<int64_t> v(static_cast<std::size_t>(B * T));
  for (auto& x : v) x = dist(rng);
  return Tensor::from_ints(v, {B, T}, DType::i32);
}

struct Case {
  int64_t B, T, Tmax, V, C;
};
const Case kCases[] = {{1, 1, 1, 1, 1}, {2, 5, 7, 3, 8}, {3, 17, 17, 50, 12}, {4, 33, 40, 7, 33}};

std::string name_of(const Case& c, DType d) {
  return std::string(tutti::name_of(d)) + " B" + std::to_string(c.B) + " T" + std::to_string(c.T) + " V" +
         std::to_string(c.V) + " C" + std::to_string(c.C);
}

TEST(EmbeddingCpu, ForwardMatchesNaive) {
  std::uint32_t seed = 1;
  for (DType d : kFloatDtypes)
    for (const Case& c : kCases) {
      const Tensor tok = random_tokens(c.B, c.T, c.V, seed++);
      const Tensor wte = random_tensor({c.V, c.C}, d, seed++), wpe = random_tensor({c.Tmax, c.C}, d, seed++);
      const Tensor out = testing::poisoned({c.B, c.T, c.C}, d);
      embedding_forward(tok, wte, wpe, out);
      const std::vector<std::int64_t> t = tok.to_ints();
      const std::vector<float> e = wte.to_floats(), p = wpe.to_floats();
      std::vector<float> want;
      for (int64_t n = 0; n < c.B * c.T; ++n)
        for (int64_t k = 0; k < c.C; ++k)
          want.push_back(
              static_cast<float>(double(e[static_cast<std::size_t>(t[static_cast<std::size_t>(n)] * c.C + k)]) +
                                 p[static_cast<std::size_t>((n % c.T) * c.C + k)]));
      expect_close(out.to_floats(), want, default_rtol(d), default_rtol(d), "out " + name_of(c, d));
    }
}

// The naive gradients in double: dwte[v] = sum of dout rows at v's positions, dwpe[t] = sum
// over the batch; plus the old values when accumulating.
void naive_backward(const Tensor& tok, const Tensor& dout, const Case& c, std::vector<double>& dwte,
                    std::vector<double>& dwpe) {
  const std::vector<std::int64_t> t = tok.to_ints();
  const std::vector<float> g = dout.to_floats();
  for (int64_t n = 0; n < c.B * c.T; ++n)
    for (int64_t k = 0; k < c.C; ++k) {
      const double v = g[static_cast<std::size_t>(n * c.C + k)];
      dwte[static_cast<std::size_t>(t[static_cast<std::size_t>(n)] * c.C + k)] += v;
      dwpe[static_cast<std::size_t>((n % c.T) * c.C + k)] += v;
    }
}

TEST(EmbeddingCpu, BackwardMatchesNaiveAndAccumulates) {
  std::uint32_t seed = 100;
  for (DType d : kFloatDtypes)
    for (DType gd : {d, DType::f32})
      for (const Case& c : kCases)
        for (bool accumulate : {false, true}) {
          if (d == DType::f32 && gd != d) continue;
          const Tensor tok = random_tokens(c.B, c.T, c.V, seed++);
          const Tensor dout = random_tensor({c.B, c.T, c.C}, d, seed++);
          const Tensor old_e = random_tensor({c.V, c.C}, gd, seed++), old_p = random_tensor({c.Tmax, c.C}, gd, seed++);
          const Tensor dwte = accumulate ? old_e.clone() : testing::poisoned({c.V, c.C}, gd);
          const Tensor dwpe = accumulate ? old_p.clone() : testing::poisoned({c.Tmax, c.C}, gd);
          embedding_backward(tok, dout, dwte, dwpe, accumulate);
          std::vector<double> we(static_cast<std::size_t>(c.V * c.C), 0.0),
              wp(static_cast<std::size_t>(c.Tmax * c.C), 0.0);
          if (accumulate) {
            const std::vector<float> oe = old_e.to_floats(), op = old_p.to_floats();
            we.assign(oe.begin(), oe.end());
            wp.assign(op.begin(), op.end());
          }
          naive_backward(tok, dout, c, we, wp);
          const std::string what =
              name_of(c, d) + " grads " + std::string(tutti::name_of(gd)) + (accumulate ? " accumulate" : "");
          const double tol = 2 * default_rtol(gd) * std::sqrt(double(c.B * c.T));
          expect_close(dwte.to_floats(), std::vector<float>(we.begin(), we.end()), tol, tol, "dwte " + what);
          expect_close(dwpe.to_floats(), std::vector<float>(wp.begin(), wp.end()), tol, tol, "dwpe " + what);
        }
}

TEST(EmbeddingCpu, GradientsAreOptionalAndFiniteDifferencesAgree) {
  // loss = sum(out · r): linear in wte and wpe, so its finite differences are the gradients.
  const Case c{2, 3, 4, 5, 3};
  const Tensor tok = random_tokens(c.B, c.T, c.V, 3);
  const Tensor wte = random_tensor({c.V, c.C}, DType::f32, 4), wpe = random_tensor({c.Tmax, c.C}, DType::f32, 5);
  const Tensor r = random_tensor({c.B, c.T, c.C}, DType::f32, 6);
  const Tensor out = Tensor::empty({c.B, c.T, c.C}, DType::f32);
  auto loss = [&] {
    embedding_forward(tok, wte, wpe, out);
    double s = 0;
    const std::vector<float> o = out.to_floats(), rv = r.to_floats();
    for (std::size_t i = 0; i < o.size(); ++i) s += double(o[i]) * rv[i];
    return s;
  };
  const Tensor dwte = testing::poisoned({c.V, c.C}, DType::f32), dwpe = testing::poisoned({c.Tmax, c.C}, DType::f32);
  embedding_backward(tok, r, dwte, Tensor(), false);
  embedding_backward(tok, r, Tensor(), dwpe, false);
  const auto to_f = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  expect_close(dwte.to_floats(), to_f(testing::numeric_gradient(wte, loss)), 1e-3, 1e-3, "dwte vs finite differences");
  expect_close(dwpe.to_floats(), to_f(testing::numeric_gradient(wpe, loss)), 1e-3, 1e-3, "dwpe vs finite differences");
}

TEST(EmbeddingCpu, BadInputsThrowNamingTheOp) {
  using testing::expect_invalid_argument;
  const Tensor tok = Tensor::from_ints({0, 1, 2, 3}, {2, 2}, DType::i32);
  const Tensor wte = random_tensor({4, 3}, DType::f32, 1), wpe = random_tensor({2, 3}, DType::f32, 2);
  const Tensor out = Tensor::zeros({2, 2, 3}, DType::f32);
  const char* fwd = "embedding_forward";
  expect_invalid_argument(
      [&] {
        embedding_forward(Tensor::from_ints({0, 1, 2, 4}, {2, 2}, DType::i32), wte, wpe, out);
      },
      fwd);
  expect_invalid_argument(
      [&] {
        embedding_forward(Tensor::from_ints({0, -1, 2, 3}, {2, 2}, DType::i32), wte, wpe, out);
      },
      fwd);
  expect_invalid_argument(
      [&] {
        embedding_forward(Tensor::from_ints({0, 1, 2, 3}, {2, 2}, DType::i64), wte, wpe, out);
      },
      fwd);
  expect_invalid_argument(
      [&] {
        embedding_forward(tok, wte, random_tensor({1, 3}, DType::f32, 3), out);
      },
      fwd);  // T > T_max
  expect_invalid_argument([&] { embedding_forward(tok, wte, wpe, Tensor::zeros({2, 2, 4}, DType::f32)); }, fwd);
  expect_invalid_argument([&] { embedding_forward(tok, wte, random_tensor({2, 3}, DType::bf16, 3), out); }, fwd);
  for (float v : out.to_floats()) EXPECT_EQ(v, 0.0f);
  const char* bwd = "embedding_backward";
  const Tensor dwte = Tensor::zeros({4, 3}, DType::f32);
  expect_invalid_argument(
      [&] {
        embedding_backward(Tensor::from_ints({0, 1, 2, 9}, {2, 2}, DType::i32), out, dwte, Tensor(), false);
      },
      bwd);
  expect_invalid_argument(
      [&] {
        embedding_backward(tok, Tensor::zeros({2, 3, 3}, DType::f32), dwte, Tensor(), false);
      },
      bwd);
  expect_invalid_argument(
      [&] {
        embedding_backward(tok, out, Tensor::zeros({4, 2}, DType::f32), Tensor(), false);
      },
      bwd);
  for (float v : dwte.to_floats()) EXPECT_EQ(v, 0.0f);
}

// ---- CUDA twin ----------------------------------------------------------------------------

// The table's rows split over `parts` "ranks" ([cuts[i], cuts[i + 1])): the parts' outputs, the
// positions added by part 0 only, sum to the whole lookup, and each part's gradient is its rows of
// the whole gradient, on `device` against the CPU's whole table. With a small table some parts
// hold no row (part 0 still adds the positions).
void expect_split_rows_match_whole(Device device) {
  const Stream s = device.is_cpu() ? Stream() : Stream::default_for(device);
  std::uint32_t seed = 700;
  for (const Case& c : kCases)
    for (int parts : {1, 2, 3}) {
      const Tensor tok = random_tokens(c.B, c.T, c.V, seed++);
      const Tensor wte = random_tensor({c.V, c.C}, DType::f32, seed++),
                   wpe = random_tensor({c.Tmax, c.C}, DType::f32, seed++);
      const Tensor dout = random_tensor({c.B, c.T, c.C}, DType::f32, seed++);
      const Tensor out = Tensor::empty({c.B, c.T, c.C}, DType::f32);
      embedding_forward(tok, wte, wpe, out);
      const Tensor dwte = Tensor::zeros({c.V, c.C}, DType::f32);
      embedding_backward(tok, dout, dwte, Tensor(), false);
      const std::vector<float> w = wte.to_floats(), g = dwte.to_floats();
      std::vector<float> sum(static_cast<std::size_t>(out.numel()), 0.0f);
      const std::string what = name_of(c, DType::f32) + " parts " + std::to_string(parts) + " on " + device.str();
      for (int p = 0; p < parts; ++p) {
        const int64_t first = c.V * p / parts, last = c.V * (p + 1) / parts, rows = last - first;
        const std::vector<float> mine(w.begin() + first * c.C, w.begin() + last * c.C);
        const Tensor part = Tensor::from_floats(mine, {rows, c.C}).to(device);
        const Tensor part_out = testing::poisoned({c.B, c.T, c.C}, DType::f32, device);
        embedding_forward(tok.to(device), part, p == 0 ? wpe.to(device) : Tensor(), part_out, {first, c.V}, s);
        const std::vector<float> o = part_out.to_floats();
        for (std::size_t i = 0; i < o.size(); ++i) sum[i] += o[i];
        const Tensor part_grad = testing::poisoned({rows, c.C}, DType::f32, device);
        embedding_backward(tok.to(device), dout.to(device), part_grad, Tensor(), false, {first, c.V}, s);
        expect_close(part_grad.to_floats(), std::vector<float>(g.begin() + first * c.C, g.begin() + last * c.C), 1e-6,
                     1e-6, "dwte rows " + std::to_string(first) + ".." + std::to_string(last) + " " + what);
      }
      expect_close(sum, out.to_floats(), 1e-6, 1e-6, "the parts' sum " + what);
    }
}

TEST(EmbeddingCpu, SplitRowsSumToTheWholeLookup) {
  expect_split_rows_match_whole(Device::cpu());
  // The whole table's range is checked, and a slice must lie within it.
  const Tensor tok = Tensor::from_ints({0, 5, 2, 9}, {2, 2}, DType::i32);
  const Tensor part = random_tensor({4, 3}, DType::f32, 1), out = Tensor::empty({2, 2, 3}, DType::f32);
  EXPECT_NO_THROW(embedding_forward(tok, part, Tensor(), out, {4, 10}));
  EXPECT_THROW(embedding_forward(tok, part, Tensor(), out, {4, 9}), InvalidArgument);   // 9 is out of [0, 9)
  EXPECT_THROW(embedding_forward(tok, part, Tensor(), out, {8, 10}), InvalidArgument);  // rows 8..12 of 10
  EXPECT_THROW(embedding_forward(tok, part, Tensor(), out, {2, 0}), InvalidArgument);   // first without total
}

Tensor gpu(const Tensor& t) { return t.to(Device::cuda(0)); }

// The last case has 2100 positions: its sort (padded to 4096 keys) takes global merge steps
// as well as the shared-memory ones; tokens drawn from 7 values repeat hundreds of times.
const Case kGpuCases[] = {{1, 1, 1, 1, 1}, {2, 5, 7, 3, 8}, {3, 17, 17, 50, 40}, {3, 700, 700, 7, 5}};

TEST(EmbeddingCuda, ForwardAndBackwardMatchCpuAndAreDeterministic) {
  TUTTI_REQUIRE_GPU();
  std::uint32_t seed = 1000;
  for (DType d : kFloatDtypes)
    for (const Case& c : kGpuCases)
      for (DType gd : {d, DType::f32})
        for (bool accumulate : {false, true}) {
          if (d == DType::f32 && gd != d) continue;
          const Tensor tok = random_tokens(c.B, c.T, c.V, seed++);
          const Tensor wte = random_tensor({c.V, c.C}, d, seed++), wpe = random_tensor({c.Tmax, c.C}, d, seed++);
          const Tensor dout = random_tensor({c.B, c.T, c.C}, d, seed++);
          const Tensor old_e = random_tensor({c.V, c.C}, gd, seed++), old_p = random_tensor({c.Tmax, c.C}, gd, seed++);
          const std::string what =
              name_of(c, d) + " grads " + std::string(tutti::name_of(gd)) + (accumulate ? " accumulate" : "");

          const Tensor out_c = Tensor::empty({c.B, c.T, c.C}, d);
          embedding_forward(tok, wte, wpe, out_c);
          const Tensor dwte_c = old_e.clone(), dwpe_c = old_p.clone();
          embedding_backward(tok, dout, dwte_c, dwpe_c, accumulate);

          const Stream st = Stream::create(Device::cuda(0));
          const Tensor out_g = testing::poisoned({c.B, c.T, c.C}, d, Device::cuda(0));
          embedding_forward(gpu(tok), gpu(wte), gpu(wpe), out_g, {}, st);
          std::vector<std::vector<float>> runs;
          for (int run = 0; run < 2; ++run) {
            const Tensor dwte_g = accumulate ? gpu(old_e) : testing::poisoned({c.V, c.C}, gd, Device::cuda(0));
            const Tensor dwpe_g = accumulate ? gpu(old_p) : testing::poisoned({c.Tmax, c.C}, gd, Device::cuda(0));
            embedding_backward(gpu(tok), gpu(dout), dwte_g, dwpe_g, accumulate, {}, st);
            st.synchronize();
            const double tol = 2 * default_rtol(gd) * std::sqrt(double(c.B * c.T));
            expect_close(dwte_g.to_floats(), dwte_c.to_floats(), tol, tol, "cuda dwte " + what);
            expect_close(dwpe_g.to_floats(), dwpe_c.to_floats(), tol, tol, "cuda dwpe " + what);
            runs.push_back(dwte_g.to_floats());
          }
          expect_close(out_g.to_floats(), out_c.to_floats(), 0, 0, "cuda out " + what);
          // Same inputs, same bits.
          ASSERT_EQ(runs[0].size(), runs[1].size());
          EXPECT_EQ(0, std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * sizeof(float))) << what;
        }
}

TEST(EmbeddingCuda, SplitRowsSumToTheWholeLookup) {
  TUTTI_REQUIRE_GPU();
  expect_split_rows_match_whole(Device::cuda(0));
}

TEST(EmbeddingCuda, TokenOutOfRangeGivesNanRowsAndNoGradient) {
  TUTTI_REQUIRE_GPU();
  const Tensor tok = Tensor::from_ints({0, 9, 1, -3}, {2, 2}, DType::i32);
  const Tensor wte = random_tensor({3, 4}, DType::f32, 1), wpe = random_tensor({2, 4}, DType::f32, 2);
  const Tensor out = Tensor::zeros({2, 2, 4}, DType::f32, Device::cuda(0));
  embedding_forward(gpu(tok), gpu(wte), gpu(wpe), out, {}, Stream::default_for(Device::cuda(0)));
  const std::vector<float> o = out.to_floats();
  for (int64_t n = 0; n < 4; ++n)
    for (int64_t k = 0; k < 4; ++k) {
      const bool bad = n == 1 || n == 3;
      EXPECT_EQ(std::isnan(o[static_cast<std::size_t>(n * 4 + k)]), bad) << n << " " << k;
    }
  const Tensor dout = Tensor::from_floats(std::vector<float>(16, 1.0f), {2, 2, 4});
  const Tensor dwte = testing::poisoned({3, 4}, DType::f32, Device::cuda(0));
  embedding_backward(gpu(tok), gpu(dout), dwte, Tensor(), false, {}, Stream::default_for(Device::cuda(0)));
  std::vector<float> want(12, 0.0f);
  for (int k = 0; k < 4; ++k) want[static_cast<std::size_t>(k)] = 1.0f, want[static_cast<std::size_t>(4 + k)] = 1.0f;
  expect_close(dwte.to_floats(), want, 0, 0, "dwte skips the tokens out of range");
}

}  // namespace
}  // namespace tutti::kernels
