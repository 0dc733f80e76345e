// The shape of one rotary-embedding call (kernels/rope.cc has validated it), for the CPU and CUDA
// paths. Internal header; plain C++.
#pragma once

#include <cstdint>

namespace tutti::kernels {

struct RopeShape {
  std::int64_t B, T;
  std::int64_t rotated_heads;  // the query heads and the key heads, adjacent at the start of a row
  std::int64_t hs;             // head size (even): pairs (i, i + hs/2)
  std::int64_t width;          // columns of a row of qkv
};

}  // namespace tutti::kernels
