// CUDA RMS normalization, fp32 accumulation for every dtype (the shape of layernorm.cu):
//   forward: one warp per row: the sum of squares, then y; lane 0 saves rstd.
//   backward dx: one warp per row: the row sum of g · xhat (g = dy · weight), then dx.
//   backward dweight: two stages, deterministic (no float atomics): blocks of (32 columns × 8
//            row-threads) sum dy · xhat over one chunk of rows into partials[chunk, D]; then every
//            column adds its chunks in order.
#include "kernels/cuda/rmsnorm.h"

#include "kernels/cuda/common.cuh"
#include "kernels/validate.h"

namespace tutti::kernels::cuda {
namespace {

using std::int64_t;

constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / 32;

template <typename T>
__global__ void rmsnorm_forward_kernel(const T* x, const T* weight, float eps, int64_t rows, int64_t D, T* y,
                                       float* rstd) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps leave together: only warp shuffles follow
  const T* xr = x + row * D;
  T* yr = y + row * D;
  float sq = 0.0f;
  for (int64_t i = lane; i < D; i += 32) {
    const float v = load_f32(xr[i]);
    sq += v * v;
  }
  const float rs = 1.0f / sqrtf(warp_allreduce_sum(sq) / static_cast<float>(D) + eps);
  for (int64_t i = lane; i < D; i += 32) yr[i] = store_as<T>(load_f32(xr[i]) * rs * load_f32(weight[i]));
  if (lane == 0) rstd[row] = rs;
}

// dx = rstd · (g - xhat · mean(g · xhat)), g = dy · weight.
template <typename T>
__global__ void rmsnorm_dx_kernel(const T* x, const T* weight, const float* rstd, const T* dy, int64_t rows, int64_t D,
                                  T* dx) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const T* xr = x + row * D;
  const T* gr = dy + row * D;
  T* out = dx + row * D;
  const float rs = rstd[row];
  float sum_gx = 0.0f;
  for (int64_t i = lane; i < D; i += 32) sum_gx += load_f32(gr[i]) * load_f32(weight[i]) * load_f32(xr[i]) * rs;
  const float mean_gx = warp_allreduce_sum(sum_gx) / static_cast<float>(D);
  for (int64_t i = lane; i < D; i += 32)
    out[i] = store_as<T>(rs * (load_f32(gr[i]) * load_f32(weight[i]) - load_f32(xr[i]) * rs * mean_gx));
}

constexpr int kTileCols = 32, kTileRows = 8;

// partial[chunk, c] = sum over the chunk's rows of dy · xhat.
template <typename T>
__global__ void rmsnorm_weight_partial_kernel(const T* x, const float* rstd, const T* dy, int64_t rows, int64_t D,
                                              int64_t rows_per_chunk, float* partial) {
  __shared__ float tile[kTileRows][kTileCols + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kTileCols + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float acc = 0.0f;
  if (c < D)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kTileRows)
      acc += load_f32(dy[r * D + c]) * load_f32(x[r * D + c]) * rstd[r];
  tile[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < D) {
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kTileRows; ++k) sum += tile[k][threadIdx.x];
    partial[static_cast<int64_t>(blockIdx.y) * D + c] = sum;
  }
}

// dweight[c] = (accumulate ? dweight[c] : 0) + the chunks' sums in order.
template <typename G>
__global__ void rmsnorm_weight_finish_kernel(const float* partial, int64_t chunks, int64_t D, G* dweight,
                                             bool accumulate) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < D; c += stride) {
    float sum = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) sum += partial[k * D + c];
    dweight[c] = store_as<G>(accumulate ? load_f32(dweight[c]) + sum : sum);
  }
}

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

}  // namespace

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& y, const Tensor& rstd,
                     const Stream& stream) {
  const int64_t D = x.dim(-1), rows = x.numel() / D;
  if (rows == 0) return;
  DeviceGuard guard(x.device());
  detail::dispatch_floating("rmsnorm_forward", x.dtype(), [&](auto tag) {
    using H = decltype(tag);
    rmsnorm_forward_kernel<<<row_blocks(rows), kBlock, 0, native(stream)>>>(ptr<H>(x), ptr<H>(weight), eps, rows, D,
                                                                            ptr<H>(y), ptr<float>(rstd));
    TUTTI_CUDA_CHECK_LAUNCH("rmsnorm_forward_kernel");
  });
}

void rmsnorm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy, const Tensor& dx,
                      const Tensor& dweight, bool accumulate_params, const Stream& stream) {
  const int64_t D = x.dim(-1), rows = x.numel() / D;
  DeviceGuard guard(x.device());
  const cudaStream_t s = native(stream);
  if (rows == 0) {  // no rows: the weight's gradient is 0 (or unchanged)
    if (!accumulate_params && dweight.defined())
      TUTTI_CUDA_CHECK(cudaMemsetAsync(dweight.data(), 0, dweight.nbytes(), s));
    return;
  }
  detail::dispatch_floating("rmsnorm_backward", x.dtype(), [&](auto tag) {
    using H = decltype(tag);
    rmsnorm_dx_kernel<<<row_blocks(rows), kBlock, 0, s>>>(ptr<H>(x), ptr<H>(weight), ptr<float>(rstd), ptr<H>(dy), rows,
                                                          D, ptr<H>(dx));
    TUTTI_CUDA_CHECK_LAUNCH("rmsnorm_dx_kernel");
    if (!dweight.defined()) return;
    const int64_t tiles = (D + kTileCols - 1) / kTileCols;
    const int64_t want = std::max<int64_t>(1, 4 * static_cast<int64_t>(sm_count()) / tiles);
    const int64_t chunks = std::min<int64_t>({want, (rows + 31) / 32, 65535});
    const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
    StreamScratch partial(static_cast<std::size_t>(chunks * D) * sizeof(float), s);
    rmsnorm_weight_partial_kernel<<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks)),
                                    dim3(kTileCols, kTileRows), 0, s>>>(ptr<H>(x), ptr<float>(rstd), ptr<H>(dy), rows,
                                                                        D, rows_per_chunk, partial.as<float>());
    TUTTI_CUDA_CHECK_LAUNCH("rmsnorm_weight_partial_kernel");
    auto finish = [&](auto g_tag) {
      using G = decltype(g_tag);
      rmsnorm_weight_finish_kernel<<<grid_for(D, kBlock), kBlock, 0, s>>>(
          partial.as<float>(), chunks, D, reinterpret_cast<G*>(dweight.data()), accumulate_params);
      TUTTI_CUDA_CHECK_LAUNCH("rmsnorm_weight_finish_kernel");
    };
    if (dweight.dtype() == DType::f32)
      finish(float{});
    else
      finish(device_t<H>{});
  });
}

}  // namespace tutti::kernels::cuda
