// CUDA causal self-attention: cuBLAS strided-batched GEMMs for the four products per head
// and a fused causal softmax kernel, llm.c's own (non-cuDNN) path.
//
// Why this path. The alternatives were a hand-written flash-attention kernel and cuDNN's fused
// attention. The GEMMs carry nearly all of attention's FLOPs, and cuBLAS runs them on the
// tensor cores near peak; a flash kernel that beats that needs warp-level MMA (mma.sync /
// wgmma in inline PTX), which the emulated CUDA device that runs every kernel in CI cannot
// execute, and cuDNN's graph API has no emulation either. So this is the fastest path that
// CI can test: the launchers, the permutes and the softmax kernels run there, and cuBLAS's
// GEMMs are the emulation's CPU references. The price is memory: the softmax probabilities
// (one T x T matrix per head and sequence) are kept for backward, as llm.c's cuBLAS path and
// GPT-2's own recipe do, and the GEMMs compute the masked upper triangle too (half of
// attention's GEMM FLOPs are wasted on it; they are a small share of a GPT-2 step's).
//
// Layout: the packed qkv [B, T, 3, heads, hs] is first permuted into q, k, v [B, heads, T, hs]
// (one stride per GEMM batch), and the result [B, heads, T, hs] back into [B, T, C], in
// scratch from the stream-ordered pool. Scores are written straight into probs (the scale
// folded into the GEMM's alpha) and turned into probabilities in place, one warp per row.
#include "kernels/cuda/attention.h"

#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cublas.cuh"
#include "kernels/validate.h"

namespace tutti::kernels::cuda {
namespace {

using std::int64_t;

constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / 32;

// dst[b, h, t, i] = src[(b·T + t)·row_stride + h·hs + i]: one head-major copy of q, k, v or
// dout. A block per row (b, t) of src (grid-stride over the B·T rows), its threads along the
// C columns: the reads are contiguous, the column arithmetic 32-bit (no 64-bit division per
// element, which would make this memory-bound copy compute-bound).
template <typename T>
__global__ void attention_to_heads_kernel(const T* src, int64_t row_stride, int64_t rows, int T_, int C, int hs,
                                          T* dst) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t b = r / T_, t = r % T_;
    const T* in = src + r * row_stride;
    T* out = dst + b * static_cast<int64_t>(C) * T_ + t * hs;  // [b, h = 0, t, 0]
    for (int c = threadIdx.x; c < C; c += blockDim.x) out[static_cast<int64_t>(c / hs) * T_ * hs + c % hs] = in[c];
  }
}

// The inverse: dst[(b·T + t)·row_stride + h·hs + i] = src[b, h, t, i].
template <typename T>
__global__ void attention_from_heads_kernel(const T* src, int64_t row_stride, int64_t rows, int T_, int C, int hs,
                                            T* dst) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t b = r / T_, t = r % T_;
    const T* in = src + b * static_cast<int64_t>(C) * T_ + t * hs;
    T* out = dst + r * row_stride;
    for (int c = threadIdx.x; c < C; c += blockDim.x) out[c] = in[static_cast<int64_t>(c / hs) * T_ * hs + c % hs];
  }
}

// In place, one warp per row of the [rows, T] scores (row r is query t = r mod T): softmax over
// columns s <= t (max subtracted, fp32), 0 after them.
template <typename T>
__global__ void causal_softmax_forward_kernel(T* att, int64_t rows, int64_t T_) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps leave together: only warp shuffles follow
  const int64_t t = row % T_;
  T* r = att + row * T_;
  float mx = -INFINITY;
  for (int64_t s = lane; s <= t; s += 32) mx = fmaxf(mx, load_f32(r[s]));
  mx = warp_allreduce_max(mx);
  float sum = 0.0f;
  for (int64_t s = lane; s <= t; s += 32) sum += expf(load_f32(r[s]) - mx);
  const float inv = 1.0f / warp_allreduce_sum(sum);
  for (int64_t s = lane; s < T_; s += 32) r[s] = store_as<T>(s <= t ? expf(load_f32(r[s]) - mx) * inv : 0.0f);
}

// In place on dp, one warp per row: dS = P ⊙ (dP - sum_s P·dP) · scale for s <= t, 0 after.
template <typename T>
__global__ void causal_softmax_backward_kernel(const T* att, T* dp, int64_t rows, int64_t T_, float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const int64_t t = row % T_;
  const T* p = att + row * T_;
  T* d = dp + row * T_;
  float dot = 0.0f;
  for (int64_t s = lane; s <= t; s += 32) dot += load_f32(p[s]) * load_f32(d[s]);
  dot = warp_allreduce_sum(dot);
  for (int64_t s = lane; s < T_; s += 32)
    d[s] = store_as<T>(s <= t ? load_f32(p[s]) * (load_f32(d[s]) - dot) * scale : 0.0f);
}

int to_int(int64_t v, const char* what) {
  TUTTI_CHECK_ARG(v <= INT32_MAX, "attention: ", what, " = ", v, " exceeds cuBLAS's 32-bit limit");
  return static_cast<int>(v);
}

// Row-major C_i[M, N] = alpha · op(A_i) · op(B_i) for i < batch, with A_i = A + i·sa etc. (in
// elements); A is [M, K] ([K, M] when ta), B [K, N] ([N, K] when tb), rows contiguous. As in
// linear.cu, cuBLAS (column-major) computes C^T = op(B)^T · op(A)^T.
void batched_gemm(cublasHandle_t h, DType dtype, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const void* A, int64_t sa, const void* B, int64_t sb, void* C, int64_t sc, int64_t batch) {
  const float beta = 0.0f;
  const cudaDataType_t t = cuda_type(dtype);
  const int lda = to_int(ta ? M : K, "lda"), ldb = to_int(tb ? K : N, "ldb"), ldc = to_int(N, "ldc");
  TUTTI_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                to_int(N, "N"), to_int(M, "M"), to_int(K, "K"), &alpha, B, t, ldb, sb,
                                                A, t, lda, sa, &beta, C, t, ldc, sc, to_int(batch, "batch"),
                                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

struct Dims {
  int64_t B, T, C, heads, hs;
  int64_t btc() const { return B * T * C; }
  int64_t rows() const { return B * heads * T; }
};

Dims dims_of(const Tensor& qkv, int64_t heads) {
  const int64_t C = qkv.dim(2) / 3;
  return {qkv.dim(0), qkv.dim(1), C, heads, C / heads};
}

// Blocks for the B·T rows of a permute: enough to fill the GPU, at most one per row.
unsigned permute_blocks(const Dims& d) {
  return static_cast<unsigned>(std::min<int64_t>(d.B * d.T, static_cast<int64_t>(sm_count()) * 32));
}

template <typename H>
void to_heads(const H* src, int64_t row_stride, const Dims& d, H* dst, cudaStream_t s) {
  attention_to_heads_kernel<<<permute_blocks(d), kBlock, 0, s>>>(src, row_stride, d.B * d.T, static_cast<int>(d.T),
                                                                 static_cast<int>(d.C), static_cast<int>(d.hs), dst);
  TUTTI_CUDA_CHECK_LAUNCH("attention_to_heads_kernel");
}

template <typename H>
void from_heads(const H* src, int64_t row_stride, const Dims& d, H* dst, cudaStream_t s) {
  attention_from_heads_kernel<<<permute_blocks(d), kBlock, 0, s>>>(src, row_stride, d.B * d.T, static_cast<int>(d.T),
                                                                   static_cast<int>(d.C), static_cast<int>(d.hs), dst);
  TUTTI_CUDA_CHECK_LAUNCH("attention_from_heads_kernel");
}

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

}  // namespace

void attention_forward(const Tensor& qkv, int64_t heads, const Tensor& out, const Tensor& probs, const Stream& stream) {
  const Dims d = dims_of(qkv, heads);
  if (d.B == 0) return;
  DeviceGuard guard(qkv.device());
  const cudaStream_t s = native(stream);
  const cublasHandle_t h = cublas_handle(qkv.device().index);
  TUTTI_CUBLAS_CHECK(cublasSetStream(h, s));
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.hs));
  detail::dispatch_floating("attention_forward", qkv.dtype(), [&](auto tag) {
    using H = decltype(tag);
    using D = device_t<H>;
    StreamScratch scratch(4 * static_cast<std::size_t>(d.btc()) * sizeof(D), s);
    D* q = scratch.as<D>();
    D* k = q + d.btc();
    D* v = k + d.btc();
    D* y = v + d.btc();
    const D* x = ptr<H>(qkv);
    to_heads(x, 3 * d.C, d, q, s);
    to_heads(x + d.C, 3 * d.C, d, k, s);
    to_heads(x + 2 * d.C, 3 * d.C, d, v, s);
    const int64_t tt = d.T * d.T, th = d.T * d.hs, batch = d.B * d.heads;
    D* att = ptr<H>(probs);
    batched_gemm(h, qkv.dtype(), false, true, d.T, d.T, d.hs, scale, q, th, k, th, att, tt, batch);  // q k^T
    causal_softmax_forward_kernel<<<row_blocks(d.rows()), kBlock, 0, s>>>(att, d.rows(), d.T);
    TUTTI_CUDA_CHECK_LAUNCH("causal_softmax_forward_kernel");
    batched_gemm(h, qkv.dtype(), false, false, d.T, d.hs, d.T, 1.0f, att, tt, v, th, y, th, batch);  // P v
    from_heads(y, d.C, d, ptr<H>(out), s);
  });
}

void attention_backward(const Tensor& qkv, const Tensor& probs, const Tensor& dout, int64_t heads, const Tensor& dqkv,
                        const Stream& stream) {
  const Dims d = dims_of(qkv, heads);
  if (d.B == 0) return;
  DeviceGuard guard(qkv.device());
  const cudaStream_t s = native(stream);
  const cublasHandle_t h = cublas_handle(qkv.device().index);
  TUTTI_CUBLAS_CHECK(cublasSetStream(h, s));
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.hs));
  detail::dispatch_floating("attention_backward", qkv.dtype(), [&](auto tag) {
    using H = decltype(tag);
    using D = device_t<H>;
    const int64_t tt = d.T * d.T, th = d.T * d.hs, batch = d.B * d.heads;
    // q, k, v, dy, dq, dk, dv head-major, then dP (turned into dS in place).
    StreamScratch scratch((7 * static_cast<std::size_t>(d.btc()) + static_cast<std::size_t>(batch * tt)) * sizeof(D),
                          s);
    D* q = scratch.as<D>();
    D* k = q + d.btc();
    D* v = k + d.btc();
    D* dy = v + d.btc();
    D* dq = dy + d.btc();
    D* dk = dq + d.btc();
    D* dv = dk + d.btc();
    D* dp = dv + d.btc();
    const D* x = ptr<H>(qkv);
    to_heads(x, 3 * d.C, d, q, s);
    to_heads(x + d.C, 3 * d.C, d, k, s);
    to_heads(x + 2 * d.C, 3 * d.C, d, v, s);
    to_heads(ptr<H>(dout), d.C, d, dy, s);
    const D* att = ptr<H>(probs);
    const DType t = qkv.dtype();
    batched_gemm(h, t, false, true, d.T, d.T, d.hs, 1.0f, dy, th, v, th, dp, tt, batch);    // dP = dy v^T
    batched_gemm(h, t, true, false, d.T, d.hs, d.T, 1.0f, att, tt, dy, th, dv, th, batch);  // dv = P^T dy
    causal_softmax_backward_kernel<<<row_blocks(d.rows()), kBlock, 0, s>>>(att, dp, d.rows(), d.T, scale);
    TUTTI_CUDA_CHECK_LAUNCH("causal_softmax_backward_kernel");
    batched_gemm(h, t, false, false, d.T, d.hs, d.T, 1.0f, dp, tt, k, th, dq, th, batch);  // dq = dS k
    batched_gemm(h, t, true, false, d.T, d.hs, d.T, 1.0f, dp, tt, q, th, dk, th, batch);   // dk = dS^T q
    D* g = ptr<H>(dqkv);
    from_heads(dq, 3 * d.C, d, g, s);
    from_heads(dk, 3 * d.C, d, g + d.C, s);
    from_heads(dv, 3 * d.C, d, g + 2 * d.C, s);
  });
}

}  // namespace tutti::kernels::cuda
