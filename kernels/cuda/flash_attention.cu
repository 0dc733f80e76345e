// CUDA tiled causal self-attention with an online softmax: cuBLAS GEMMs on tiles of queries and
// keys, batched over the B·G key/value heads, and small fused kernels between them.
//
// Why this shape. The fastest attention on an H100 is a fused kernel on the tensor cores
// (FlashAttention-2/3: mma.sync / wgmma in inline PTX, scores in registers), which the emulated
// CUDA device that runs every kernel in CI cannot execute. cuBLAS's GEMMs run on the tensor cores
// and are emulated, so the tiles' products go to cuBLAS and only the softmax between them is ours:
// the same algorithm as the CPU path (kernels/cpu/flash_attention.cc), with a tile of scores in
// global memory (L2-resident at these sizes) instead of registers. Memory stays linear in T: the
// scratch is the head-major copies of q, k, v (and dout, dq), one tile pair of scores and the
// row statistics (kernels/flash_tiles.h counts it). Not yet measured on a GPU.
//
// Layout. Query head h = g·R + j (R = H / G query heads per key/value head g) is copied to
// q[b, g, t, j, :], i.e. the R query heads of a group are adjacent rows: one GEMM with the
// group's shared keys serves all of them (M = rows·R), reading k[b, g, :, :] once. k and v are
// copied to [b, g, t, :]. A tile of queries [r0, r1) is then rows [r0·R, r1·R) of batch entry
// z = b·G + g, row m being query t = r0 + m / R of head j = m % R.
//
// Forward, per query tile: m = -inf, l = 0, acc = 0; for each key tile up to the tile's last
// query: S = scale · q k^T (f32), then one warp per row takes S into m and l, rescales the row's
// acc and writes P = exp(S - m) (in the input dtype, as FlashAttention rounds P for its second
// GEMM), then acc += P v (f32). Finally out = acc / l and lse = m + log l.
// Backward (FlashAttention-2's order), per key tile: dk = dv = 0 (f32); for each query tile that
// sees it: S = scale · q k^T, P = exp(S - lse), dv += P^T dy, dP = dy v^T, dS = P ⊙ (dP - D)·scale
// (D = rowsum(dy ⊙ out), once per call), dq += dS k (f32, every query, kept for the whole call),
// dk += dS^T q; then dk and dv are written into dqkv. Deterministic: every sum has a fixed order.
#include "kernels/cuda/flash_attention.h"

#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cublas.cuh"
#include "kernels/validate.h"

namespace tutti::kernels::cuda {
namespace {

using std::int64_t;

constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / 32;

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

// The keys of a tile starting at key c0 (cols of them) that query t sees.
__device__ __forceinline__ int64_t visible_keys(int64_t t, int64_t c0, int64_t cols) {
  const int64_t n = t - c0 + 1;
  return n < 0 ? 0 : (n > cols ? cols : n);
}

// dst[b, g, t, j, i] = src[(b·T + t)·row_stride + col0 + (g·R + j)·hs + i] for the `heads` = G·R
// heads of one part of qkv (q: R = H / G; k, v: R = 1) or of dout. A block per row (b, t), its
// threads along the part's columns (contiguous reads).
template <typename D>
__global__ void flash_to_groups_kernel(const D* src, int64_t row_stride, int64_t col0, int64_t rows, int64_t T_, int G,
                                       int R, int hs, D* dst) {
  const int cols = G * R * hs;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t b = r / T_, t = r % T_;
    const D* in = src + r * row_stride + col0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      const int h = c / hs, i = c % hs, g = h / R, j = h % R;
      dst[(((b * G + g) * T_ + t) * R + j) * hs + i] = in[c];
    }
  }
}

// m = -inf, l = 0 for `rows` rows, acc = 0 for rows x hs.
__global__ void flash_init_rows_kernel(float* m, float* l, int64_t rows, float* acc, int64_t hs) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * hs; i += stride) {
    acc[i] = 0.0f;
    if (i < rows) {
      m[i] = -INFINITY;
      l[i] = 0.0f;
    }
  }
}

// One warp per row of the tile: rows are (z, m) with z < Z batch entries of M = rows_q·R rows
// each (stride `tile_rows` = bq·R rows in the scratch), scores s [.., ld] f32 -> p [.., ld] in
// the input dtype. Online-softmax step: the row's max and sum take in the visible keys, its
// accumulator (hs columns, f32) is rescaled to the new max.
template <typename D>
__global__ void flash_online_softmax_kernel(const float* s, D* p, int64_t ld, int64_t Z, int64_t M, int64_t tile_rows,
                                            int R, int64_t r0, int64_t c0, int64_t cols, float* m, float* l, float* acc,
                                            int64_t hs) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= Z * M) return;  // whole warps leave together: only warp shuffles follow
  const int64_t z = row / M, mr = row % M, slot = z * tile_rows + mr;
  const float* sr = s + slot * ld;
  D* pr = p + slot * ld;
  const int64_t n = visible_keys(r0 + mr / R, c0, cols);
  // Every lane reads the row's statistics before the shuffles below; lane 0 alone writes them
  // after the last one.
  const float m_old = m[slot], l_old = l[slot];
  float mx = m_old;
  for (int64_t j = lane; j < n; j += 32) mx = fmaxf(mx, sr[j]);
  mx = warp_allreduce_max(mx);
  float sum = 0.0f;
  for (int64_t j = lane; j < cols; j += 32) {
    const float e = j < n ? expf(sr[j] - mx) : 0.0f;
    const D rounded = store_as<D>(e);
    pr[j] = rounded;
    sum += load_f32(rounded);  // l sums what the P·v GEMM multiplies
  }
  sum = warp_allreduce_sum(sum);
  if (n == 0) return;                    // nothing visible: m, l and acc stay (p is all 0)
  const float alpha = expf(m_old - mx);  // the first tile: e^-inf = 0
  float* a = acc + slot * hs;
  for (int64_t i = lane; i < hs; i += 32) a[i] *= alpha;
  if (lane == 0) {
    l[slot] = l_old * alpha + sum;
    m[slot] = mx;
  }
}

// out and lse of a finished query tile: one warp per row.
template <typename D>
__global__ void flash_finish_rows_kernel(const float* acc, const float* m, const float* l, int64_t Z, int64_t M,
                                         int64_t tile_rows, int R, int64_t r0, int64_t T_, int G, int64_t hs, D* out,
                                         float* lse) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= Z * M) return;
  const int64_t z = row / M, mr = row % M, slot = z * tile_rows + mr;
  const int64_t b = z / G, g = z % G, t = r0 + mr / R, h = g * R + mr % R, H = static_cast<int64_t>(G) * R;
  const float inv = 1.0f / l[slot];
  const float* a = acc + slot * hs;
  D* o = out + (b * T_ + t) * H * hs + h * hs;
  for (int64_t i = lane; i < hs; i += 32) o[i] = store_as<D>(a[i] * inv);
  if (lane == 0) lse[(b * H + h) * T_ + t] = m[slot] + logf(l[slot]);
}

// D[b, g, t, j] = sum_i dout · out for query head h = g·R + j: one warp per (b, t, h).
template <typename D>
__global__ void flash_row_dot_kernel(const D* out, const D* dout, int64_t rows, int64_t T_, int G, int R, int64_t hs,
                                     float* Dsum) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int64_t H = static_cast<int64_t>(G) * R, h = row % H, bt = row / H, b = bt / T_, t = bt % T_;
  const D* o = out + row * hs;
  const D* d = dout + row * hs;
  float dot = 0.0f;
  for (int64_t i = lane; i < hs; i += 32) dot += load_f32(o[i]) * load_f32(d[i]);
  dot = warp_allreduce_sum(dot);
  if (lane == 0) Dsum[((b * G + h / R) * T_ + t) * R + h % R] = dot;
}

// Backward's probabilities of one tile (P = exp(S - lse), 0 where not visible), one warp per row.
template <typename D>
__global__ void flash_probs_kernel(const float* s, D* p, int64_t ld, int64_t Z, int64_t M, int64_t tile_rows, int R,
                                   int64_t r0, int64_t c0, int64_t cols, int64_t T_, int G, const float* lse) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= Z * M) return;
  const int64_t z = row / M, mr = row % M, slot = z * tile_rows + mr;
  const int64_t b = z / G, g = z % G, t = r0 + mr / R, h = g * R + mr % R, H = static_cast<int64_t>(G) * R;
  const float shift = lse[(b * H + h) * T_ + t];
  const int64_t n = visible_keys(t, c0, cols);
  const float* sr = s + slot * ld;
  D* pr = p + slot * ld;
  for (int64_t j = lane; j < cols; j += 32) pr[j] = store_as<D>(j < n ? expf(sr[j] - shift) : 0.0f);
}

// dS = P ⊙ (dP - D[t]) · scale, one warp per row.
template <typename D>
__global__ void flash_score_grads_kernel(const D* p, const float* dp, D* ds, int64_t ld, int64_t Z, int64_t M,
                                         int64_t tile_rows, int64_t r0, int R, int64_t T_, const float* Dsum,
                                         int64_t cols, float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= Z * M) return;
  const int64_t z = row / M, mr = row % M, slot = z * tile_rows + mr;
  const float d = Dsum[(z * T_ + r0) * R + mr];  // [b, g, t, j] with t·R + j = r0·R + mr
  for (int64_t j = lane; j < cols; j += 32)
    ds[slot * ld + j] = store_as<D>(load_f32(p[slot * ld + j]) * (dp[slot * ld + j] - d) * scale);
}

// dqkv's key and value heads at keys [c0, c0 + cols) from one key tile's f32 dk and dv
// ([z, bk, hs]): a block per (b, key), threads along the G·hs columns.
template <typename D>
__global__ void flash_store_kv_kernel(const float* dk, const float* dv, int64_t B, int64_t T_, int G, int64_t hs,
                                      int64_t bk, int64_t c0, int64_t cols, int64_t W, int64_t q_cols, D* dqkv) {
  for (int64_t r = blockIdx.x; r < B * cols; r += gridDim.x) {
    const int64_t b = r / cols, j = r % cols;
    D* row = dqkv + (b * T_ + c0 + j) * W + q_cols;
    for (int64_t c = threadIdx.x; c < G * hs; c += blockDim.x) {
      const int64_t g = c / hs, i = c % hs, src = ((b * G + g) * bk + j) * hs + i;
      row[c] = store_as<D>(dk[src]);
      row[G * hs + c] = store_as<D>(dv[src]);
    }
  }
}

// dqkv's query heads from dq [b, g, t, j, :] (f32): a block per row (b, t).
template <typename D>
__global__ void flash_store_q_kernel(const float* dq, int64_t rows, int64_t T_, int G, int R, int64_t hs, int64_t W,
                                     D* dqkv) {
  const int64_t cols = static_cast<int64_t>(G) * R * hs;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t b = r / T_, t = r % T_;
    D* row = dqkv + r * W;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const int64_t h = c / hs, i = c % hs;
      row[c] = store_as<D>(dq[(((b * G + h / R) * T_ + t) * R + h % R) * hs + i]);
    }
  }
}

int to_int(int64_t v, const char* what) {
  TUTTI_CHECK_ARG(v <= INT32_MAX, "flash attention: ", what, " = ", v, " exceeds cuBLAS's 32-bit limit");
  return static_cast<int>(v);
}

// One operand of a batched GEMM: pointer, type, row-major leading dimension and batch stride
// (elements).
struct Operand {
  const void* data;
  cudaDataType_t type;
  int64_t ld, stride;
};

// Row-major C_z[M, N] = alpha · op(A_z) · op(B_z) + beta · C_z for z < batch (A is [M, K], or
// [K, M] when ta; B is [K, N], or [N, K] when tb). cuBLAS is column-major: it computes
// C^T = op(B)^T · op(A)^T. fp32 accumulation; C may be f32 while A and B are halves.
void gemm(cublasHandle_t h, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const Operand& A,
          const Operand& B, float beta, void* C, cudaDataType_t c_type, int64_t ldc, int64_t sc, int64_t batch) {
  TUTTI_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, to_int(N, "N"), to_int(M, "M"), to_int(K, "K"),
      &alpha, B.data, B.type, to_int(B.ld, "ldb"), B.stride, A.data, A.type, to_int(A.ld, "lda"), A.stride, &beta, C,
      c_type, to_int(ldc, "ldc"), sc, to_int(batch, "batch"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Carves one scratch allocation into 256-byte aligned parts.
class Carver {
 public:
  explicit Carver(char* base) : base_(base) {}
  template <typename T>
  T* take(int64_t elements) {
    T* p = reinterpret_cast<T*>(base_ + offset_);
    offset_ += (static_cast<std::size_t>(elements) * sizeof(T) + 255) / 256 * 256;
    return p;
  }

 private:
  char* base_;
  std::size_t offset_ = 0;
};

// The scratch of one call: flash_gpu_scratch_bytes (flash_tiles.h) plus the alignment of each part.
std::size_t scratch_bytes(const FlashShape& s, DType dtype, bool backward) {
  return static_cast<std::size_t>(flash_gpu_scratch_bytes(s, size_of(dtype), backward)) + 16 * 256;
}

template <typename D>
void to_groups(const D* src, int64_t row_stride, int64_t col0, const FlashShape& s, int R, D* dst, cudaStream_t st) {
  const int64_t rows = s.B * s.T;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(rows, static_cast<int64_t>(sm_count()) * 32));
  flash_to_groups_kernel<<<blocks, kBlock, 0, st>>>(src, row_stride, col0, rows, s.T, static_cast<int>(s.G), R,
                                                    static_cast<int>(s.hs), dst);
  TUTTI_CUDA_CHECK_LAUNCH("flash_to_groups_kernel");
}

unsigned row_grid(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(rows, 1), static_cast<int64_t>(sm_count()) * 32));
}

// What both launchers set up: the cuBLAS handle bound to the stream, the tiles and the scale.
// The caller holds a DeviceGuard for qkv's device first.
struct Setup {
  cudaStream_t st;
  cublasHandle_t handle;
  int R;                             // query heads per key/value head
  int64_t bq, bk, Z, hs, tile_rows;  // tiles, B·G batch entries, head size, rows of a query tile
  float scale;
};
Setup setup(const Tensor& qkv, const FlashShape& s, const Stream& stream) {
  Setup u{native(stream),
          cublas_handle(qkv.device().index),
          static_cast<int>(s.group()),
          gpu_query_tile(s),
          gpu_key_tile(s),
          s.B * s.G,
          s.hs,
          0,
          1.0f / std::sqrt(static_cast<float>(s.hs))};
  u.tile_rows = u.bq * u.R;
  TUTTI_CUBLAS_CHECK(cublasSetStream(u.handle, u.st));
  return u;
}

// q, k and v of the packed qkv, head-major in groups (see the layout above).
template <typename D>
void split_heads(const D* x, const FlashShape& s, int R, D* q, D* k, D* v, cudaStream_t st) {
  to_groups(x, s.width(), 0, s, R, q, st);
  to_groups(x, s.width(), s.H * s.hs, s, 1, k, st);
  to_groups(x, s.width(), (s.H + s.G) * s.hs, s, 1, v, st);
}

}  // namespace

void flash_attention_forward(const Tensor& qkv, const FlashShape& s, const Tensor& out, const Tensor& lse,
                             const Stream& stream) {
  if (s.B == 0) return;
  DeviceGuard guard(qkv.device());
  const auto [st, handle, R, bq, bk, Z, hs, tile_rows, scale] = setup(qkv, s, stream);
  detail::dispatch_floating("flash_attention_forward", qkv.dtype(), [&](auto tag) {
    using H = decltype(tag);
    using D = device_t<H>;
    const cudaDataType_t dt = cuda_type(qkv.dtype());
    StreamScratch scratch(scratch_bytes(s, qkv.dtype(), false), st);
    Carver carve(scratch.as<char>());
    D* q = carve.take<D>(s.B * s.T * s.H * hs);
    D* k = carve.take<D>(s.B * s.T * s.G * hs);
    D* v = carve.take<D>(s.B * s.T * s.G * hs);
    float* S = carve.take<float>(Z * tile_rows * bk);
    D* P = carve.take<D>(Z * tile_rows * bk);
    float* acc = carve.take<float>(Z * tile_rows * hs);
    float* m = carve.take<float>(Z * tile_rows);
    float* l = carve.take<float>(Z * tile_rows);
    split_heads(ptr<H>(qkv), s, R, q, k, v, st);
    for (int64_t r0 = 0; r0 < s.T; r0 += bq) {
      const int64_t r1 = std::min(s.T, r0 + bq), M = (r1 - r0) * R;
      flash_init_rows_kernel<<<grid_for(Z * tile_rows * hs, kBlock), kBlock, 0, st>>>(m, l, Z * tile_rows, acc, hs);
      TUTTI_CUDA_CHECK_LAUNCH("flash_init_rows_kernel");
      const Operand qa{q + r0 * R * hs, dt, hs, s.T * R * hs};
      for (int64_t c0 = 0; c0 < r1; c0 += bk) {
        const int64_t cols = std::min(bk, r1 - c0);
        gemm(handle, false, true, M, cols, hs, scale, qa, Operand{k + c0 * hs, dt, hs, s.T * hs}, 0.0f, S, CUDA_R_32F,
             bk, tile_rows * bk, Z);  // S = scale · q k^T
        flash_online_softmax_kernel<<<row_blocks(Z * M), kBlock, 0, st>>>(S, P, bk, Z, M, tile_rows, R, r0, c0, cols, m,
                                                                          l, acc, hs);
        TUTTI_CUDA_CHECK_LAUNCH("flash_online_softmax_kernel");
        gemm(handle, false, false, M, hs, cols, 1.0f, Operand{P, dt, bk, tile_rows * bk},
             Operand{v + c0 * hs, dt, hs, s.T * hs}, 1.0f, acc, CUDA_R_32F, hs, tile_rows * hs, Z);  // acc += P v
      }
      flash_finish_rows_kernel<<<row_blocks(Z * M), kBlock, 0, st>>>(
          acc, m, l, Z, M, tile_rows, R, r0, s.T, static_cast<int>(s.G), hs, ptr<H>(out), ptr<float>(lse));
      TUTTI_CUDA_CHECK_LAUNCH("flash_finish_rows_kernel");
    }
  });
}

void flash_attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dout,
                              const FlashShape& s, const Tensor& dqkv, const Stream& stream) {
  if (s.B == 0) return;
  DeviceGuard guard(qkv.device());
  const auto [st, handle, R, bq, bk, Z, hs, tile_rows, scale] = setup(qkv, s, stream);
  detail::dispatch_floating("flash_attention_backward", qkv.dtype(), [&](auto tag) {
    using H = decltype(tag);
    using D = device_t<H>;
    const cudaDataType_t dt = cuda_type(qkv.dtype());
    StreamScratch scratch(scratch_bytes(s, qkv.dtype(), true), st);
    Carver carve(scratch.as<char>());
    const int64_t nq = s.B * s.T * s.H * hs, nkv = s.B * s.T * s.G * hs;
    D* q = carve.take<D>(nq);
    D* k = carve.take<D>(nkv);
    D* v = carve.take<D>(nkv);
    D* dy = carve.take<D>(nq);
    float* Dsum = carve.take<float>(s.B * s.H * s.T);
    float* SD = carve.take<float>(Z * tile_rows * bk);  // the scores, then dP
    D* P = carve.take<D>(Z * tile_rows * bk);
    D* dS = carve.take<D>(Z * tile_rows * bk);
    float* dq = carve.take<float>(nq);
    float* dk = carve.take<float>(Z * bk * hs);
    float* dv = carve.take<float>(Z * bk * hs);
    split_heads(ptr<H>(qkv), s, R, q, k, v, st);
    to_groups(ptr<H>(dout), s.H * hs, 0, s, R, dy, st);
    flash_row_dot_kernel<<<row_blocks(s.B * s.T * s.H), kBlock, 0, st>>>(ptr<H>(out), ptr<H>(dout), s.B * s.T * s.H,
                                                                         s.T, static_cast<int>(s.G), R, hs, Dsum);
    TUTTI_CUDA_CHECK_LAUNCH("flash_row_dot_kernel");
    TUTTI_CUDA_CHECK(cudaMemsetAsync(dq, 0, static_cast<std::size_t>(nq) * sizeof(float), st));
    for (int64_t c0 = 0; c0 < s.T; c0 += bk) {
      const int64_t cols = std::min(bk, s.T - c0);
      TUTTI_CUDA_CHECK(cudaMemsetAsync(dk, 0, static_cast<std::size_t>(Z * bk * hs) * sizeof(float), st));
      TUTTI_CUDA_CHECK(cudaMemsetAsync(dv, 0, static_cast<std::size_t>(Z * bk * hs) * sizeof(float), st));
      const Operand kc{k + c0 * hs, dt, hs, s.T * hs}, vc{v + c0 * hs, dt, hs, s.T * hs};
      for (int64_t r0 = c0 / bq * bq; r0 < s.T; r0 += bq) {  // the query tiles that see some key of this one
        // Near the diagonal only part of the pair is visible: queries before c0 see none of these
        // keys, keys after the tile's last query are seen by none of its queries.
        const int64_t r1 = std::min(s.T, r0 + bq), first = std::max(r0, c0), M = (r1 - first) * R;
        const int64_t seen = std::min(cols, r1 - c0);
        const Operand qr{q + first * R * hs, dt, hs, s.T * R * hs}, dyr{dy + first * R * hs, dt, hs, s.T * R * hs};
        const Operand p{P, dt, bk, tile_rows * bk}, ds{dS, dt, bk, tile_rows * bk};
        gemm(handle, false, true, M, seen, hs, scale, qr, kc, 0.0f, SD, CUDA_R_32F, bk, tile_rows * bk, Z);  // S
        flash_probs_kernel<<<row_blocks(Z * M), kBlock, 0, st>>>(SD, P, bk, Z, M, tile_rows, R, first, c0, seen, s.T,
                                                                 static_cast<int>(s.G), ptr<float>(lse));
        TUTTI_CUDA_CHECK_LAUNCH("flash_probs_kernel");
        gemm(handle, true, false, seen, hs, M, 1.0f, p, dyr, 1.0f, dv, CUDA_R_32F, hs, bk * hs, Z);  // dv += P^T dy
        gemm(handle, false, true, M, seen, hs, 1.0f, dyr, vc, 0.0f, SD, CUDA_R_32F, bk, tile_rows * bk, Z);  // dP
        flash_score_grads_kernel<<<row_blocks(Z * M), kBlock, 0, st>>>(P, SD, dS, bk, Z, M, tile_rows, first, R, s.T,
                                                                       Dsum, seen, scale);
        TUTTI_CUDA_CHECK_LAUNCH("flash_score_grads_kernel");
        gemm(handle, false, false, M, hs, seen, 1.0f, ds, kc, 1.0f, dq + first * R * hs, CUDA_R_32F, hs, s.T * R * hs,
             Z);                                                                                     // dq += dS k
        gemm(handle, true, false, seen, hs, M, 1.0f, ds, qr, 1.0f, dk, CUDA_R_32F, hs, bk * hs, Z);  // dk += dS^T q
      }
      flash_store_kv_kernel<<<row_grid(s.B * cols), kBlock, 0, st>>>(dk, dv, s.B, s.T, static_cast<int>(s.G), hs, bk,
                                                                     c0, cols, s.width(), s.H * hs, ptr<H>(dqkv));
      TUTTI_CUDA_CHECK_LAUNCH("flash_store_kv_kernel");
    }
    flash_store_q_kernel<<<row_grid(s.B * s.T), kBlock, 0, st>>>(dq, s.B * s.T, s.T, static_cast<int>(s.G), R, hs,
                                                                 s.width(), ptr<H>(dqkv));
    TUTTI_CUDA_CHECK_LAUNCH("flash_store_q_kernel");
  });
}

}  // namespace tutti::kernels::cuda
