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
template <typename T> struct DeviceType;
template <> struct DeviceType<float> { using type = float; };
template <> struct DeviceType<Half> { using type = __half; };
template <> struct DeviceType<BFloat16> { using type = __nv_bfloat16; };
template <typename T> using device_t = typename DeviceType<T>::type;

// Loads and stores through fp32, the type all arithmetic accumulates in.
__device__ __forceinline__ float load_f32(float x) { return x; }
__device__ __forceinline__ float load_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float load_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T store_as(float v);
template <> __device__ __forceinline__ float store_as<float>(float v) { return v; }
template <> __device__ __forceinline__ __half store_as<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 store_as<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

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

}  // namespace tutti::kernels::cuda
