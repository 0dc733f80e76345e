// Inputs for the kernel benchmarks: uniform floats in [-1, 1) from a seed (the same values on
// every run, so that two builds compare on equal data). Header-only, for benchmarks/*.
#pragma once

#include <cstddef>
#include <random>
#include <vector>

namespace bench {

inline std::vector<float> uniform_floats(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

}  // namespace bench
