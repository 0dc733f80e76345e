// nn::Module through Sequential and the layers: the plumbing adds nothing to the raw kernels,
// whole models against finite differences, gradient accumulation, structure, names and hooks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
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

using testing::build_conv_model;
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

// A model built under DeferredParameters holds no parameter storage until materialize(), which
// fills it from init's sources with the values an eager init draws, bit for bit.
TEST(Structure, DeferredParametersAreFilledAtMaterializeWithInitsValues) {
  nn::Sequential eager;
  testing::build_mlp(eager, 5, 7, 3);
  eager.set_precision(DType::bf16).init(21);
  const std::int64_t before = Storage::live_bytes(Device::cpu());
  nn::Sequential deferred;
  {
    nn::DeferredParameters defer;
    EXPECT_TRUE(nn::DeferredParameters::active());
    testing::build_mlp(deferred, 5, 7, 3);
  }
  EXPECT_FALSE(nn::DeferredParameters::active());
  deferred.set_precision(DType::bf16).init(21);
  EXPECT_EQ(Storage::live_bytes(Device::cpu()), before) << "a deferred model allocated parameters before materialize";
  EXPECT_TRUE(deferred.has_deferred_parameters());
  EXPECT_EQ(deferred.signature(), eager.signature());
  for (nn::Parameter* p : deferred.parameters()) {
    EXPECT_TRUE(p->deferred && !p->value.defined() && p->source) << p->name;
  }
  // Nothing reads a parameter without storage: each refusal says what to do.
  const auto refused = [&](const std::function<void()>& call) {
    try {
      call();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(refused([&] {
              deferred.forward(random_tensor({2, 5}, DType::f32, 1));
            }).find("materialize()"),
            std::string::npos);
  EXPECT_NE(refused([&] { deferred.state_dict(); }).find("is deferred"), std::string::npos);
  EXPECT_NE(refused([&] { deferred.storage().flatten(); }).find("is deferred"), std::string::npos);

  deferred.materialize();
  EXPECT_FALSE(deferred.has_deferred_parameters());
  EXPECT_EQ(testing::parameter_values(deferred), testing::parameter_values(eager));
  const std::vector<nn::Parameter*> a = deferred.parameters(), b = eager.parameters();
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i]->compute.defined()) << a[i]->name;
    EXPECT_EQ(a[i]->compute.to_floats(), b[i]->compute.to_floats()) << a[i]->name;
  }
  EXPECT_EQ(deferred.forward(random_tensor({2, 5}, DType::f32, 1)).to_floats(),
            eager.forward(random_tensor({2, 5}, DType::f32, 1)).to_floats());

  // Never initialized: materialize names the parameter.
  nn::Sequential bare;
  {
    nn::DeferredParameters defer;
    testing::build_mlp(bare, 5, 7, 3);
  }
  const std::string error = refused([&] { bare.materialize(); });
  EXPECT_NE(error.find("parameter 0.weight is deferred"), std::string::npos) << error;
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

}  // namespace
}  // namespace tutti
