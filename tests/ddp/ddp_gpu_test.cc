// DistributedDataParallel on GPUs, against the one-rank reference on the CPU: every rank trains
// a CPU copy of the model on the WHOLE global batch, and a GPU copy under DDP on its slice, on
// a stream of its own (the GPU paths: the model's stream, the reducer's flat buffers and
// per-bucket collectives, the fused unscale-and-check, the found-inf flag, the optimizer's
// fused kernels; under ZeRO the reduce-scatters, the sharded fused updates on shard views,
// the all-gathers of the updated compute copies and the agreed found-inf flag). Both
// backends: the job's communicator (nccl where every rank has its own GPU) and mpi staging
// GPU tensors through pinned host memory.
//
// Where it runs: ddp_gpu_test on a GPU machine (skipped elsewhere), ddp_gpu_test_emu on the
// emulated CUDA device in every CI run (TUTTI_EMU_DEVICES=4, so each rank has a GPU of its own;
// one registration adds random stream delays, so a missing stream wait shows as a wrong result).
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <string>

#include "ddp_test_util.h"
#include "tutti/amp/loss_scaler.h"
#include "tutti/amp/policy.h"
#include "tutti/ddp/ddp.h"
#include "tutti/nn/loss.h"

namespace tutti::ddp {
namespace {

using namespace tutti::testing;

// The communicators the tests run on: the job's (nccl, or mpi where ranks share a GPU), and
// one that stages GPU tensors through the host.
Communicator& communicator_for(const std::string& backend) {
  if (backend == "job") return world().communicator();
  static std::shared_ptr<Communicator> staging = world().new_communicator({.timeout = std::chrono::seconds(60)}, "mpi");
  return *staging;
}

class DdpGpu : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!world().device().is_cuda()) GTEST_SKIP() << "no GPU visible: DDP's GPU path not run";
  }
};

struct GpuRun {
  Opt optimizer = Opt::sgd;
  int steps = 3;
  int accumulation = 1;
  std::int64_t micro_batch = 12;
  amp::Policy policy = amp::Policy::fp32();
  DdpOptions ddp;
  bool deferred = false;  // the DDP model built under nn::DeferredParameters
};

// Trains a CPU reference on whole batches and a GPU copy under DDP; returns the relative
// difference of their parameters, and checks that training moved them.
double train_gpu_against_cpu(Communicator& comm, const GpuRun& run) {
  const Device gpu = world().device();
  const Stream stream = Stream::create(gpu);
  auto reference = make_mlp();
  amp::apply(run.policy, *reference);
  reference->init(kSeed);
  std::unique_ptr<nn::Module> distributed;
  if (run.deferred) {
    nn::DeferredParameters defer;
    distributed = make_mlp();
  } else {
    distributed = make_mlp();
  }
  amp::apply(run.policy, *distributed);
  // Only rank 0 initializes properly: DDP broadcasts its values.
  distributed->to(gpu, stream).init(world().rank() == 0 ? kSeed : kSeed + 17);

  auto ref_opt = make_optimizer(run.optimizer, *reference);
  DdpOptions options = run.ddp;
  options.accumulation_steps = run.accumulation;
  options.reducer.grad_comm_dtype = run.policy.comm;
  DistributedDataParallel ddp(comm, *distributed, options);
  auto ddp_opt = make_optimizer(run.optimizer, *distributed);
  ddp.attach(*ddp_opt);  // the model's stream, and the plan (or this rank's shard)
  amp::LossScaler scaler(run.policy.default_scaler());
  nn::CrossEntropyLoss ref_loss, loss;
  for (int step = 0; step < run.steps; ++step) {
    const Batch big = global_batch({12}, run.micro_batch * run.accumulation, 100 + static_cast<std::uint32_t>(step));
    // The reference needs no loss scale: its fp32 gradient buffers hold unscaled gradients.
    reference->zero_grad();
    ref_loss.forward(reference->forward(big.x), big.y);
    reference->backward(ref_loss.grad());
    ref_opt->step();
    for (int micro = 0; micro < run.accumulation; ++micro) {
      const Batch mb = my_slice(rows(big, micro * run.micro_batch, run.micro_batch));
      loss.forward(ddp.forward(mb.x.to(gpu, stream)), mb.y.to(gpu, stream), scaler.scale(), stream);
      if (ddp.backward(loss.grad(), scaler.scale())) {
        EXPECT_FALSE(ddp.found_nonfinite());
        if (scaler.update(false)) ddp_opt->step();
        ddp.zero_grad();
      }
    }
  }
  stream.synchronize();
  auto untouched = make_mlp();
  untouched->init(kSeed);
  EXPECT_GT(relative_difference(*untouched, *reference), 1e-3) << "training must move the parameters";
  // Whole parameters, gathered from the shards under ZeRO, on the CPU.
  auto gathered = make_mlp();
  gathered->load_state_dict(ddp.state().model_state_dict());
  return relative_difference(*gathered, *reference);
}

TEST_P(DdpGpu, SgdMatchesOneRankOnTheCpu) {
  EXPECT_LE(train_gpu_against_cpu(communicator_for(GetParam()), {.optimizer = Opt::sgd}), 1e-5);
}

TEST_P(DdpGpu, AdamWWithAccumulationMatchesOneRankOnTheCpu) {
  EXPECT_LE(train_gpu_against_cpu(communicator_for(GetParam()), {.optimizer = Opt::adamw, .accumulation = 3}), 1e-5);
}

TEST_P(DdpGpu, ManySmallBucketsWithoutOverlapMatch) {
  GpuRun run;
  run.ddp.bucket_cap_mb = run.ddp.first_bucket_cap_mb = 1e-9;  // a bucket per parameter
  EXPECT_LE(train_gpu_against_cpu(communicator_for(GetParam()), run), 1e-5);
  run.ddp.reducer.overlap = false;
  EXPECT_LE(train_gpu_against_cpu(communicator_for(GetParam()), run), 1e-5);
}

TEST_P(DdpGpu, MixedPrecisionStaysCloseToTheCpu) {
  // bf16 compute with bf16 gradients on the wire; fp16 compute with a dynamic loss scale.
  EXPECT_LE(train_gpu_against_cpu(communicator_for(GetParam()), {.policy = amp::Policy::bf16()}), 2e-2);
  EXPECT_LE(train_gpu_against_cpu(communicator_for(GetParam()), {.policy = amp::Policy::fp16()}), 3e-3);
}

// ZeRO-1, 2 and 3 on GPUs: reduce-scatter per bucket, fused updates of this rank's shard,
// all-gather of the updated compute copies (in the next forward, or right after the step; at
// stage 3 each layer's group before its use in forward and again in backward, on the
// communicator's stream with event waits).
TEST_P(DdpGpu, ZeroStagesMatchOneRankOnTheCpu) {
  Communicator& comm = communicator_for(GetParam());
  const amp::Policy bf16_grads{DType::bf16, DType::f32, DType::bf16, DType::bf16};
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("zero stage " + std::to_string(stage));
    GpuRun run;
    run.ddp.sharding = sharding_of_stage(stage);
    run.ddp.bucket_cap_mb = run.ddp.first_bucket_cap_mb = 3e-4;  // several buckets and shards
    EXPECT_LE(train_gpu_against_cpu(comm, run), 1e-5);
    run.optimizer = Opt::adamw;
    run.accumulation = 2;
    if (auto* s = std::get_if<ShardOptimizer>(&run.ddp.sharding)) s->gather_during_forward = false;
    if (auto* s = std::get_if<ShardGradients>(&run.ddp.sharding)) s->gather_during_forward = false;
    EXPECT_LE(train_gpu_against_cpu(comm, run), 1e-5);
    run.accumulation = 1;
    run.ddp.sharding = sharding_of_stage(stage);
    // Half compute: the fp32 masters are this rank's shard, the gathers move bf16 / fp16.
    // (SGD, as the stage-0 test above: AdamW's normalized steps magnify fp16's rounding, at
    // any stage alike.)
    run.optimizer = Opt::sgd;
    run.policy = bf16_grads;
    EXPECT_LE(train_gpu_against_cpu(comm, run), 3e-2);
    run.policy = amp::Policy::fp16();
    EXPECT_LE(train_gpu_against_cpu(comm, run), 3e-3);
  }
}

// A model built without storage (nn::DeferredParameters): at stage 3 each group is filled on
// rank 0's GPU from its source, broadcast, and cut into this rank's shard; at stage 1 the model
// is materialized on the GPU first.
TEST_P(DdpGpu, DeferredParametersMatchOneRankOnTheCpu) {
  Communicator& comm = communicator_for(GetParam());
  for (int stage : {3, 1}) {
    SCOPED_TRACE("zero stage " + std::to_string(stage));
    GpuRun run{.optimizer = Opt::adamw, .deferred = true};
    run.ddp.sharding = sharding_of_stage(stage);
    run.ddp.bucket_cap_mb = run.ddp.first_bucket_cap_mb = 3e-4;
    EXPECT_LE(train_gpu_against_cpu(comm, run), 1e-5);
    run.optimizer = Opt::sgd;
    run.policy = amp::Policy::bf16();
    EXPECT_LE(train_gpu_against_cpu(comm, run), 3e-2);
  }
}

TEST_P(DdpGpu, NonFiniteGradientOnOneRankSkipsTheStepEverywhere) {
  for (int stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("zero stage " + std::to_string(stage));
    const Device gpu = world().device();
    const Stream stream = Stream::create(gpu);
    auto model = make_mlp();
    model->to(gpu, stream).init(kSeed);
    DistributedDataParallel ddp(communicator_for(GetParam()), *model, {.sharding = sharding_of_stage(stage)});
    auto opt = make_optimizer(Opt::sgd, *model);
    ddp.attach(*opt);
    amp::LossScaler scaler;  // dynamic, 2^16
    nn::CrossEntropyLoss loss;
    const Batch b = my_slice(global_batch({12}, 12, 7));
    const bool poisoned = world().rank() == world().world_size() - 1;
    const float grad_scale = poisoned ? std::numeric_limits<float>::infinity() : scaler.scale();
    loss.forward(ddp.forward(b.x.to(gpu, stream)), b.y.to(gpu, stream), grad_scale, stream);
    ASSERT_TRUE(ddp.backward(loss.grad(), scaler.scale()));
    EXPECT_TRUE(ddp.found_nonfinite()) << "rank " << world().rank() << " must see the last rank's inf";
    EXPECT_FALSE(scaler.update(true));
    ddp.zero_grad();
    loss.forward(ddp.forward(b.x.to(gpu, stream)), b.y.to(gpu, stream), scaler.scale(), stream);
    ASSERT_TRUE(ddp.backward(loss.grad(), scaler.scale()));
    EXPECT_FALSE(ddp.found_nonfinite()) << "a clean step after it goes through";
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DdpGpu, ::testing::Values("job", "mpi_staging"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tutti::ddp

int main(int argc, char** argv) { return tutti::testing::run_world_tests(argc, argv, "auto"); }
