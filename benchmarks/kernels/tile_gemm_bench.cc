// tile_gemm_bench: the tiled attention's CPU products on kernels/cpu/tile_gemm (what the tiled
// attention runs) against the same products through OpenBLAS (cpu::sgemm, what it ran before),
// at the tiles of a training step, side by side in one process, one thread.
//
// For one head of a sequence of --seq tokens, head size --head-size, tiles of --query-tile queries x
// --key-tile keys (qkv packed as the model holds it: rows of 3 x --heads x head size), one full
// tile of each product:
//   S      [queries, keys]  = q · k^T       (tile_gemm reads k^T packed once per head)
//   P v    [queries, hs]   += P · v
//   dv     [keys, hs]      += P^T · dout    (A read transposed in place)
//   dS k   [queries, hs]   += dS · k
// and the per-head transpose of k that tile_gemm's S needs (8 x 8 register blocks) against an
// element-wise loop. GFLOP/s are medians of --rounds rounds, the two interleaved in each round so
// that a noisy neighbour hits both.
//
//   OPENBLAS_NUM_THREADS=1 build/benchmarks/kernels/tile_gemm_bench --seq 128 --head-size 32 --query-tile 32 --key-tile
//   128
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <vector>

#include "common/random.h"
#include "common/stats.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/tile_gemm.h"

namespace {

using std::int64_t;
using tutti::kernels::cpu::sgemm;
using tutti::kernels::cpu::tile_gemm;
using tutti::kernels::cpu::transpose_into;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tile_gemm_bench: the tiled attention's CPU products, tile_gemm against OpenBLAS"};
  int64_t T = 128, hs = 32, heads = 4, bq = 32, bk = 128;
  int rounds = 15;
  app.add_option("--seq", T, "tokens of the sequence")->check(CLI::PositiveNumber);
  app.add_option("--head-size", hs, "head size")->check(CLI::PositiveNumber);
  app.add_option("--heads", heads, "heads (sets the stride between rows of q, k and v)")->check(CLI::PositiveNumber);
  app.add_option("--query-tile", bq, "queries per tile")->check(CLI::PositiveNumber);
  app.add_option("--key-tile", bk, "keys per tile")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "rounds (medians)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  bq = std::min(bq, T);
  bk = std::min(bk, T);

  const int64_t W = 3 * heads * hs, HC = heads * hs;  // qkv row, output row
  const std::vector<float> qkv = bench::uniform_floats(static_cast<std::size_t>(T * W), 1);
  const std::vector<float> dout = bench::uniform_floats(static_cast<std::size_t>(T * HC), 2);
  const std::vector<float> p = bench::uniform_floats(static_cast<std::size_t>(bq * bk), 3);
  std::vector<float> kt(static_cast<std::size_t>(hs * T)), s(static_cast<std::size_t>(bq * bk));
  std::vector<float> acc(static_cast<std::size_t>(bq * hs)), dkv(static_cast<std::size_t>(bk * hs));
  std::vector<float> dq(static_cast<std::size_t>(T * W));
  const float* q = qkv.data();
  const float* k = qkv.data() + HC;
  const float* v = qkv.data() + 2 * HC;
  transpose_into(k, T, hs, W, kt.data(), T);

  struct Product {
    const char* name;
    int64_t M, N, K;
    std::function<void()> tiled, blas;
  };
  const float scale = 0.125f;
  const std::vector<Product> products = {
      {"S = q k^T", bq, bk, hs, [&] { tile_gemm(bq, bk, hs, scale, q, W, 1, kt.data(), T, false, s.data(), bk); },
       [&] { sgemm(false, true, bq, bk, hs, scale, q, W, k, W, 0.0f, s.data(), bk); }},
      {"P v", bq, hs, bk, [&] { tile_gemm(bq, hs, bk, 1.0f, p.data(), bk, 1, v, W, true, acc.data(), hs); },
       [&] { sgemm(false, false, bq, hs, bk, 1.0f, p.data(), bk, v, W, 1.0f, acc.data(), hs); }},
      {"dv += P^T dout", bk, hs, bq,
       [&] { tile_gemm(bk, hs, bq, 1.0f, p.data(), 1, bk, dout.data(), HC, true, dkv.data(), hs); },
       [&] { sgemm(true, false, bk, hs, bq, 1.0f, p.data(), bk, dout.data(), HC, 1.0f, dkv.data(), hs); }},
      {"dq += dS k", bq, hs, bk, [&] { tile_gemm(bq, hs, bk, 1.0f, p.data(), bk, 1, k, W, true, dq.data(), W); },
       [&] { sgemm(false, false, bq, hs, bk, 1.0f, p.data(), bk, k, W, 1.0f, dq.data(), W); }},
  };
  // About 2 ms of each per round.
  auto inner_for = [](double flops) { return std::max(1, static_cast<int>(2e-3 * 60e9 / flops)); };

  std::printf("tile_gemm_bench: T %lld, head size %lld, %lld heads, tiles %lld x %lld, medians of %d rounds\n",
              static_cast<long long>(T), static_cast<long long>(hs), static_cast<long long>(heads),
              static_cast<long long>(bq), static_cast<long long>(bk), rounds);
  std::printf("%-16s %5s %5s %5s %12s %12s %7s\n", "product", "M", "N", "K", "tile_gemm", "OpenBLAS", "ratio");
  for (const Product& pr : products) {
    const double flops = 2.0 * static_cast<double>(pr.M * pr.N * pr.K);
    const int inner = inner_for(flops);
    std::vector<double> tiled, blas;
    for (int r = 0; r < rounds; ++r) {
      tiled.push_back(bench::seconds_per_call(pr.tiled, inner));
      blas.push_back(bench::seconds_per_call(pr.blas, inner));
    }
    const double a = bench::median(tiled), b = bench::median(blas);
    std::printf("%-16s %5lld %5lld %5lld %7.1f GF/s %7.1f GF/s %6.2fx\n", pr.name, static_cast<long long>(pr.M),
                static_cast<long long>(pr.N), static_cast<long long>(pr.K), flops / a / 1e9, flops / b / 1e9, b / a);
  }
  // The transpose of one head's keys.
  auto element_wise = [&] {
    for (int64_t r = 0; r < T; ++r)
      for (int64_t c = 0; c < hs; ++c) kt[static_cast<std::size_t>(c * T + r)] = k[r * W + c];
  };
  const int inner = std::max(1, static_cast<int>(2e-3 / (1e-9 * static_cast<double>(T * hs))));
  std::vector<double> blocked, plain;
  for (int r = 0; r < rounds; ++r) {
    blocked.push_back(bench::seconds_per_call([&] { transpose_into(k, T, hs, W, kt.data(), T); }, inner));
    plain.push_back(bench::seconds_per_call(element_wise, inner));
  }
  const double a = bench::median(blocked), b = bench::median(plain);
  std::printf("%-16s %5lld %5lld %5s %7.2f ns/el %6.2f ns/el %6.2fx\n", "k^T (transpose)", static_cast<long long>(T),
              static_cast<long long>(hs), "", a * 1e9 / static_cast<double>(T * hs),
              b * 1e9 / static_cast<double>(T * hs), b / a);
  return 0;
}
