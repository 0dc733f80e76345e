// train::Run with ranks as threads (tutti::ThreadGroup, no mpirun): resume (explicit, auto,
// the refusal to overwrite), a stop asked on one rank that stops every rank after the same
// step with a checkpoint from which the resumed run ends bit-identical to an uninterrupted
// one, divergence, the checkpoint cadence, the program's figures in the step's allreduce, and
// the JSON summary of each ending. The reference of "bit-identical" is the same program run
// without interruption (the thread backend sums in rank order, so two runs of one program
// agree bit for bit).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "train/train_program.h"
#include "tutti/amp/loss_scaler.h"
#include "tutti/comm/thread_group.h"
#include "tutti/data/loader.h"
#include "tutti/ddp/ddp.h"
#include "tutti/io/checkpoint.h"
#include "tutti/kernels/threads.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/loss.h"
#include "tutti/nn/sequential.h"
#include "tutti/optim/sgd.h"
#include "tutti/train/run.h"

namespace tutti::train {
namespace {

using testing::Plan;
using testing::Result;
using testing::train;

class RunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("tutti_run_test_" + std::to_string(::getpid()) + "_" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string ckpt_dir() const { return (dir_ / "ckpt").string(); }
  std::string ckpt() const { return ckpt_dir() + "/checkpoint.tckp"; }
  std::string file(const std::string& name) const {
    std::filesystem::create_directories(dir_);
    return (dir_ / name).string();
  }
  static std::string read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::filesystem::path dir_;
};

std::int64_t step_of(const std::string& ckpt) { return get_int_scalar(io::load_checkpoint(ckpt).state, "train.step"); }

TEST_F(RunTest, StopOnOneRankStopsEveryRankAfterTheSameStepAndTheResumeEndsAsAnUninterruptedRun) {
  for (int zero : {0, 1}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    std::filesystem::remove_all(dir_);
    const Result whole = train({.ranks = 3, .zero = zero, .options = {.steps = 9}});
    const Result stopped = train({.ranks = 3,
                                  .zero = zero,
                                  .options = {.steps = 9, .checkpoint_dir = ckpt_dir()},
                                  .stop_rank = 2,
                                  .stop_step = 4,
                                  .summary = file("stopped.json")});
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(stopped.steps[r], 4) << "rank " << r;
      EXPECT_EQ(stopped.outcomes[r].status, Outcome::Status::stopped) << "rank " << r;
      EXPECT_EQ(stopped.outcomes[r].exit_code, r == 0 ? 75 : 0) << "rank " << r;
      EXPECT_EQ(stopped.outcomes[r].signal, SIGTERM);
      EXPECT_EQ(stopped.outcomes[r].signal_rank, 2);
    }
    EXPECT_EQ(stopped.outcomes[0].message,
              "stopped at step 4 of 9 by SIGTERM (on rank 2). Checkpoint written to " + ckpt() +
                  ". Resume with the same command and --resume (--resume auto also starts afresh when there is no "
                  "checkpoint).");
    EXPECT_TRUE(stopped.outcomes[1].message.empty());
    EXPECT_EQ(stopped.checkpoint_steps, std::vector<std::int64_t>{4});  // the stop's, no other
    EXPECT_EQ(step_of(ckpt()), 4);
    const std::string json = read(file("stopped.json"));
    EXPECT_NE(json.find("\"status\": \"stopped\""), std::string::npos) << json;
    EXPECT_NE(json.find("\"signal\": \"SIGTERM\""), std::string::npos) << json;
    EXPECT_NE(json.find("\"steps\": 4"), std::string::npos) << json;
    EXPECT_NE(json.find("\"checkpoint\": \"" + ckpt() + "\""), std::string::npos) << json;

    const Result resumed = train(
        {.ranks = 3, .zero = zero, .options = {.steps = 9, .checkpoint_dir = ckpt_dir(), .resume = Resume::automatic}});
    EXPECT_TRUE(resumed.resumed);
    EXPECT_EQ(resumed.first_step, 4);
    EXPECT_EQ(resumed.outcomes[0].status, Outcome::Status::completed);
    EXPECT_EQ(resumed.outcomes[0].exit_code, 0);
    ASSERT_EQ(resumed.params.size(), whole.params.size());
    EXPECT_EQ(resumed.params, whole.params) << "the resumed run ends other than the uninterrupted one";
  }
}

TEST_F(RunTest, ResumeAcrossWorldSizesContinuesTheSameTraining) {
  const Result whole = train({.ranks = 2, .options = {.steps = 6}});
  train({.ranks = 4, .options = {.steps = 3, .checkpoint_dir = ckpt_dir()}});
  const Result resumed =
      train({.ranks = 2, .options = {.steps = 6, .checkpoint_dir = ckpt_dir(), .resume = Resume::yes}});
  EXPECT_EQ(resumed.first_step, 3);
  ASSERT_EQ(resumed.params.size(), whole.params.size());
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < whole.params.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(resumed.params[i] - whole.params[i])));
    ref = std::max(ref, static_cast<double>(std::fabs(whole.params[i])));
  }
  EXPECT_LE(diff / ref, 1e-5);  // only the order of the sums over ranks differs
}

TEST_F(RunTest, ResumeExplicitAutoAndTheRefusalToOverwrite) {
  // --resume without a checkpoint: refused; --resume auto: starts afresh.
  try {
    train({.options = {.steps = 2, .checkpoint_dir = ckpt_dir(), .resume = Resume::yes}});
    ADD_FAILURE() << "resuming without a checkpoint was not refused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no checkpoint at " + ckpt()), std::string::npos) << e.what();
  }
  const Result fresh = train({.options = {.steps = 2, .checkpoint_dir = ckpt_dir(), .resume = Resume::automatic}});
  EXPECT_FALSE(fresh.resumed);
  EXPECT_EQ(fresh.first_step, 0);
  EXPECT_EQ(step_of(ckpt()), 2);
  // A checkpoint exists: starting afresh without --overwrite is refused and leaves it alone.
  const auto before = std::filesystem::last_write_time(ckpt());
  try {
    train({.options = {.steps = 3, .checkpoint_dir = ckpt_dir()}});
    ADD_FAILURE() << "starting over an existing checkpoint was not refused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("a checkpoint exists at " + ckpt()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--overwrite"), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::filesystem::last_write_time(ckpt()), before);
  // auto and yes continue it; overwrite starts afresh and replaces it.
  const Result continued = train({.options = {.steps = 3, .checkpoint_dir = ckpt_dir(), .resume = Resume::automatic}});
  EXPECT_TRUE(continued.resumed);
  EXPECT_EQ(continued.first_step, 2);
  EXPECT_EQ(step_of(ckpt()), 3);
  const Result again = train({.options = {.steps = 4, .checkpoint_dir = ckpt_dir(), .resume = Resume::yes}});
  EXPECT_EQ(again.first_step, 3);
  const Result over = train({.options = {.steps = 1, .checkpoint_dir = ckpt_dir(), .overwrite = true}});
  EXPECT_FALSE(over.resumed);
  EXPECT_EQ(over.first_step, 0);
  EXPECT_EQ(step_of(ckpt()), 1);
  // Another model's checkpoint is refused by its metadata.
  io::Checkpoint other = io::load_checkpoint(ckpt());
  other.metadata["model"] = "cnn";
  io::save_checkpoint(ckpt(), other.state, other.metadata);
  try {
    train({.options = {.steps = 2, .checkpoint_dir = ckpt_dir(), .resume = Resume::yes}});
    ADD_FAILURE() << "another model's checkpoint was resumed";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("another model"), std::string::npos) << e.what();
  }
}

TEST_F(RunTest, CheckpointCadenceEveryNStepsAtTheEndAndAtAStop) {
  const Result every = train({.options = {.steps = 10, .checkpoint_dir = ckpt_dir(), .checkpoint_every = 4}});
  EXPECT_EQ(every.checkpoint_steps, (std::vector<std::int64_t>{4, 8, 10}));
  std::filesystem::remove_all(ckpt_dir());
  const Result end_only = train({.options = {.steps = 5, .checkpoint_dir = ckpt_dir()}});
  EXPECT_EQ(end_only.checkpoint_steps, (std::vector<std::int64_t>{5}));
  std::filesystem::remove_all(ckpt_dir());
  const Result stop = train(
      {.options = {.steps = 10, .checkpoint_dir = ckpt_dir(), .checkpoint_every = 3}, .stop_rank = 1, .stop_step = 5});
  EXPECT_EQ(stop.checkpoint_steps, (std::vector<std::int64_t>{3, 5}));
  // No folder: no checkpoint, and the stop says it cannot be resumed.
  const Result none = train({.options = {.steps = 10, .checkpoint_every = 3}, .stop_rank = 0, .stop_step = 2});
  EXPECT_TRUE(none.checkpoint_steps.empty());
  EXPECT_EQ(none.outcomes[0].status, Outcome::Status::stopped);
  EXPECT_NE(none.outcomes[0].message.find("No checkpoint was written"), std::string::npos) << none.outcomes[0].message;
}

TEST_F(RunTest, ANonFiniteLossEndsTheRunNamingTheLastGoodCheckpoint) {
  const Result r =
      train({.options = {.steps = 10, .checkpoint_dir = ckpt_dir(), .checkpoint_every = 2, .precision = "fp32"},
             .inf_step = 5,
             .summary = file("diverged.json")});
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(r.outcomes[rank].status, Outcome::Status::diverged);
    EXPECT_EQ(r.outcomes[rank].exit_code, rank == 0 ? 3 : 0);
    EXPECT_EQ(r.steps[rank], 5);
  }
  const std::string& m = r.outcomes[0].message;
  EXPECT_EQ(m.rfind("error: the training loss is inf at step 5 (fp32): the run diverged. The last good checkpoint "
                    "(written before the loss stopped being finite) is " +
                        ckpt() + ", at step 4 with train loss ",
                    0),
            0u)
      << m;
  EXPECT_EQ(r.checkpoint_steps, (std::vector<std::int64_t>{2, 4}));  // none of the diverged step
  EXPECT_EQ(step_of(ckpt()), 4);
  const std::string json = read(file("diverged.json"));
  EXPECT_NE(json.find("\"status\": \"diverged\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"loss\": \"inf\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"last_finite_step\": 4"), std::string::npos) << json;
  EXPECT_NE(json.find("\"steps\": 5"), std::string::npos) << json;
}

TEST_F(RunTest, TheProgramsFiguresAreAveragedInTheStepsAllreduce) {
  const Result with = train({.ranks = 3, .options = {.steps = 5}, .figures = true});
  // Steps 1, 3, 5 carry (rank, step before it) from every rank: the mean rank is 1.
  EXPECT_EQ(with.figures, (std::vector<std::vector<float>>{{1, 0}, {1, 2}, {1, 4}}));
  // The same training as without them (the loss and the stop flag keep their places).
  const Result without = train({.ranks = 3, .options = {.steps = 5}});
  EXPECT_EQ(with.params, without.params);
}

TEST_F(RunTest, ACompletedRunSummarizesItsSteps) {
  const Result r = train({.options = {.steps = 3}, .summary = file("done.json")});
  EXPECT_EQ(r.outcomes[0].status, Outcome::Status::completed);
  EXPECT_TRUE(r.outcomes[0].message.empty());
  const std::string json = read(file("done.json"));
  EXPECT_NE(json.find("\"status\": \"completed\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"steps\": 3"), std::string::npos) << json;
  EXPECT_NE(json.find("\"resumed_from_step\": 0"), std::string::npos) << json;
}

// The asynchronous checkpoint writer (the default; RunOptions::checkpoint_mode) under the Run.
// A slow disk is a before_write hook that sleeps: writes stay in flight over later steps.
io::CheckpointHooks slow_writes(std::chrono::milliseconds each, std::int64_t only_step = -1) {
  return {.before_write = [each, only_step](std::int64_t step, const std::string&) {
    if (only_step < 0 || step == only_step) std::this_thread::sleep_for(each);
  }};
}

TEST_F(RunTest, AsyncCheckpointsResumeToTheSameModelAsSyncOnes) {
  const Result whole = train({.options = {.steps = 9}});
  std::vector<std::vector<float>> ends;
  for (const io::CheckpointMode mode : {io::CheckpointMode::sync, io::CheckpointMode::async}) {
    SCOPED_TRACE(mode == io::CheckpointMode::sync ? "sync" : "async");
    std::filesystem::remove_all(ckpt_dir());
    // Writes in flight over the next steps: the file must hold the state of its own step.
    RunOptions o{.steps = 9, .checkpoint_dir = ckpt_dir(), .checkpoint_every = 2, .checkpoint_mode = mode};
    const detail::RunHooks hooks{.checkpoint = slow_writes(std::chrono::milliseconds(30))};
    const Result stopped = train({.options = o, .hooks = hooks, .stop_rank = 1, .stop_step = 5});
    EXPECT_EQ(stopped.checkpoint_steps, (std::vector<std::int64_t>{2, 4, 5}));
    EXPECT_EQ(step_of(ckpt()), 5);
    o.resume = Resume::yes;
    const Result resumed = train({.options = o, .hooks = hooks});
    EXPECT_EQ(resumed.first_step, 5);
    EXPECT_EQ(resumed.params, whole.params) << "the resumed run ends other than the uninterrupted one";
    ends.push_back(resumed.params);
  }
  EXPECT_EQ(ends[0], ends[1]);
}

TEST_F(RunTest, AFailedBackgroundWriteEndsTheRunNamingTheFileAndTheStep) {
  // The disk fails while the checkpoint of step 4 is written in the background: the run ends
  // with that error (rank 0 throws at its next end_step; the other ranks are ended, not left
  // waiting in the step's allreduce until the 20 s timeout).
  RunOptions o{.steps = 10, .checkpoint_dir = ckpt_dir(), .checkpoint_every = 2};
  detail::RunHooks hooks;
  hooks.checkpoint.before_write = [](std::int64_t step, const std::string&) {
    if (step == 4) throw std::runtime_error("No space left on device (test)");
  };
  const auto t0 = std::chrono::steady_clock::now();
  try {
    train({.options = o, .hooks = hooks, .watchdog = true});
    ADD_FAILURE() << "a failed background write went unnoticed";
  } catch (const std::exception& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("No space left on device (test)"), std::string::npos) << m;
    EXPECT_NE(m.find(ckpt()), std::string::npos) << m;
    EXPECT_NE(m.find("step 4"), std::string::npos) << m;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_EQ(step_of(ckpt()), 2);  // the last good one is left as it was
  // A folder that cannot be made (under a regular file): the error names the file and the step.
  std::ofstream(file("plain")) << "x";
  o = {.steps = 3, .checkpoint_dir = (dir_ / "plain" / "ckpt").string(), .checkpoint_every = 2};
  try {
    train({.options = o, .hooks = hooks, .watchdog = true});
    ADD_FAILURE() << "a checkpoint folder under a regular file went unnoticed";
  } catch (const std::exception& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(o.checkpoint_dir + "/checkpoint.tckp"), std::string::npos) << m;
    EXPECT_NE(m.find("step 2"), std::string::npos) << m;
  }
}

TEST_F(RunTest, TheLastAndTheStopCheckpointAreNeverSkipped) {
  // A checkpoint every step, each write slower than several steps, and skip when busy: most
  // are skipped, but not the last step's nor a stop's, which are complete when the run ends.
  RunOptions o{.steps = 8, .checkpoint_dir = ckpt_dir(), .checkpoint_every = 1, .checkpoint_busy = io::WhenBusy::skip};
  const detail::RunHooks hooks{.checkpoint = slow_writes(std::chrono::milliseconds(300), 1)};
  const Result done = train({.options = o, .hooks = hooks});
  EXPECT_FALSE(done.skipped_steps.empty()) << "nothing was skipped: the test shows nothing";
  EXPECT_EQ(std::count(done.skipped_steps.begin(), done.skipped_steps.end(), 8), 0);
  EXPECT_EQ(step_of(ckpt()), 8);
  std::filesystem::remove_all(ckpt_dir());
  const Result stopped = train({.options = o, .hooks = hooks, .stop_rank = 1, .stop_step = 4});
  EXPECT_FALSE(stopped.skipped_steps.empty());
  EXPECT_EQ(std::count(stopped.skipped_steps.begin(), stopped.skipped_steps.end(), 4), 0);
  EXPECT_EQ(step_of(ckpt()), 4);
  EXPECT_NE(stopped.outcomes[0].message.find("Checkpoint written to " + ckpt()), std::string::npos);
}

TEST_F(RunTest, TheDivergenceMessageNamesACheckpointWrittenCompletely) {
  // Step 1's write is slow, steps 2-4's are skipped, step 5 diverges: the last good checkpoint
  // is step 1's (on disk when finish() returns), not step 4's, which was never written.
  RunOptions o{.steps = 10, .checkpoint_dir = ckpt_dir(), .checkpoint_every = 1, .checkpoint_busy = io::WhenBusy::skip};
  const detail::RunHooks hooks{.checkpoint = slow_writes(std::chrono::milliseconds(500), 1)};
  const Result r = train({.options = o, .hooks = hooks, .inf_step = 5});
  ASSERT_EQ(r.outcomes[0].status, Outcome::Status::diverged);
  EXPECT_FALSE(r.skipped_steps.empty()) << "nothing was skipped: the test shows nothing";
  const std::int64_t on_disk = step_of(ckpt());
  EXPECT_EQ(std::count(r.skipped_steps.begin(), r.skipped_steps.end(), on_disk), 0);
  EXPECT_NE(r.outcomes[0].message.find(ckpt() + ", at step " + std::to_string(on_disk) + " with"), std::string::npos)
      << r.outcomes[0].message << " (the file holds step " << on_disk << ")";
}

TEST(Summary, QuotesJsonAndReplacesBytesThatAreNotUtf8) {
  EXPECT_EQ(json_quote("a\"b\\c\n"), "\"a\\\"b\\\\c\\n\"");
  EXPECT_EQ(json_quote("\xc3\xa9"), "\"\xc3\xa9\"");  // é stays
  EXPECT_EQ(json_quote("x\xff"
                       "y"),
            "\"x\\ufffdy\"");                               // a stray byte
  EXPECT_EQ(json_quote("\xe2\x82"), "\"\\ufffd\\ufffd\"");  // a cut sequence
  EXPECT_EQ(json_quote(std::string_view("\x01", 1)), "\"\\u0001\"");
}

TEST(ParseResume, TakesTheFlagValues) {
  EXPECT_EQ(parse_resume("no"), Resume::no);
  EXPECT_EQ(parse_resume("yes"), Resume::yes);
  EXPECT_EQ(parse_resume("auto"), Resume::automatic);
  EXPECT_THROW(parse_resume("maybe"), InvalidArgument);
}

}  // namespace
}  // namespace tutti::train
