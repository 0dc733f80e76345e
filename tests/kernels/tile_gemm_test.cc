// The tiled attention's register-tiled GEMM and transpose (kernels/cpu/tile_gemm.h) against
// plain loops: every edge of the 6 x 16 blocks (rows and columns short of a block, columns short
// of a vector), A read in place and transposed, stores and accumulation, padded strides.
#include "kernels/cpu/tile_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace tutti::kernels::cpu {
namespace {

std::vector<float> random_floats(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

struct Case {
  std::int64_t M, N, K;
  bool transposed_a, accumulate;
  float alpha;
};

// Runs one case with padded strides and checks every element of C against a double-precision sum,
// and that the padding around C is untouched.
void check(const Case& c, std::mt19937& rng) {
  const std::int64_t lda = c.K + 3, ldb = c.N + 5, ldc = c.N + 7;
  // A is [M, K] in place (rows lda apart) or stored transposed as [K, M] (rows M + 2 apart).
  const std::int64_t at_ld = c.M + 2;
  const std::vector<float> A = random_floats(static_cast<std::size_t>(std::max(c.M * lda, c.K * at_ld) + 1), rng);
  const std::vector<float> B = random_floats(static_cast<std::size_t>(std::max<std::int64_t>(c.K, 1) * ldb), rng);
  std::vector<float> C = random_floats(static_cast<std::size_t>(c.M * ldc), rng);
  const std::vector<float> before = C;
  const std::int64_t a_row = c.transposed_a ? 1 : lda, a_col = c.transposed_a ? at_ld : 1;
  if (!c.accumulate)  // not read: nan there must not reach the result
    for (std::int64_t i = 0; i < c.M; ++i)
      for (std::int64_t j = 0; j < c.N; ++j) C[static_cast<std::size_t>(i * ldc + j)] = std::nanf("");
  tile_gemm(c.M, c.N, c.K, c.alpha, A.data(), a_row, a_col, B.data(), ldb, c.accumulate, C.data(), ldc);
  for (std::int64_t i = 0; i < c.M; ++i)
    for (std::int64_t j = 0; j < ldc; ++j) {
      const auto at = static_cast<std::size_t>(i * ldc + j);
      if (j >= c.N) {
        ASSERT_EQ(C[at], before[at]) << "wrote past column " << c.N << " at row " << i;
        continue;
      }
      double sum = 0.0, magnitude = 0.0;
      for (std::int64_t k = 0; k < c.K; ++k) {
        const double term = static_cast<double>(A[static_cast<std::size_t>(i * a_row + k * a_col)]) *
                            static_cast<double>(B[static_cast<std::size_t>(k * ldb + j)]);
        sum += term;
        magnitude += std::fabs(term);
      }
      const double want = c.alpha * sum + (c.accumulate ? before[at] : 0.0);
      ASSERT_NEAR(C[at], want, 1e-6 * (magnitude + 1.0))
          << "C[" << i << ", " << j << "] of M " << c.M << " N " << c.N << " K " << c.K
          << (c.transposed_a ? " A^T" : "") << (c.accumulate ? " accumulating" : "");
    }
}

TEST(TileGemm, MatchesPlainLoopsAtEveryBlockEdge) {
  std::mt19937 rng(7);
  int cases = 0;
  for (std::int64_t M : {1, 2, 5, 6, 7, 12, 13, 32})
    for (std::int64_t N : {1, 7, 8, 9, 16, 17, 24, 33, 48})
      for (std::int64_t K : {1, 5, 32, 97})
        for (bool transposed_a : {false, true})
          for (bool accumulate : {false, true}) {
            check({M, N, K, transposed_a, accumulate, accumulate ? 1.0f : 0.37f}, rng);
            ++cases;
          }
  EXPECT_EQ(cases, 8 * 9 * 4 * 4);
}

TEST(TileGemm, EmptySumStoresZeroOrLeavesC) {
  std::vector<float> C(6 * 20, 2.5f);
  const float unused = 1.0f;
  tile_gemm(6, 20, 0, 1.0f, &unused, 1, 1, &unused, 20, true, C.data(), 20);
  for (float x : C) EXPECT_EQ(x, 2.5f);
  tile_gemm(6, 20, 0, 1.0f, &unused, 1, 1, &unused, 20, false, C.data(), 20);
  for (float x : C) EXPECT_EQ(x, 0.0f);
}

TEST(TileGemm, StridesOfWholePagesGiveTheSameResult) {
  // B's rows 4 KiB apart (k^T of 1024 keys): the strides that made the kernel copy its panels.
  std::mt19937 rng(3);
  const std::int64_t M = 13, N = 40, K = 64, ldb = 1024;
  const std::vector<float> A = random_floats(static_cast<std::size_t>(M * K), rng);
  const std::vector<float> B = random_floats(static_cast<std::size_t>(K * ldb), rng);
  std::vector<float> C(static_cast<std::size_t>(M * N));
  tile_gemm(M, N, K, 1.0f, A.data(), K, 1, B.data(), ldb, false, C.data(), N);
  for (std::int64_t i = 0; i < M; ++i)
    for (std::int64_t j = 0; j < N; ++j) {
      double sum = 0.0;
      for (std::int64_t k = 0; k < K; ++k)
        sum += static_cast<double>(A[static_cast<std::size_t>(i * K + k)]) * B[static_cast<std::size_t>(k * ldb + j)];
      ASSERT_NEAR(C[static_cast<std::size_t>(i * N + j)], sum, 1e-4);
    }
}

TEST(TransposeInto, EveryElementLandsAndNothingElseIsWritten) {
  std::mt19937 rng(11);
  for (std::int64_t rows : {1, 7, 8, 9, 16, 23, 128})
    for (std::int64_t cols : {1, 3, 8, 12, 32, 33}) {
      const std::int64_t ld_src = cols + 4, ld_dst = rows + 9;
      const std::vector<float> src = random_floats(static_cast<std::size_t>(rows * ld_src), rng);
      std::vector<float> dst(static_cast<std::size_t>(cols * ld_dst), -7.0f);
      transpose_into(src.data(), rows, cols, ld_src, dst.data(), ld_dst);
      for (std::int64_t c = 0; c < cols; ++c)
        for (std::int64_t r = 0; r < ld_dst; ++r) {
          const float got = dst[static_cast<std::size_t>(c * ld_dst + r)];
          if (r < rows)
            ASSERT_EQ(got, src[static_cast<std::size_t>(r * ld_src + c)])
                << rows << " x " << cols << " at " << r << ", " << c;
          else
            ASSERT_EQ(got, -7.0f) << "wrote past row " << rows;
        }
    }
}

}  // namespace
}  // namespace tutti::kernels::cpu
