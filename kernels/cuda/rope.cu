// CUDA rotary position embedding: a grid-stride loop over the pairs (row, head, i) of the rotated
// heads, each thread turning one pair in place (it reads both columns before writing either, and
// no other thread touches them). Memory-bound; fp32 arithmetic.
#include "kernels/cuda/rope.h"

#include "kernels/cuda/common.cuh"
#include "kernels/validate.h"

namespace tutti::kernels::cuda {
namespace {

using std::int64_t;

constexpr int kBlock = 256;

template <typename T>
__global__ void rope_rotate_kernel(T* x, const float* table, int64_t rows, int64_t T_, int64_t heads, int64_t half,
                                   int64_t width, float sign) {
  const int64_t pairs = rows * heads * half, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs; p += stride) {
    const int64_t i = p % half, h = (p / half) % heads, row = p / (half * heads), t = row % T_;
    T* a = x + row * width + h * 2 * half + i;
    T* b = a + half;
    const float c = table[(t * half + i) * 2], s = sign * table[(t * half + i) * 2 + 1];
    const float va = load_f32(*a), vb = load_f32(*b);
    *a = store_as<T>(va * c - vb * s);
    *b = store_as<T>(vb * c + va * s);
  }
}

}  // namespace

void rope_rotate(const Tensor& qkv, const RopeShape& s, const Tensor& table, bool inverse, const Stream& stream) {
  const int64_t rows = s.B * s.T, half = s.hs / 2;
  if (rows == 0) return;
  DeviceGuard guard(qkv.device());
  detail::dispatch_floating("rope", qkv.dtype(), [&](auto tag) {
    using H = decltype(tag);
    rope_rotate_kernel<<<grid_for(rows * s.rotated_heads * half, kBlock), kBlock, 0, native(stream)>>>(
        ptr<H>(qkv), ptr<float>(table), rows, s.T, s.rotated_heads, half, s.width, inverse ? -1.0f : 1.0f);
    TUTTI_CUDA_CHECK_LAUNCH("rope_rotate_kernel");
  });
}

}  // namespace tutti::kernels::cuda
