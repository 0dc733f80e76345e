// What the GPT benchmarks (benchmarks/models/*) share: the model's shape from the command line
// (a preset, with --layers, --width, --heads over it) and random token batches. Header-only.
#pragma once

#include <tutti/tutti.h>

#include <CLI/CLI.hpp>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace bench {

struct GptShape {
  std::string model = "gpt-tiny";
  std::int64_t layers = 0, width = 0, heads = 0;  // 0: the preset's
};

// --model, and where `all` --layers, --width and --heads (else --layers only).
inline void add_gpt_shape_options(CLI::App& app, GptShape& shape, bool all = true) {
  app.add_option("--model", shape.model, "a GptConfig preset")
      ->check(CLI::IsMember(tutti::models::GptConfig::preset_names()))
      ->capture_default_str();
  app.add_option("--layers", shape.layers, "override the preset's layers")->check(CLI::PositiveNumber);
  if (!all) return;
  app.add_option("--width", shape.width, "override the preset's width (C)")->check(CLI::PositiveNumber);
  app.add_option("--heads", shape.heads, "override the preset's heads")->check(CLI::PositiveNumber);
}

// The preset with the overrides given.
inline tutti::models::GptConfig gpt_config(const GptShape& shape) {
  tutti::models::GptConfig config = tutti::models::GptConfig::preset(shape.model);
  if (shape.layers > 0) config.layers = shape.layers;
  if (shape.width > 0) config.width = shape.width;
  if (shape.heads > 0) config.heads = shape.heads;
  return config;
}

// [B, T] i32 tokens drawn uniformly from [0, V) by a generator seeded with `seed`.
inline tutti::Tensor random_tokens(std::int64_t B, std::int64_t T, std::int64_t V, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::int64_t> v(static_cast<std::size_t>(B * T));
  for (auto& x : v) x = static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(V));
  return tutti::Tensor::from_ints(v, {B, T}, tutti::DType::i32);
}

}  // namespace bench
