// Pieces shared by the DDP tests: small models, deterministic global batches, each rank's
// slice of them, optimizers, the distance between two models' parameters, and the text of a
// refusal.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ddp_world.h"
#include "tutti/core/error.h"
#include "tutti/nn/layers.h"
#include "tutti/optim/adamw.h"
#include "tutti/optim/sgd.h"

namespace tutti::testing {

inline constexpr std::int64_t kClasses = 5;
inline constexpr std::uint64_t kSeed = 1234;

inline std::unique_ptr<nn::Sequential> make_mlp(std::int64_t hidden = 16) {
  auto m = std::make_unique<nn::Sequential>();
  m->add<nn::Linear>(12, hidden)
      .add<nn::ReLU>()
      .add<nn::Linear>(hidden, 9)
      .add<nn::GELU>()
      .add<nn::Linear>(9, kClasses);
  return m;
}

// A deterministic global batch: inputs [B, ...] and labels [B].
struct Batch {
  Tensor x, y;
};
inline Batch global_batch(const Shape& input_shape, std::int64_t batch, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  Shape shape = input_shape;
  shape.insert(shape.begin(), batch);
  std::vector<float> x(static_cast<std::size_t>(numel_of(shape)));
  for (float& v : x) v = normal(rng);
  std::vector<std::int64_t> y(static_cast<std::size_t>(batch));
  for (auto& v : y) v = static_cast<std::int64_t>(rng() % kClasses);
  return {Tensor::from_floats(x, shape), Tensor::from_ints(y, {batch}, DType::i32)};
}

// Rows [begin, begin + count) of a batch.
inline Batch rows(const Batch& b, std::int64_t begin, std::int64_t count) {
  const std::int64_t row = b.x.numel() / b.x.dim(0);
  Shape shape = b.x.shape();
  shape[0] = count;
  return {b.x.view(begin * row, shape).clone(), b.y.view(begin, {count}).clone()};
}

// This rank's share of a global batch.
inline Batch my_slice(const Batch& global) {
  const std::int64_t per_rank = global.x.dim(0) / world().world_size();
  return rows(global, world().rank() * per_rank, per_rank);
}

enum class Opt { sgd, adamw };

inline std::unique_ptr<optim::Optimizer> make_optimizer(Opt kind, nn::Module& model) {
  if (kind == Opt::sgd) {
    optim::SgdOptions o;
    o.lr = 0.1f;
    o.momentum = 0.9f;
    o.weight_decay = 1e-3f;
    return std::make_unique<optim::SGD>(model.parameters(), o);
  }
  optim::AdamWOptions o;
  o.lr = 1e-2f;
  o.weight_decay = 0.05f;
  return std::make_unique<optim::AdamW>(model.parameters(), o);
}

// Parameter values, one vector per parameter.
using Values = std::vector<std::vector<float>>;

// A model's parameter values (on any device).
inline Values values_of(nn::Module& m) {
  Values out;
  for (nn::Parameter* p : m.parameters()) out.push_back(p->value.to_floats());
  return out;
}

// Max |a - b| / max |b| over two sets of parameter values of the same shapes.
inline double relative_difference(const Values& a, const Values& b) {
  EXPECT_EQ(a.size(), b.size());
  double max_diff = 0, max_ref = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_EQ(a[i].size(), b[i].size()) << "parameter " << i;
    for (std::size_t j = 0; j < a[i].size() && j < b[i].size(); ++j) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[i][j] - b[i][j])));
      max_ref = std::max(max_ref, static_cast<double>(std::fabs(b[i][j])));
    }
  }
  return max_diff / std::max(max_ref, 1e-30);
}

// The same over the parameters of two models.
inline double relative_difference(nn::Module& a, nn::Module& b) {
  return relative_difference(values_of(a), values_of(b));
}

// What `f` throws as InvalidArgument, or "(no error)".
inline std::string refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace tutti::testing
