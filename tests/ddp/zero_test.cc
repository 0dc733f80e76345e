// DistributedDataParallel and its Reducer with ranks as threads (tutti::ThreadGroup): ZeRO
// stages 1 and 2 against stage 0 and against one rank with the whole batch, at 1 to 4 ranks,
// with parameter counts that no rank count divides, accumulation, clipping, fp16 with a step
// the loss scaler skips, bf16; under adversarial timing (collectives late, completing out of
// order, failing); every misuse of the reducer; and checkpoints that resume across world
// sizes and stages. No mpirun: the real backends are tested by ddp_test and ddp_gpu_test.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <mutex>
#include <random>

#include "ddp_test_util.h"
#include "tutti/amp/loss_scaler.h"
#include "tutti/amp/policy.h"
#include "tutti/comm/thread_group.h"
#include "tutti/ddp/ddp.h"
#include "tutti/io/checkpoint.h"
#include "tutti/kernels/threads.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/loss.h"
#include "tutti/optim/adamw.h"
#include "tutti/optim/sgd.h"

namespace tutti::ddp {
namespace {

using namespace std::chrono_literals;

using testing::kClasses;  // the labels of testing::global_batch
constexpr std::int64_t kIn = 12;
constexpr std::uint64_t kSeed = 4321;

// 12-16-9-5 with a LayerNorm: 443 parameters, which no world size from 2 to 4 divides.
std::unique_ptr<nn::Sequential> make_model() {
  auto m = std::make_unique<nn::Sequential>();
  m->add<nn::Linear>(kIn, 16).add<nn::ReLU>().add<nn::Linear>(16, 9).add<nn::LayerNorm>(9).add<nn::GELU>();
  m->add<nn::Linear>(9, kClasses);
  return m;
}

using testing::Batch;
using testing::rows;
// Global batch `seed`: [n, kIn] inputs and [n] labels (ddp_test_util.h).
Batch global_batch(std::int64_t n, std::uint32_t seed) { return testing::global_batch({kIn}, n, seed); }

enum class Opt { sgd, adamw };
std::unique_ptr<optim::Optimizer> make_optimizer(Opt kind, nn::Module& model) {
  // Decay on matrices only: the groups work on shards too.
  auto groups = optim::weight_decay_groups(model.parameters(), 0.05f);
  if (kind == Opt::sgd) return std::make_unique<optim::SGD>(groups, optim::SgdOptions{.lr = 0.1f, .momentum = 0.9f});
  return std::make_unique<optim::AdamW>(groups, optim::AdamWOptions{.lr = 1e-2f});
}

struct TrainRun {
  int ranks = 2;
  int zero = 0;
  Opt optimizer = Opt::adamw;
  int steps = 3;
  int accumulation = 1;
  std::int64_t micro_batch = 12;  // global rows per micro-step: divisible by 1..4
  amp::Policy policy = amp::Policy::fp32();
  double clip = 0;          // max global norm (0: no clipping)
  int poison_step = -1;     // this step's last rank multiplies its loss gradient by inf
  double bucket_mb = 3e-4;  // several buckets
  bool gather_during_forward = true;
  std::vector<CollectiveFault> faults;
  int first_step = 0;                 // the data of steps [first_step, first_step + steps)
  const StateDict* resume = nullptr;  // model + optimizer + scaler state to start from
  StateDict* save = nullptr;          // where to put the state at the end (from rank 0)
};

using testing::relative_difference;
using testing::Values;

Values values_of(const StateDict& model_state, nn::Module& like) {
  Values out;
  for (nn::Parameter* p : like.parameters()) out.push_back(model_state.at(p->name).to_floats());
  return out;
}

// Trains run.ranks thread ranks under DistributedDataParallel; returns every rank's final
// parameters (whole, through model_state_dict, so ZeRO's shards are gathered).
std::vector<Values> train(const TrainRun& run) {
  kernels::set_cpu_threads(1);
  ThreadGroup group(run.ranks, {.timeout = std::chrono::seconds(20)});
  for (const CollectiveFault& f : run.faults) group.inject(f);
  std::vector<Values> out(static_cast<std::size_t>(run.ranks));
  group.run([&](int rank) {
    Communicator& comm = group.communicator(rank);
    auto model = make_model();
    amp::apply(run.policy, *model);
    model->init(rank == 0 ? kSeed : kSeed + 99);  // rank 0's values reach everyone
    DdpOptions o;
    o.sharding = sharding_of_stage(run.zero);
    if (auto* s = std::get_if<ShardOptimizer>(&o.sharding)) s->gather_during_forward = run.gather_during_forward;
    if (auto* s = std::get_if<ShardGradients>(&o.sharding)) s->gather_during_forward = run.gather_during_forward;
    o.accumulation_steps = run.accumulation;
    o.bucket_cap_mb = o.first_bucket_cap_mb = run.bucket_mb;
    DistributedDataParallel ddp(comm, *model, o);
    auto opt = make_optimizer(run.optimizer, *model);
    ddp.attach(*opt);
    amp::LossScaler scaler(run.policy.default_scaler());
    if (run.resume) {
      ddp.state().load_model_state_dict(io::strip_prefix(*run.resume, "model."));
      ddp.state().load_optimizer_state_dict(*opt, io::strip_prefix(*run.resume, "optim."));
      scaler.load_state_dict(io::strip_prefix(*run.resume, "scaler."));
    }
    nn::CrossEntropyLoss loss;
    const std::int64_t per_rank = run.micro_batch / run.ranks;
    for (int step = run.first_step; step < run.first_step + run.steps; ++step) {
      const Batch big = global_batch(run.micro_batch * run.accumulation, 100 + static_cast<std::uint32_t>(step));
      for (int micro = 0; micro < run.accumulation; ++micro) {
        const Batch mb = rows(big, micro * run.micro_batch + rank * per_rank, per_rank);
        const bool poisoned = step == run.poison_step && rank == run.ranks - 1 && micro == 0;
        const float grad_scale = poisoned ? std::numeric_limits<float>::infinity() : scaler.scale();
        loss.forward(ddp.forward(mb.x), mb.y, grad_scale);
        const bool synced = ddp.backward(loss.grad(), scaler.scale());
        ASSERT_EQ(synced, micro == run.accumulation - 1);
        if (!synced) continue;
        const bool nonfinite = ddp.found_nonfinite();
        EXPECT_EQ(nonfinite, step == run.poison_step) << "rank " << rank << " step " << step;
        float coefficient = 1.0f;
        if (run.clip > 0 && !nonfinite) coefficient = ddp.grad_norm(run.clip).coefficient;
        if (scaler.update(nonfinite)) opt->step(coefficient);
        ddp.zero_grad();
      }
    }
    const StateDict model_state = ddp.state().model_state_dict();
    const StateDict optim_state = ddp.state().optimizer_state_dict(*opt);
    out[static_cast<std::size_t>(rank)] = values_of(model_state, *model);
    if (run.save && rank == 0) {
      run.save->clear();
      for (const auto& [k, t] : model_state) (*run.save)["model." + k] = t;
      for (const auto& [k, t] : optim_state) (*run.save)["optim." + k] = t;
      for (const auto& [k, t] : scaler.state_dict()) (*run.save)["scaler." + k] = t;
    }
  });
  return out;
}

// The one-rank reference: the whole global batch at once, no communication.
Values train_reference(const TrainRun& run) {
  kernels::set_cpu_threads(1);
  auto model = make_model();
  amp::apply(run.policy, *model);
  model->init(kSeed);
  model->storage().flatten();
  auto opt = make_optimizer(run.optimizer, *model);
  nn::CrossEntropyLoss loss;
  for (int step = 0; step < run.steps; ++step) {
    if (step == run.poison_step) continue;  // every rank skips it
    const Batch big = global_batch(run.micro_batch * run.accumulation, 100 + static_cast<std::uint32_t>(step));
    model->zero_grad();
    loss.forward(model->forward(big.x), big.y);
    model->backward(loss.grad());
    float coefficient = 1.0f;
    if (run.clip > 0) coefficient = optim::compute_grad_norm(model->parameters(), run.clip).coefficient;
    opt->step(coefficient);
  }
  return values_of(model->state_dict(), *model);
}

// ---- ZeRO against stage 0 and against one rank ---------------------------------------------

void expect_ranks_agree(const std::vector<Values>& per_rank) {
  for (std::size_t r = 1; r < per_rank.size(); ++r) {
    EXPECT_EQ(per_rank[r], per_rank[0]) << "rank " << r << " holds other parameters than rank 0";
  }
}

TEST(Zero, StagesMatchStageZeroAndOneRankAtOneToFourRanks) {
  for (Opt opt : {Opt::adamw, Opt::sgd}) {
    const Values reference = train_reference({.optimizer = opt});
    for (int ranks = 1; ranks <= 4; ++ranks) {
      Values stage0;
      for (int zero : {0, 1, 2}) {
        SCOPED_TRACE("ranks " + std::to_string(ranks) + ", zero " + std::to_string(zero) +
                     (opt == Opt::adamw ? ", adamw" : ", sgd"));
        const std::vector<Values> got = train({.ranks = ranks, .zero = zero, .optimizer = opt});
        expect_ranks_agree(got);
        EXPECT_LE(relative_difference(got[0], reference), 1e-5);
        // The same sums and the same fused update on each element: bit for bit stage 0's.
        if (zero == 0)
          stage0 = got[0];
        else
          EXPECT_EQ(got[0], stage0);
      }
    }
  }
}

TEST(Zero, AccumulationAndClippingMatchOneRank) {
  TrainRun run;
  run.accumulation = 3;
  run.clip = 0.05;  // well below the gradients' norm: every step is clipped
  const Values reference = train_reference(run);
  TrainRun unclipped = run;
  unclipped.clip = 0;
  ASSERT_GT(relative_difference(train_reference(unclipped), reference), 1e-4) << "clipping must act";
  for (int zero : {0, 1, 2}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    run.ranks = 3;
    run.zero = zero;
    const std::vector<Values> got = train(run);
    expect_ranks_agree(got);
    EXPECT_LE(relative_difference(got[0], reference), 1e-5);
  }
}

TEST(Zero, HalfPrecisionAndASkippedStep) {
  // bf16 compute, fp32 gradients sent as bf16; bf16 gradients (ZeRO's memory layout); fp16 with
  // a dynamic loss scale and one step whose gradient is inf on one rank: skipped everywhere.
  const amp::Policy bf16_grads{DType::bf16, DType::f32, DType::bf16, DType::bf16};
  struct Case {
    amp::Policy policy;
    int poison_step;
    double tolerance;  // against the one-rank reference in the same policy
  };
  for (const Case& c :
       {Case{amp::Policy::bf16(), -1, 2e-2}, Case{bf16_grads, -1, 3e-2}, Case{amp::Policy::fp16(), 1, 3e-3}}) {
    TrainRun run;
    run.policy = c.policy;
    run.poison_step = c.poison_step;
    const Values reference = train_reference(run);
    Values stage0;
    for (int zero : {0, 1, 2}) {
      SCOPED_TRACE("compute " + std::string(name_of(c.policy.compute)) + ", grads " +
                   std::string(name_of(c.policy.grad)) + ", zero " + std::to_string(zero));
      run.ranks = 3;
      run.zero = zero;
      const std::vector<Values> got = train(run);
      expect_ranks_agree(got);
      EXPECT_LE(relative_difference(got[0], reference), c.tolerance);
      if (zero == 0)
        stage0 = got[0];
      else
        EXPECT_LE(relative_difference(got[0], stage0), 1e-6);
    }
  }
}

// ---- adversarial timing ----------------------------------------------------------------------

// Collectives late by up to 3 ms on random ranks, and completing out of issue order: outputs
// appear only at completion, so code that reads before it waits would see stale values. The
// result must be what it is without faults, bit for bit.
TEST(Zero, LateAndReorderedCollectivesChangeNothing) {
  for (int zero : {0, 1, 2}) {
    for (const bool gather_in_forward : {true, false}) {
      SCOPED_TRACE("zero " + std::to_string(zero) +
                   (gather_in_forward ? ", gathers in forward" : ", gathers after step"));
      TrainRun run;
      run.ranks = 3;
      run.zero = zero;
      run.accumulation = 2;
      run.gather_during_forward = gather_in_forward;
      const std::vector<Values> calm = train(run);
      std::mt19937 rng(static_cast<unsigned>(17 + zero));
      // Up to seq 40: setup and the first two steps; the runs issue more than that.
      for (std::uint64_t seq = 1; seq <= 40; ++seq) {
        const int rank = static_cast<int>(rng() % 4) - 1;  // -1: all ranks
        if (rng() % 2) {
          run.faults.push_back({.seq = seq,
                                .rank = rank,
                                .action = CollectiveFault::Action::delay,
                                .delay = std::chrono::milliseconds(rng() % 4)});
        } else {
          run.faults.push_back({.seq = seq, .rank = rank, .action = CollectiveFault::Action::reorder, .after = 1});
        }
      }
      const std::vector<Values> stormy = train(run);
      expect_ranks_agree(stormy);
      EXPECT_EQ(stormy[0], calm[0]);
    }
  }
}

// A collective that fails mid-step: every rank's step throws the failure, and the reducer
// refuses to go on (its buffers hold a half-done reduction).
TEST(Zero, ACollectiveThatFailsMidStepFailsTheStep) {
  kernels::set_cpu_threads(1);
  ThreadGroup group(2, {.timeout = std::chrono::seconds(5)});
  std::vector<std::string> errors(2), after(2);
  group.run([&](int rank) {
    auto model = make_model();
    model->init(kSeed);
    DistributedDataParallel ddp(group.communicator(rank), *model,
                                {.bucket_cap_mb = 3e-4, .first_bucket_cap_mb = 3e-4, .sharding = ShardOptimizer{}});
    auto opt = make_optimizer(Opt::adamw, *model);
    ddp.attach(*opt);
    nn::CrossEntropyLoss loss;
    const Batch b = rows(global_batch(12, 5), rank * 6, 6);
    // The next collective after a barrier is the step's first bucket.
    const std::uint64_t first_bucket = group.communicator(rank).barrier().info().seq + 1;
    if (rank == 0) group.inject({.seq = first_bucket + 1, .action = CollectiveFault::Action::fail});
    group.bootstrap(rank).barrier();  // the fault is in place on every rank's behalf
    loss.forward(ddp.forward(b.x), b.y);
    try {
      ddp.backward(loss.grad());
    } catch (const Error& e) {
      errors[static_cast<std::size_t>(rank)] = e.what();
    }
    EXPECT_EQ(ddp.reducer().phase(), Reducer::Phase::failed);
    try {
      ddp.zero_grad();
    } catch (const Error& e) {
      after[static_cast<std::size_t>(rank)] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[static_cast<std::size_t>(r)].find("injected failure of collective"), std::string::npos)
        << errors[static_cast<std::size_t>(r)];
    EXPECT_NE(after[static_cast<std::size_t>(r)].find("failed earlier and cannot be used again"), std::string::npos)
        << after[static_cast<std::size_t>(r)];
  }
}

// A rank that never issues a collective: the others' wait ends with a TimeoutError naming it.
TEST(Zero, ARankThatNeverComesIsNamed) {
  ThreadGroup group(3, {.timeout = std::chrono::milliseconds(300)});
  std::string error;
  group.run([&](int rank) {
    if (rank == 2) return;
    Tensor t = Tensor::zeros({4}, DType::f32);
    try {
      group.communicator(rank).allreduce(t).wait();
    } catch (const TimeoutError& e) {
      if (rank == 0) error = e.what();
    }
  });
  EXPECT_NE(error.find("not issued by rank(s) 2"), std::string::npos) << error;
}

// ---- the reducer misused, in every order -------------------------------------------------------

// Each misuse is an error at once, the same whatever the timing of the collectives.
TEST(Zero, ReducerMisuseIsADeterministicError) {
  const std::vector<nn::PlanParam> specs = {{"a", {3, 5}}, {"b", {7}}, {"c", {33}}};
  struct Misuse {
    const char* name;
    GradientSharding sharding;
    std::function<void(Reducer&)> act;  // ends with the misuse
    const char* message;
  };
  auto all = [](Reducer& r) {
    for (std::size_t i = 0; i < r.size(); ++i) {
      (void)r.grad(i);
      r.mark_ready(i);
    }
  };
  const std::vector<Misuse> misuses = {
      {"mark before prepare", GradientSharding::none, [](Reducer& r) { r.mark_ready(0); }, "outside a backward pass"},
      {"finish without prepare", GradientSharding::scatter, [](Reducer& r) { r.finish(); },
       "no synchronized backward pass"},
      {"finish an accumulating pass", GradientSharding::none,
       [&](Reducer& r) {
         r.prepare(false);
         all(r);
         r.finish();
       },
       "no synchronized backward pass"},
      {"prepare twice", GradientSharding::scatter,
       [&](Reducer& r) {
         r.prepare(true);
         all(r);
         r.prepare(true);
       },
       "never finished"},
      {"prepare twice before any gradient", GradientSharding::none,
       [&](Reducer& r) {
         r.prepare(true);
         r.prepare(true);
       },
       "never finished"},
      {"prepare after finish without zero", GradientSharding::shard_only,
       [&](Reducer& r) {
         r.prepare(true);
         all(r);
         r.finish();
         r.prepare(false);
       },
       "call zero()"},
      {"zero while reducing", GradientSharding::none,
       [&](Reducer& r) {
         r.prepare(true);
         all(r);
         r.zero();
       },
       "finish() it first"},
      {"mark twice", GradientSharding::scatter,
       [&](Reducer& r) {
         r.prepare(true);
         r.mark_ready(1);
         r.mark_ready(1);
       },
       "marked ready twice"},
      {"gradient outside a pass", GradientSharding::shard_only, [](Reducer& r) { (void)r.grad(0); },
       "only within a backward pass"},
      {"gradient written after its bucket left", GradientSharding::shard_only,
       [&](Reducer& r) {
         r.prepare(true);
         all(r);
         (void)r.grad(2);
       },
       "after its bucket"},
      {"a gradient never marked", GradientSharding::shard_only,
       [&](Reducer& r) {
         r.prepare(true);
         r.mark_ready(0);
         r.mark_ready(2);
         r.finish();
       },
       "'b'"},
  };
  for (const bool stormy : {false, true}) {
    for (const Misuse& m : misuses) {
      SCOPED_TRACE(std::string(m.name) + (stormy ? ", collectives late" : ""));
      ThreadGroup group(2, {.timeout = std::chrono::seconds(5)});
      if (stormy) {
        for (std::uint64_t seq = 1; seq <= 6; ++seq) group.inject({.seq = seq, .delay = std::chrono::milliseconds(20)});
      }
      std::vector<std::string> errors(2);
      group.run([&](int rank) {
        nn::FlatPlanOptions po;
        po.world_size = 2;
        po.bucket_cap_mb = po.first_bucket_cap_mb = 1e-9;  // a bucket per gradient
        Reducer red(group.communicator(rank), nn::make_flat_plan(specs, po), DType::f32, Device::cpu(),
                    {.sharding = m.sharding});
        try {
          m.act(red);
        } catch (const Error& e) {
          errors[static_cast<std::size_t>(rank)] = e.what();
        }
      });
      for (const std::string& e : errors) EXPECT_NE(e.find(m.message), std::string::npos) << e;
    }
  }
}

// ---- checkpoints across world sizes and stages -------------------------------------------------

TEST(Zero, CheckpointsResumeAcrossWorldSizesAndStages) {
  // Uninterrupted: 6 steps on one rank at stage 0.
  const std::vector<Values> straight = train({.ranks = 1, .zero = 0, .steps = 6});
  // Stage 1 on 2 ranks -> stage 0 on 1 rank -> stage 2 on 4 ranks, 2 steps each.
  StateDict a, b;
  train({.ranks = 2, .zero = 1, .steps = 2, .save = &a});
  train({.ranks = 1, .zero = 0, .steps = 2, .first_step = 2, .resume = &a, .save = &b});
  const std::vector<Values> resumed = train({.ranks = 4, .zero = 2, .steps = 2, .first_step = 4, .resume = &b});
  expect_ranks_agree(resumed);
  EXPECT_LE(relative_difference(resumed[0], straight[0]), 1e-5);
  EXPECT_EQ(a.count("optim.step"), 1u);
  EXPECT_EQ(get_int_scalar(b, "optim.step"), 4);
  // Nothing changes (same stage, same ranks): bit for bit the uninterrupted run.
  StateDict c;
  const std::vector<Values> whole = train({.ranks = 3, .zero = 2, .steps = 4});
  train({.ranks = 3, .zero = 2, .steps = 2, .save = &c});
  const std::vector<Values> continued = train({.ranks = 3, .zero = 2, .steps = 2, .first_step = 2, .resume = &c});
  EXPECT_EQ(continued[0], whole[0]);
}

// ---- memory, reported -----------------------------------------------------------------------

TEST(Zero, MemoryIsTheShardsPlusWholeParameters) {
  kernels::set_cpu_threads(1);
  const amp::Policy bf16_grads{DType::bf16, DType::f32, DType::bf16, DType::bf16};
  for (int zero : {0, 1, 2}) {
    ThreadGroup group(4);
    std::vector<DdpMemory> mem(4);
    std::int64_t total = 0, shard = 0;
    group.run([&](int rank) {
      auto model = make_model();
      amp::apply(bf16_grads, *model);
      model->init(kSeed);
      DistributedDataParallel ddp(group.communicator(rank), *model, {.sharding = sharding_of_stage(zero)});
      auto opt = make_optimizer(Opt::adamw, *model);
      ddp.attach(*opt);
      nn::CrossEntropyLoss loss;
      const Batch b = rows(global_batch(12, 5), rank * 3, 3);
      loss.forward(ddp.forward(b.x), b.y);
      ddp.backward(loss.grad());
      opt->step();
      mem[static_cast<std::size_t>(rank)] = ddp.memory();
      if (rank == 0) {
        total = ddp.reducer().plan().total;
        shard = ddp.reducer().plan().shard_numel;
      }
    });
    SCOPED_TRACE("zero " + std::to_string(zero));
    const DdpMemory& m = mem[0];
    EXPECT_EQ(m.parameters, 2 * total);  // bf16, whole
    EXPECT_EQ(m.master_weights, zero == 0 ? 4 * total : 4 * shard);
    EXPECT_EQ(m.gradients, zero == 2 ? 2 * shard : 2 * total);  // bf16
    EXPECT_EQ(m.optimizer_state, zero == 0 ? 8 * total : 8 * shard);
    if (zero > 0) EXPECT_LT(shard * 4, total + 4 * 8 * 4) << "a shard is a quarter, give or take padding";
    if (zero == 2) EXPECT_GT(m.communication, 0) << "the pool";
  }
}

}  // namespace
}  // namespace tutti::ddp
