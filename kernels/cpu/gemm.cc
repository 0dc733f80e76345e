#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>

namespace tutti::kernels::cpu {

void sgemm(bool transpose_a, bool transpose_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
           const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (beta == 0.0f || K == 0) {
    // Nothing read from C: zeroed (or, for K = 0, where BLAS implementations differ, scaled).
    for (std::int64_t i = 0; i < M; ++i) {
      float* row = C + i * ldc;
      if (beta == 0.0f)
        std::fill(row, row + N, 0.0f);
      else
        for (std::int64_t j = 0; j < N; ++j) row[j] *= beta;
    }
    if (K == 0) return;
    beta = 1.0f;  // OpenBLAS skips its scaling pass for beta 1
  }
  auto blas = [](std::int64_t v) { return static_cast<blasint>(std::max<std::int64_t>(1, v)); };
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(M), static_cast<blasint>(N), static_cast<blasint>(K), alpha, A, blas(lda), B,
              blas(ldb), beta, C, blas(ldc));
}

}  // namespace tutti::kernels::cpu
