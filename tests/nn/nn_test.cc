#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "nn/nn_test_util.h"
#include "tutti/kernels/cross_entropy.h"
#include "tutti/kernels/elementwise.h"
#include "tutti/kernels/linear.h"
#include "tutti/kernels/optimizer.h"
#include "tutti/nn/init.h"
#include "tutti/optim/sgd.h"

namespace tutti {
namespace {

using testing::expect_close;
using testing::random_labels;
using testing::random_tensor;

// ---- the layer plumbing adds nothing ---------------------------------------------------

// Three SGD steps of Linear-ReLU-Linear through the nn layer, against the same steps
// written directly with the kernels.
void check_plumbing(bool flat) {
  const std::int64_t n = 6, in = 5, hidden = 7, classes = 3;
  nn::Sequential model;
  testing::build_mlp(model, in, hidden, classes);
  model.init(11);
  if (flat) model.storage().flatten();
  optim::SgdOptions so{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f};
  optim::SGD opt(model.parameters(), so);
  nn::CrossEntropyLoss loss;

  // The reference starts from the model's initial values.
  StateDict init = model.state_dict();
  Tensor w1 = init.at("0.weight").clone(), b1 = init.at("0.bias").clone();
  Tensor w2 = init.at("2.weight").clone(), b2 = init.at("2.bias").clone();
  std::vector<Tensor> ws{w1, b1, w2, b2};
  std::vector<Tensor> bufs;
  for (const Tensor& w : ws) bufs.push_back(Tensor::zeros(w.shape(), DType::f32));

  for (int step = 0; step < 3; ++step) {
    const Tensor x = random_tensor({n, in}, DType::f32, 100 + step);
    const Tensor y = random_labels(n, classes, DType::i64, 200 + step);

    model.zero_grad();
    testing::forward_backward(model, loss, x, y);
    opt.step();

    Tensor h = Tensor::empty({n, hidden}, DType::f32), a = Tensor::empty({n, hidden}, DType::f32);
    Tensor z = Tensor::empty({n, classes}, DType::f32), dz = Tensor::empty({n, classes}, DType::f32);
    Tensor l = Tensor::empty({1}, DType::f32);
    kernels::linear_forward(x, w1, b1, h);
    kernels::relu_forward(h, a);
    kernels::linear_forward(a, w2, b2, z);
    kernels::softmax_cross_entropy(z, y, l, dz);
    std::vector<Tensor> gs;
    for (const Tensor& w : ws) gs.push_back(Tensor::empty(w.shape(), DType::f32));
    Tensor da = Tensor::empty({n, hidden}, DType::f32);
    kernels::linear_backward(a, w2, dz, da, gs[2], gs[3], false);
    kernels::relu_backward(h, da, da);
    kernels::linear_backward(x, w1, da, Tensor(), gs[0], gs[1], false);
    for (std::size_t i = 0; i < ws.size(); ++i) {
      kernels::SgdParams sp{.lr = so.lr, .momentum = so.momentum, .weight_decay = so.weight_decay};
      kernels::sgd_update(ws[i], gs[i], bufs[i], Tensor(), sp, step == 0);
    }
    EXPECT_NEAR(nn::item(loss.loss()), nn::item(l), 1e-6) << "step " << step;
  }
  const auto params = model.parameters();
  for (std::size_t i = 0; i < ws.size(); ++i) {
    expect_close(params[i]->value, ws[i], 1e-6, 1e-7, "after 3 steps: " + params[i]->name);
  }
}

TEST(Plumbing, MlpTrainsLikeRawKernels) { check_plumbing(false); }
TEST(Plumbing, FlatMlpTrainsLikeRawKernels) { check_plumbing(true); }

// ---- finite differences over a whole model ---------------------------------------------

// Conv2d GELU MaxPool2d Flatten Linear Residual(LayerNorm Linear GELU) Linear.
void build_conv_model(nn::Sequential& model) {
  model.add<nn::Conv2d>(2, 3, 3, nn::Conv2dOptions{.padding = 1})
      .add<nn::GELU>()
      .add<nn::MaxPool2d>()
      .add<nn::Flatten>()
      .add<nn::Linear>(27, 8, nn::LinearOptions{.init = nn::WeightInit::xavier_uniform});
  model.emplace<nn::Residual>().body().add<nn::LayerNorm>(8).add<nn::Linear>(8, 8).add<nn::GELU>();
  model.add<nn::Linear>(8, 5);
}

TEST(Gradients, WholeModelMatchesFiniteDifferences) {
  nn::Sequential model;
  build_conv_model(model);
  model.init(5).set_input_grad(true);
  // LayerNorm's gamma and beta start at 1 and 0: give them values that test more.
  for (nn::Parameter* p : model.parameters()) {
    if (p->name.find("body.0") != std::string::npos || p->name.ends_with("bias")) {
      p->value.copy_from(random_tensor(p->shape(), DType::f32, static_cast<std::uint32_t>(p->numel()), 0.5f, 1.5f));
    }
  }
  const Tensor x = random_tensor({3, 2, 6, 6}, DType::f32, 1);
  const Tensor y = random_labels(3, 5, DType::i32, 2);
  nn::CrossEntropyLoss loss;
  model.zero_grad();
  loss.forward(model.forward(x), y);
  const Tensor input_grad = model.backward(loss.grad()).clone();
  auto f = [&] {
    const Tensor& logits = model.forward(x);
    return nn::item(loss.forward(logits, y));
  };
  for (nn::Parameter* p : model.parameters()) {
    const std::vector<float> analytic = p->grad.to_floats();
    const std::vector<double> numeric = testing::numeric_gradient(p->value, f, 3e-3);
    expect_close(analytic, std::vector<float>(numeric.begin(), numeric.end()), 3e-2, 2e-3, "d loss / d " + p->name);
  }
  const std::vector<double> numeric_x = testing::numeric_gradient(x, f, 3e-3);
  expect_close(input_grad.to_floats(), std::vector<float>(numeric_x.begin(), numeric_x.end()), 3e-2, 2e-3,
               "d loss / d x");
}

// Smaller stacks, so that a failure points at the layer: each against finite differences,
// parameters and input.
TEST(Gradients, SmallStacksMatchFiniteDifferences) {
  for (int variant = 0; variant < 5; ++variant) {
    nn::Sequential model;
    const nn::Conv2dOptions same{.padding = 1};
    switch (variant) {
      case 0: model.add<nn::Conv2d>(2, 3, 3, same).add<nn::Flatten>().add<nn::Linear>(108, 5); break;
      case 1:
        model.add<nn::Conv2d>(2, 3, 3, nn::Conv2dOptions{.stride = 2})
            .add<nn::GELU>()
            .add<nn::Flatten>()
            .add<nn::Linear>(12, 5);
        break;
      case 2:
        model.add<nn::Conv2d>(2, 3, 3, same).add<nn::MaxPool2d>().add<nn::Flatten>().add<nn::Linear>(27, 5);
        break;
      case 3: model.add<nn::Flatten>().add<nn::LayerNorm>(72).add<nn::Linear>(72, 5); break;
      default:
        model.add<nn::MaxPool2d>().add<nn::Flatten>().add<nn::Linear>(18, 7).add<nn::ReLU>().add<nn::Linear>(7, 5);
        break;
    }
    model.init(5).set_input_grad(true);
    const Tensor x = random_tensor({3, 2, 6, 6}, DType::f32, 1);
    const Tensor y = random_labels(3, 5, DType::i32, 2);
    nn::CrossEntropyLoss loss;
    model.zero_grad();
    loss.forward(model.forward(x), y);
    const Tensor input_grad = model.backward(loss.grad()).clone();
    auto f = [&] { return nn::item(loss.forward(model.forward(x), y)); };
    const std::string what = model.describe() + ": d loss / d ";
    for (nn::Parameter* p : model.parameters()) {
      const std::vector<double> numeric = testing::numeric_gradient(p->value, f, 3e-3);
      expect_close(p->grad.to_floats(), std::vector<float>(numeric.begin(), numeric.end()), 3e-2, 2e-3, what + p->name);
    }
    const std::vector<double> numeric_x = testing::numeric_gradient(x, f, 3e-3);
    expect_close(input_grad.to_floats(), std::vector<float>(numeric_x.begin(), numeric_x.end()), 3e-2, 2e-3,
                 what + "x");
  }
}

// ---- gradient accumulation -------------------------------------------------------------

TEST(Gradients, AccumulationOverMicroBatchesEqualsOneBatch) {
  for (const std::int64_t k : {2, 3}) {
    const std::int64_t micro = 5, n = k * micro;
    auto build = [](nn::Sequential& m) {
      m.add<nn::Linear>(6, 9).add<nn::GELU>().add<nn::LayerNorm>(9).add<nn::Linear>(9, 4);
      m.init(21);
    };
    nn::Sequential whole, accumulated;
    build(whole);
    build(accumulated);
    const Tensor x = random_tensor({n, 6}, DType::f32, 3);
    const Tensor y = random_labels(n, 4, DType::i64, 4);
    nn::CrossEntropyLoss loss;
    whole.zero_grad();
    testing::forward_backward(whole, loss, x, y);
    accumulated.zero_grad();
    for (std::int64_t i = 0; i < k; ++i) {
      // Each micro-batch's mean loss weighs 1/k, so the sum is the whole batch's mean.
      testing::forward_backward(accumulated, loss, testing::rows(x, i * micro, micro),
                                testing::rows(y, i * micro, micro), 1.0f / static_cast<float>(k));
    }
    testing::expect_same_grads(accumulated, whole, 1e-4, 1e-6, "k = " + std::to_string(k));
  }
}

TEST(Gradients, BackwardAccumulatesUntilZeroed) {
  nn::Sequential model;
  testing::build_mlp(model, 4, 6, 3);
  model.init(2);
  const Tensor x = random_tensor({5, 4}, DType::f32, 8);
  const Tensor y = random_labels(5, 3, DType::i32, 9);
  nn::CrossEntropyLoss loss;
  model.zero_grad();
  testing::forward_backward(model, loss, x, y);
  const auto once = testing::parameter_values(model);
  std::vector<std::vector<float>> g1;
  for (nn::Parameter* p : model.parameters()) g1.push_back(p->grad.to_floats());
  testing::forward_backward(model, loss, x, y);
  const auto params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::vector<float> twice = g1[i];
    for (float& v : twice) v *= 2;
    expect_close(params[i]->grad.to_floats(), twice, 1e-6, 1e-7, "accumulated " + params[i]->name);
  }
  model.zero_grad();
  for (nn::Parameter* p : params) {
    for (float v : p->grad.to_floats()) ASSERT_EQ(v, 0.0f) << p->name;
  }
}

// ---- structure, names, hooks -----------------------------------------------------------

TEST(Structure, NamesOrderAndSignature) {
  nn::Sequential model;
  build_conv_model(model);
  std::vector<std::string> names;
  for (nn::Parameter* p : model.parameters()) names.push_back(p->name);
  const std::vector<std::string> expected{"0.weight",       "0.bias",        "4.weight",        "4.bias",
                                          "5.body.0.gamma", "5.body.0.beta", "5.body.1.weight", "5.body.1.bias",
                                          "6.weight",       "6.bias"};
  EXPECT_EQ(names, expected);
  EXPECT_NE(model.signature().find("0.weight [3, 2, 3, 3] f32 trainable"), std::string::npos) << model.signature();
  nn::Sequential same, other;
  build_conv_model(same);
  testing::build_mlp(other, 4, 4, 4);
  EXPECT_EQ(model.structure_hash(), same.structure_hash());
  EXPECT_NE(model.structure_hash(), other.structure_hash());
}

TEST(Structure, GradReadyHookFiresOncePerParameterInReverseOrder) {
  nn::Sequential model;
  build_conv_model(model);
  model.init(3);
  std::vector<std::string> order;
  model.storage().set_grad_ready_hook([&](nn::Parameter& p) {
    // The gradient is already written when the hook runs (CPU: synchronously).
    EXPECT_TRUE(p.grad.defined()) << p.name;
    order.push_back(p.name);
  });
  nn::CrossEntropyLoss loss;
  testing::forward_backward(model, loss, random_tensor({2, 2, 6, 6}, DType::f32, 1),
                            random_labels(2, 5, DType::i32, 1));
  std::vector<std::string> expected;
  for (nn::Parameter* p : model.parameters()) expected.push_back(p->name);
  std::reverse(expected.begin(), expected.end());
  EXPECT_EQ(order, expected);
}

TEST(Structure, FrozenParametersGetNoGradientAndNoUpdate) {
  nn::Sequential model;
  testing::build_mlp(model, 4, 5, 3);
  model.init(4);
  nn::Parameter* frozen = model.parameters()[0];
  frozen->requires_grad = false;
  const std::vector<float> before = frozen->value.to_floats();
  std::set<std::string> hooked;
  model.storage().set_grad_ready_hook([&](nn::Parameter& p) { hooked.insert(p.name); });
  optim::SGD opt(model.parameters(), {.lr = 0.5f});
  nn::CrossEntropyLoss loss;
  testing::forward_backward(model, loss, random_tensor({3, 4}, DType::f32, 2), random_labels(3, 3, DType::i32, 3));
  opt.step();
  EXPECT_FALSE(frozen->grad.defined());
  EXPECT_EQ(hooked.count("0.weight"), 0u);
  EXPECT_EQ(hooked.size(), 3u);
  EXPECT_EQ(frozen->value.to_floats(), before);
}

TEST(Structure, ForwardBeforeInitThrows) {
  nn::Sequential model;
  testing::build_mlp(model, 3, 3, 2);
  EXPECT_THROW(model.forward(random_tensor({2, 3}, DType::f32, 1)), InvalidArgument);
  model.init(1);
  EXPECT_NO_THROW(model.forward(random_tensor({2, 3}, DType::f32, 1)));
  // Settings belong to the model: a child refuses them.
  EXPECT_THROW(model[0].init(2), InvalidArgument);
}

TEST(Structure, BackwardTwiceAfterOneForwardIsAnError) {
  nn::Sequential model;
  testing::build_mlp(model, 4, 6, 3);
  model.init(2);
  const Tensor x = random_tensor({5, 4}, DType::f32, 8);
  const Tensor y = random_labels(5, 3, DType::i32, 9);
  nn::CrossEntropyLoss loss;
  EXPECT_FALSE(model.awaiting_backward());
  model.forward(x);
  EXPECT_TRUE(model.awaiting_backward());
  loss.forward(model.forward(x), y);
  model.backward(loss.grad());
  EXPECT_FALSE(model.awaiting_backward());
  std::vector<std::vector<float>> once;
  for (nn::Parameter* p : model.parameters()) once.push_back(p->grad.to_floats());
  try {
    model.backward(loss.grad());
    FAIL() << "a second backward of one forward must throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("each backward needs a forward of its own"), std::string::npos) << e.what();
  }
  // Nothing was added by the refused call; a new forward makes backward legal again.
  const auto params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) EXPECT_EQ(params[i]->grad.to_floats(), once[i]) << params[i]->name;
  loss.forward(model.forward(x), y);
  EXPECT_NO_THROW(model.backward(loss.grad()));
  EXPECT_EQ(params[0]->grad.to_floats()[0], 2 * once[0][0]);
}

// A non-sequential model built from the layers: two branches over the same input, summed.
class TwoBranch : public nn::Module {
 public:
  TwoBranch() : a_(4, 3), b_(4, 3) {
    register_module("a", a_);
    register_module("b", b_);
  }
  std::string describe() const override { return "TwoBranch"; }

 protected:
  Tensor forward_impl(const Tensor& x) override {
    Tensor ya = a_.forward(x);
    Tensor yb = b_.forward(x);
    Tensor y = buffer(0, ya.shape(), ya.dtype());
    kernels::add(ya, yb, y, stream());
    return y;
  }
  Tensor backward_impl(const Tensor& dy) override {
    Tensor dxa = a_.backward(dy), dxb = b_.backward(dy);
    if (!input_grad_needed()) return Tensor();
    Tensor dx = buffer(1, dxa.shape(), dxa.dtype());
    kernels::add(dxa, dxb, dx, stream());
    return dx;
  }

 private:
  nn::Linear a_, b_;
};

TEST(Structure, CustomModuleComposesLayers) {
  TwoBranch model;
  model.init(9);
  const auto params = model.parameters();
  ASSERT_EQ(params.size(), 4u);
  EXPECT_EQ(params[0]->name, "a.weight");
  EXPECT_EQ(params[3]->name, "b.bias");
  const Tensor x = random_tensor({3, 4}, DType::f32, 1);
  const Tensor y = random_labels(3, 3, DType::i32, 2);
  nn::CrossEntropyLoss loss;
  testing::forward_backward(model, loss, x, y);
  auto f = [&] { return nn::item(loss.forward(model.forward(x), y)); };
  for (nn::Parameter* p : params) {
    const std::vector<double> numeric = testing::numeric_gradient(p->value, f, 3e-3);
    expect_close(p->grad.to_floats(), std::vector<float>(numeric.begin(), numeric.end()), 2e-2, 1e-3, p->name);
  }
}

// ---- flat buffers ----------------------------------------------------------------------

TEST(Flat, ParametersAndGradsAreViewsInReverseOrder) {
  nn::Sequential model;
  build_conv_model(model);
  model.init(6);
  const auto before = testing::parameter_values(model);
  model.storage().flatten();
  const auto params = model.parameters();
  ASSERT_NE(model.storage().plan(), nullptr);
  const nn::FlatPlan& plan = *model.storage().plan();
  ASSERT_TRUE(model.storage().values().defined());
  EXPECT_EQ(model.storage().values().numel(), plan.total);
  // Reverse registration order: the last parameter starts the buffer, the first ends it;
  // every offset aligned to 8 elements.
  EXPECT_EQ(plan.entries.back().offset, 0);
  EXPECT_LE(plan.entries.front().offset + params.front()->numel(), plan.total);
  EXPECT_GT(plan.entries.front().offset + params.front()->numel(), plan.total - 8) << "padding: one block at most";
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(plan.entries[i].offset % 8, 0);
    EXPECT_TRUE(params[i]->value.shares_storage_with(model.storage().values())) << params[i]->name;
    EXPECT_EQ(params[i]->value.data(), model.storage().values().view(plan.entries[i].offset, {1}).data());
    EXPECT_EQ(params[i]->value.to_floats(), before[i].second) << params[i]->name;
  }
  nn::CrossEntropyLoss loss;
  testing::forward_backward(model, loss, random_tensor({2, 2, 6, 6}, DType::f32, 1),
                            random_labels(2, 5, DType::i32, 1));
  ASSERT_TRUE(model.storage().grads().defined());
  EXPECT_TRUE(model.storage().owns_grad_buffer());
  ASSERT_NE(model.storage().grad_plan(), nullptr);
  EXPECT_EQ(model.storage().grad_plan(), model.storage().plan())
      << "the first backward lays gradients out by the values' plan";
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(params[i]->grad.shares_storage_with(model.storage().grads())) << params[i]->name;
  }
}

// The data-parallel runtime's way: its own buffer, with gaps between parameters.
TEST(Flat, GradientsGoIntoAPlacedBufferWithGaps) {
  nn::Sequential reference, placed;
  build_conv_model(reference);
  build_conv_model(placed);
  reference.init(8);
  placed.init(8);
  const nn::FlatPlan plan = placed.storage().make_plan({.align_elements = 16});
  EXPECT_EQ(plan.entries.back().offset, 0);
  for (const nn::PlanEntry& e : plan.entries) EXPECT_EQ(e.offset % 16, 0);
  Tensor bucket = Tensor::zeros({plan.total + 3}, DType::f32);
  placed.storage().set_grad_buffer(bucket, plan);
  EXPECT_TRUE(placed.storage().grads().defined());
  EXPECT_FALSE(placed.storage().owns_grad_buffer());  // not the model's own
  const Tensor x = random_tensor({3, 2, 6, 6}, DType::f32, 2);
  const Tensor y = random_labels(3, 5, DType::i32, 3);
  nn::CrossEntropyLoss loss;
  testing::forward_backward(reference, loss, x, y);
  testing::forward_backward(placed, loss, x, y);
  testing::expect_same_grads(placed, reference, 0, 0, "placed grads");
  const std::vector<float> flat = bucket.to_floats();
  const auto params = placed.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::vector<float> g = params[i]->grad.to_floats();
    for (std::int64_t j = 0; j < params[i]->numel(); ++j) {
      ASSERT_EQ(flat[static_cast<std::size_t>(plan.entries[i].offset + j)], g[static_cast<std::size_t>(j)]);
    }
  }
  // Gaps stay zero.
  std::vector<bool> used(flat.size(), false);
  for (std::size_t i = 0; i < params.size(); ++i) {
    for (std::int64_t j = 0; j < params[i]->numel(); ++j)
      used[static_cast<std::size_t>(plan.entries[i].offset + j)] = true;
  }
  for (std::size_t j = 0; j < flat.size(); ++j) {
    if (!used[j]) ASSERT_EQ(flat[j], 0.0f) << "gap element " << j;
  }
  // Direct placement works too: param.grad = buffer.view(offset, shape).
  Tensor other = Tensor::zeros({plan.total}, DType::f32);
  for (std::size_t i = 0; i < params.size(); ++i)
    params[i]->grad = other.view(plan.entries[i].offset, params[i]->shape());
  testing::forward_backward(placed, loss, x, y);
  testing::expect_same_grads(placed, reference, 0, 0, "directly placed grads");
}

// One plan: buffers laid out by two different plans, or a plan of another model, are errors.
TEST(Flat, PlansThatDoNotFitAreRejected) {
  nn::Sequential model, other;
  testing::build_mlp(model, 3, 4, 2);
  testing::build_mlp(other, 3, 5, 2);
  model.init(1);
  const nn::FlatPlan plan = model.storage().make_plan();
  EXPECT_THROW(model.storage().flatten(other.storage().make_plan()), InvalidArgument);
  EXPECT_THROW(model.storage().set_grad_buffer(Tensor::zeros({plan.total - 1}, DType::f32), plan), InvalidArgument);
  model.storage().flatten(plan);
  const nn::FlatPlan wider = model.storage().make_plan({.align_elements = 32});
  ASSERT_FALSE(wider == plan);
  try {
    model.storage().set_grad_buffer(Tensor::zeros({wider.total}, DType::f32), wider);
    FAIL() << "gradients in another plan than the values must be refused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("values and gradients must share one"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model.storage().allocate_grads(wider), InvalidArgument);
  model.storage().allocate_grads(plan);
  EXPECT_EQ(model.storage().grad_plan(), model.storage().plan());
}

// The plan itself: buckets cut at parameter boundaries by the caps, padded so that every
// rank's chunk is aligned; chunks tile each bucket; shard offsets follow each other.
TEST(Flat, PlanBucketsAndShards) {
  std::vector<nn::PlanParam> params = {{"a", {1000}}, {"b", {3}}, {"c", {7, 9}}, {"d", {1}}, {"e", {333}}};
  for (int world : {1, 2, 3, 4}) {
    nn::FlatPlanOptions o;
    o.world_size = world;
    o.first_bucket_cap_mb = 1000 * 4.0 / (1024 * 1024);  // 1000 f32: e, d, c, b fit; a does not
    o.bucket_cap_mb = 1e-9;                              // then one parameter per bucket
    const nn::FlatPlan plan = nn::make_flat_plan(params, o);
    ASSERT_EQ(plan.buckets.size(), 2u) << plan.describe();
    EXPECT_EQ(plan.entries[4].offset, 0);
    EXPECT_EQ(plan.entries[4].bucket, 0);
    EXPECT_EQ(plan.entries[1].bucket, 0);
    EXPECT_EQ(plan.entries[0].bucket, 1);
    std::int64_t shard = 0, at = 0;
    for (const nn::PlanBucket& b : plan.buckets) {
      EXPECT_EQ(b.begin, at);
      EXPECT_EQ(b.numel() % (8 * world), 0) << "bucket padded to a multiple of world size x alignment";
      EXPECT_EQ(b.chunk * world, b.numel());
      EXPECT_EQ(b.shard_offset, shard);
      for (std::size_t i : b.entries) {
        EXPECT_GE(plan.entries[i].offset, b.begin);
        EXPECT_LE(plan.entries[i].offset + plan.entries[i].numel, b.end);
      }
      shard += b.chunk;
      at = b.end;
    }
    EXPECT_EQ(plan.total, at);
    EXPECT_EQ(plan.shard_numel, shard);
    // Every element of the buffer belongs to exactly one rank's shard.
    std::vector<int> owner(static_cast<std::size_t>(plan.total), -1);
    for (int r = 0; r < world; ++r) {
      for (const nn::ElementRange& range : plan.shard_ranges(r)) {
        for (std::int64_t j = range.begin; j < range.end; ++j) {
          ASSERT_EQ(owner[static_cast<std::size_t>(j)], -1);
          owner[static_cast<std::size_t>(j)] = r;
        }
      }
    }
    EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0);
    // Less than one alignment block of padding per rank and bucket beyond the parameters'.
    std::int64_t params_numel = 0;
    for (const nn::PlanEntry& e : plan.entries) params_numel += e.numel;
    EXPECT_LT(plan.total - params_numel, static_cast<std::int64_t>(plan.buckets.size() * 8 * world + 5 * 8));
  }
  EXPECT_THROW(nn::make_flat_plan(params, {.world_size = 0}), InvalidArgument);
}

TEST(Flat, CoalesceViewsMergesNeighbours) {
  Tensor buf = Tensor::zeros({20}, DType::f32);
  // Reverse order, as gradients are laid out: b before a in memory, listed a then b.
  const Tensor a = buf.view(10, {2, 5}), b = buf.view(4, {6}), c = buf.view(0, {3});
  auto merged = nn::coalesce_views({a, b, c, Tensor::zeros({4}, DType::f32)});
  ASSERT_EQ(merged.size(), 3u);  // a+b merged; c is not adjacent to b (gap at 3); the separate one
  EXPECT_EQ(merged[0].numel(), 16);
  EXPECT_EQ(merged[0].data(), b.data());
  EXPECT_EQ(merged[1].numel(), 3);
}

// ---- initialization, state, layers -----------------------------------------------------

TEST(Init, DeterministicAndScaled) {
  nn::Sequential a, b, c;
  for (nn::Sequential* m : {&a, &b, &c}) build_conv_model(*m);
  a.init(42);
  b.init(42);
  c.init(43);
  testing::expect_same_parameters(a, b, 0, 0, "same seed");
  EXPECT_NE(a.parameters()[0]->value.to_floats(), c.parameters()[0]->value.to_floats());
  for (nn::Parameter* p : a.parameters()) {
    const std::vector<float> v = p->value.to_floats();
    if (p->name.ends_with("gamma")) {
      for (float x : v) EXPECT_EQ(x, 1.0f);
    } else if (p->name.ends_with("bias") || p->name.ends_with("beta")) {
      for (float x : v) EXPECT_EQ(x, 0.0f);
    } else {
      double bound = 0;
      if (p->init.kind == nn::InitSpec::Kind::kaiming_uniform) bound = std::sqrt(6.0 / p->init.fan_in);
      if (p->init.kind == nn::InitSpec::Kind::xavier_uniform)
        bound = std::sqrt(6.0 / (p->init.fan_in + p->init.fan_out));
      ASSERT_GT(bound, 0) << p->name;
      double sum_sq = 0;
      for (float x : v) {
        EXPECT_LE(std::fabs(x), bound) << p->name;
        sum_sq += x * x;
      }
      // Uniform(-b, b) has variance b²/3.
      EXPECT_NEAR(sum_sq / static_cast<double>(v.size()), bound * bound / 3, bound * bound / 3 * 0.6) << p->name;
    }
  }
  EXPECT_EQ(a.parameters()[0]->init.fan_in, 2 * 3 * 3);
}

TEST(State, StateDictRoundTrip) {
  nn::Sequential a, b;
  build_conv_model(a);
  build_conv_model(b);
  a.init(1);
  b.load_state_dict(a.state_dict());
  testing::expect_same_parameters(a, b, 0, 0, "loaded");
  const Tensor x = random_tensor({2, 2, 6, 6}, DType::f32, 5);
  EXPECT_EQ(a.forward(x).to_floats(), b.forward(x).to_floats());
  StateDict partial = a.state_dict();
  partial.erase("0.weight");
  EXPECT_THROW(b.load_state_dict(partial), InvalidArgument);
  StateDict extra = a.state_dict();
  extra["nonsense"] = scalar_tensor(1);
  EXPECT_THROW(b.load_state_dict(extra), InvalidArgument);
  EXPECT_NO_THROW(b.load_state_dict(partial, /*strict=*/false));
}

TEST(Layers, DropoutMasksTrainingOnlyAndBackwardMatches) {
  nn::Sequential model;
  model.add<nn::Dropout>(0.25f);
  model.init(7).set_input_grad(true);
  const Tensor x = random_tensor({8, 33}, DType::f32, 4, 0.5f, 1.5f);  // never zero
  const std::vector<float> xv = x.to_floats();
  const std::vector<float> y1 = model.forward(x).to_floats();
  const Tensor dy = random_tensor({8, 33}, DType::f32, 5);
  const std::vector<float> dx = model.backward(dy).to_floats();
  const std::vector<float> dyv = dy.to_floats();
  int dropped = 0;
  for (std::size_t i = 0; i < xv.size(); ++i) {
    if (y1[i] == 0.0f) {
      ++dropped;
      EXPECT_EQ(dx[i], 0.0f);
    } else {
      EXPECT_NEAR(y1[i], xv[i] / 0.75f, 1e-6);
      EXPECT_NEAR(dx[i], dyv[i] / 0.75f, 1e-6);
    }
  }
  EXPECT_GT(dropped, 30);
  EXPECT_LT(dropped, 100);
  const std::vector<float> y2 = model.forward(x).to_floats();
  EXPECT_NE(y1, y2);  // a new mask per forward
  model.eval();
  EXPECT_EQ(model.forward(x).to_floats(), xv);
}

// Slice r of N equal slices of a batch gets exactly the rows of the whole batch's mask (what
// makes N data-parallel ranks drop like one process), and no two slices share a mask.
TEST(Layers, DropoutSlicesDrawTheWholeBatchsMask) {
  constexpr int kSlices = 4;
  constexpr std::int64_t kRows = 8, kCols = 33, kPer = kRows / kSlices;
  const Tensor x = Tensor::from_floats(std::vector<float>(kRows * kCols, 1.0f), {kRows, kCols});
  nn::Sequential whole;
  whole.add<nn::Dropout>(0.5f);
  whole.init(7);
  std::vector<std::unique_ptr<nn::Sequential>> slices;
  for (int r = 0; r < kSlices; ++r) {
    slices.push_back(std::make_unique<nn::Sequential>());
    slices.back()->add<nn::Dropout>(0.5f);
    slices.back()->init(7).set_batch_slice(r, kSlices);
  }
  for (int forward = 0; forward < 3; ++forward) {  // the counters advance alike
    const std::vector<float> all = whole.forward(x).to_floats();
    std::set<std::vector<float>> distinct;
    for (int r = 0; r < kSlices; ++r) {
      const std::vector<float> mine = slices[r]->forward(testing::rows(x, r * kPer, kPer)).to_floats();
      const std::vector<float> expected(all.begin() + r * kPer * kCols, all.begin() + (r + 1) * kPer * kCols);
      EXPECT_EQ(mine, expected) << "slice " << r << ", forward " << forward;
      distinct.insert(mine);
    }
    EXPECT_EQ(distinct.size(), static_cast<std::size_t>(kSlices)) << "two slices share a mask";
  }
  EXPECT_THROW(whole.set_batch_slice(4, 4), InvalidArgument);
  EXPECT_THROW(whole[0].set_batch_slice(0, 1), InvalidArgument);  // a setting of the model
}

// The random-number position is the model's state: a model loaded from a state dict draws
// the masks the saved one would have drawn next.
TEST(Layers, DropoutPositionIsInTheStateDict) {
  auto build = [](nn::Sequential& m) { m.add<nn::Linear>(9, 17).add<nn::Dropout>(0.3f).add<nn::Linear>(17, 4); };
  nn::Sequential a, b;
  build(a);
  build(b);
  a.init(5);
  b.init(6);  // another seed: the state dict must carry Dropout's seed, too
  const Tensor x = random_tensor({5, 9}, DType::f32, 6);
  for (int i = 0; i < 3; ++i) a.forward(x);
  const StateDict saved = a.state_dict();
  ASSERT_EQ(saved.count("1.rng_seed"), 1u);
  ASSERT_EQ(saved.count("1.rng_counter"), 1u);
  EXPECT_EQ(saved.at("1.rng_counter").to_ints()[0], 3 * 5 * 17);
  EXPECT_NE(a.signature().find("1.rng_counter [1] i64 state"), std::string::npos) << a.signature();
  b.load_state_dict(saved);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(b.forward(x).to_floats(), a.forward(x).to_floats()) << "forward " << i;
  // A state dict without it is refused (strict) and leaves the position alone (not strict).
  StateDict weights_only = saved;
  weights_only.erase("1.rng_counter");
  try {
    b.load_state_dict(weights_only);
    FAIL() << "a missing Dropout state must be refused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no entry for '1.rng_counter' (state of Dropout(0.3))"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(b.load_state_dict(weights_only, /*strict=*/false));
  EXPECT_EQ(b.forward(x).to_floats(), a.forward(x).to_floats());
}

TEST(Layers, ShapesAreCheckedWithClearErrors) {
  nn::Sequential model;
  testing::build_mlp(model, 4, 5, 3);
  model.init(1);
  try {
    model.forward(random_tensor({2, 6}, DType::f32, 1));
    FAIL() << "expected a throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("Linear(4, 5)"), std::string::npos) << e.what();
  }
}

// ---- GPU twins -------------------------------------------------------------------------

TEST(Gpu, InitForwardBackwardMatchCpu) {
  TUTTI_REQUIRE_GPU();
  nn::Sequential cpu, gpu;
  build_conv_model(cpu);
  build_conv_model(gpu);
  const Stream stream = Stream::create(Device::cuda(0));
  gpu.to(Device::cuda(0), stream).init(13);
  cpu.init(13);
  testing::expect_same_parameters(gpu, cpu, 0, 0, "init on the GPU");
  const Tensor x = random_tensor({4, 2, 6, 6}, DType::f32, 1);
  const Tensor y = random_labels(4, 5, DType::i32, 2);
  nn::CrossEntropyLoss lc, lg;
  testing::forward_backward(cpu, lc, x, y);
  testing::forward_backward(gpu, lg, x.to(Device::cuda(0)), y.to(Device::cuda(0)));
  EXPECT_NEAR(nn::item(lg.loss(), stream), nn::item(lc.loss()), 1e-4);
  testing::expect_same_grads(gpu, cpu, 1e-3, 1e-5, "GPU grads");
  // Hooks fire on the backward thread, after the kernels are issued.
  int calls = 0;
  gpu.storage().set_grad_ready_hook([&](nn::Parameter&) { ++calls; });
  testing::forward_backward(gpu, lg, x.to(Device::cuda(0)), y.to(Device::cuda(0)));
  EXPECT_EQ(calls, static_cast<int>(gpu.parameters().size()));
}

TEST(Gpu, DropoutMaskIsTheSameAsOnTheCpu) {
  TUTTI_REQUIRE_GPU();
  nn::Sequential cpu, gpu;
  for (nn::Sequential* m : {&cpu, &gpu}) m->add<nn::Linear>(9, 17).add<nn::Dropout>(0.3f).add<nn::Linear>(17, 4);
  cpu.init(5);
  gpu.to(Device::cuda(0)).init(5);
  const Tensor x = random_tensor({5, 9}, DType::f32, 6);
  const Tensor y = random_labels(5, 4, DType::i32, 7);
  nn::CrossEntropyLoss lc, lg;
  for (int i = 0; i < 2; ++i) {  // the second forward draws a new mask, on both
    cpu.zero_grad();
    gpu.zero_grad();
    testing::forward_backward(cpu, lc, x, y);
    testing::forward_backward(gpu, lg, x.to(Device::cuda(0)), y.to(Device::cuda(0)));
    EXPECT_NEAR(nn::item(lg.loss()), nn::item(lc.loss()), 1e-4);
    testing::expect_same_grads(gpu, cpu, 1e-3, 1e-5, "with dropout");
  }
}

TEST(Gpu, FlatModelAndAccumulationMatchCpu) {
  TUTTI_REQUIRE_GPU();
  nn::Sequential cpu, gpu;
  build_conv_model(cpu);
  build_conv_model(gpu);
  cpu.init(3);
  gpu.to(Device::cuda(0)).init(3);
  cpu.storage().flatten();
  gpu.storage().flatten();
  const Tensor x = random_tensor({6, 2, 6, 6}, DType::f32, 4);
  const Tensor y = random_labels(6, 5, DType::i64, 5);
  nn::CrossEntropyLoss lc, lg;
  cpu.zero_grad();
  gpu.zero_grad();
  for (int i = 0; i < 2; ++i) {
    testing::forward_backward(cpu, lc, testing::rows(x, 3 * i, 3), testing::rows(y, 3 * i, 3), 0.5f);
    testing::forward_backward(gpu, lg, testing::rows(x, 3 * i, 3).to(Device::cuda(0)),
                              testing::rows(y, 3 * i, 3).to(Device::cuda(0)), 0.5f);
  }
  testing::expect_same_grads(gpu, cpu, 1e-3, 1e-5, "accumulated GPU grads");
  EXPECT_TRUE(gpu.storage().grads().defined());
  EXPECT_TRUE(gpu.storage().grads().device().is_cuda());
}

}  // namespace
}  // namespace tutti
