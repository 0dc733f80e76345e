#include "tutti/nn/init.h"

#include <cmath>

namespace tutti::nn {

std::uint64_t InitRng::next_u64() {
  std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

float InitRng::next_uniform() { return static_cast<float>(next_u64() >> 40) * (1.0f / 16777216.0f); }

std::uint64_t derive_seed(std::uint64_t seed, std::uint64_t index) {
  InitRng rng(seed ^ (0xD1B54A32D192ED03ull * (index + 1)));
  return rng.next_u64();
}

void fill_init(const Tensor& t, const InitSpec& spec, InitRng& rng) {
  TUTTI_CHECK_ARG(t.device().is_cpu() && t.dtype() == DType::f32, "fill_init: needs a CPU f32 tensor, got ", t.str());
  float* p = t.data_as<float>();
  const std::int64_t n = t.numel();
  double bound = 0;
  switch (spec.kind) {
    case InitSpec::Kind::zeros:
      for (std::int64_t i = 0; i < n; ++i) p[i] = 0.0f;
      return;
    case InitSpec::Kind::ones:
      for (std::int64_t i = 0; i < n; ++i) p[i] = 1.0f;
      return;
    case InitSpec::Kind::uniform: bound = spec.bound; break;
    case InitSpec::Kind::normal:
      // Box-Muller on two 53-bit uniforms (u1 in (0, 1], so log(u1) is finite): every value
      // a function of the generator's bits (and of libm's log and cos).
      for (std::int64_t i = 0; i < n; ++i) {
        const double u1 = (static_cast<double>(rng.next_u64() >> 11) + 1.0) * 0x1.0p-53;
        const double u2 = static_cast<double>(rng.next_u64() >> 11) * 0x1.0p-53;
        p[i] = static_cast<float>(spec.bound * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
      }
      return;
    case InitSpec::Kind::kaiming_uniform:
      TUTTI_CHECK_ARG(spec.fan_in > 0, "kaiming_uniform: fan_in must be positive, got ", spec.fan_in);
      bound = std::sqrt(6.0 / spec.fan_in);
      break;
    case InitSpec::Kind::xavier_uniform:
      TUTTI_CHECK_ARG(spec.fan_in + spec.fan_out > 0, "xavier_uniform: fan_in + fan_out must be positive");
      bound = std::sqrt(6.0 / (spec.fan_in + spec.fan_out));
      break;
  }
  const float b = static_cast<float>(bound);
  for (std::int64_t i = 0; i < n; ++i) p[i] = (2.0f * rng.next_uniform() - 1.0f) * b;
}

}  // namespace tutti::nn
