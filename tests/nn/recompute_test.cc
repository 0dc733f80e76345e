// Activation checkpointing in nn (Residual::set_recompute, RecomputeWorkspace): a model of
// residuals whose bodies recompute gives bit for bit the outputs and gradients of the same
// model without recomputation, Dropout inside a body replaying its mask, over several steps;
// the checkpointed bodies share one workspace; an empty body is refused. On the CPU and on
// the GPU (emulated in CI).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "nn_test_util.h"
#include "tutti/core/tensor.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/sequential.h"

namespace tutti::nn {
namespace {

constexpr std::int64_t kWidth = 12, kRows = 6, kClasses = 5, kBlocks = 3;

// Linear, then kBlocks residuals of LayerNorm, Linear, GELU, Dropout, Linear (each recomputing
// in `workspace` when given), then a Linear head.
void build(Sequential& model, const std::shared_ptr<RecomputeWorkspace>& workspace) {
  model.add<Linear>(7, kWidth);
  for (int b = 0; b < kBlocks; ++b) {
    Residual& r = model.emplace<Residual>();
    r.body()
        .add<LayerNorm>(kWidth)
        .add<Linear>(kWidth, 2 * kWidth)
        .add<GELU>()
        .add<Dropout>(0.3f)
        .add<Linear>(2 * kWidth, kWidth);
    if (workspace) r.set_recompute(workspace);
  }
  model.add<Linear>(kWidth, kClasses);
}

// Runs `steps` forward/backward passes of both models on the same data (gradients
// accumulating, Dropout drawing a new mask each step) and checks every output and gradient
// bit for bit.
void expect_identical_steps(Sequential& plain, Sequential& checkpointed, int steps) {
  const Stream& s = plain.stream();
  for (int step = 0; step < steps; ++step) {
    const Tensor x = testing::random_tensor({kRows, 7}, DType::f32, 100 + step).to(plain.device(), s);
    const Tensor labels =
        Tensor::from_ints({0, 1, 2, 3, 4, static_cast<std::int64_t>(step % kClasses)}, {kRows}, DType::i32)
            .to(plain.device(), s);
    CrossEntropyLoss la, lb;
    const Tensor ya = plain.forward(x), yb = checkpointed.forward(x);
    EXPECT_EQ(ya.to_floats(), yb.to_floats()) << "output, step " << step;
    la.forward(ya, labels, 1.0f, s);
    lb.forward(yb, labels, 1.0f, s);
    plain.backward(la.grad());
    checkpointed.backward(lb.grad());
    const auto pa = plain.parameters(), pb = checkpointed.parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (std::size_t i = 0; i < pa.size(); ++i) {
      EXPECT_EQ(pa[i]->grad.to_floats(), pb[i]->grad.to_floats()) << "grad of " << pa[i]->name << ", step " << step;
    }
  }
  // The Dropout layers' positions advanced alike: the replays drew no random numbers of their own.
  for (const auto& [name, t] : plain.extra_state()) {
    EXPECT_EQ(t.to_ints(), checkpointed.extra_state().at(name).to_ints()) << name;
  }
}

void check_on(Device device) {
  const Stream stream = device.is_cpu() ? Stream() : Stream::create(device);
  Sequential plain, checkpointed;
  build(plain, nullptr);
  auto workspace = std::make_shared<RecomputeWorkspace>();
  build(checkpointed, workspace);
  for (Sequential* m : {&plain, &checkpointed}) m->to(device, stream).init(3);
  expect_identical_steps(plain, checkpointed, 3);
  // One workspace served all three bodies: it holds one body's buffers, not three.
  EXPECT_GT(workspace->bytes(), 0);
  // The Dropout's masks matter: a model drawing other masks (another seed) has other gradients.
  Sequential other;
  build(other, nullptr);
  other.to(device, stream).init(4);
  other.load_state_dict(plain.state_dict(), /*strict=*/false);
  const StateDict extra = plain.extra_state();
  StateDict shifted = extra;  // a Dropout's state is restored whole: seed and position
  for (auto& [name, t] : shifted) {
    if (name.find("rng_counter") != std::string::npos)
      t = Tensor::from_ints({t.to_ints()[0] + 1}, t.shape(), t.dtype());
  }
  other.load_extra_state(shifted, /*strict=*/false);
  const Tensor x = testing::random_tensor({kRows, 7}, DType::f32, 100).to(device, stream);
  EXPECT_NE(other.forward(x).to_floats(), plain.forward(x).to_floats()) << "Dropout draws no mask in this model";
}

TEST(Recompute, ResidualsGiveBitIdenticalGradientsWithDropoutReplayed) { check_on(Device::cpu()); }

TEST(Recompute, WorkspaceHoldsOneBodyAndDropsActivations) {
  // Activations of a fresh model's first step (its buffers are allocated then): with three
  // checkpointed bodies in one workspace, fewer bytes than with three bodies' own.
  auto first_step_bytes = [](bool recompute) {
    Sequential m;
    build(m, recompute ? std::make_shared<RecomputeWorkspace>() : nullptr);
    m.init(1);
    m.storage().allocate_grads();
    const Tensor x = testing::random_tensor({64, 7}, DType::f32, 5);
    const Tensor labels = Tensor::zeros({64}, DType::i32);
    Storage::reset_peak_bytes(Device::cpu());
    const std::int64_t before = Storage::live_bytes(Device::cpu());
    CrossEntropyLoss loss;
    loss.forward(m.forward(x), labels);
    m.backward(loss.grad());
    return Storage::peak_bytes(Device::cpu()) - before;
  };
  const std::int64_t plain = first_step_bytes(false), checkpointed = first_step_bytes(true);
  EXPECT_GT(plain, 0);
  EXPECT_LT(checkpointed, plain * 3 / 4) << plain << " bytes without recomputation, " << checkpointed << " with";
}

TEST(Recompute, EmptyBodyAndSwitchingOffAreHandled) {
  Residual empty;
  try {
    empty.set_recompute(std::make_shared<RecomputeWorkspace>());
    FAIL() << "recompute of an empty body must be refused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("nothing to recompute"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(empty.recomputes());
  EXPECT_NO_THROW(empty.set_recompute(nullptr));
  // Checkpointed bodies do not nest, whichever is set first.
  for (const bool outer_first : {true, false}) {
    Residual outer;
    Residual& inner = outer.body().emplace<Residual>();
    inner.body().add<Linear>(4, 4);
    auto a = std::make_shared<RecomputeWorkspace>(), b = std::make_shared<RecomputeWorkspace>();
    (outer_first ? outer : inner).set_recompute(a);
    EXPECT_THROW((outer_first ? inner : outer).set_recompute(b), InvalidArgument) << outer_first;
    // Moving the one that is on to another workspace is fine.
    EXPECT_NO_THROW((outer_first ? outer : inner).set_recompute(b));
  }
  // Switched on, then off again: the residual trains as a plain one.
  Sequential plain, toggled;
  build(plain, nullptr);
  build(toggled, std::make_shared<RecomputeWorkspace>());
  for (std::size_t i = 1; i <= kBlocks; ++i) {
    auto& r = static_cast<Residual&>(toggled[i]);
    EXPECT_TRUE(r.recomputes());
    r.set_recompute(nullptr);
    EXPECT_FALSE(r.recomputes());
  }
  plain.init(2);
  toggled.init(2);
  expect_identical_steps(plain, toggled, 1);
}

TEST(Gpu, RecomputeResidualsAreBitIdentical) {
  TUTTI_REQUIRE_GPU();
  check_on(Device::cuda(0));
}

}  // namespace
}  // namespace tutti::nn
