// DistributedDataParallel against the one-rank reference: every rank trains a local copy of
// the model on the WHOLE global batch (no communication), and a DDP copy on its slice of it;
// after K steps both must hold the same parameters. Run under mpiexec with 1 to 4 ranks.
#include "tutti/ddp/ddp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <random>

#include "ddp_test_util.h"
#include "tutti/amp/loss_scaler.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/loss.h"
#include "tutti/optim/adamw.h"
#include "tutti/optim/sgd.h"

namespace tutti::ddp {
namespace {

using namespace tutti::testing;

std::unique_ptr<nn::Sequential> make_cnn() {
  auto m = std::make_unique<nn::Sequential>();
  nn::Conv2dOptions pad1;
  pad1.padding = 1;
  m->add<nn::Conv2d>(1, 3, 3, pad1)
      .add<nn::ReLU>()
      .add<nn::MaxPool2d>()
      .add<nn::Flatten>()
      .add<nn::Linear>(3 * 4 * 4, kClasses);
  return m;
}

struct RunConfig {
  Opt optimizer = Opt::sgd;
  int steps = 3;
  int accumulation = 1;
  std::int64_t micro_batch = 12;  // global rows per micro-step; divisible by 1..4
  float loss_scale = 1.0f;        // DDP side: the loss gradient's scale (as a LossScaler's)
  DdpOptions ddp;
};

// Trains `reference` on whole global batches without communication, and `distributed` under
// DDP on this rank's slices, with the same data and steps.
void train_both(nn::Module& reference, nn::Module& distributed, const Shape& input_shape, const RunConfig& cfg) {
  auto ref_opt = make_optimizer(cfg.optimizer, reference);
  DistributedDataParallel ddp(world().communicator(), distributed, cfg.ddp);
  auto ddp_opt = make_optimizer(cfg.optimizer, distributed);
  ddp.attach(*ddp_opt);
  nn::CrossEntropyLoss loss;
  const int k = cfg.accumulation;
  for (int step = 0; step < cfg.steps; ++step) {
    const Batch big = global_batch(input_shape, cfg.micro_batch * k, 100 + static_cast<std::uint32_t>(step));
    // Reference: one pass over the whole step's data.
    reference.zero_grad();
    loss.forward(reference.forward(big.x), big.y);
    reference.backward(loss.grad());
    ref_opt->step();
    // DDP: k micro-steps over this rank's slice of each micro-batch.
    for (int micro = 0; micro < k; ++micro) {
      const Batch mb = my_slice(rows(big, micro * cfg.micro_batch, cfg.micro_batch));
      // ddp.h's "Gradient scaling": grad_scale is the loss scale alone; backward divides by
      // ranks · micro-batches · loss scale.
      loss.forward(ddp.forward(mb.x), mb.y, cfg.loss_scale);
      const bool synced = ddp.backward(loss.grad(), cfg.loss_scale);
      ASSERT_EQ(synced, micro == k - 1) << "micro-step " << micro;
      if (synced) {
        ASSERT_FALSE(ddp.found_nonfinite());
        ddp_opt->step();
        ddp.zero_grad();
      }
    }
  }
}

void expect_equivalent(const std::function<std::unique_ptr<nn::Sequential>()>& make, const Shape& input_shape,
                       const RunConfig& cfg, double tolerance = 1e-5) {
  auto reference = make();
  reference->init(kSeed);
  auto distributed = make();
  // Only rank 0 initializes: DDP must broadcast its values to the others.
  distributed->init(world().rank() == 0 ? kSeed : kSeed + 17);
  train_both(*reference, *distributed, input_shape, cfg);
  const double diff = relative_difference(*distributed, *reference);
  EXPECT_LE(diff, tolerance) << "rank " << world().rank() << " of " << world().world_size();
  // And the step really changed something (the test is not comparing two untouched models).
  auto untouched = make();
  untouched->init(kSeed);
  EXPECT_GT(relative_difference(*untouched, *reference), 1e-3);
}

TEST(Ddp, MlpWithSgdMatchesOneRank) {
  expect_equivalent([] { return make_mlp(); }, {12}, {.optimizer = Opt::sgd});
}

TEST(Ddp, MlpWithAdamWMatchesOneRank) {
  expect_equivalent([] { return make_mlp(); }, {12}, {.optimizer = Opt::adamw});
}

TEST(Ddp, CnnWithSgdMatchesOneRank) { expect_equivalent(make_cnn, {1, 8, 8}, {.optimizer = Opt::sgd}); }

TEST(Ddp, CnnWithAdamWMatchesOneRank) { expect_equivalent(make_cnn, {1, 8, 8}, {.optimizer = Opt::adamw}); }

// ZeRO on the job's backend (mpi under mpiexec): reduce-scatter, sharded update, all-gather,
// against one rank with the whole batch.
TEST(Ddp, ZeroStagesMatchOneRank) {
  for (int stage : {1, 2}) {
    RunConfig cfg;
    cfg.optimizer = Opt::adamw;
    cfg.accumulation = 2;
    cfg.ddp.accumulation_steps = 2;
    cfg.ddp.sharding = sharding_of_stage(stage);
    cfg.ddp.bucket_cap_mb = cfg.ddp.first_bucket_cap_mb = 2e-4;  // several buckets
    SCOPED_TRACE("zero stage " + std::to_string(stage));
    expect_equivalent([] { return make_mlp(); }, {12}, cfg);
    cfg.optimizer = Opt::sgd;
    cfg.accumulation = cfg.ddp.accumulation_steps = 1;
    expect_equivalent(make_cnn, {1, 8, 8}, cfg);
  }
}

TEST(Ddp, AccumulationMatchesOneRankWithTheWholeBatch) {
  RunConfig cfg;
  cfg.accumulation = 3;
  cfg.ddp.accumulation_steps = 3;
  expect_equivalent([] { return make_mlp(); }, {12}, cfg);
}

// The documented recipe (ddp.h, "Gradient scaling") with a loss scale and 4 micro-batches,
// ZeRO-2 and stage 0, against one rank with the whole batch and no scaling. SGD, whose step is
// linear in the gradient: a gradient divided by k twice would show as a 4x smaller step.
TEST(Ddp, DocumentedScalingWithAccumulationMatchesOneRank) {
  for (int stage : {0, 2}) {
    RunConfig cfg;
    cfg.optimizer = Opt::sgd;
    cfg.accumulation = cfg.ddp.accumulation_steps = 4;
    cfg.loss_scale = 1024.0f;
    cfg.ddp.sharding = sharding_of_stage(stage);
    SCOPED_TRACE("zero stage " + std::to_string(stage));
    expect_equivalent([] { return make_mlp(); }, {12}, cfg);
  }
}

TEST(Ddp, OverlapOffGivesTheSameResult) {
  RunConfig cfg;
  cfg.ddp.reducer.overlap = false;
  expect_equivalent([] { return make_mlp(); }, {12}, cfg);
}

TEST(Ddp, BucketLayoutsGiveTheSameParameters) {
  // Tiny caps: every parameter its own bucket. Huge caps: one bucket for all.
  RunConfig tiny, huge;
  tiny.ddp.bucket_cap_mb = tiny.ddp.first_bucket_cap_mb = 1e-9;
  huge.ddp.bucket_cap_mb = huge.ddp.first_bucket_cap_mb = 1e6;
  auto ref_a = make_mlp(), ref_b = make_mlp(), a = make_mlp(), b = make_mlp();
  for (auto* m : {ref_a.get(), ref_b.get(), a.get(), b.get()}) m->init(kSeed);
  {
    DistributedDataParallel probe(world().communicator(), *a, tiny.ddp);
    EXPECT_EQ(probe.reducer().bucket_count(), static_cast<int>(a->parameters().size()));
  }
  {
    DistributedDataParallel probe(world().communicator(), *b, huge.ddp);
    EXPECT_EQ(probe.reducer().bucket_count(), 1);
  }
  train_both(*ref_a, *a, {12}, tiny);
  train_both(*ref_b, *b, {12}, huge);
  EXPECT_LE(relative_difference(*a, *b), 1e-6);
}

TEST(Ddp, BucketsAreReverseOrderWithASmallFirstBucket) {
  auto m = std::make_unique<nn::Sequential>();
  m->add<nn::Linear>(256, 512).add<nn::ReLU>().add<nn::Linear>(512, 512).add<nn::ReLU>().add<nn::Linear>(512, 10);
  m->init(1);
  DdpOptions o;
  o.first_bucket_cap_mb = 0.05;  // the last Linear (about 20 KB) alone
  o.bucket_cap_mb = 1.0;         // a 512x512 weight (1 MiB) alone
  DistributedDataParallel ddp(world().communicator(), *m, o);
  const Reducer& r = ddp.reducer();
  const auto params = m->parameters();
  // The last layer's parameters come first in the buffer and in bucket 0.
  EXPECT_EQ(r.bucket_of(params.size() - 1), 0);
  EXPECT_EQ(r.bucket_of(params.size() - 2), 0);
  EXPECT_LT(r.offset(params.size() - 1), r.offset(0));
  EXPECT_GT(r.bucket_of(0), r.bucket_of(params.size() - 1));
  // Every gradient is a view into the bucket buffer: no copy in or out.
  for (nn::Parameter* p : params) EXPECT_TRUE(p->grad.shares_storage_with(r.buffer())) << p->name;
  for (std::size_t i = 1; i < params.size(); ++i) EXPECT_GE(r.bucket_of(i - 1), r.bucket_of(i));
}

TEST(Ddp, HalfPrecisionCommunicationStaysClose) {
  for (DType comm : {DType::bf16, DType::f16}) {
    RunConfig cfg;
    cfg.ddp.reducer.grad_comm_dtype = comm;
    expect_equivalent([] { return make_mlp(); }, {12}, cfg, comm == DType::bf16 ? 2e-2 : 3e-3);
  }
}

TEST(Ddp, NonFiniteGradientOnOneRankSkipsTheStepEverywhere) {
  auto model = make_mlp();
  model->init(kSeed);
  DistributedDataParallel ddp(world().communicator(), *model, {});
  auto opt = make_optimizer(Opt::adamw, *model);
  amp::LossScaler scaler;  // dynamic, 2^16
  nn::CrossEntropyLoss loss;
  const StateDict before = model->state_dict();
  const Batch b = my_slice(global_batch({12}, 12, 7));
  // The last rank's loss gradient is multiplied by inf: its gradients hold inf (and nan).
  const bool poisoned = world().rank() == world().world_size() - 1;
  const float grad_scale = poisoned ? std::numeric_limits<float>::infinity() : scaler.scale();
  loss.forward(ddp.forward(b.x), b.y, grad_scale);
  ASSERT_TRUE(ddp.backward(loss.grad(), scaler.scale()));
  const bool found = ddp.found_nonfinite();
  EXPECT_TRUE(found) << "rank " << world().rank() << " must see the other rank's inf";
  const bool stepped = scaler.update(found);
  EXPECT_FALSE(stepped);
  if (stepped) opt->step();
  EXPECT_EQ(scaler.scale(), 32768.0f);
  EXPECT_EQ(opt->steps(), 0);
  const StateDict after = model->state_dict();
  for (const auto& [name, t] : before) EXPECT_EQ(t.to_floats(), after.at(name).to_floats()) << name;
  // A clean step afterwards goes through on every rank.
  ddp.zero_grad();
  loss.forward(ddp.forward(b.x), b.y, scaler.scale());
  ASSERT_TRUE(ddp.backward(loss.grad(), scaler.scale()));
  EXPECT_FALSE(ddp.found_nonfinite());
}

TEST(Ddp, ModelThatDiffersOnOneRankFailsEverywhere) {
  if (world().world_size() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  const bool odd_one = world().rank() == 1;
  auto model = make_mlp(odd_one ? 14 : 16);
  model->init(kSeed);
  try {
    DistributedDataParallel ddp(world().communicator(), *model, {});
    FAIL() << "rank " << world().rank() << ": the start-up check must fail";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("differs across ranks"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank(s) 1 "), std::string::npos) << msg;
    if (odd_one) {
      EXPECT_NE(msg.find("0.weight [14, 12]"), std::string::npos) << msg;
      EXPECT_NE(msg.find("0.weight [16, 12]"), std::string::npos) << msg;
    }
  }
}

// A model with a layer that forward never uses: its parameters get no gradient.
class WithUnusedLayer : public nn::Module {
 public:
  WithUnusedLayer() {
    register_module("used", used_);
    register_module("unused", unused_);
  }
  std::string describe() const override { return "WithUnusedLayer"; }

 protected:
  Tensor forward_impl(const Tensor& x) override { return used_.forward(x); }
  Tensor backward_impl(const Tensor& dy) override { return used_.backward(dy); }

 private:
  nn::Linear used_{12, kClasses};
  nn::Linear unused_{12, kClasses};
};

TEST(Ddp, ParameterWithoutGradientIsNamedNotAHang) {
  const Batch b = my_slice(global_batch({12}, 12, 3));
  nn::CrossEntropyLoss loss;
  {
    WithUnusedLayer model;
    model.init(kSeed);
    DistributedDataParallel ddp(world().communicator(), model, {});
    loss.forward(ddp.forward(b.x), b.y);
    try {
      ddp.backward(loss.grad());
      FAIL() << "an unused parameter must be an error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'unused.weight'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("ReducerOptions::allow_unused"), std::string::npos) << msg;
    }
  }
  {
    WithUnusedLayer model;
    model.init(kSeed);
    DdpOptions o;
    o.reducer.allow_unused = true;
    DistributedDataParallel ddp(world().communicator(), model, o);
    loss.forward(ddp.forward(b.x), b.y);
    EXPECT_TRUE(ddp.backward(loss.grad()));
    EXPECT_FALSE(ddp.found_nonfinite());
    for (float g : model.parameters().back()->grad.to_floats()) EXPECT_EQ(g, 0.0f);
  }
}

TEST(Ddp, OptimizerUpdatesTheWholeModelInOneFusedCall) {
  auto model = make_mlp();
  model->init(kSeed);
  DdpOptions o;
  o.bucket_cap_mb = o.first_bucket_cap_mb = 1e-9;  // many buckets: still one flat layout
  DistributedDataParallel ddp(world().communicator(), *model, o);
  auto opt = make_optimizer(Opt::adamw, *model);
  nn::CrossEntropyLoss loss;
  const Batch b = my_slice(global_batch({12}, 12, 9));
  loss.forward(ddp.forward(b.x), b.y);
  ASSERT_TRUE(ddp.backward(loss.grad()));
  opt->step();
  // Not attached: one call per parameter, as documented (nothing guesses the layout).
  EXPECT_EQ(opt->last_step_kernel_calls(), static_cast<int>(model->parameters().size()));
  ddp.zero_grad();
  ddp.attach(*opt);
  loss.forward(ddp.forward(b.x), b.y);
  ASSERT_TRUE(ddp.backward(loss.grad()));
  opt->step();
  EXPECT_EQ(opt->last_step_kernel_calls(), 1);
}

TEST(Ddp, StatsCountBytesAndBuckets) {
  auto model = make_mlp();
  model->init(kSeed);
  DistributedDataParallel ddp(world().communicator(), *model, {});
  nn::CrossEntropyLoss loss;
  const Batch b = my_slice(global_batch({12}, 12, 5));
  loss.forward(ddp.forward(b.x), b.y);
  ASSERT_TRUE(ddp.backward(loss.grad()));
  const StepStats& s = ddp.reducer().last_stats();
  EXPECT_EQ(s.buckets, ddp.reducer().bucket_count());
  EXPECT_EQ(s.bytes_reduced, static_cast<std::int64_t>(ddp.reducer().buffer().nbytes()));
  EXPECT_GE(s.backward_ms, 0.0);
  EXPECT_GE(s.exposed_comm_ms, 0.0);
  EXPECT_LE(s.exposed_comm_ms, s.finish_ms);
  // The mpi backend times each allreduce; they run one after another inside the span.
  EXPECT_GT(s.comm_run_ms, 0.0);
  EXPECT_LE(s.comm_run_ms, s.comm_ms + 0.05);
}

}  // namespace
}  // namespace tutti::ddp

int main(int argc, char** argv) { return tutti::testing::run_world_tests(argc, argv); }
