// CUDA layer normalization, fp32 accumulation for every dtype.
//   forward: one warp per row: mean, then the sum of squared deviations (two passes over the
//            row, no cancellation), then y; lane 0 saves mean and rstd.
//   backward dx: one warp per row: the two row sums of g = dy·gamma, then dx.
//   backward dgamma/dbeta: two stages, deterministic (no float atomics): blocks of (32
//            columns × 8 row-threads) sum dy·xhat and dy over one chunk of rows into
//            partials[chunk, D]; then every column adds its chunks in order.
#include "kernels/cuda/layernorm.h"

#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/validate.h"

namespace tutti::kernels::cuda {
namespace {

using std::int64_t;

constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / 32;

template <typename T>
__global__ void layernorm_forward_kernel(const T* x, const T* gamma, const T* beta, float eps, int64_t rows, int64_t D,
                                         T* y, float* mean, float* rstd) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps leave together: only warp shuffles follow
  const T* xr = x + row * D;
  T* yr = y + row * D;
  float sum = 0.0f;
  for (int64_t i = lane; i < D; i += 32) sum += load_f32(xr[i]);
  const float mu = warp_allreduce_sum(sum) / static_cast<float>(D);
  float sq = 0.0f;
  for (int64_t i = lane; i < D; i += 32) {
    const float d = load_f32(xr[i]) - mu;
    sq += d * d;
  }
  const float var = warp_allreduce_sum(sq) / static_cast<float>(D);
  const float rs = 1.0f / sqrtf(var + eps);
  for (int64_t i = lane; i < D; i += 32)
    yr[i] = store_as<T>((load_f32(xr[i]) - mu) * rs * load_f32(gamma[i]) + load_f32(beta[i]));
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// dx = rstd · (g - mean(g) - xhat · mean(g · xhat)), g = dy · gamma.
template <typename T>
__global__ void layernorm_dx_kernel(const T* x, const T* gamma, const float* mean, const float* rstd, const T* dy,
                                    int64_t rows, int64_t D, T* dx) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const T* xr = x + row * D;
  const T* gr = dy + row * D;
  T* out = dx + row * D;
  const float mu = mean[row], rs = rstd[row];
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int64_t i = lane; i < D; i += 32) {
    const float g = load_f32(gr[i]) * load_f32(gamma[i]);
    sum_g += g;
    sum_gx += g * (load_f32(xr[i]) - mu) * rs;
  }
  const float mean_g = warp_allreduce_sum(sum_g) / static_cast<float>(D);
  const float mean_gx = warp_allreduce_sum(sum_gx) / static_cast<float>(D);
  for (int64_t i = lane; i < D; i += 32) {
    const float xhat = (load_f32(xr[i]) - mu) * rs;
    out[i] = store_as<T>(rs * (load_f32(gr[i]) * load_f32(gamma[i]) - mean_g - xhat * mean_gx));
  }
}

constexpr int kTileCols = 32, kTileRows = 8;

// partial_g[chunk, c] = sum over the chunk's rows of dy · xhat; partial_b likewise of dy.
template <typename T>
__global__ void layernorm_param_partial_kernel(const T* x, const float* mean, const float* rstd, const T* dy,
                                               int64_t rows, int64_t D, int64_t rows_per_chunk, float* partial_g,
                                               float* partial_b) {
  __shared__ float tile_g[kTileRows][kTileCols + 1];
  __shared__ float tile_b[kTileRows][kTileCols + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kTileCols + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float acc_g = 0.0f, acc_b = 0.0f;
  if (c < D)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kTileRows) {
      const float g = load_f32(dy[r * D + c]);
      acc_g += g * (load_f32(x[r * D + c]) - mean[r]) * rstd[r];
      acc_b += g;
    }
  tile_g[threadIdx.y][threadIdx.x] = acc_g;
  tile_b[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y == 0 && c < D) {
    float sg = 0.0f, sb = 0.0f;
#pragma unroll
    for (int k = 0; k < kTileRows; ++k) sg += tile_g[k][threadIdx.x], sb += tile_b[k][threadIdx.x];
    partial_g[static_cast<int64_t>(blockIdx.y) * D + c] = sg;
    partial_b[static_cast<int64_t>(blockIdx.y) * D + c] = sb;
  }
}

// out[c] = (accumulate ? out[c] : 0) + the chunks' sums in order; a null out is skipped.
template <typename G>
__global__ void layernorm_param_finish_kernel(const float* partial_g, const float* partial_b, int64_t chunks, int64_t D,
                                              G* dgamma, G* dbeta, bool accumulate) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < D; c += stride) {
    float sg = 0.0f, sb = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) sg += partial_g[k * D + c], sb += partial_b[k * D + c];
    if (dgamma != nullptr) dgamma[c] = store_as<G>(accumulate ? load_f32(dgamma[c]) + sg : sg);
    if (dbeta != nullptr) dbeta[c] = store_as<G>(accumulate ? load_f32(dbeta[c]) + sb : sb);
  }
}

unsigned row_blocks(int64_t rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

}  // namespace

void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, const Tensor& y,
                       const Tensor& mean, const Tensor& rstd, const Stream& stream) {
  const int64_t D = x.dim(-1), rows = x.numel() / D;
  if (rows == 0) return;
  DeviceGuard guard(x.device());
  detail::dispatch_floating("layernorm_forward", x.dtype(), [&](auto tag) {
    using H = decltype(tag);
    layernorm_forward_kernel<<<row_blocks(rows), kBlock, 0, native(stream)>>>(
        ptr<H>(x), ptr<H>(gamma), ptr<H>(beta), eps, rows, D, ptr<H>(y), ptr<float>(mean), ptr<float>(rstd));
    TUTTI_CUDA_CHECK_LAUNCH("layernorm_forward_kernel");
  });
}

void layernorm_backward(const Tensor& x, const Tensor& gamma, const Tensor& mean, const Tensor& rstd, const Tensor& dy,
                        const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta, bool accumulate_params,
                        const Stream& stream) {
  const int64_t D = x.dim(-1), rows = x.numel() / D;
  DeviceGuard guard(x.device());
  const cudaStream_t s = native(stream);
  const bool params = dgamma.defined() || dbeta.defined();
  if (rows == 0) {  // no rows: parameter gradients are 0 (or unchanged)
    if (!accumulate_params) {
      if (dgamma.defined()) TUTTI_CUDA_CHECK(cudaMemsetAsync(dgamma.data(), 0, dgamma.nbytes(), s));
      if (dbeta.defined()) TUTTI_CUDA_CHECK(cudaMemsetAsync(dbeta.data(), 0, dbeta.nbytes(), s));
    }
    return;
  }
  detail::dispatch_floating("layernorm_backward", x.dtype(), [&](auto tag) {
    using H = decltype(tag);
    layernorm_dx_kernel<<<row_blocks(rows), kBlock, 0, s>>>(ptr<H>(x), ptr<H>(gamma), ptr<float>(mean),
                                                            ptr<float>(rstd), ptr<H>(dy), rows, D, ptr<H>(dx));
    TUTTI_CUDA_CHECK_LAUNCH("layernorm_dx_kernel");
    if (!params) return;
    const int64_t tiles = (D + kTileCols - 1) / kTileCols;
    const int64_t want = std::max<int64_t>(1, 4 * static_cast<int64_t>(sm_count()) / tiles);
    const int64_t chunks = std::min<int64_t>({want, (rows + 31) / 32, 65535});
    const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
    StreamScratch partial(2 * static_cast<std::size_t>(chunks * D) * sizeof(float), s);
    float* partial_g = partial.as<float>();
    float* partial_b = partial_g + chunks * D;
    layernorm_param_partial_kernel<<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(chunks)),
                                     dim3(kTileCols, kTileRows), 0, s>>>(
        ptr<H>(x), ptr<float>(mean), ptr<float>(rstd), ptr<H>(dy), rows, D, rows_per_chunk, partial_g, partial_b);
    TUTTI_CUDA_CHECK_LAUNCH("layernorm_param_partial_kernel");
    // dgamma and dbeta share a dtype here when both are given; each is f32 or x's dtype.
    const DType gd = dgamma.defined() ? dgamma.dtype() : dbeta.dtype();
    auto finish = [&](auto g_tag) {
      using G = decltype(g_tag);
      G* g = dgamma.defined() ? reinterpret_cast<G*>(dgamma.data()) : nullptr;
      G* b = dbeta.defined() ? reinterpret_cast<G*>(dbeta.data()) : nullptr;
      layernorm_param_finish_kernel<<<grid_for(D, kBlock), kBlock, 0, s>>>(partial_g, partial_b, chunks, D, g, b,
                                                                           accumulate_params);
      TUTTI_CUDA_CHECK_LAUNCH("layernorm_param_finish_kernel");
    };
    if (dgamma.defined() && dbeta.defined() && dgamma.dtype() != dbeta.dtype()) {
      // Mixed (one f32, one half): finish each on its own.
      auto finish_one = [&](const Tensor& t, bool is_gamma) {
        auto run = [&](auto g_tag) {
          using G = decltype(g_tag);
          G* p = reinterpret_cast<G*>(t.data());
          layernorm_param_finish_kernel<<<grid_for(D, kBlock), kBlock, 0, s>>>(
              partial_g, partial_b, chunks, D, is_gamma ? p : nullptr, is_gamma ? nullptr : p, accumulate_params);
          TUTTI_CUDA_CHECK_LAUNCH("layernorm_param_finish_kernel");
        };
        if (t.dtype() == DType::f32)
          run(float{});
        else
          run(device_t<H>{});
      };
      finish_one(dgamma, true);
      finish_one(dbeta, false);
    } else if (gd == DType::f32) {
      finish(float{});
    } else {
      finish(device_t<H>{});
    }
  });
}

}  // namespace tutti::kernels::cuda
