#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "nn/nn_test_util.h"
#include "tutti/amp/loss_scaler.h"
#include "tutti/amp/policy.h"
#include "tutti/optim/adamw.h"
#include "tutti/optim/clip.h"
#include "tutti/optim/sgd.h"

namespace tutti {
namespace {

using testing::expect_close;
using testing::random_labels;
using testing::random_tensor;

// One scaled step: backward with the loss scaled, unscale and check, update, maybe step.
// Returns whether the optimizer stepped.
bool scaled_step(nn::Module& model, nn::CrossEntropyLoss& loss, optim::Optimizer& opt, amp::LossScaler& scaler,
                 const Tensor& x, const Tensor& y, bool inject_inf = false) {
  model.zero_grad();
  testing::forward_backward(model, loss, x, y, scaler.scale());
  if (inject_inf) {
    // As an overflowing fp16 backward would leave it.
    nn::Parameter* p = model.parameters()[1];
    Tensor bad = Tensor::from_floats({std::numeric_limits<float>::infinity()}, {1}, p->grad.dtype());
    p->grad.view(0, {1}).copy_from(bad.to(p->grad.device()), model.stream());
  }
  const Tensor& found = scaler.unscale_and_check(model.parameters(), model.stream());
  if (!scaler.update(found, model.stream())) return false;
  opt.step();
  return true;
}

void build(nn::Sequential& m, Device device = Device::cpu()) {
  m.add<nn::Linear>(8, 16).add<nn::ReLU>().add<nn::Linear>(16, 3);
  m.to(device).init(3);
}

TEST(LossScaler, DefaultsAreGradScalers) {
  const amp::LossScalerOptions o;
  EXPECT_EQ(o.init_scale, 65536.0f);
  EXPECT_EQ(o.growth_factor, 2.0f);
  EXPECT_EQ(o.backoff_factor, 0.5f);
  EXPECT_EQ(o.growth_interval, 2000);
  EXPECT_EQ(o.min_scale, 1.0f);
  EXPECT_EQ(amp::LossScaler().scale(), 65536.0f);
  EXPECT_THROW(amp::LossScaler({.backoff_factor = 1.5f}), InvalidArgument);
  EXPECT_THROW(amp::LossScaler({.min_scale = 0.0f}), InvalidArgument);
  EXPECT_THROW(amp::LossScaler({.init_scale = 4.0f, .min_scale = 8.0f}), InvalidArgument);
}

// Backing off below the floor is the error that says the run diverged, not a scale of 0.
TEST(LossScaler, BackingOffBelowTheFloorSaysTheRunDiverged) {
  amp::LossScaler scaler;  // 2^16, halves on inf/nan, floor 1
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(scaler.update(false));
  ASSERT_FALSE(scaler.update(true));
  ASSERT_TRUE(scaler.update(false));                                    // a good step ends a streak
  for (int i = 0; i < 15; ++i) ASSERT_FALSE(scaler.update(true)) << i;  // 32768 -> 1: allowed
  EXPECT_EQ(scaler.scale(), 1.0f);
  EXPECT_EQ(scaler.nonfinite_streak(), 15);
  EXPECT_EQ(scaler.steps(), 20);
  try {
    scaler.update(true);
    FAIL() << "a scale below min_scale must be an error";
  } catch (const InvalidArgument& e) {
    FAIL() << "the caller did nothing wrong: " << e.what();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("the run diverged"), std::string::npos) << msg;
    EXPECT_NE(msg.find("16 step(s) in a row had inf/nan"), std::string::npos) << msg;
    EXPECT_NE(msg.find("step 21,"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fell from 32768"), std::string::npos) << msg;
    EXPECT_NE(msg.find("16 skipped in all"), std::string::npos) << msg;
    EXPECT_NE(msg.find("min_scale = 1"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("must be positive"), std::string::npos) << msg;
  }
  // Left as before that step: scale 1, nothing counted.
  EXPECT_EQ(scaler.scale(), 1.0f);
  EXPECT_EQ(scaler.skipped_steps(), 16);
  EXPECT_EQ(scaler.steps(), 20);

  // Another floor; a fixed scale never backs off, so it has none.
  amp::LossScaler high({.init_scale = 1024.0f, .min_scale = 256.0f});
  EXPECT_FALSE(high.update(true));
  EXPECT_FALSE(high.update(true));
  EXPECT_EQ(high.scale(), 256.0f);
  EXPECT_THROW(high.update(true), Error);
  amp::LossScaler fixed({.mode = amp::ScalerMode::fixed, .init_scale = 1.0f});
  for (int i = 0; i < 100; ++i) ASSERT_FALSE(fixed.update(true));
}

// An fp16 run whose weights blew up: every gradient is nan at any scale. The scaler stops it
// after 17 skipped steps with the divergence error, instead of halving the scale to 0.
TEST(LossScaler, DivergedFp16TrainingEndsWithTheDivergenceError) {
  nn::Sequential model;
  build(model);
  model.set_precision(DType::f16);
  optim::SGD opt(model.parameters(), {.lr = 1e30f});
  amp::LossScaler scaler(amp::Policy::fp16().default_scaler());
  nn::CrossEntropyLoss loss;
  const Tensor x = random_tensor({6, 8}, DType::f32, 1);
  const Tensor y = random_labels(6, 3, DType::i32, 2);
  int steps = 0, stepped = 0;
  std::string error;
  try {
    for (; steps < 300; ++steps) stepped += scaled_step(model, loss, opt, scaler, x, y) ? 1 : 0;
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("the run diverged: 17 step(s) in a row"), std::string::npos) << error;
  EXPECT_GE(stepped, 1);  // the first step was fine and blew the weights up
  EXPECT_EQ(steps, stepped + 16);
  EXPECT_EQ(scaler.scale(), 1.0f);
}

TEST(LossScaler, InfSkipsStepLeavesStateAndHalvesScale) {
  nn::Sequential model;
  build(model);
  optim::AdamW opt(model.parameters(), {.lr = 0.01f});
  amp::LossScaler scaler;
  nn::CrossEntropyLoss loss;
  const Tensor x = random_tensor({6, 8}, DType::f32, 1);
  const Tensor y = random_labels(6, 3, DType::i32, 2);
  ASSERT_TRUE(scaled_step(model, loss, opt, scaler, x, y));  // give the optimizer some state
  const auto params_before = testing::parameter_values(model);
  const StateDict opt_before = opt.state_dict();
  EXPECT_FALSE(scaled_step(model, loss, opt, scaler, x, y, /*inject_inf=*/true));
  EXPECT_EQ(scaler.scale(), 32768.0f);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_EQ(scaler.growth_tracker(), 0);
  EXPECT_EQ(testing::parameter_values(model), params_before);
  const StateDict opt_after = opt.state_dict();
  ASSERT_EQ(opt_after.size(), opt_before.size());
  for (const auto& [key, t] : opt_before) {
    if (t.dtype() == DType::f32) {
      EXPECT_EQ(opt_after.at(key).to_floats(), t.to_floats()) << key;
    } else {
      EXPECT_EQ(opt_after.at(key).to_ints(), t.to_ints()) << key;
    }
  }
  EXPECT_EQ(opt.steps(), 1);
  // The next good step goes through.
  EXPECT_TRUE(scaled_step(model, loss, opt, scaler, x, y));
  EXPECT_EQ(opt.steps(), 2);
}

TEST(LossScaler, GoodStepsGrowTheScale) {
  amp::LossScaler scaler({.init_scale = 8.0f, .growth_interval = 3});
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(scaler.update(false));
    EXPECT_EQ(scaler.scale(), round == 0 ? 8.0f : 16.0f);
    EXPECT_TRUE(scaler.update(false));
    EXPECT_EQ(scaler.scale(), round == 0 ? 16.0f : 32.0f);
    EXPECT_EQ(scaler.growth_tracker(), 0);
  }
  // An inf resets the run of good steps.
  EXPECT_TRUE(scaler.update(false));
  EXPECT_FALSE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 16.0f);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(scaler.update(false));
  EXPECT_EQ(scaler.scale(), 16.0f);
  EXPECT_TRUE(scaler.update(false));
  EXPECT_EQ(scaler.scale(), 32.0f);
}

TEST(LossScaler, UnscaledGradientsEqualUnscaledTraining) {
  nn::Sequential plain, scaled;
  build(plain);
  build(scaled);
  amp::LossScaler scaler({.init_scale = 1024.0f});
  nn::CrossEntropyLoss loss;
  const Tensor x = random_tensor({5, 8}, DType::f32, 3);
  const Tensor y = random_labels(5, 3, DType::i32, 4);
  testing::forward_backward(plain, loss, x, y);
  testing::forward_backward(scaled, loss, x, y, scaler.scale());
  // A divisor as the data-parallel runtime passes (ranks × micro-batches).
  const Tensor& found = scaler.unscale_and_check(scaled.parameters(), Stream(), 3.0f);
  EXPECT_EQ(found.to_ints()[0], 0);
  for (nn::Parameter* p : plain.parameters()) {
    std::vector<float> g = p->grad.to_floats();
    for (float& v : g) v /= 3.0f;
    p->grad.copy_from(Tensor::from_floats(g, p->shape()));
  }
  testing::expect_same_grads(scaled, plain, 1e-6, 1e-9, "unscaled");
}

// With clipping, the norm read is the step's one sync and tells the found-inf flag too.
TEST(LossScaler, ClippingNormServesAsTheFoundInfCheck) {
  nn::Sequential model;
  build(model);
  optim::SGD opt(model.parameters(), {.lr = 0.1f});
  amp::LossScaler scaler;
  nn::CrossEntropyLoss loss;
  const Tensor x = random_tensor({6, 8}, DType::f32, 1);
  const Tensor y = random_labels(6, 3, DType::i32, 2);
  for (const bool inject : {false, true}) {
    model.zero_grad();
    testing::forward_backward(model, loss, x, y, scaler.scale());
    if (inject) model.parameters()[2]->grad.data_as<float>()[1] = std::numeric_limits<float>::quiet_NaN();
    const Tensor& flag = scaler.unscale_and_check(model.parameters(), model.stream());
    const optim::GradNorm norm = optim::compute_grad_norm(model.parameters(), 1.0, model.stream());
    EXPECT_EQ(norm.finite, !inject);
    EXPECT_EQ(flag.to_ints()[0], inject ? 1 : 0);
    const auto before = testing::parameter_values(model);
    if (scaler.update(!norm.finite)) opt.step(norm.coefficient);
    EXPECT_EQ(testing::parameter_values(model) == before, inject);
  }
  EXPECT_EQ(scaler.scale(), 32768.0f);
}

TEST(LossScaler, StaticAndOffModes) {
  amp::LossScaler fixed({.mode = amp::ScalerMode::fixed, .init_scale = 128.0f, .growth_interval = 1});
  EXPECT_FALSE(fixed.update(true));
  EXPECT_TRUE(fixed.update(false));
  EXPECT_EQ(fixed.scale(), 128.0f);
  amp::LossScaler off({.mode = amp::ScalerMode::off});
  EXPECT_EQ(off.scale(), 1.0f);
  EXPECT_FALSE(off.enabled());
  Tensor g = Tensor::from_floats({1.0f, std::numeric_limits<float>::quiet_NaN()}, {2});
  EXPECT_TRUE(off.update(off.unscale_and_check({g})));  // off never skips
  EXPECT_EQ(g.to_floats()[0], 1.0f);                    // and does not scale
  // A fixed scaler still finds the nan.
  Tensor g2 = Tensor::from_floats({1.0f, std::numeric_limits<float>::quiet_NaN()}, {2});
  EXPECT_FALSE(fixed.update(fixed.unscale_and_check({g2})));
}

TEST(LossScaler, StateDictRoundTrip) {
  amp::LossScaler a({.growth_interval = 5});
  a.update(true);
  a.update(false);
  a.update(false);
  amp::LossScaler b({.growth_interval = 5});
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(b.scale(), a.scale());
  EXPECT_EQ(b.growth_tracker(), 2);
  EXPECT_EQ(b.skipped_steps(), 1);
  EXPECT_EQ(b.steps(), 3);
  EXPECT_EQ(b.nonfinite_streak(), 0);
  a.update(true);
  EXPECT_EQ(amp::LossScaler(a.options()).nonfinite_streak(), 0);
  amp::LossScaler c({.growth_interval = 5});
  c.load_state_dict(a.state_dict());
  EXPECT_EQ(c.nonfinite_streak(), 1);
  EXPECT_EQ(c.steps(), 4);
  for (int i = 0; i < 3; ++i) b.update(false);
  EXPECT_EQ(b.scale(), 65536.0f);  // 32768 grew back after 5 good steps in all
}

TEST(Policy, DefaultsAndApply) {
  EXPECT_EQ(amp::Policy::fp16().default_scaler().mode, amp::ScalerMode::dynamic);
  EXPECT_EQ(amp::Policy::bf16().default_scaler().mode, amp::ScalerMode::off);
  EXPECT_EQ(amp::Policy::fp32().default_scaler().mode, amp::ScalerMode::off);
  nn::Sequential model;
  build(model);
  amp::apply(amp::Policy::bf16(), model);
  EXPECT_EQ(model.compute_dtype(), DType::bf16);
  EXPECT_EQ(model.grad_dtype(), DType::f32);
  for (nn::Parameter* p : model.parameters()) {
    ASSERT_TRUE(p->compute.defined());
    EXPECT_EQ(p->compute.dtype(), DType::bf16);
  }
  EXPECT_THROW(amp::apply({.compute = DType::f16, .master = DType::f16}, model), InvalidArgument);
  EXPECT_THROW(model.set_precision(DType::bf16, DType::f16), InvalidArgument);
}

// ---- mixed-precision training converges like fp32 --------------------------------------

// Blobs that overlap a little: training matters (chance is 1/4) and fp32 does not reach 100%.
constexpr float kSpread = 2.5f;
constexpr int kEpochs = 3;

// Trains an MLP on separable blobs; returns the test accuracy before and after training.
struct Accuracy {
  double before, after;
};
Accuracy train_blobs(DType compute, DType grad, Device device) {
  const std::int64_t dim = 16, classes = 4, batch = 64;
  const testing::Blobs train = testing::make_blobs(512, dim, classes, 1, kSpread);
  const testing::Blobs test = testing::make_blobs(256, dim, classes, 1, kSpread);  // the same blobs
  nn::Sequential model;
  model.add<nn::Linear>(dim, 32).add<nn::ReLU>().add<nn::Linear>(32, classes);
  model.to(device).init(7);
  model.set_precision(compute, grad);
  model.storage().flatten();
  optim::AdamW opt(model.parameters(), {.lr = 0.01f, .weight_decay = 0.0f});
  opt.set_stream(model.stream());
  amp::Policy policy{.compute = compute, .grad = grad};
  amp::LossScaler scaler(policy.default_scaler());
  nn::CrossEntropyLoss loss;
  const Tensor xs = train.x.to(device), ys = train.labels.to(device);
  auto accuracy = [&] {
    return static_cast<double>(
               nn::count_correct(model.forward(test.x.to(device)), test.labels.to(device), model.stream())) /
           256.0;
  };
  const double before = accuracy();
  int skipped = 0;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    for (std::int64_t b = 0; b < 512 / batch; ++b) {
      model.zero_grad();
      testing::forward_backward(model, loss, testing::rows(xs, b * batch, batch), testing::rows(ys, b * batch, batch),
                                scaler.scale());
      const Tensor& found = scaler.unscale_and_check(model.parameters(), model.stream());
      if (scaler.update(found, model.stream())) {
        opt.step();
      } else {
        ++skipped;
      }
    }
  }
  EXPECT_LE(skipped, 3) << name_of(compute);
  model.eval();
  return {before, accuracy()};
}

void check_convergence(Device device) {
  const Accuracy a32 = train_blobs(DType::f32, DType::f32, device);
  const double fp32 = a32.after;
  EXPECT_LE(a32.before, 0.6) << "the problem is too easy to tell anything";
  EXPECT_GE(fp32, 0.93);
  for (const DType half : {DType::bf16, DType::f16}) {
    const double acc = train_blobs(half, DType::f32, device).after;
    EXPECT_GE(acc, fp32 - 0.02) << name_of(half) << " with fp32 gradients";
    const double acc_half_grads = train_blobs(half, half, device).after;
    EXPECT_GE(acc_half_grads, fp32 - 0.03) << name_of(half) << " with " << name_of(half) << " gradients";
  }
}

TEST(MixedPrecision, HalfTrainingConvergesLikeFp32) { check_convergence(Device::cpu()); }

// ---- GPU twins -------------------------------------------------------------------------

TEST(Gpu, HalfTrainingConvergesLikeFp32) {
  TUTTI_REQUIRE_GPU();
  check_convergence(Device::cuda(0));
}

TEST(Gpu, InfSkipsStepOnTheDevice) {
  TUTTI_REQUIRE_GPU();
  nn::Sequential model;
  build(model, Device::cuda(0));
  model.set_stream(Stream::create(Device::cuda(0)));
  model.set_precision(DType::f16);
  optim::SGD opt(model.parameters(), {.lr = 0.1f, .momentum = 0.9f});
  opt.set_stream(model.stream());
  amp::LossScaler scaler;
  nn::CrossEntropyLoss loss;
  const Tensor x = random_tensor({6, 8}, DType::f32, 1).to(Device::cuda(0));
  const Tensor y = random_labels(6, 3, DType::i32, 2).to(Device::cuda(0));
  ASSERT_TRUE(scaled_step(model, loss, opt, scaler, x, y));
  model.stream().synchronize();
  const auto before = testing::parameter_values(model);
  EXPECT_FALSE(scaled_step(model, loss, opt, scaler, x, y, true));
  model.stream().synchronize();
  EXPECT_EQ(testing::parameter_values(model), before);
  EXPECT_EQ(scaler.scale(), 32768.0f);
}

}  // namespace
}  // namespace tutti
