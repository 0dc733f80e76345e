// The counter-based random numbers of dropout, shared by the CPU and the CUDA kernels so both
// draw the same number for the same (seed, counter) and so drop the same elements.
//
// uniform(seed, i) is output i of a SplitMix64 generator whose state starts at mix(seed):
// a 64-bit bijective mixer (Stafford's variant 13, as in SplitMix64) over state + i · gamma.
// The top 24 bits become a float in [0, 1) exactly (k · 2^-24), so the comparison with p
// is bit-identical on every device. Plain C++; nvcc sees __host__ __device__.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TUTTI_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TUTTI_HOST_DEVICE inline
#endif

namespace tutti::kernels::rng {

TUTTI_HOST_DEVICE std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The generator's starting state for a seed (compute once per launch).
TUTTI_HOST_DEVICE std::uint64_t key_of(std::uint64_t seed) { return mix64(seed ^ 0x5851f42d4c957f2dULL); }

// Uniform in [0, 1) for counter `index` of the stream `key` (= key_of(seed)).
TUTTI_HOST_DEVICE float uniform(std::uint64_t key, std::uint64_t index) {
  const std::uint64_t h = mix64(key + (index + 1) * 0x9e3779b97f4a7c15ULL);
  return static_cast<float>(static_cast<std::uint32_t>(h >> 40)) * (1.0f / 16777216.0f);
}

}  // namespace tutti::kernels::rng
