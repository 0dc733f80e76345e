// Shared pieces of the CUDA kernels: element types, fp32 conversion, launch geometry,
// stream access. Internal header for .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda_check.h"
#include "tutti/core/dtype.h"
#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"

namespace tutti::kernels::cuda {

// The device element type of a host element type: float, __half, __nv_bfloat16.
template <typename T>
struct DeviceType;
template <>
struct DeviceType<float> {
  using type = float;
};
template <>
struct DeviceType<Half> {
  using type = __half;
};
template <>
struct DeviceType<BFloat16> {
  using type = __nv_bfloat16;
};
template <typename T>
using device_t = typename DeviceType<T>::type;

// Loads and stores through fp32, the type all arithmetic accumulates in.
__device__ __forceinline__ float load_f32(float x) { return x; }
__device__ __forceinline__ float load_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float load_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T store_as(float v);
template <>
__device__ __forceinline__ float store_as<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half store_as<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 store_as<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// The cudaStream_t of a tutti Stream (the default stream for a CPU Stream object).
inline cudaStream_t native(const Stream& s) { return static_cast<cudaStream_t>(s.native()); }

// Typed device pointer of a tensor.
template <typename T>
device_t<T>* ptr(const Tensor& t) {
  return reinterpret_cast<device_t<T>*>(t.data());
}

// Number of SMs of the current device, asked once per device.
int sm_count();

// A grid for a grid-stride loop over n items with `block` threads: enough blocks to fill
// every SM several times over, never more than the work needs.
inline unsigned grid_for(std::int64_t n, int block, int blocks_per_sm = 8) {
  const std::int64_t needed = (n + block - 1) / block;
  const std::int64_t cap = static_cast<std::int64_t>(sm_count()) * blocks_per_sm;
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min(needed, cap)));
}

// ---- added by kernels-b: device scope, vector packs, block reductions ----

// Makes `device`'s GPU current on this thread for the scope (kernels launch on the current
// device), and restores the previous one afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device) {
    TUTTI_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device.index) TUTTI_CUDA_CHECK(cudaSetDevice(device.index));
    target_ = device.index;
  }
  ~DeviceGuard() {
    if (previous_ != target_) cudaSetDevice(previous_);  // a destructor must not throw
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  int target_ = 0;
};

// VEC elements loaded or stored as one aligned vector access (VEC·sizeof(T) = 16 bytes makes
// one 128-bit load). Only for pointers aligned to alignof(Pack) (see is_aligned).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};

inline bool is_aligned(const void* p, std::size_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

// Sum over the block of every thread's v; the result is valid in thread 0. blockDim.x must be
// a multiple of 32 (at most 1024). Contains __syncthreads: every thread of the block calls it.
__device__ __forceinline__ float block_reduce_sum(float v) {
  __shared__ float warp_sums[32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // warp_sums may still be read by a previous call
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / 32;
    v = lane < warps ? warp_sums[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;
}

// ---- added by kernels-a: warp/block all-reductions, stream-ordered scratch, launch check ----

// Sum / max over the 32 lanes of a warp; every lane gets the result (butterfly, fixed order).
template <typename T>
__device__ __forceinline__ T warp_allreduce_sum(T v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float warp_allreduce_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum / max over the block; every thread gets the result. blockDim.x a multiple of 32 (at
// most 1024); every thread of the block must call it (it holds __syncthreads).
template <typename T>
__device__ __forceinline__ T block_allreduce_sum(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_allreduce_sum(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_allreduce_sum(lane < warps ? partial[lane] : T(0));
}
__device__ __forceinline__ float block_allreduce_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_allreduce_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_allreduce_max(lane < warps ? partial[lane] : -INFINITY);
}

// Device memory for the lifetime of one launcher, ordered on its stream (cudaMallocAsync /
// cudaFreeAsync from the device's pool): no host sync, and calls on other streams never share it.
class StreamScratch {
 public:
  StreamScratch(std::size_t nbytes, cudaStream_t stream) : stream_(stream) {
    if (nbytes > 0) TUTTI_CUDA_CHECK(cudaMallocAsync(&data_, nbytes, stream));
  }
  ~StreamScratch() {
    if (data_ != nullptr) cudaFreeAsync(data_, stream_);  // a destructor must not throw
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  cudaStream_t stream_;
};

// TUTTI_CUDA_CHECK_LAUNCH for a kernel name known only at run time.
inline void check_launch(const char* what, const char* file, int line) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) [[unlikely]]
    ::tutti::detail::throw_cuda_error(err, what, file, line);
}
#define TUTTI_CUDA_CHECK_LAUNCH_OF(what) ::tutti::kernels::cuda::check_launch((what), __FILE__, __LINE__)

}  // namespace tutti::kernels::cuda
