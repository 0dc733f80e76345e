// CUDA token + position embedding.
//   forward: one thread per output element (a gather and an add).
//   dwpe:    one thread per element of dwpe, summing over the batch in order.
//   dwte:    a scatter-add made deterministic without float atomics: the positions are
//            sorted by (token, position) with a bitonic sort of 64-bit keys (token << 32 |
//            position; keys are unique, so the sorted order is unique too); then one block
//            per run of equal tokens sums that token's rows of dout in position order, each
//            thread a set of channels, and adds the sum to dwte once. Atomic adds would be
//            faster but add in whatever order the threads arrive, so two runs would differ in
//            the last bits (llm.c's deterministic encoder backward buckets by token for the
//            same reason, on the host).
// The sort runs in tiles of kTile keys in shared memory for every step whose partners lie
// in one tile, and in global memory (one launch per step) for the longer ones: for N keys,
// log2(N / kTile) · (log2(N / kTile) + 1) / 2 global steps (15 for N = 32768).
#include "kernels/cuda/embedding.h"

#include <limits>

#include "kernels/cuda/common.cuh"
#include "kernels/validate.h"

namespace tutti::kernels::cuda {
namespace {

using std::int64_t;
using std::uint64_t;

constexpr int kBlock = 256;
constexpr int kTile = 512;  // keys a block sorts in shared memory (kTile / 2 threads, 4 KiB)
constexpr uint64_t kPad = ~uint64_t{0};

// wte holds rows [first, first + V) of a table of `total` rows: a token of the table outside them
// gives its position alone (another rank adds its row), a token outside the table nan.
template <typename T>
__global__ void embedding_forward_kernel(const std::int32_t* tokens, const T* wte, const T* wpe, int64_t V,
                                         int64_t first, int64_t total, int64_t T_, int64_t C, int64_t n, float nan,
                                         T* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n; idx += stride) {
    const int64_t pos = idx / C, c = idx % C;
    const int64_t tok = tokens[pos];
    const int64_t row = tok - first;
    const float position = wpe != nullptr ? load_f32(wpe[(pos % T_) * C + c]) : 0.0f;
    const float embedded = row >= 0 && row < V ? load_f32(wte[row * C + c]) + position : position;
    out[idx] = store_as<T>(tok >= 0 && tok < total ? embedded : nan);
  }
}

// dwpe[t, c] (+)= sum over b of dout[b, t, c] for t < T; rows t >= T get 0 (or keep their
// value when accumulating).
template <typename T, typename G>
__global__ void embedding_wpe_backward_kernel(const T* dout, int64_t B, int64_t T_, int64_t C, int64_t rows,
                                              bool accumulate, G* dwpe) {
  const int64_t n = rows * C;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n; idx += stride) {
    const int64_t t = idx / C, c = idx % C;
    float sum = 0.0f;
    if (t < T_)
      for (int64_t b = 0; b < B; ++b) sum += load_f32(dout[(b * T_ + t) * C + c]);
    dwpe[idx] = store_as<G>(accumulate ? load_f32(dwpe[idx]) + sum : sum);
  }
}

// keys[i] = (token - first) << 32 | i for the n positions (a token outside [first, first + V),
// this table's rows, sorts after every one inside and is skipped), kPad up to `padded`.
__global__ void embedding_sort_keys_kernel(const std::int32_t* tokens, int64_t n, int64_t first, int64_t V,
                                           int64_t padded, uint64_t* keys) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < padded; i += stride) {
    if (i >= n) {
      keys[i] = kPad;
      continue;
    }
    const int64_t row = tokens[i] - first;
    const uint64_t t = row >= 0 && row < V ? static_cast<uint64_t>(row) : uint64_t{0xffffffffu};
    keys[i] = t << 32 | static_cast<uint64_t>(i);
  }
}

// One compare-exchange of the bitonic network: elements i and i + j (i without bit j), in
// ascending order where bit k of i is clear, else descending.
__device__ __forceinline__ void compare_exchange(uint64_t& a, uint64_t& b, bool ascending) {
  if ((a > b) == ascending) {
    const uint64_t t = a;
    a = b;
    b = t;
  }
}

// Stages k = 2 .. kTile, every step inside each block's tile of kTile keys.
__global__ void bitonic_sort_tile_kernel(uint64_t* keys) {
  __shared__ uint64_t tile[kTile];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kTile;
  const int p = threadIdx.x;
  tile[p] = keys[base + p];
  tile[p + kTile / 2] = keys[base + p + kTile / 2];
  __syncthreads();
  for (int k = 2; k <= kTile; k *= 2)
    for (int j = k / 2; j > 0; j /= 2) {
      const int i = 2 * j * (p / j) + p % j;
      compare_exchange(tile[i], tile[i + j], ((base + i) & k) == 0);
      __syncthreads();
    }
  keys[base + p] = tile[p];
  keys[base + p + kTile / 2] = tile[p + kTile / 2];
}

// Stage k > kTile, the steps j < kTile (partners inside one tile).
__global__ void bitonic_merge_tile_kernel(uint64_t* keys, int64_t k) {
  __shared__ uint64_t tile[kTile];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kTile;
  const int p = threadIdx.x;
  tile[p] = keys[base + p];
  tile[p + kTile / 2] = keys[base + p + kTile / 2];
  __syncthreads();
  for (int j = kTile / 2; j > 0; j /= 2) {
    const int i = 2 * j * (p / j) + p % j;
    compare_exchange(tile[i], tile[i + j], ((base + i) & k) == 0);
    __syncthreads();
  }
  keys[base + p] = tile[p];
  keys[base + p + kTile / 2] = tile[p + kTile / 2];
}

// Stage k, step j >= kTile: one compare-exchange per thread, in global memory.
__global__ void bitonic_merge_global_kernel(uint64_t* keys, int64_t padded, int64_t k, int64_t j) {
  const int64_t pairs = padded / 2;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs; p += stride) {
    const int64_t i = 2 * j * (p / j) + p % j;
    compare_exchange(keys[i], keys[i + j], (i & k) == 0);
  }
}

// Block by block over the sorted keys: the block at the first key of a token's run sums the
// run's rows of dout in position order (each thread its channels) and adds the sum to
// dwte[token]; every other block skips its key.
template <typename T, typename G>
__global__ void embedding_wte_backward_kernel(const uint64_t* keys, const T* dout, int64_t n, int64_t V, int64_t C,
                                              G* dwte) {
  for (int64_t s = blockIdx.x; s < n; s += gridDim.x) {
    const uint64_t tok = keys[s] >> 32;
    if (tok >= static_cast<uint64_t>(V) || (s > 0 && (keys[s - 1] >> 32) == tok)) continue;
    int64_t end = s + 1;
    while (end < n && (keys[end] >> 32) == tok) ++end;
    G* row = dwte + static_cast<int64_t>(tok) * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
      float sum = 0.0f;
      for (int64_t e = s; e < end; ++e) sum += load_f32(dout[static_cast<int64_t>(keys[e] & 0xffffffffu) * C + c]);
      row[c] = store_as<G>(load_f32(row[c]) + sum);
    }
  }
}

// The smallest power of two >= n and >= kTile.
int64_t padded_size(int64_t n) {
  int64_t p = kTile;
  while (p < n) p *= 2;
  return p;
}

// Sorts the keys of `tokens` (see above) into `keys` (padded_size(n) of them).
void sort_token_keys(const Tensor& tokens, int64_t first, int64_t V, uint64_t* keys, cudaStream_t s) {
  const int64_t n = tokens.numel(), padded = padded_size(n);
  embedding_sort_keys_kernel<<<grid_for(padded, kBlock), kBlock, 0, s>>>(
      static_cast<const std::int32_t*>(tokens.data()), n, first, V, padded, keys);
  TUTTI_CUDA_CHECK_LAUNCH("embedding_sort_keys_kernel");
  const unsigned tiles = static_cast<unsigned>(padded / kTile);
  bitonic_sort_tile_kernel<<<tiles, kTile / 2, 0, s>>>(keys);
  TUTTI_CUDA_CHECK_LAUNCH("bitonic_sort_tile_kernel");
  for (int64_t k = 2 * kTile; k <= padded; k *= 2) {
    for (int64_t j = k / 2; j >= kTile; j /= 2) {
      bitonic_merge_global_kernel<<<grid_for(padded / 2, kBlock), kBlock, 0, s>>>(keys, padded, k, j);
      TUTTI_CUDA_CHECK_LAUNCH("bitonic_merge_global_kernel");
    }
    bitonic_merge_tile_kernel<<<tiles, kTile / 2, 0, s>>>(keys, k);
    TUTTI_CUDA_CHECK_LAUNCH("bitonic_merge_tile_kernel");
  }
}

}  // namespace

void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& out,
                       const EmbeddingRows& rows, const Stream& stream) {
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(out.device());
  detail::dispatch_floating("embedding_forward", wte.dtype(), [&](auto tag) {
    using H = decltype(tag);
    embedding_forward_kernel<<<grid_for(n, kBlock), kBlock, 0, native(stream)>>>(
        static_cast<const std::int32_t*>(tokens.data()), ptr<H>(wte), wpe.defined() ? ptr<H>(wpe) : nullptr, wte.dim(0),
        rows.first, rows.total, tokens.dim(1), wte.dim(1), n, std::numeric_limits<float>::quiet_NaN(), ptr<H>(out));
    TUTTI_CUDA_CHECK_LAUNCH("embedding_forward_kernel");
  });
}

void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dwte, const Tensor& dwpe,
                        bool accumulate_params, const EmbeddingRows& rows, const Stream& stream) {
  DeviceGuard guard(dout.device());
  const cudaStream_t s = native(stream);
  const int64_t B = tokens.dim(0), T = tokens.dim(1), C = dout.dim(2), n = tokens.numel();
  detail::dispatch_floating("embedding_backward", dout.dtype(), [&](auto tag) {
    using H = decltype(tag);
    // Each gradient is f32 or dout's dtype: run `f` with its device element type.
    auto with_grad_type = [&](const Tensor& g, auto f) {
      if (g.dtype() == DType::f32)
        f(static_cast<float*>(g.data()));
      else
        f(reinterpret_cast<device_t<H>*>(g.data()));
    };
    if (dwpe.defined() && dwpe.numel() > 0) {
      with_grad_type(dwpe, [&](auto* g) {
        embedding_wpe_backward_kernel<<<grid_for(dwpe.numel(), kBlock), kBlock, 0, s>>>(
            ptr<H>(dout), B, T, C, dwpe.dim(0), accumulate_params, g);
        TUTTI_CUDA_CHECK_LAUNCH("embedding_wpe_backward_kernel");
      });
    }
    if (dwte.defined() && dwte.numel() > 0) {
      if (!accumulate_params) TUTTI_CUDA_CHECK(cudaMemsetAsync(dwte.data(), 0, dwte.nbytes(), s));
      if (n == 0) return;
      const int64_t V = dwte.dim(0);
      StreamScratch keys(static_cast<std::size_t>(padded_size(n)) * sizeof(uint64_t), s);
      sort_token_keys(tokens, rows.first, V, keys.as<uint64_t>(), s);
      const int threads = C >= 256 ? 256 : 64;
      const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(n, 65535));
      with_grad_type(dwte, [&](auto* g) {
        embedding_wte_backward_kernel<<<blocks, threads, 0, s>>>(keys.as<uint64_t>(), ptr<H>(dout), n, V, C, g);
        TUTTI_CUDA_CHECK_LAUNCH("embedding_wte_backward_kernel");
      });
    }
  });
}

}  // namespace tutti::kernels::cuda
