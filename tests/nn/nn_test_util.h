// Helpers shared by the nn, optim and amp tests: small models, synthetic data, one training
// step, and comparisons of whole models.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernel_test_util.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/loss.h"
#include "tutti/nn/sequential.h"

namespace tutti::testing {

// Linear(in, hidden) ReLU Linear(hidden, classes).
inline void build_mlp(nn::Sequential& model, std::int64_t in, std::int64_t hidden, std::int64_t classes) {
  model.add<nn::Linear>(in, hidden).add<nn::ReLU>().add<nn::Linear>(hidden, classes);
}

// The values of every parameter, by name.
inline std::vector<std::pair<std::string, std::vector<float>>> parameter_values(nn::Module& model) {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (nn::Parameter* p : model.parameters()) out.emplace_back(p->name, p->value.to_floats());
  return out;
}

inline void expect_same_parameters(nn::Module& a, nn::Module& b, double rtol, double atol, const std::string& what) {
  const auto pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size()) << what;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    expect_close(pa[i]->value.to_floats(), pb[i]->value.to_floats(), rtol, atol, what + ": " + pa[i]->name);
  }
}

inline void expect_same_grads(nn::Module& a, nn::Module& b, double rtol, double atol, const std::string& what) {
  const auto pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size()) << what;
  for (std::size_t i = 0; i < pa.size(); ++i) {
    ASSERT_TRUE(pa[i]->grad.defined() && pb[i]->grad.defined()) << what << ": " << pa[i]->name;
    expect_close(pa[i]->grad.to_floats(), pb[i]->grad.to_floats(), rtol, atol, what + ": grad of " + pa[i]->name);
  }
}

// A linearly separable problem: `classes` Gaussian blobs in `dim` dimensions with well
// separated random centres. x [n, dim] f32, labels [n] i32, on the CPU.
struct Blobs {
  Tensor x, labels;
};
inline Blobs make_blobs(std::int64_t n, std::int64_t dim, std::int64_t classes, std::uint32_t seed,
                        float spread = 0.6f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> centres(static_cast<std::size_t>(classes * dim));
  for (auto& c : centres) c = 2.0f * normal(rng);
  std::vector<float> x(static_cast<std::size_t>(n * dim));
  std::vector<std::int64_t> y(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t c = i % classes;
    y[static_cast<std::size_t>(i)] = c;
    for (std::int64_t d = 0; d < dim; ++d) {
      x[static_cast<std::size_t>(i * dim + d)] = centres[static_cast<std::size_t>(c * dim + d)] + spread * normal(rng);
    }
  }
  return {Tensor::from_floats(x, {n, dim}), Tensor::from_ints(y, {n}, DType::i32)};
}

// Rows [begin, begin + count) of a tensor, as a view.
inline Tensor rows(const Tensor& t, std::int64_t begin, std::int64_t count) {
  const std::int64_t row = t.ndim() == 1 ? 1 : t.numel() / t.dim(0);
  Shape shape = t.shape();
  shape[0] = count;
  return t.view(begin * row, shape);
}

// Conv2d GELU MaxPool2d Flatten Linear Residual(LayerNorm Linear GELU) Linear.
inline void build_conv_model(nn::Sequential& model) {
  model.add<nn::Conv2d>(2, 3, 3, nn::Conv2dOptions{.padding = 1})
      .add<nn::GELU>()
      .add<nn::MaxPool2d>()
      .add<nn::Flatten>()
      .add<nn::Linear>(27, 8, nn::LinearOptions{.init = nn::WeightInit::xavier_uniform});
  model.emplace<nn::Residual>().body().add<nn::LayerNorm>(8).add<nn::Linear>(8, 8).add<nn::GELU>();
  model.add<nn::Linear>(8, 5);
}

// zero_grad, forward, loss, backward. Returns the loss tensor (not read).
inline Tensor forward_backward(nn::Module& model, nn::CrossEntropyLoss& loss, const Tensor& x, const Tensor& labels,
                               float grad_scale = 1.0f) {
  const Tensor& logits = model.forward(x);
  const Tensor& l = loss.forward(logits, labels, grad_scale, model.stream());
  model.backward(loss.grad());
  return l;
}

}  // namespace tutti::testing
