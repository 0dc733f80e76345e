// CUDA reductions. sum / sum_squares run in two stages: a grid-stride pass where every block
// reduces its share to one fp32 partial, then one block sums the partials in a fixed order
// (deterministic: no float atomics) and writes or adds the result into out. The partials live
// in stream-ordered memory (StreamScratch, cudaMallocAsync), so concurrent calls on other
// streams cannot collide and nothing syncs the host. check_finite ORs a flag per block and
// only ever stores 1.
#include "kernels/cuda/reduce.h"

#include "kernels/cuda/common.cuh"
#include "kernels/validate.h"

namespace tutti::kernels::cuda {
namespace {

using std::int64_t;

constexpr int kBlock = 256;
constexpr int kFinishBlock = 1024;

template <bool Square>
__device__ __forceinline__ float term(float v) {
  return Square ? v * v : v;
}

// Each block writes the sum of its share into partials[blockIdx.x]. VEC elements per 16-byte
// load when x is aligned (VEC = 1 otherwise); the tail after the last full pack is scalar.
template <bool Square, typename T, int VEC>
__global__ void partial_sums_kernel(const T* __restrict__ x, int64_t n, float* __restrict__ partials) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = n / VEC;
  const auto* xp = reinterpret_cast<const Pack<T, VEC>*>(x);
  float acc = 0.0f;
  for (int64_t i = tid; i < packs; i += stride) {
    const Pack<T, VEC> p = xp[i];
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc += term<Square>(load_f32(p.v[j]));
  }
  for (int64_t i = packs * VEC + tid; i < n; i += stride) acc += term<Square>(load_f32(x[i]));
  acc = block_reduce_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// One block: out = (accumulate ? out : 0) + sum of the partials, in a fixed order.
__global__ void finish_sum_kernel(const float* __restrict__ partials, int count, float* out, bool accumulate) {
  float acc = 0.0f;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_reduce_sum(acc);
  if (threadIdx.x == 0) *out = accumulate ? *out + acc : acc;
}

template <typename T, int VEC>
__global__ void check_finite_kernel(const T* __restrict__ x, int64_t n, int* found) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = n / VEC;
  const auto* xp = reinterpret_cast<const Pack<T, VEC>*>(x);
  bool bad = false;
  for (int64_t i = tid; i < packs; i += stride) {
    const Pack<T, VEC> p = xp[i];
#pragma unroll
    for (int j = 0; j < VEC; ++j) bad |= !isfinite(load_f32(p.v[j]));
  }
  for (int64_t i = packs * VEC + tid; i < n; i += stride) bad |= !isfinite(load_f32(x[i]));
  // Only ever stores 1: the flag collects several buffers and is never cleared here. Atomic:
  // several blocks may find a non-finite value, and plain stores to one address from several
  // blocks of a launch are a data race (the emulated device's hazard detector says so).
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicExch(found, 1);
}

template <bool Square>
void reduce_launch(const char* op, const Tensor& x, const Tensor& out, bool accumulate, const Stream& stream) {
  DeviceGuard guard(x.device());
  const cudaStream_t s = native(stream);
  const int64_t n = x.numel();
  detail::dispatch_floating(op, x.dtype(), [&](auto tag) {
    using T = device_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    const T* xp = ptr<decltype(tag)>(x);
    const bool vec = is_aligned(xp, 16);
    const unsigned grid = grid_for(vec ? n / kVec : n, kBlock);
    StreamScratch scratch(grid * sizeof(float), s);
    float* partials = scratch.as<float>();
    if (vec) {
      partial_sums_kernel<Square, T, kVec><<<grid, kBlock, 0, s>>>(xp, n, partials);
    } else {
      partial_sums_kernel<Square, T, 1><<<grid, kBlock, 0, s>>>(xp, n, partials);
    }
    TUTTI_CUDA_CHECK_LAUNCH("partial_sums_kernel");
    finish_sum_kernel<<<1, kFinishBlock, 0, s>>>(partials, static_cast<int>(grid), out.data_as<float>(), accumulate);
    TUTTI_CUDA_CHECK_LAUNCH("finish_sum_kernel");
  });
}

}  // namespace

void sum(const Tensor& x, const Tensor& out, bool accumulate, const Stream& stream) {
  reduce_launch<false>("sum", x, out, accumulate, stream);
}

void sum_squares(const Tensor& x, const Tensor& out, bool accumulate, const Stream& stream) {
  reduce_launch<true>("sum_squares", x, out, accumulate, stream);
}

void check_finite(const Tensor& x, const Tensor& found, const Stream& stream) {
  DeviceGuard guard(x.device());
  const cudaStream_t s = native(stream);
  const int64_t n = x.numel();
  detail::dispatch_floating("check_finite", x.dtype(), [&](auto tag) {
    using T = device_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    const T* xp = ptr<decltype(tag)>(x);
    int* flag = found.data_as<std::int32_t>();
    if (is_aligned(xp, 16)) {
      check_finite_kernel<T, kVec><<<grid_for(n / kVec, kBlock), kBlock, 0, s>>>(xp, n, flag);
    } else {
      check_finite_kernel<T, 1><<<grid_for(n, kBlock), kBlock, 0, s>>>(xp, n, flag);
    }
    TUTTI_CUDA_CHECK_LAUNCH("check_finite_kernel");
  });
}

}  // namespace tutti::kernels::cuda
