// __nv_bfloat16 of the emulated CUDA device: the top 16 bits of an fp32, rounded to nearest
// even; a nan becomes CUDA's canonical bf16 nan (0x7fff), inf stays inf.
#pragma once

#include <bit>
#include <cstdint>

#include "cuda_runtime.h"

struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) {
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
      __x = 0x7fff;
    } else {
      const std::uint32_t lsb = (bits >> 16) & 1u;
      __x = static_cast<unsigned short>((bits + 0x7fffu + lsb) >> 16);
    }
  }
  operator float() const { return std::bit_cast<float>(static_cast<std::uint32_t>(__x) << 16); }
};

inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return static_cast<float>(h); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) {
  __nv_bfloat16 h;
  h.__x = bits;
  return h;
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
