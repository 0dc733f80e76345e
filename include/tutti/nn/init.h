// Deterministic initialization. Values are drawn on the host from a counter-based generator
// (SplitMix64), so a seed gives the same bits on every machine, compiler and device.
#pragma once

#include <cstdint>

#include "tutti/core/tensor.h"
#include "tutti/nn/parameter.h"

namespace tutti::nn {

// A small, portable generator: SplitMix64 over a 64-bit state.
class InitRng {
 public:
  explicit InitRng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next_u64();
  // Uniform in [0, 1) with 24 random bits (exactly representable as a float).
  float next_uniform();

 private:
  std::uint64_t state_;
};

// The seed of the index-th stream derived from `seed` (parameters, dropout layers).
std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t index);

// Fills a CPU f32 tensor by `spec` from `rng`.
void fill_init(const Tensor& cpu_f32, const InitSpec& spec, InitRng& rng);

}  // namespace tutti::nn
