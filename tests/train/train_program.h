// The program train::Run's tests run (run_test.cc, snapshot_test.cc): a DDP MLP with SGD
// (momentum: optimizer state that a resume must restore), a DistributedLoader (its position
// too), 2 accumulation steps, under a train::Run, with ranks as threads (tutti::ThreadGroup).
// The thread backend sums in rank order, so two runs of one program agree bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <string>

#include <unistd.h>

#include "tutti/amp/loss_scaler.h"
#include "tutti/comm/thread_group.h"
#include "tutti/data/loader.h"
#include "tutti/ddp/ddp.h"
#include "tutti/ddp/powersgd.h"
#include "tutti/kernels/threads.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/loss.h"
#include "tutti/nn/sequential.h"
#include "tutti/optim/sgd.h"
#include "tutti/train/run.h"

namespace tutti::train::testing {

constexpr std::int64_t kIn = 12, kClasses = 5, kSamples = 96, kGlobalBatch = 24;

// 96 samples of 12 features, 5 classes: the same on every rank.
inline data::Dataset dataset() {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(kSamples * kIn);
  for (float& v : x) v = normal(rng);
  std::vector<std::int64_t> y(kSamples);
  for (auto& v : y) v = static_cast<std::int64_t>(rng() % kClasses);
  return {Tensor::from_floats(x, {kSamples, kIn}), Tensor::from_ints(y, {kSamples}, DType::i32)};
}

struct Plan {
  int ranks = 2;
  int zero = 0;
  RunOptions options;
  detail::RunHooks hooks;       // slow writes, a folder's free space
  int stop_rank = -1;           // this rank calls request_stop(SIGTERM) ...
  std::int64_t stop_step = 0;   // ... within this step (1-based)
  std::int64_t inf_step = 0;    // rank 0 adds an inf loss in this step (0: never)
  std::string summary;          // the JSON summary's path ("": none)
  bool figures = false;         // every step, 2 figures of the program's own ride in the allreduce
  bool watchdog = false;        // the ranks are watched as a Job's: a rank that throws ends the others
  std::int64_t crash_step = 0;  // every rank leaves after this step without finish(), as if killed (0: never)
  // 0: each rank's micro-batch is 12 / ranks samples, 2 accumulation steps. > 0: it is `slice`
  // samples, and the accumulation steps keep the global batch at 24 (24 / (ranks x slice)):
  // the same slices of the global batch at every world size (DdpOptions::deterministic).
  std::int64_t slice = 0;
  bool deterministic = false;                    // DdpOptions::deterministic
  int fraction_bits = 40;                        // DeterministicOptions::fixed_point_fraction_bits
  std::optional<ddp::PowerSgdOptions> powersgd;  // a ddp::PowerSgdHook registered with these
  // Within step notice_step (1-based), rank notice_rank writes the file notice_file (a
  // preemption notice for RunOptions::preemption's "file:" source; 0: never).
  std::int64_t notice_step = 0;
  int notice_rank = -1;
  std::string notice_file;
};

struct Result {
  std::vector<float> params;                   // rank 0's whole parameters at the end
  std::vector<Outcome> outcomes;               // per rank
  std::vector<std::int64_t> steps;             // per rank: steps done
  std::vector<std::int64_t> checkpoint_steps;  // rank 0: the steps end_step() wrote a checkpoint at
  std::vector<std::int64_t> skipped_steps;     // rank 0: ... whose checkpoint was skipped (a write in flight)
  std::int64_t first_step = -1;
  bool resumed = false;
  std::vector<std::vector<float>> figures;   // rank 0: the figures after each step's allreduce
  std::string note;                          // rank 0: Run::note()
  bool from_memory = false;                  // rank 0: Run::resumed_from_memory()
  std::vector<std::int64_t> snapshot_steps;  // rank 0: the steps end_step() wrote a memory snapshot at
  std::string snapshot_dir;                  // rank 0: Run::snapshot_dir()
  std::uint64_t snapshot_bytes = 0;          // rank 0: Run::snapshot_bytes_per_node()
  std::vector<std::int64_t> snapshot_every;  // per rank: StepEnd::snapshot_every after the last step
  std::vector<double> losses;                // rank 0: StepEnd::loss of each step
};

// The program: a DDP MLP with SGD (momentum: optimizer state that a resume must restore),
// a DistributedLoader (its position too), a global batch of 24 (2 accumulation steps unless
// Plan::slice says otherwise), under a train::Run.
inline Result train(const Plan& plan) {
  kernels::set_cpu_threads(1);
  ThreadGroupOptions group_options;
  group_options.comm.timeout = std::chrono::seconds(20);
  group_options.watchdog = plan.watchdog;
  ThreadGroup group(plan.ranks, group_options);
  Result out;
  out.outcomes.resize(static_cast<std::size_t>(plan.ranks));
  out.steps.resize(static_cast<std::size_t>(plan.ranks));
  std::vector<std::int64_t>& snapshot_every = out.snapshot_every;
  snapshot_every.resize(static_cast<std::size_t>(plan.ranks));
  group.run([&](int rank) {
    Communicator& comm = group.communicator(rank);
    Summary summary(plan.summary);
    nn::Sequential model;
    model.add<nn::Linear>(kIn, 16).add<nn::ReLU>().add<nn::Linear>(16, kClasses);
    model.init(rank == 0 ? 11 : 99);  // rank 0's values reach everyone
    const std::int64_t micro = plan.slice > 0 ? plan.slice : kGlobalBatch / 2 / plan.ranks;
    const int accumulation = static_cast<int>(kGlobalBatch / (micro * plan.ranks));
    ddp::DdpOptions o;
    o.accumulation_steps = accumulation;
    if (plan.deterministic)
      o.deterministic = ddp::DeterministicOptions{.fixed_point_fraction_bits = plan.fraction_bits};
    o.sharding = ddp::sharding_of_stage(plan.zero);
    ddp::DistributedDataParallel ddp(comm, model, o);
    if (plan.powersgd) ddp.register_comm_hook(std::make_shared<ddp::PowerSgdHook>(*plan.powersgd));
    optim::SGD optimizer(model.parameters(), {.lr = 0.05f, .momentum = 0.9f});
    ddp.attach(optimizer);
    amp::LossScaler scaler(amp::LossScalerOptions{.mode = amp::ScalerMode::off});
    data::DistributedLoader loader(
        dataset(), {.global_micro_batch_size = micro * plan.ranks, .rank = rank, .world_size = plan.ranks, .seed = 3});
    nn::CrossEntropyLoss loss;
    const Tensor inf = Tensor::from_floats({std::numeric_limits<float>::infinity()}, {1});

    RunOptions options = plan.options;
    options.metadata["model"] = "mlp 12-16-5";
    if (!plan.summary.empty()) options.summary = &summary;
    Run run(comm, {ddp, optimizer, scaler, loader}, options, plan.hooks);
    if (rank == 0) {
      out.first_step = run.first_step();
      out.resumed = run.resumed();
      out.note = run.note();
      out.from_memory = run.resumed_from_memory();
      out.snapshot_dir = run.snapshot_dir();
      out.snapshot_bytes = run.snapshot_bytes_per_node();
    }
    while (run.next()) {
      // This rank's figures (rank, step), on every other step only: the tensor changes size.
      Tensor figures = run.sync_slots(plan.figures && run.step() % 2 == 0 ? 2 : 0);
      if (figures.defined()) {
        figures.copy_from(Tensor::from_floats({static_cast<float>(rank), static_cast<float>(run.step())}, {2}));
      }
      for (int m = 0; m < accumulation; ++m) {
        const data::Batch b = loader.next();
        loss.forward(ddp.forward(b.images), b.labels);
        ddp.backward(loss.grad());
        run.add_loss(loss.loss(), 1.0f / static_cast<float>(accumulation));
      }
      if (rank == 0 && run.step() + 1 == plan.inf_step) run.add_loss(inf);
      if (rank == plan.stop_rank && run.step() + 1 == plan.stop_step) run.request_stop(SIGTERM);
      if (rank == plan.notice_rank && run.step() + 1 == plan.notice_step) {
        std::ofstream(plan.notice_file) << "{\"action\": \"terminate\"}\n";
      }
      optimizer.step();
      ddp.zero_grad();
      const StepEnd& end = run.end_step();
      if (rank == 0) out.losses.push_back(end.loss);
      if (rank == 0 && end.checkpoint) out.checkpoint_steps.push_back(end.step);
      if (rank == 0 && end.checkpoint_skipped) out.skipped_steps.push_back(end.step);
      if (rank == 0 && figures.defined()) out.figures.push_back(figures.to_floats());
      if (rank == 0 && end.snapshot) out.snapshot_steps.push_back(end.step);
      snapshot_every[static_cast<std::size_t>(rank)] = end.snapshot_every;
      if (end.step == plan.crash_step) break;
    }
    if (plan.crash_step > 0 && run.step() == plan.crash_step) {
      out.steps[static_cast<std::size_t>(rank)] = run.step();
      return;  // killed: no finish(), nothing cleaned up
    }
    out.outcomes[static_cast<std::size_t>(rank)] = run.finish();
    out.steps[static_cast<std::size_t>(rank)] = run.step();
    const StateDict state = ddp.state().model_state_dict();
    if (rank == 0) {
      for (const nn::Parameter* p : model.parameters()) {
        const std::vector<float> v = state.at(p->name).to_floats();
        out.params.insert(out.params.end(), v.begin(), v.end());
      }
    }
  });
  return out;
}

// A fixture with a fresh folder per test (removed after it) for the runs' checkpoints and the
// memory snapshots' stand-in for /dev/shm.
class RunDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("tutti_" + std::string(info->test_suite_name()) + "_" + std::to_string(::getpid()) + "_" + info->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string ckpt_dir() const { return (dir_ / "ckpt").string(); }
  std::string memory() const { return (dir_ / "shm").string(); }
  std::filesystem::path dir_;
};

// The largest difference between two runs' parameters, relative to the largest parameter.
inline double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    ref = std::max(ref, static_cast<double>(std::fabs(b[i])));
  }
  return diff / ref;
}

}  // namespace tutti::train::testing
