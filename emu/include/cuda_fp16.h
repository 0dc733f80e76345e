// __half of the emulated CUDA device: IEEE binary16 bits, converted through GCC's _Float16
// (libgcc's conversions round to nearest even and keep inf and nan), as CUDA's __float2half_rn.
#pragma once

#include <bit>
#include <cstdint>

#include "cuda_runtime.h"

struct __half {
  unsigned short __x;
  __half() = default;
  __half(float f) : __x(std::bit_cast<unsigned short>(static_cast<_Float16>(f))) {}
  operator float() const { return static_cast<float>(std::bit_cast<_Float16>(__x)); }
};

inline __half __float2half_rn(float f) { return __half(f); }
inline __half __float2half(float f) { return __half(f); }
inline float __half2float(__half h) { return static_cast<float>(h); }
inline __half __ushort_as_half(unsigned short bits) {
  __half h;
  h.__x = bits;
  return h;
}
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
