#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>

#include "nn/nn_test_util.h"
#include "tutti/nn/transformer.h"
#include "tutti/optim/adamw.h"
#include "tutti/optim/clip.h"
#include "tutti/optim/lr_schedule.h"
#include "tutti/optim/sgd.h"

namespace tutti {
namespace {

using testing::expect_close;
using testing::random_labels;
using testing::random_tensor;

double max_abs_difference(nn::Module& a, nn::Module& b) {
  double out = 0;
  const auto pa = a.parameters(), pb = b.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    const auto va = pa[i]->value.to_floats(), vb = pb[i]->value.to_floats();
    for (std::size_t j = 0; j < va.size(); ++j) out = std::max(out, static_cast<double>(std::fabs(va[j] - vb[j])));
  }
  return out;
}

// Standalone parameters with random values, as an optimizer sees them.
struct Params {
  std::vector<std::unique_ptr<nn::Parameter>> owned;
  std::vector<nn::Parameter*> ptrs;
  explicit Params(const std::vector<Shape>& shapes, std::uint32_t seed = 1, Device device = Device::cpu()) {
    for (const Shape& s : shapes) {
      owned.push_back(std::make_unique<nn::Parameter>(s, nn::InitSpec::zeros()));
      owned.back()->value = random_tensor(s, DType::f32, seed++).to(device);
      owned.back()->name = "p" + std::to_string(owned.size());
      ptrs.push_back(owned.back().get());
    }
  }
};

// ---- closed forms ----------------------------------------------------------------------

void check_sgd_closed_form(Device device) {
  for (const bool nesterov : {false, true}) {
    Params ps({{3, 5}, {7}}, 1, device);
    const float lr = 0.05f, mu = 0.8f;
    std::vector<std::vector<float>> w0, g;
    for (nn::Parameter* p : ps.ptrs) {
      w0.push_back(p->value.to_floats());
      p->grad = random_tensor(p->shape(), DType::f32, 77).to(device);
      g.push_back(p->grad.to_floats());
    }
    optim::SGD opt(ps.ptrs, {.lr = lr, .momentum = mu, .nesterov = nesterov});
    const int steps = 4;
    for (int t = 0; t < steps; ++t) opt.step();
    // buf_t = g (1 - mu^t) / (1 - mu); the step is buf_t, or g + mu buf_t with Nesterov.
    double total = 0;
    for (int t = 1; t <= steps; ++t) {
      const double buf = (1 - std::pow(mu, t)) / (1 - mu);
      total += nesterov ? 1 + mu * buf : buf;
    }
    for (std::size_t i = 0; i < ps.ptrs.size(); ++i) {
      std::vector<float> expected(w0[i].size());
      for (std::size_t j = 0; j < expected.size(); ++j)
        expected[j] = static_cast<float>(w0[i][j] - lr * total * g[i][j]);
      expect_close(ps.ptrs[i]->value.to_floats(), expected, 1e-5, 1e-6, nesterov ? "nesterov" : "momentum");
    }
    EXPECT_EQ(opt.steps(), steps);
  }
}

TEST(Sgd, ConstantGradientClosedForm) { check_sgd_closed_form(Device::cpu()); }

void check_adamw_closed_form(Device device) {
  Params ps({{4, 3}, {5}}, 1, device);
  const float lr = 0.01f, wd = 0.1f, eps = 1e-8f;
  std::vector<std::vector<float>> w0, g;
  for (nn::Parameter* p : ps.ptrs) {
    w0.push_back(p->value.to_floats());
    p->grad = random_tensor(p->shape(), DType::f32, 5).to(device);
    g.push_back(p->grad.to_floats());
  }
  optim::AdamW opt(ps.ptrs, {.lr = lr, .eps = eps, .weight_decay = wd});
  const int steps = 5;
  for (int t = 0; t < steps; ++t) opt.step();
  // With a constant g the bias-corrected moments are exactly g and g², so every step moves
  // by lr · g / (|g| + eps) (bias correction is what makes the first step full size), and
  // the decoupled decay multiplies w by (1 - lr wd) each step:
  //   w_T = a^T w0 - lr u (1 - a^T) / (1 - a),  a = 1 - lr wd,  u = g / (|g| + eps).
  const double a = 1.0 - static_cast<double>(lr) * wd;
  const double at = std::pow(a, steps);
  for (std::size_t i = 0; i < ps.ptrs.size(); ++i) {
    std::vector<float> expected(w0[i].size());
    for (std::size_t j = 0; j < expected.size(); ++j) {
      const double u = g[i][j] / (std::fabs(g[i][j]) + eps);
      expected[j] = static_cast<float>(at * w0[i][j] - lr * u * (1 - at) / (1 - a));
    }
    expect_close(ps.ptrs[i]->value.to_floats(), expected, 1e-5, 2e-6, "AdamW closed form");
  }
}

TEST(AdamW, ConstantGradientClosedFormWithBiasCorrectionAndDecay) { check_adamw_closed_form(Device::cpu()); }

// ---- against a double-precision reference, changing gradients ---------------------------

TEST(Sgd, MatchesReferenceWithWeightDecayAndScale) {
  Params ps({{6, 4}, {3}, {1}});
  const optim::SgdOptions o{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.05f, .nesterov = true};
  optim::SGD opt(ps.ptrs, o);
  std::vector<std::vector<double>> w, buf;
  for (nn::Parameter* p : ps.ptrs) {
    const auto v = p->value.to_floats();
    w.emplace_back(v.begin(), v.end());
    buf.emplace_back(v.size(), 0.0);
  }
  const float scale = 0.7f;
  for (int t = 0; t < 4; ++t) {
    for (std::size_t i = 0; i < ps.ptrs.size(); ++i) {
      nn::Parameter* p = ps.ptrs[i];
      p->grad = random_tensor(p->shape(), DType::f32, 100 * t + static_cast<std::uint32_t>(i));
      const auto g = p->grad.to_floats();
      for (std::size_t j = 0; j < g.size(); ++j) {
        const double gj = scale * g[j] + o.weight_decay * w[i][j];
        buf[i][j] = t == 0 ? gj : o.momentum * buf[i][j] + gj;
        w[i][j] -= o.lr * (gj + o.momentum * buf[i][j]);
      }
    }
    opt.step(scale);
  }
  for (std::size_t i = 0; i < ps.ptrs.size(); ++i) {
    expect_close(ps.ptrs[i]->value.to_floats(), std::vector<float>(w[i].begin(), w[i].end()), 1e-5, 1e-6, "SGD");
  }
}

TEST(AdamW, MatchesReference) {
  Params ps({{5, 5}, {9}});
  const optim::AdamWOptions o{.lr = 0.02f, .beta1 = 0.8f, .beta2 = 0.95f, .eps = 1e-6f, .weight_decay = 0.2f};
  optim::AdamW opt(ps.ptrs, o);
  std::vector<std::vector<double>> w, m, v;
  for (nn::Parameter* p : ps.ptrs) {
    const auto x = p->value.to_floats();
    w.emplace_back(x.begin(), x.end());
    m.emplace_back(x.size(), 0.0);
    v.emplace_back(x.size(), 0.0);
  }
  for (int t = 1; t <= 4; ++t) {
    for (std::size_t i = 0; i < ps.ptrs.size(); ++i) {
      nn::Parameter* p = ps.ptrs[i];
      p->grad = random_tensor(p->shape(), DType::f32, 10 * t + static_cast<std::uint32_t>(i));
      const auto g = p->grad.to_floats();
      for (std::size_t j = 0; j < g.size(); ++j) {
        m[i][j] = o.beta1 * m[i][j] + (1 - o.beta1) * g[j];
        v[i][j] = o.beta2 * v[i][j] + (1 - o.beta2) * g[j] * g[j];
        const double mh = m[i][j] / (1 - std::pow(o.beta1, t)), vh = v[i][j] / (1 - std::pow(o.beta2, t));
        w[i][j] -= o.lr * (o.weight_decay * w[i][j] + mh / (std::sqrt(vh) + o.eps));
      }
    }
    opt.step();
  }
  for (std::size_t i = 0; i < ps.ptrs.size(); ++i) {
    expect_close(ps.ptrs[i]->value.to_floats(), std::vector<float>(w[i].begin(), w[i].end()), 1e-5, 1e-6, "AdamW");
  }
}

TEST(Optimizer, SkipsFrozenAndGradlessParameters) {
  Params ps({{3}, {4}, {5}});
  ps.ptrs[0]->requires_grad = false;
  ps.ptrs[0]->grad = random_tensor({3}, DType::f32, 1);
  ps.ptrs[2]->grad = random_tensor({5}, DType::f32, 2);
  const auto v0 = ps.ptrs[0]->value.to_floats(), v1 = ps.ptrs[1]->value.to_floats(), v2 = ps.ptrs[2]->value.to_floats();
  optim::AdamW opt(ps.ptrs, {.lr = 0.1f});
  opt.step();
  EXPECT_EQ(ps.ptrs[0]->value.to_floats(), v0);
  EXPECT_EQ(ps.ptrs[1]->value.to_floats(), v1);
  EXPECT_NE(ps.ptrs[2]->value.to_floats(), v2);
  EXPECT_EQ(opt.last_step_kernel_calls(), 1);
}

// ---- flat buffers: one fused call ------------------------------------------------------

void build(nn::Sequential& m) {
  m.add<nn::Linear>(7, 9).add<nn::GELU>().add<nn::LayerNorm>(9).add<nn::Linear>(9, 4);
  m.init(17);
}

enum class Layout { per_parameter, flat, flat_aligned, aligned_lazy_grads, placed };

// Trains 3 AdamW steps; returns the kernel calls of the last step. Flat layouts bind the
// optimizer to the model's plan (flat_target) once the gradients exist.
int train(nn::Sequential& model, Layout layout, nn::Sequential* reference = nullptr,
          std::vector<optim::ParamGroup> groups = {}) {
  Tensor outside;
  if (layout == Layout::flat) {
    model.flatten_parameters(model.make_plan({.align_elements = 1}));
    model.allocate_flat_grads(*model.flat_plan());
  } else if (layout == Layout::flat_aligned) {
    const nn::FlatPlan plan = model.make_plan({.align_elements = 8});
    model.flatten_parameters(plan);
    model.allocate_flat_grads(plan);
  } else if (layout == Layout::aligned_lazy_grads) {
    model.flatten_parameters(model.make_plan({.align_elements = 8}));  // the first backward allocates grads like it
  } else if (layout == Layout::placed) {
    model.flatten_parameters();
    outside = Tensor::zeros({model.flat_plan()->total}, DType::f32);
    model.set_grad_buffer(outside, *model.flat_plan());
  } else {
    for (nn::Parameter* p : model.parameters()) p->grad = Tensor::zeros(p->shape(), DType::f32);
  }
  if (groups.empty()) groups.push_back({model.parameters(), std::nullopt});
  optim::AdamW opt(groups, {.lr = 0.05f, .weight_decay = 0.1f});
  nn::CrossEntropyLoss loss;
  for (int t = 0; t < 3; ++t) {
    opt.zero_grad();
    testing::forward_backward(model, loss, random_tensor({6, 7}, DType::f32, t), random_labels(6, 4, DType::i32, t));
    if (layout != Layout::per_parameter && !opt.bound()) opt.bind(optim::flat_target(model));
    opt.step();
  }
  if (reference != nullptr) testing::expect_same_parameters(model, *reference, 0, 0, "same training, other layout");
  return opt.last_step_kernel_calls();
}

TEST(Flat, WholeModelInOneFusedCallWithSameResults) {
  nn::Sequential reference, flat, aligned, lazy, placed;
  for (nn::Sequential* m : {&reference, &flat, &aligned, &lazy, &placed}) build(*m);
  EXPECT_EQ(train(reference, Layout::per_parameter), 6);
  EXPECT_EQ(train(flat, Layout::flat, &reference), 1);
  EXPECT_EQ(train(aligned, Layout::flat_aligned, &reference), 1);
  EXPECT_EQ(train(lazy, Layout::aligned_lazy_grads, &reference), 1);
  EXPECT_EQ(train(placed, Layout::placed, &reference), 1);
}

// Parameter groups: decay on matrices only (the default rule), per parameter and flat (one
// fused call per run of parameters that share a decay), against the closed form of the rule.
TEST(Flat, WeightDecayGroupsPerParameterAndFlat) {
  nn::Sequential per, flat, all_decay;
  for (nn::Sequential* m : {&per, &flat, &all_decay}) build(*m);
  auto groups_of = [](nn::Sequential& m) { return optim::weight_decay_groups(m.parameters(), 0.5f); };
  const auto g = groups_of(per);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].weight_decay, 0.5f);
  EXPECT_EQ(g[1].weight_decay, 0.0f);
  for (nn::Parameter* p : g[0].parameters) EXPECT_GE(p->ndim(), 2) << p->name;
  for (nn::Parameter* p : g[1].parameters) EXPECT_EQ(p->ndim(), 1) << p->name;
  EXPECT_EQ(g[0].parameters.size(), 2u);  // the two Linear weights
  EXPECT_EQ(g[1].parameters.size(), 4u);  // their biases, LayerNorm's gain and offset
  EXPECT_EQ(train(per, Layout::per_parameter, nullptr, groups_of(per)), 6);
  // Plan order (reverse registration): bias3, weight3 | ln.beta, ln.gamma, bias0 | weight0:
  // four runs of one decay.
  EXPECT_EQ(train(flat, Layout::flat_aligned, &per, groups_of(flat)), 4);
  train(all_decay, Layout::per_parameter);
  EXPECT_GT(max_abs_difference(flat, all_decay), 1e-4) << "the groups must change the training";
}

// The default rule on a GPT a user builds from tutti's layers (a Sequential: embedding, two
// pre-LN blocks, final LayerNorm, tied head): exactly the blocks' weight matrices decay,
// 12·C² per layer; neither embedding (wte is also the head) nor a LayerNorm or bias does.
TEST(Optimizer, DefaultDecayRuleOnAGptOfTuttisLayers) {
  const std::int64_t V = 32, T = 8, C = 16, L = 2;
  nn::Sequential model;
  auto& embed = model.emplace<nn::TokenPositionEmbedding>(V, T, C);
  for (int l = 0; l < L; ++l) {
    model.emplace<nn::Residual>()
        .body()
        .add<nn::LayerNorm>(C)
        .add<nn::Linear>(C, 3 * C)
        .add<nn::CausalSelfAttention>(2)
        .add<nn::Linear>(C, C);
    model.emplace<nn::Residual>()
        .body()
        .add<nn::LayerNorm>(C)
        .add<nn::Linear>(C, 4 * C)
        .add<nn::GELU>()
        .add<nn::Linear>(4 * C, C);
  }
  model.add<nn::LayerNorm>(C).add<nn::TiedLinear>(embed.wte);
  const auto groups = optim::weight_decay_groups(model.parameters(), 0.1f);
  ASSERT_EQ(groups.size(), 2u);
  std::int64_t decayed = 0;
  for (const nn::Parameter* p : groups[0].parameters) decayed += p->numel();
  EXPECT_EQ(decayed, 12 * C * C * L);
  for (const nn::Parameter* p : groups[1].parameters) {
    EXPECT_TRUE(p->ndim() == 1 || p == &embed.wte || p == &embed.wpe) << p->name << " is not decayed";
  }
  // The shape-only rule, for who wants it, still decays the embeddings.
  const auto shape_groups = optim::weight_decay_groups(model.parameters(), 0.1f, optim::decays_if_matrix);
  std::int64_t by_shape = 0;
  for (const nn::Parameter* p : shape_groups[0].parameters) by_shape += p->numel();
  EXPECT_EQ(by_shape, 12 * C * C * L + V * C + T * C);
}

// Decoupled decay per group, against its closed form: with zero gradients AdamW moves each
// weight by -lr · wd · w, SGD (coupled L2, no momentum) by -lr · wd · w too.
TEST(Optimizer, GroupsTakeTheirOwnWeightDecay) {
  Params ps({{2, 3}, {4}});
  for (nn::Parameter* p : ps.ptrs) p->grad = Tensor::zeros(p->shape(), DType::f32);
  const auto w0 = ps.ptrs[0]->value.to_floats(), w1 = ps.ptrs[1]->value.to_floats();
  std::vector<optim::ParamGroup> groups = {{{ps.ptrs[0]}, 0.25f}, {{ps.ptrs[1]}, std::nullopt}};
  optim::AdamW adam(groups, {.lr = 0.1f, .weight_decay = 0.5f});
  adam.step();
  for (std::size_t j = 0; j < w0.size(); ++j)
    EXPECT_NEAR(ps.ptrs[0]->value.to_floats()[j], w0[j] * (1 - 0.1f * 0.25f), 1e-6);
  for (std::size_t j = 0; j < w1.size(); ++j)
    EXPECT_NEAR(ps.ptrs[1]->value.to_floats()[j], w1[j] * (1 - 0.1f * 0.5f), 1e-6);
  EXPECT_THROW(optim::SGD({{{ps.ptrs[0]}, -1.0f}}), InvalidArgument);
  EXPECT_THROW(optim::SGD({{{ps.ptrs[0]}, 0.0f}, {{ps.ptrs[0]}, 0.0f}}), InvalidArgument);  // listed twice
}

TEST(Flat, StateFollowsWhenTheModelIsFlattenedLater) {
  nn::Sequential reference, later;
  build(reference);
  build(later);
  optim::AdamW ref_opt(reference.parameters(), {.lr = 0.05f});
  optim::AdamW opt(later.parameters(), {.lr = 0.05f});
  nn::CrossEntropyLoss loss;
  for (int t = 0; t < 4; ++t) {
    if (t == 2) {
      later.flatten_parameters();
      later.allocate_flat_grads(*later.flat_plan());
      opt.bind(optim::flat_target(later));  // the state of two steps is carried over
    }
    const Tensor x = random_tensor({5, 7}, DType::f32, t);
    const Tensor y = random_labels(5, 4, DType::i32, t);
    for (auto [m, o] : {std::pair{&reference, &ref_opt}, std::pair{&later, &opt}}) {
      m->zero_grad();
      testing::forward_backward(*m, loss, x, y);
      o->step();
    }
  }
  EXPECT_EQ(opt.last_step_kernel_calls(), 1);
  testing::expect_same_parameters(later, reference, 0, 0, "flattened after two steps");
}

TEST(Flat, HalfComputeCopiesAreUpdatedInTheSamePass) {
  for (const DType half : {DType::bf16, DType::f16}) {
    for (const bool flat : {false, true}) {
      nn::Sequential model;
      build(model);
      model.set_precision(half);
      if (flat) model.flatten_parameters();
      optim::SGD opt(model.parameters(), {.lr = 0.1f, .momentum = 0.5f});
      nn::CrossEntropyLoss loss;
      testing::forward_backward(model, loss, random_tensor({4, 7}, DType::f32, 1), random_labels(4, 4, DType::i32, 2));
      if (flat) opt.bind(optim::flat_target(model));
      opt.step();
      EXPECT_EQ(opt.last_step_kernel_calls(), flat ? 1 : 6);
      for (nn::Parameter* p : model.parameters()) {
        ASSERT_TRUE(p->compute.defined());
        ASSERT_EQ(p->compute.dtype(), half);
        const Tensor expected = Tensor::from_floats(p->value.to_floats(), p->shape(), half);
        EXPECT_EQ(p->compute.to_floats(), expected.to_floats()) << p->name << " " << name_of(half);
      }
    }
  }
}

// ---- state -----------------------------------------------------------------------------

TEST(State, SaveLoadContinuesExactly) {
  for (const bool adam : {true, false}) {
    nn::Sequential straight, first, resumed;
    for (nn::Sequential* m : {&straight, &first, &resumed}) build(*m);
    auto make = [&](nn::Sequential& m) -> std::unique_ptr<optim::Optimizer> {
      if (adam) return std::make_unique<optim::AdamW>(m.parameters(), optim::AdamWOptions{.lr = 0.03f});
      return std::make_unique<optim::SGD>(m.parameters(), optim::SgdOptions{.lr = 0.1f, .momentum = 0.9f});
    };
    auto o_straight = make(straight), o_first = make(first), o_resumed = make(resumed);
    nn::CrossEntropyLoss loss;
    auto step = [&](nn::Sequential& m, optim::Optimizer& o, int t) {
      m.zero_grad();
      testing::forward_backward(m, loss, random_tensor({5, 7}, DType::f32, t), random_labels(5, 4, DType::i32, t));
      o.step();
    };
    for (int t = 0; t < 5; ++t) step(straight, *o_straight, t);
    for (int t = 0; t < 3; ++t) step(first, *o_first, t);
    const StateDict saved = o_first->state_dict();
    EXPECT_EQ(get_int_scalar(saved, "step"), 3);
    EXPECT_EQ(saved.count(adam ? "0.weight.exp_avg_sq" : "0.weight.momentum_buffer"), 1u);
    resumed.load_state_dict(first.state_dict());
    o_resumed->load_state_dict(saved);
    EXPECT_EQ(o_resumed->steps(), 3);
    for (int t = 3; t < 5; ++t) step(resumed, *o_resumed, t);
    testing::expect_same_parameters(resumed, straight, 0, 0, adam ? "AdamW resumed" : "SGD resumed");
    StateDict broken = saved;
    broken.erase(broken.rbegin()->first == "step" ? std::next(broken.rbegin())->first : broken.rbegin()->first);
    EXPECT_THROW(o_resumed->load_state_dict(broken), InvalidArgument);
  }
}

// ---- schedules -------------------------------------------------------------------------

TEST(Schedule, ConstantWarmupCosine) {
  EXPECT_FLOAT_EQ(optim::LrSchedule::constant(0.3f).at(1000), 0.3f);
  const auto warm = optim::LrSchedule::linear_warmup(1.0f, 4);
  EXPECT_FLOAT_EQ(warm.at(0), 0.25f);
  EXPECT_FLOAT_EQ(warm.at(2), 0.75f);
  EXPECT_FLOAT_EQ(warm.at(3), 1.0f);
  EXPECT_FLOAT_EQ(warm.at(50), 1.0f);
  const auto cos = optim::LrSchedule::cosine(1.0f, 10, 110, 0.1f);
  EXPECT_FLOAT_EQ(cos.at(4), 0.5f);
  EXPECT_FLOAT_EQ(cos.at(10), 1.0f);
  EXPECT_NEAR(cos.at(60), 0.1 + 0.9 * 0.5, 1e-6);  // halfway: cos(pi/2) = 0
  EXPECT_NEAR(cos.at(35), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-6);
  EXPECT_FLOAT_EQ(cos.at(110), 0.1f);
  EXPECT_FLOAT_EQ(cos.at(500), 0.1f);

  // The optimizer takes the schedule's rate at each step: SGD without momentum moves by lr·g.
  Params ps(std::vector<Shape>{{4}});
  ps.ptrs[0]->grad = Tensor::from_floats({1, 1, 1, 1}, {4});
  optim::SGD opt(ps.ptrs, {.lr = 123.0f});
  opt.set_schedule(warm);
  float expected = ps.ptrs[0]->value.to_floats()[0];
  for (int t = 0; t < 6; ++t) {
    EXPECT_FLOAT_EQ(opt.lr(), warm.at(t));
    expected -= warm.at(t);
    opt.step();
  }
  EXPECT_NEAR(ps.ptrs[0]->value.to_floats()[0], expected, 1e-5);
}

// ---- clipping --------------------------------------------------------------------------

TEST(Clip, GlobalNormOverAllGradients) {
  Params ps({{3, 4}, {5}, {1}});
  double sum = 0;
  for (nn::Parameter* p : ps.ptrs) {
    p->grad = random_tensor(p->shape(), DType::f32, static_cast<std::uint32_t>(p->numel()), -2, 2);
    for (float g : p->grad.to_floats()) sum += static_cast<double>(g) * g;
  }
  const double norm = std::sqrt(sum);
  EXPECT_NEAR(nn::item(optim::grad_norm_squared(ps.ptrs)), sum, 1e-4 * sum);
  const optim::GradNorm n = optim::compute_grad_norm(ps.ptrs, norm / 2);
  EXPECT_NEAR(n.norm, norm, 1e-5 * norm);
  EXPECT_TRUE(n.finite);
  EXPECT_NEAR(n.coefficient, 0.5, 1e-5);
  EXPECT_EQ(optim::compute_grad_norm(ps.ptrs, norm * 2).coefficient, 1.0f);

  // Clipping through the optimizer's grad_scale equals clipping the gradients in place.
  Params copy({{3, 4}, {5}, {1}});
  for (std::size_t i = 0; i < ps.ptrs.size(); ++i) copy.ptrs[i]->grad = ps.ptrs[i]->grad.clone();
  optim::SGD a(ps.ptrs, {.lr = 0.1f}), b(copy.ptrs, {.lr = 0.1f});
  a.step(n.coefficient);
  EXPECT_NEAR(optim::clip_grad_norm(copy.ptrs, norm / 2), norm, 1e-5 * norm);
  EXPECT_NEAR(std::sqrt(nn::item(optim::grad_norm_squared(copy.ptrs))), norm / 2, 1e-5 * norm);
  b.step();
  for (std::size_t i = 0; i < ps.ptrs.size(); ++i) {
    expect_close(ps.ptrs[i]->value, copy.ptrs[i]->value, 1e-6, 1e-7, "clip via step vs in place");
  }

  // A non-finite gradient shows in the norm.
  ps.ptrs[1]->grad.data_as<float>()[2] = std::numeric_limits<float>::infinity();
  const optim::GradNorm bad = optim::compute_grad_norm(ps.ptrs, 1.0);
  EXPECT_FALSE(bad.finite);
  EXPECT_EQ(bad.coefficient, 1.0f);
}

// ---- GPU twins -------------------------------------------------------------------------

TEST(Gpu, ClosedForms) {
  TUTTI_REQUIRE_GPU();
  check_sgd_closed_form(Device::cuda(0));
  check_adamw_closed_form(Device::cuda(0));
}

TEST(Gpu, FlatAdamWAndSgdMatchCpu) {
  TUTTI_REQUIRE_GPU();
  for (const DType compute : {DType::f32, DType::bf16}) {
    for (const bool adam : {true, false}) {
      nn::Sequential cpu, gpu;
      build(cpu);
      build(gpu);
      const Stream stream = Stream::create(Device::cuda(0));
      gpu.to(Device::cuda(0), stream);
      for (nn::Sequential* m : {&cpu, &gpu}) {
        m->set_precision(compute);
        m->flatten_parameters();
      }
      auto make = [&](nn::Sequential& m) -> std::unique_ptr<optim::Optimizer> {
        if (adam) return std::make_unique<optim::AdamW>(m.parameters(), optim::AdamWOptions{.lr = 0.01f});
        return std::make_unique<optim::SGD>(m.parameters(), optim::SgdOptions{.lr = 0.05f, .momentum = 0.9f});
      };
      auto oc = make(cpu), og = make(gpu);
      og->set_stream(stream);
      nn::CrossEntropyLoss lc, lg;
      for (int t = 0; t < 3; ++t) {
        const Tensor x = random_tensor({8, 7}, DType::f32, t), y = random_labels(8, 4, DType::i32, t);
        oc->zero_grad();
        og->zero_grad();
        testing::forward_backward(cpu, lc, x, y);
        testing::forward_backward(gpu, lg, x.to(Device::cuda(0)), y.to(Device::cuda(0)));
        if (t == 0) {
          oc->bind(optim::flat_target(cpu));
          og->bind(optim::flat_target(gpu));
        }
        oc->step();
        og->step();
      }
      stream.synchronize();
      EXPECT_EQ(og->last_step_kernel_calls(), 1);
      const double tol = compute == DType::f32 ? 1e-4 : 2e-2;
      testing::expect_same_parameters(gpu, cpu, tol, tol,
                                      std::string(adam ? "AdamW " : "SGD ") + std::string(name_of(compute)));
      const StateDict sg = og->state_dict(), sc = oc->state_dict();
      for (const auto& [key, t] : sc) {
        if (key != "step") expect_close(sg.at(key), t, 10 * tol, 10 * tol, key);
      }
    }
  }
}

}  // namespace
}  // namespace tutti
