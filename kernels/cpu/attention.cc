#include "kernels/cpu/attention.h"

#include <cblas.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"

namespace tutti::kernels::cpu {
namespace {

using std::int64_t;

// Row-major C[M, N] = alpha · op(A) · op(B) on fp32 memory with explicit leading dimensions
// (the heads are column blocks of the packed qkv rows: ld 3C, no copy). beta = 0: OpenBLAS
// does not read C then (the tests poison every output with nan to hold it to that).
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(M),
              static_cast<blasint>(N), static_cast<blasint>(K), alpha, A, static_cast<blasint>(lda), B,
              static_cast<blasint>(ldb), 0.0f, C, static_cast<blasint>(ldc));
}

// Row i of the T x T scores s keeps columns j <= i: softmax over those (max subtracted), 0
// after them. Compute-bound on exp_f32: compiled per vector width.
TUTTI_CPU_SIMD_CLONES void causal_softmax(float* s, int64_t T) {
  const ExpBounds bounds = exp_bounds();
  for (int64_t i = 0; i < T; ++i) {
    float* row = s + i * T;
    const int64_t n = i + 1;
    const float mx = max_f32(row, n);
    for (int64_t j = 0; j < n; ++j) row[j] = exp_f32(row[j] - mx, bounds);
    const float inv = 1.0f / sum_f32(row, n);
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
    for (int64_t j = n; j < T; ++j) row[j] = 0.0f;
  }
}

// dS = P ⊙ (dP - rowsum(P ⊙ dP)) · scale over j <= i, 0 after (in place in dp).
TUTTI_CPU_SIMD_CLONES void causal_softmax_backward(const float* p, float* dp, int64_t T, float scale) {
  for (int64_t i = 0; i < T; ++i) {
    const float* pr = p + i * T;
    float* dr = dp + i * T;
    const int64_t n = i + 1;
    const float d = sum_lanes(n, [pr, dr](int64_t j) { return pr[j] * dr[j]; });
    for (int64_t j = 0; j < n; ++j) dr[j] = pr[j] * (dr[j] - d) * scale;
    for (int64_t j = n; j < T; ++j) dr[j] = 0.0f;
  }
}

}  // namespace

void attention_forward(const Tensor& qkv, int64_t heads, const Tensor& out, const Tensor& probs) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3, hs = C / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const F32Buffer QKV(qkv, true), O(out, false), P(probs, false);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      const float* q = QKV.data() + b * T * 3 * C + h * hs;
      float* p = P.data() + (b * heads + h) * T * T;
      gemm(false, true, T, T, hs, scale, q, 3 * C, q + C, 3 * C, p, T);  // S = q k^T / sqrt(hs)
      causal_softmax(p, T);
      gemm(false, false, T, hs, T, 1.0f, p, T, q + 2 * C, 3 * C, O.data() + b * T * C + h * hs, C);  // P v
    }
  O.store();
  P.store();
}

void attention_backward(const Tensor& qkv, const Tensor& probs, const Tensor& dout, int64_t heads,
                        const Tensor& dqkv) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3, hs = C / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const F32Buffer QKV(qkv, true), P(probs, true), DO(dout, true), DQKV(dqkv, false);
  std::vector<float> dp(static_cast<std::size_t>(T * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      const float* q = QKV.data() + b * T * 3 * C + h * hs;
      const float* p = P.data() + (b * heads + h) * T * T;
      const float* dy = DO.data() + b * T * C + h * hs;
      float* dq = DQKV.data() + b * T * 3 * C + h * hs;
      gemm(false, true, T, T, hs, 1.0f, dy, C, q + 2 * C, 3 * C, dp.data(), T);  // dP = dy v^T
      gemm(true, false, T, hs, T, 1.0f, p, T, dy, C, dq + 2 * C, 3 * C);          // dv = P^T dy
      causal_softmax_backward(p, dp.data(), T, scale);                           // dS
      gemm(false, false, T, hs, T, 1.0f, dp.data(), T, q + C, 3 * C, dq, 3 * C);  // dq = dS k
      gemm(true, false, T, hs, T, 1.0f, dp.data(), T, q, 3 * C, dq + C, 3 * C);   // dk = dS^T q
    }
  DQKV.store();
}

}  // namespace tutti::kernels::cpu
