// Helpers of the model tests: random token batches.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "tutti/core/tensor.h"

namespace tutti::testing {

// [B, T] i32 tokens uniform in [0, V), from `seed`.
inline Tensor random_tokens(std::int64_t B, std::int64_t T, std::int64_t V, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int64_t> v(static_cast<std::size_t>(B * T));
  for (auto& x : v) x = static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(V));
  return Tensor::from_ints(v, {B, T}, DType::i32);
}

}  // namespace tutti::testing
