#include "kernels/cpu/tile_gemm.h"

#include <cstring>
#include <vector>

#include "kernels/cpu/common.h"

namespace tutti::kernels::cpu {
namespace {

using std::int64_t;

// 8 floats: one AVX register; two SSE registers in the clones without AVX (GCC splits it).
using f32x8 = float __attribute__((vector_size(32)));

// One R x (8·V) block of C kept in registers over the whole K: per k, V rows-of-8 of B are loaded
// once and each of the R elements A(i, k) is broadcast against them. R = 6, V = 2 is 12
// accumulators + 2 of B + 1 broadcast: 15 of AVX2's 16 registers, and 12 multiply-adds for 8
// loads, so the FMA units, not the loads, set the pace. Inlined into each clone of tile_gemm, so
// every target gets its own code; no vector crosses a call (that would change the ABI).
template <int R, int V>
__attribute__((always_inline)) inline void block(int64_t K, float alpha, const float* A, int64_t a_row, int64_t a_col,
                                                 const float* B, int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  f32x8 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = f32x8{};
  for (int64_t k = 0; k < K; ++k) {
    f32x8 b[V];
    for (int v = 0; v < V; ++v) std::memcpy(&b[v], B + k * ldb + 8 * v, sizeof(f32x8));
    for (int r = 0; r < R; ++r) {
      const float a = A[r * a_row + k * a_col];
      const f32x8 splat = {a, a, a, a, a, a, a, a};  // one broadcast load (`f32x8{} + a` adds a 0 first)
      for (int v = 0; v < V; ++v) acc[r][v] += splat * b[v];
    }
  }
  const f32x8 scale = {alpha, alpha, alpha, alpha, alpha, alpha, alpha, alpha};
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) {
      f32x8 out = acc[r][v] * scale;
      float* c = C + r * ldc + 8 * v;
      if (accumulate) {
        f32x8 old;
        std::memcpy(&old, c, sizeof old);
        out += old;
      }
      std::memcpy(c, &out, sizeof out);
    }
}

// Columns [n, n + 8·V) of every row of C, in blocks of 6 rows and then the rest. A block of 1 or 2
// rows has too few accumulators to hide the multiply-add's latency (it runs at about half the
// rate per row), so 7 or 8 rows left are done as 4 + 3 or 4 + 4 (32 queries: 6 x 4 + 4 + 4).
template <int V>
__attribute__((always_inline)) inline void column_panel(int64_t M, int64_t K, float alpha, const float* A,
                                                        int64_t a_row, int64_t a_col, const float* B, int64_t ldb,
                                                        bool accumulate, float* C, int64_t ldc) {
  int64_t rest = M % 6;  // the rows after the blocks of 6
  if ((rest == 1 || rest == 2) && M > 6) rest += 6;
  int64_t i = 0;
  for (; i < M - rest; i += 6) block<6, V>(K, alpha, A + i * a_row, a_row, a_col, B, ldb, accumulate, C + i * ldc, ldc);
  if (rest > 6) {
    block<4, V>(K, alpha, A + i * a_row, a_row, a_col, B, ldb, accumulate, C + i * ldc, ldc);
    i += 4;
  }
  const float* a = A + i * a_row;
  float* c = C + i * ldc;
  switch (M - i) {
    case 5: block<5, V>(K, alpha, a, a_row, a_col, B, ldb, accumulate, c, ldc); break;
    case 4: block<4, V>(K, alpha, a, a_row, a_col, B, ldb, accumulate, c, ldc); break;
    case 3: block<3, V>(K, alpha, a, a_row, a_col, B, ldb, accumulate, c, ldc); break;
    case 2: block<2, V>(K, alpha, a, a_row, a_col, B, ldb, accumulate, c, ldc); break;
    case 1: block<1, V>(K, alpha, a, a_row, a_col, B, ldb, accumulate, c, ldc); break;
    default: break;
  }
}

// B[0..K, 0..cols) copied to `panel` with rows `cols` apart.
inline void pack_panel(const float* B, int64_t ldb, int64_t K, int64_t cols, float* panel) {
  for (int64_t k = 0; k < K; ++k) std::memcpy(panel + k * cols, B + k * ldb, static_cast<std::size_t>(cols) * 4);
}

}  // namespace

TUTTI_CPU_SIMD_CLONES void tile_gemm(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t a_row,
                                     int64_t a_col, const float* B, int64_t ldb, bool accumulate, float* C,
                                     int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  // Each 16-column panel of B is read once per 6 rows of C. In place, its K rows lie ldb apart:
  // at strides of a multiple of 4 KiB (k^T of 1024 keys, a head of dout) they all fall in one set
  // of the L1 cache and evict each other (measured 59 against 81 GFLOP/s for 64 x 256 x 64). So
  // the panel is first copied to a contiguous buffer (K x 16 floats: 16 KiB at K = 256), as BLAS
  // packs; the copy is 1/(2 M) of the panel's multiply-adds.
  thread_local std::vector<float> panel;
  if (panel.size() < static_cast<std::size_t>(K * 16)) panel.resize(static_cast<std::size_t>(K * 16));
  int64_t n = 0;
  for (; n + 16 <= N; n += 16) {
    pack_panel(B + n, ldb, K, 16, panel.data());
    column_panel<2>(M, K, alpha, A, a_row, a_col, panel.data(), 16, accumulate, C + n, ldc);
  }
  for (; n + 8 <= N; n += 8) {
    pack_panel(B + n, ldb, K, 8, panel.data());
    column_panel<1>(M, K, alpha, A, a_row, a_col, panel.data(), 8, accumulate, C + n, ldc);
  }
  // The last N % 8 columns (a head size or a tile that is not a multiple of 8): one at a time.
  for (; n < N; ++n)
    for (int64_t i = 0; i < M; ++i) {
      float sum = 0.0f;
      for (int64_t k = 0; k < K; ++k) sum += A[i * a_row + k * a_col] * B[k * ldb + n];
      float& c = C[i * ldc + n];
      c = accumulate ? c + alpha * sum : alpha * sum;
    }
}

namespace {

// dst's 8 x 8 block = the transpose of src's, in registers: 8 row loads, 24 shuffles (the
// unpack / shuffle / permute pattern of an AVX transpose), 8 row stores. An element-wise loop,
// which stores every float to another cache line, took 15% of gpt-tiny's attention (perf).
__attribute__((always_inline)) inline void transpose_8x8(const float* src, int64_t ld_src, float* dst, int64_t ld_dst) {
  f32x8 r[8];
  for (int i = 0; i < 8; ++i) std::memcpy(&r[i], src + i * ld_src, sizeof(f32x8));
  f32x8 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = __builtin_shufflevector(t[i], t[i + 2], 0, 1, 8, 9, 4, 5, 12, 13);
    u[i + 1] = __builtin_shufflevector(t[i], t[i + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    u[i + 2] = __builtin_shufflevector(t[i + 1], t[i + 3], 0, 1, 8, 9, 4, 5, 12, 13);
    u[i + 3] = __builtin_shufflevector(t[i + 1], t[i + 3], 2, 3, 10, 11, 6, 7, 14, 15);
  }
  for (int c = 0; c < 4; ++c) {  // column c from the low halves, column c + 4 from the high ones
    const f32x8 low = __builtin_shufflevector(u[c], u[c + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    const f32x8 high = __builtin_shufflevector(u[c], u[c + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    std::memcpy(dst + c * ld_dst, &low, sizeof low);
    std::memcpy(dst + (c + 4) * ld_dst, &high, sizeof high);
  }
}

}  // namespace

TUTTI_CPU_SIMD_CLONES void transpose_into(const float* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst,
                                          int64_t ld_dst) {
  const int64_t full_rows = rows / 8 * 8, full_cols = cols / 8 * 8;
  for (int64_t r = 0; r < full_rows; r += 8)
    for (int64_t c = 0; c < full_cols; c += 8)
      transpose_8x8(src + r * ld_src + c, ld_src, dst + c * ld_dst + r, ld_dst);
  // The edges: the last cols % 8 columns of every row, the last rows % 8 rows.
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = r < full_rows ? full_cols : 0; c < cols; ++c) dst[c * ld_dst + r] = src[r * ld_src + c];
}

}  // namespace tutti::kernels::cpu
