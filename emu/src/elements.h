// The element types the emulated libraries compute on (cuBLAS, cuDNN): loaded as fp32,
// stored with one rounding to nearest even.
#pragma once

#include <cstddef>
#include <vector>

#include "cuda_bf16.h"
#include "cuda_fp16.h"

namespace tutti::emu {

enum class Element { f32, f16, bf16 };

inline float load(const void* p, Element t, std::size_t i) {
  switch (t) {
    case Element::f16: return static_cast<const __half*>(p)[i];
    case Element::bf16: return static_cast<const __nv_bfloat16*>(p)[i];
    case Element::f32: break;
  }
  return static_cast<const float*>(p)[i];
}

// Elements [0, n) of p as fp32, converted once: loops that read each element many times (the
// convolutions' direct loops) convert it once instead of per read (an f16 load is a software
// conversion on the CPU: 76% of the emulated convolution test's time was in it).
inline std::vector<float> loads(const void* p, Element t, std::size_t n) {
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = load(p, t, i);
  return out;
}

inline void store(void* p, Element t, std::size_t i, float v) {
  switch (t) {
    case Element::f16: static_cast<__half*>(p)[i] = __half(v); return;
    case Element::bf16: static_cast<__nv_bfloat16*>(p)[i] = __nv_bfloat16(v); return;
    case Element::f32: break;
  }
  static_cast<float*>(p)[i] = v;
}

}  // namespace tutti::emu
