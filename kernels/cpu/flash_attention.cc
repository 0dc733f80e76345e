#include "kernels/cpu/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/common.h"
#include "kernels/cpu/tile_gemm.h"

namespace tutti::kernels::cpu {
namespace {

using std::int64_t;

// How many of a tile's `cols` keys, the first of which is key `first_col`, query t may see
// (keys s <= t): 0 when the whole tile is after it.
inline int64_t visible(int64_t t, int64_t first_col, int64_t cols) {
  return std::clamp<int64_t>(t - first_col + 1, 0, cols);
}

// The online softmax's step for one tile of scaled scores s [rows, ld] (query t = first_row + i
// on row i, key first_col + j in column j): each row's running max m and sum l take in the
// tile, the row's accumulated output acc [rows, hs] is rescaled to the new max, and s becomes
// the tile's unnormalized probabilities exp(s - m) (0 for the keys the row may not see), ready
// for acc += s · v. Compute-bound on exp_f32: compiled per vector width.
TUTTI_CPU_SIMD_CLONES void online_softmax_tile(float* s, int64_t ld, int64_t rows, int64_t cols, int64_t first_row,
                                               int64_t first_col, float* m, float* l, float* acc, int64_t hs) {
  const ExpBounds bounds = exp_bounds();
  for (int64_t i = 0; i < rows; ++i) {
    float* row = s + i * ld;
    const int64_t n = visible(first_row + i, first_col, cols);
    for (int64_t j = n; j < cols; ++j) row[j] = 0.0f;
    if (n == 0) continue;  // nothing new for this row: m, l and acc stay
    const float mx = std::max(m[i], max_f32(row, n));
    // The first tile has m = -inf: alpha = e^-inf = 0 scales the (zero) accumulator.
    const float alpha = exp_f32(m[i] - mx, bounds);
    for (int64_t j = 0; j < n; ++j) row[j] = exp_f32(row[j] - mx, bounds);
    l[i] = l[i] * alpha + sum_f32(row, n);
    m[i] = mx;
    float* a = acc + i * hs;
    for (int64_t c = 0; c < hs; ++c) a[c] *= alpha;
  }
}

// Backward's recomputed probabilities of one tile: p = exp(s - lse[t]) for the keys query t
// sees, 0 after them (s holds the scaled scores and becomes p).
TUTTI_CPU_SIMD_CLONES void tile_probabilities(float* s, int64_t ld, int64_t rows, int64_t cols, int64_t first_row,
                                              int64_t first_col, const float* lse) {
  const ExpBounds bounds = exp_bounds();
  for (int64_t i = 0; i < rows; ++i) {
    float* row = s + i * ld;
    const int64_t n = visible(first_row + i, first_col, cols);
    const float shift = lse[first_row + i];
    for (int64_t j = 0; j < n; ++j) row[j] = exp_f32(row[j] - shift, bounds);
    for (int64_t j = n; j < cols; ++j) row[j] = 0.0f;
  }
}

// dS = P ⊙ (dP - D[t]) · scale in place in dp (P is 0 where the query may not see the key, so
// dS is too).
TUTTI_CPU_SIMD_CLONES void tile_score_grads(const float* p, float* dp, int64_t ld, int64_t rows, int64_t cols,
                                            int64_t first_row, const float* D, float scale) {
  for (int64_t i = 0; i < rows; ++i) {
    const float d = D[first_row + i];
    const float* pr = p + i * ld;
    float* dr = dp + i * ld;
    TUTTI_IVDEP
    for (int64_t j = 0; j < cols; ++j) dr[j] = pr[j] * (dr[j] - d) * scale;
  }
}

}  // namespace

void flash_attention_forward(const Tensor& qkv, const FlashShape& s, const Tensor& out, const Tensor& lse) {
  const int64_t T = s.T, H = s.H, G = s.G, hs = s.hs, W = s.width(), HC = H * hs;
  const int64_t bq = cpu_query_tile(s), bk = cpu_key_tile(s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const F32Buffer X(qkv, true), O(out, false);
  float* L = static_cast<float*>(lse.data());
  std::vector<float> tile(static_cast<std::size_t>(bq * bk)), acc(static_cast<std::size_t>(bq * hs));
  std::vector<float> m(static_cast<std::size_t>(bq)), l(static_cast<std::size_t>(bq));
  std::vector<float> kt(static_cast<std::size_t>(hs * T));  // k^T of the key/value head: [hs, T]
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / s.group();
      const float* base = X.data() + b * T * W;
      const float* q = base + h * hs;
      const float* v = base + (H + G + g) * hs;
      if (h % s.group() == 0) transpose_into(base + (H + g) * hs, T, hs, W, kt.data(), T);  // once per group
      float* o = O.data() + b * T * HC + h * hs;
      float* row_lse = L + (b * H + h) * T;
      for (int64_t r0 = 0; r0 < T; r0 += bq) {
        const int64_t r1 = std::min(T, r0 + bq), rows = r1 - r0;
        std::fill(acc.begin(), acc.end(), 0.0f);
        std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
        std::fill(l.begin(), l.end(), 0.0f);
        for (int64_t c0 = 0; c0 < r1; c0 += bk) {  // keys after the tile's last query are never seen
          const int64_t cols = std::min(bk, r1 - c0);
          tile_gemm(rows, cols, hs, scale, q + r0 * W, W, 1, kt.data() + c0, T, false, tile.data(), bk);  // S
          online_softmax_tile(tile.data(), bk, rows, cols, r0, c0, m.data(), l.data(), acc.data(), hs);
          tile_gemm(rows, hs, cols, 1.0f, tile.data(), bk, 1, v + c0 * W, W, true, acc.data(), hs);  // += P v
        }
        for (int64_t i = 0; i < rows; ++i) {
          const float inv = 1.0f / l[static_cast<std::size_t>(i)];
          const float* a = acc.data() + i * hs;
          float* dst = o + (r0 + i) * HC;
          for (int64_t c = 0; c < hs; ++c) dst[c] = a[c] * inv;
          row_lse[r0 + i] = m[static_cast<std::size_t>(i)] + std::log(l[static_cast<std::size_t>(i)]);
        }
      }
    }
  O.store();
}

// FlashAttention-2's loop order: for each key/value head and key tile, the dk and dv of that tile
// accumulate in a small buffer over every query tile of every query head of its group (so the
// shared key/value heads are summed without atomics or copies), while each query's dq accumulates
// in place over the key tiles. Deterministic: the order of every sum is fixed.
void flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                              const FlashShape& s, const Tensor& dqkv) {
  const int64_t T = s.T, H = s.H, G = s.G, hs = s.hs, W = s.width(), HC = H * hs, group = s.group();
  const int64_t bq = cpu_query_tile(s), bk = cpu_key_tile(s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const F32Buffer X(qkv, true), O(out, true), DO(dout, true), DX(dqkv, false);
  const float* L = static_cast<const float*>(lse.data());
  // Nothing of dqkv is zeroed first: dk and dv are copied out whole per key tile, and every query
  // sees key 0, so each dq row's first term comes from the first key tile, which stores it (the
  // later tiles add theirs).
  // D[b, h, t] = sum_i dout · out: the row sums of P ⊙ dP, from the output instead of P.
  std::vector<float> D(static_cast<std::size_t>(s.B * H * T));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const float* o = O.data() + (b * T + t) * HC + h * hs;
        const float* d = DO.data() + (b * T + t) * HC + h * hs;
        D[static_cast<std::size_t>((b * H + h) * T + t)] = sum_lanes(hs, [o, d](int64_t i) { return o[i] * d[i]; });
      }
  std::vector<float> p(static_cast<std::size_t>(bq * bk)), dp(static_cast<std::size_t>(bq * bk));
  std::vector<float> dk_tile(static_cast<std::size_t>(bk * hs)), dv_tile(static_cast<std::size_t>(bk * hs));
  std::vector<float> kt(static_cast<std::size_t>(hs * T)), vt(static_cast<std::size_t>(hs * T));  // [hs, T]
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t g = 0; g < G; ++g) {
      const float* base = X.data() + b * T * W;
      const float* k = base + (H + g) * hs;
      transpose_into(k, T, hs, W, kt.data(), T);
      transpose_into(base + (H + G + g) * hs, T, hs, W, vt.data(), T);
      float* dk = DX.data() + b * T * W + (H + g) * hs;
      float* dv = DX.data() + b * T * W + (H + G + g) * hs;
      for (int64_t c0 = 0; c0 < T; c0 += bk) {
        const int64_t cols = std::min(bk, T - c0);
        std::fill(dk_tile.begin(), dk_tile.end(), 0.0f);
        std::fill(dv_tile.begin(), dv_tile.end(), 0.0f);
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          const float* q = base + h * hs;
          const float* dy = DO.data() + b * T * HC + h * hs;
          float* dq = DX.data() + b * T * W + h * hs;
          const float* row_lse = L + (b * H + h) * T;
          const float* row_d = D.data() + (b * H + h) * T;
          for (int64_t r0 = c0 / bq * bq; r0 < T; r0 += bq) {  // the query tiles that see some key of this one
            // Near the diagonal only part of the pair is visible: queries before c0 see none of
            // these keys, keys after the tile's last query are seen by none of its queries.
            const int64_t r1 = std::min(T, r0 + bq), first = std::max(r0, c0), rows = r1 - first;
            const int64_t seen = std::min(cols, r1 - c0);
            const float* qr = q + first * W;
            const float* dyr = dy + first * HC;
            tile_gemm(rows, seen, hs, scale, qr, W, 1, kt.data() + c0, T, false, p.data(), bk);  // S
            tile_probabilities(p.data(), bk, rows, seen, first, c0, row_lse);
            tile_gemm(seen, hs, rows, 1.0f, p.data(), 1, bk, dyr, HC, true, dv_tile.data(), hs);   // dv += P^T dy
            tile_gemm(rows, seen, hs, 1.0f, dyr, HC, 1, vt.data() + c0, T, false, dp.data(), bk);  // dP = dy v^T
            tile_score_grads(p.data(), dp.data(), bk, rows, seen, first, row_d, scale);            // dS
            tile_gemm(rows, hs, seen, 1.0f, dp.data(), bk, 1, k + c0 * W, W, c0 > 0, dq + first * W, W);  // dS k
            tile_gemm(seen, hs, rows, 1.0f, dp.data(), 1, bk, qr, W, true, dk_tile.data(), hs);  // dk += dS^T q
          }
        }
        for (int64_t j = 0; j < cols; ++j)
          for (int64_t c = 0; c < hs; ++c) {
            dk[(c0 + j) * W + c] = dk_tile[static_cast<std::size_t>(j * hs + c)];
            dv[(c0 + j) * W + c] = dv_tile[static_cast<std::size_t>(j * hs + c)];
          }
      }
    }
  DX.store();
}

}  // namespace tutti::kernels::cpu
