// The layers: initialization, state dicts, Dropout, shape errors; and the layers on the GPU
// against the CPU.
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

using testing::build_conv_model;
using testing::expect_close;
using testing::random_labels;
using testing::random_tensor;

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
  gpu.set_grad_ready_hook([&](nn::Parameter&) { ++calls; });
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

}  // namespace
}  // namespace tutti
