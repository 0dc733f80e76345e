// CUDA fixed-point sums: one grid-stride pass each. The rounding is nearbyint (ties to even)
// on x · scale computed in double by one IEEE multiply, as the CPU kernels do, so a slice's
// contribution is the same integers on either.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fixed_point.h"
#include "kernels/validate.h"

namespace tutti::kernels::cuda {
namespace {

using std::int64_t;

constexpr int kBlock = 256;

template <typename T>
__global__ void fixed_point_accumulate_kernel(T* __restrict__ x, int64_t n, double scale, double limit,
                                              long long* __restrict__ acc, unsigned long long* status, bool zero_x) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  bool nonfinite = false, out_of_range = false;
  for (int64_t i = tid; i < n; i += stride) {
    const float f = load_f32(x[i]);
    if (zero_x) x[i] = store_as<T>(0.0f);
    if (!isfinite(f)) {
      nonfinite = true;
      continue;
    }
    const double v = nearbyint(static_cast<double>(f) * scale);
    if (fabs(v) > limit) {
      out_of_range = true;
      continue;
    }
    acc[i] += static_cast<long long>(v);
  }
  // Only ever stores 1, atomically: several blocks may find one (see reduce.cu's check_finite).
  const int any_nonfinite = __syncthreads_or(nonfinite);
  const int any_out_of_range = __syncthreads_or(out_of_range);
  if (threadIdx.x == 0 && any_nonfinite) atomicExch(&status[0], 1ull);
  if (threadIdx.x == 0 && any_out_of_range) atomicExch(&status[1], 1ull);
}

template <typename T>
__global__ void fixed_point_to_float_kernel(const long long* __restrict__ acc, int64_t n, double scale,
                                            T* __restrict__ out) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = tid; i < n; i += stride) {
    out[i] = store_as<T>(static_cast<float>(static_cast<double>(acc[i]) * scale));
  }
}

}  // namespace

void fixed_point_accumulate(const Tensor& x, double scale, double limit, const Tensor& acc, const Tensor& status,
                            bool zero_x, const Stream& stream) {
  DeviceGuard guard(x.device());
  const cudaStream_t s = native(stream);
  const int64_t n = x.numel();
  detail::dispatch_floating("fixed_point_accumulate", x.dtype(), [&](auto tag) {
    using T = device_t<decltype(tag)>;
    fixed_point_accumulate_kernel<T><<<grid_for(n, kBlock), kBlock, 0, s>>>(
        ptr<decltype(tag)>(x), n, scale, limit, reinterpret_cast<long long*>(acc.data()),
        reinterpret_cast<unsigned long long*>(status.data()), zero_x);
    TUTTI_CUDA_CHECK_LAUNCH("fixed_point_accumulate_kernel");
  });
}

void fixed_point_to_float(const Tensor& acc, double scale, const Tensor& out, const Stream& stream) {
  DeviceGuard guard(acc.device());
  const cudaStream_t s = native(stream);
  const int64_t n = acc.numel();
  detail::dispatch_floating("fixed_point_to_float", out.dtype(), [&](auto tag) {
    using T = device_t<decltype(tag)>;
    fixed_point_to_float_kernel<T><<<grid_for(n, kBlock), kBlock, 0, s>>>(
        reinterpret_cast<const long long*>(acc.data()), n, scale, ptr<decltype(tag)>(out));
    TUTTI_CUDA_CHECK_LAUNCH("fixed_point_to_float_kernel");
  });
}

}  // namespace tutti::kernels::cuda
