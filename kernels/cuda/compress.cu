// CUDA block quantization: one warp per block of values for quantize (absmax by a warp
// all-reduction, then the codes), one thread per byte for dequantize. The f32 operations are
// the CPU reference's (kernels/cpu/compress.cc), with explicit rounding intrinsics so that nvcc
// contracts nothing into a fused multiply-add: the same bits on both.
#include "kernels/cuda/compress.h"

#include "kernels/cuda/common.cuh"

namespace tutti::kernels::cuda {
namespace {

using std::int64_t;

constexpr int kBlock = 256;  // threads per CUDA block: 8 warps, each one block of values at a time

__device__ __forceinline__ int quantize_one(float v, float s, int qmax) {
  if (s == 0.0f) return 0;
  const float r = rintf(__fdiv_rn(v, s));  // ties to even
  return r > static_cast<float>(qmax) ? qmax : (r < static_cast<float>(-qmax) ? -qmax : static_cast<int>(r));
}

__device__ __forceinline__ float load_value(const float* __restrict__ x, const float* __restrict__ r, int64_t i) {
  return r != nullptr ? __fadd_rn(x[i], r[i]) : x[i];
}

// Warp w of the grid takes blocks w, w + warps, ...: absmax, the scale, then each lane the codes
// of every 32nd value (8 bits) or pair of values (4 bits: block is even, so a byte never
// straddles two blocks and each byte has one writer). residual (may be null): error feedback.
template <int BITS>
__global__ void quantize_kernel(const float* __restrict__ x, float* __restrict__ residual,
                                unsigned char* __restrict__ bytes, float* __restrict__ scales, int64_t n, int64_t block,
                                int64_t nblocks, int64_t padded_bytes) {
  constexpr int kQmax = BITS == 8 ? 127 : 7;
  const int lane = threadIdx.x % 32;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t b = warp; b < nblocks; b += warps) {
    const int64_t start = b * block;
    const int64_t len = n - start < block ? n - start : block;
    float absmax = 0.0f;
    for (int64_t j = lane; j < len; j += 32) absmax = fmaxf(absmax, fabsf(load_value(x, residual, start + j)));
    absmax = warp_allreduce_max(absmax);
    __syncwarp();  // every lane has read its residuals before any lane overwrites them (4 bits)
    const float s = __fdiv_rn(absmax, static_cast<float>(kQmax));
    if (lane == 0) scales[b] = s;
    if constexpr (BITS == 8) {
      for (int64_t j = lane; j < len; j += 32) {
        const float v = load_value(x, residual, start + j);
        const int code = quantize_one(v, s, kQmax);
        bytes[start + j] = static_cast<unsigned char>(static_cast<signed char>(code));
        if (residual != nullptr) residual[start + j] = __fsub_rn(v, __fmul_rn(static_cast<float>(code), s));
      }
    } else {
      for (int64_t p = lane; 2 * p < len; p += 32) {
        const int64_t i0 = start + 2 * p;
        const float v0 = load_value(x, residual, i0);
        const int c0 = quantize_one(v0, s, kQmax);
        unsigned byte = static_cast<unsigned>(c0) & 0xfu;
        if (residual != nullptr) residual[i0] = __fsub_rn(v0, __fmul_rn(static_cast<float>(c0), s));
        if (2 * p + 1 < len) {
          const float v1 = load_value(x, residual, i0 + 1);
          const int c1 = quantize_one(v1, s, kQmax);
          byte |= (static_cast<unsigned>(c1) & 0xfu) << 4;
          if (residual != nullptr) residual[i0 + 1] = __fsub_rn(v1, __fmul_rn(static_cast<float>(c1), s));
        }
        bytes[i0 / 2] = static_cast<unsigned char>(byte);
      }
    }
    // The last block's warp zeroes the bytes past the last value, up to the end of the word.
    if (b == nblocks - 1) {
      const int64_t used = BITS == 8 ? n : (n + 1) / 2;
      for (int64_t k = used + lane; k < padded_bytes; k += 32) bytes[k] = 0;
    }
  }
}

// One thread per byte: its one (8 bits) or two (4 bits) values.
template <int BITS>
__global__ void dequantize_kernel(const unsigned char* __restrict__ bytes, const float* __restrict__ scales,
                                  float* __restrict__ out, int64_t n, int64_t block, bool accumulate) {
  const int64_t used = BITS == 8 ? n : (n + 1) / 2;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < used; k += stride) {
    const unsigned byte = bytes[k];
    constexpr int kPer = BITS == 8 ? 1 : 2;
    for (int h = 0; h < kPer; ++h) {
      const int64_t i = k * kPer + h;
      if (i >= n) break;
      const int code = BITS == 8 ? static_cast<int>(static_cast<signed char>(byte))
                                 : static_cast<int>(((byte >> (4 * h)) & 0xfu) ^ 8u) - 8;
      const float d = __fmul_rn(static_cast<float>(code), scales[i / block]);
      out[i] = accumulate ? __fadd_rn(out[i], d) : d;
    }
  }
}

}  // namespace

void quantize_blocks(const Tensor& x, int bits, std::int64_t block, const Tensor& q, const Tensor& scales,
                     const Tensor& residual, const Stream& stream) {
  DeviceGuard guard(x.device());
  const cudaStream_t s = native(stream);
  const int64_t n = x.numel();
  const int64_t nblocks = (n + block - 1) / block;
  const unsigned grid = grid_for(nblocks * 32, kBlock);
  float* r = residual.defined() ? residual.data_as<float>() : nullptr;
  auto* bytes = static_cast<unsigned char*>(q.data());
  if (bits == 8) {
    quantize_kernel<8>
        <<<grid, kBlock, 0, s>>>(x.data_as<float>(), r, bytes, scales.data_as<float>(), n, block, nblocks, q.nbytes());
  } else {
    quantize_kernel<4>
        <<<grid, kBlock, 0, s>>>(x.data_as<float>(), r, bytes, scales.data_as<float>(), n, block, nblocks, q.nbytes());
  }
  TUTTI_CUDA_CHECK_LAUNCH("quantize_kernel");
}

void dequantize_blocks(const Tensor& q, const Tensor& scales, int bits, std::int64_t block, const Tensor& out,
                       bool accumulate, const Stream& stream) {
  DeviceGuard guard(out.device());
  const cudaStream_t s = native(stream);
  const int64_t n = out.numel();
  const auto* bytes = static_cast<const unsigned char*>(q.data());
  if (bits == 8) {
    dequantize_kernel<8><<<grid_for(n, kBlock), kBlock, 0, s>>>(bytes, scales.data_as<float>(), out.data_as<float>(), n,
                                                                block, accumulate);
  } else {
    dequantize_kernel<4><<<grid_for((n + 1) / 2, kBlock), kBlock, 0, s>>>(bytes, scales.data_as<float>(),
                                                                          out.data_as<float>(), n, block, accumulate);
  }
  TUTTI_CUDA_CHECK_LAUNCH("dequantize_kernel");
}

}  // namespace tutti::kernels::cuda
