#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/gemm.h"

namespace tutti::kernels::cpu {
namespace {

using std::int64_t;

// Row-major C[M, N] = alpha · op(A) · op(B), C not read (gemm.h), with explicit leading dimensions
// (the heads are column blocks of the packed qkv rows: ld 3C, no copy); the tests poison every
// output with nan to hold it to that.
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
          int64_t ldb, float* C, int64_t ldc) {
  sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, 0.0f, C, ldc);
}

// Rows [first, first + rows) of a T x T score matrix (s points at row `first`): row i keeps
// columns j <= i, softmax over those (max subtracted), 0 after them. Compute-bound on
// exp_f32: compiled per vector width.
TUTTI_CPU_SIMD_CLONES void causal_softmax(float* s, int64_t first, int64_t rows, int64_t T) {
  const ExpBounds bounds = exp_bounds();
  for (int64_t i = first; i < first + rows; ++i) {
    float* row = s + (i - first) * T;
    const int64_t n = i + 1;
    const float mx = max_f32(row, n);
    for (int64_t j = 0; j < n; ++j) row[j] = exp_f32(row[j] - mx, bounds);
    const float inv = 1.0f / sum_f32(row, n);
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
    for (int64_t j = n; j < T; ++j) row[j] = 0.0f;
  }
}

// dS = P ⊙ (dP - rowsum(P ⊙ dP)) · scale over j <= i, 0 after (in place in dp), for rows
// [first, first + rows) (p and dp point at row `first`).
TUTTI_CPU_SIMD_CLONES void causal_softmax_backward(const float* p, float* dp, int64_t first, int64_t rows, int64_t T,
                                                   float scale) {
  for (int64_t i = first; i < first + rows; ++i) {
    const float* pr = p + (i - first) * T;
    float* dr = dp + (i - first) * T;
    const int64_t n = i + 1;
    const float d = sum_lanes(n, [pr, dr](int64_t j) { return pr[j] * dr[j]; });
    for (int64_t j = 0; j < n; ++j) dr[j] = pr[j] * (dr[j] - d) * scale;
    for (int64_t j = n; j < T; ++j) dr[j] = 0.0f;
  }
}

}  // namespace

// The causal mask leaves the upper triangle of every T x T product zero, so the rows (and,
// for the transposed products, the columns) go in blocks of kBlock: block [r0, r1) needs
// only columns [0, r1). With T = 128, 62.5% of the full products' FLOPs.
constexpr int64_t kBlock = 32;

void attention_forward(const Tensor& qkv, int64_t heads, const Tensor& out, const Tensor& probs) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3, hs = C / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const F32Buffer QKV(qkv, true), O(out, false), P(probs, false);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      const float* q = QKV.data() + b * T * 3 * C + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* p = P.data() + (b * heads + h) * T * T;
      float* o = O.data() + b * T * C + h * hs;
      for (int64_t r0 = 0; r0 < T; r0 += kBlock) {
        const int64_t r1 = std::min(T, r0 + kBlock), rows = r1 - r0;
        gemm(false, true, rows, r1, hs, scale, q + r0 * 3 * C, 3 * C, k, 3 * C, p + r0 * T, T);  // S = q k^T / sqrt(hs)
        causal_softmax(p + r0 * T, r0, rows, T);
        gemm(false, false, rows, hs, r1, 1.0f, p + r0 * T, T, v, 3 * C, o + r0 * C, C);  // P v
      }
    }
  O.store();
  P.store();
}

void attention_backward(const Tensor& qkv, const Tensor& probs, const Tensor& dout, int64_t heads, const Tensor& dqkv) {
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3, hs = C / heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const F32Buffer QKV(qkv, true), P(probs, true), DO(dout, true), DQKV(dqkv, false);
  std::vector<float> dp(static_cast<std::size_t>(T * T));
  float* ds = dp.data();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < heads; ++h) {
      const float* q = QKV.data() + b * T * 3 * C + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      const float* p = P.data() + (b * heads + h) * T * T;
      const float* dy = DO.data() + b * T * C + h * hs;
      float* dq = DQKV.data() + b * T * 3 * C + h * hs;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      for (int64_t r0 = 0; r0 < T; r0 += kBlock) {  // by rows: dP, dS, dq
        const int64_t r1 = std::min(T, r0 + kBlock), rows = r1 - r0;
        gemm(false, true, rows, r1, hs, 1.0f, dy + r0 * C, C, v, 3 * C, ds + r0 * T, T);           // dP = dy v^T
        causal_softmax_backward(p + r0 * T, ds + r0 * T, r0, rows, T, scale);                      // dS
        gemm(false, false, rows, hs, r1, 1.0f, ds + r0 * T, T, k, 3 * C, dq + r0 * 3 * C, 3 * C);  // dq = dS k
      }
      for (int64_t c0 = 0; c0 < T; c0 += kBlock) {  // by columns: dv, dk (rows before c0 are 0 there)
        const int64_t c1 = std::min(T, c0 + kBlock), cols = c1 - c0, rows = T - c0;
        gemm(true, false, cols, hs, rows, 1.0f, p + c0 * T + c0, T, dy + c0 * C, C, dv + c0 * 3 * C, 3 * C);  // P^T dy
        gemm(true, false, cols, hs, rows, 1.0f, ds + c0 * T + c0, T, q + c0 * 3 * C, 3 * C, dk + c0 * 3 * C,
             3 * C);  // dS^T q
      }
    }
  DQKV.store();
}

}  // namespace tutti::kernels::cpu
