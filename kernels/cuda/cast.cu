// CUDA casts (round to nearest even through fp32: every f16 and bf16 value is exact in fp32,
// so each cast rounds once) and the fused unscale-and-check of mixed precision.
#include "kernels/cuda/cast.h"

#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/validate.h"

namespace tutti::kernels::cuda {
namespace {

using std::int64_t;

constexpr int kBlock = 256;

// VEC elements per access: 16 bytes of the narrower type (8 for a half, 4 for f32 -> f32).
template <typename From, typename To, int VEC>
__global__ void cast_kernel(const From* __restrict__ x, To* __restrict__ out, int64_t n) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = n / VEC;
  const auto* xp = reinterpret_cast<const Pack<From, VEC>*>(x);
  auto* op = reinterpret_cast<Pack<To, VEC>*>(out);
  for (int64_t i = tid; i < packs; i += stride) {
    const Pack<From, VEC> a = xp[i];
    Pack<To, VEC> b;
#pragma unroll
    for (int j = 0; j < VEC; ++j) b.v[j] = store_as<To>(load_f32(a.v[j]));
    op[i] = b;
  }
  for (int64_t i = packs * VEC + tid; i < n; i += stride) out[i] = store_as<To>(load_f32(x[i]));
}

// In place: g = round(g · inv_scale); the flag is set when a value is non-finite before
// scaling or after rounding (a half can overflow when inv_scale > 1). Only ever stores 1.
template <typename T, int VEC>
__global__ void unscale_kernel(T* __restrict__ g, int64_t n, float inv_scale, int* found) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = n / VEC;
  auto* gp = reinterpret_cast<Pack<T, VEC>*>(g);
  bool bad = false;
  for (int64_t i = tid; i < packs; i += stride) {
    Pack<T, VEC> p = gp[i];
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float v = load_f32(p.v[j]);
      p.v[j] = store_as<T>(v * inv_scale);
      bad |= !isfinite(v) || !isfinite(load_f32(p.v[j]));
    }
    gp[i] = p;
  }
  for (int64_t i = packs * VEC + tid; i < n; i += stride) {
    const float v = load_f32(g[i]);
    const T scaled = store_as<T>(v * inv_scale);
    bad |= !isfinite(v) || !isfinite(load_f32(scaled));
    g[i] = scaled;
  }
  // Atomic: several blocks may find a non-finite value, and plain stores to one address from
  // several blocks of a launch are a data race (the emulated device's hazard detector says so).
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicExch(found, 1);
}

template <typename From, typename To>
void launch_cast(const From* x, To* out, int64_t n, cudaStream_t s) {
  constexpr int kVec = 16 / (sizeof(From) < sizeof(To) ? sizeof(From) : sizeof(To));
  if (is_aligned(x, sizeof(From) * kVec) && is_aligned(out, sizeof(To) * kVec)) {
    cast_kernel<From, To, kVec><<<grid_for(n / kVec, kBlock), kBlock, 0, s>>>(x, out, n);
  } else {
    cast_kernel<From, To, 1><<<grid_for(n, kBlock), kBlock, 0, s>>>(x, out, n);
  }
  TUTTI_CUDA_CHECK_LAUNCH("cast_kernel");
}

}  // namespace

void cast(const Tensor& x, const Tensor& out, const Stream& stream) {
  DeviceGuard guard(x.device());
  const cudaStream_t s = native(stream);
  if (x.dtype() == out.dtype()) {
    if (x.data() != out.data()) {
      TUTTI_CUDA_CHECK(cudaMemcpyAsync(out.data(), x.data(), x.nbytes(), cudaMemcpyDeviceToDevice, s));
    }
    return;
  }
  detail::dispatch_floating("cast", x.dtype(), [&](auto from_tag) {
    using FromHost = decltype(from_tag);
    detail::dispatch_floating("cast", out.dtype(), [&](auto to_tag) {
      using ToHost = decltype(to_tag);
      // Same-dtype pairs never reach here (copied above); skip instantiating them.
      if constexpr (!std::is_same_v<FromHost, ToHost>) {
        launch_cast(ptr<FromHost>(x), ptr<ToHost>(out), x.numel(), s);
      }
    });
  });
}

void unscale_and_check(const Tensor& grad, float inv_scale, const Tensor& found, const Stream& stream) {
  DeviceGuard guard(grad.device());
  const cudaStream_t s = native(stream);
  const int64_t n = grad.numel();
  detail::dispatch_floating("unscale_and_check", grad.dtype(), [&](auto tag) {
    using T = device_t<decltype(tag)>;
    constexpr int kVec = 16 / sizeof(T);
    T* g = ptr<decltype(tag)>(grad);
    int* flag = found.data_as<std::int32_t>();
    if (is_aligned(g, 16)) {
      unscale_kernel<T, kVec><<<grid_for(n / kVec, kBlock), kBlock, 0, s>>>(g, n, inv_scale, flag);
    } else {
      unscale_kernel<T, 1><<<grid_for(n, kBlock), kBlock, 0, s>>>(g, n, inv_scale, flag);
    }
    TUTTI_CUDA_CHECK_LAUNCH("unscale_kernel");
  });
}

}  // namespace tutti::kernels::cuda
