// DdpOptions::deterministic under train::Run, ranks as threads: the same global batch of 24 in
// slices of 2 trains bit-identical parameters at world sizes 1, 2, 3 and 4; a run that loses
// ranks and resumes on fewer (from its checkpoint file, or from a node's memory snapshot) ends
// bit-identical to one that never did. The normal mode is the control: its sums follow the
// world size, so its parameters differ in the last bits (and stay within 1e-4 relative, the
// issue's target for a run with failures).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include <unistd.h>

#include "train/train_program.h"
#include "tutti/core/error.h"

namespace tutti::train {
namespace {

namespace fs = std::filesystem;
using testing::Plan;
using testing::relative_difference;
using testing::Result;
using testing::train;

constexpr std::int64_t kSteps = 8;  // two epochs of 96 samples

Plan sliced(int ranks, bool deterministic, std::int64_t steps = kSteps) {
  Plan p{.ranks = ranks, .options = {.steps = steps}};
  p.slice = 2;  // 12 slices per step: 12, 6, 4 or 3 per rank
  p.deterministic = deterministic;
  return p;
}

using DeterministicTest = testing::RunDirTest;

TEST_F(DeterministicTest, EveryWorldSizeTrainsTheSameBits) {
  const Result one = train(sliced(1, true));
  ASSERT_FALSE(one.params.empty());
  const Result normal_one = train(sliced(1, false));
  int normal_differs = 0;
  for (int ranks : {2, 3, 4}) {
    SCOPED_TRACE("ranks " + std::to_string(ranks));
    const Result r = train(sliced(ranks, true));
    EXPECT_EQ(r.params, one.params) << "deterministic mode: " << ranks << " ranks differ from 1 by "
                                    << relative_difference(r.params, one.params);
    EXPECT_EQ(r.losses, one.losses) << "the logged loss is summed exactly too";
    const Result normal = train(sliced(ranks, false));
    if (normal.params != normal_one.params) ++normal_differs;
    const double normal_diff = relative_difference(normal.params, normal_one.params);
    std::printf("normal mode, %d ranks against 1: relative difference %.3g\n", ranks, normal_diff);
    EXPECT_LE(normal_diff, 1e-4);
  }
  // The control: without the exact sums the order of the additions shows.
  EXPECT_GT(normal_differs, 0) << "the normal mode gave the same bits at every world size: the test cannot tell";
  // The fixed point rounds each slice's gradient to 2^-40: close to the normal mode.
  std::printf("deterministic against normal mode, 1 rank: relative difference %.3g\n",
              relative_difference(one.params, normal_one.params));
  EXPECT_LE(relative_difference(one.params, normal_one.params), 1e-5);
  EXPECT_NE(one.params, normal_one.params);
}

TEST_F(DeterministicTest, ARunThatLostRanksEndsAsOneThatNeverDid) {
  for (bool deterministic : {true, false}) {
    SCOPED_TRACE(deterministic ? "deterministic" : "normal");
    fs::remove_all(dir_);
    const Result whole = train(sliced(4, deterministic));
    // 4 ranks write a checkpoint after step 3 and stop; 3 ranks continue it.
    Plan first = sliced(4, deterministic, 3);
    first.options.checkpoint_dir = ckpt_dir();
    train(first);
    Plan rest = sliced(3, deterministic);
    rest.options.checkpoint_dir = ckpt_dir();
    rest.options.resume = Resume::yes;
    const Result resumed = train(rest);
    EXPECT_EQ(resumed.first_step, 3);
    ASSERT_EQ(resumed.params.size(), whole.params.size());
    if (deterministic) {
      EXPECT_EQ(resumed.params, whole.params) << "differs by " << relative_difference(resumed.params, whole.params);
    } else {
      std::printf("normal mode, 4 ranks then 3 from the file: relative difference %.3g\n",
                  relative_difference(resumed.params, whole.params));
      EXPECT_LE(relative_difference(resumed.params, whole.params), 1e-4);
    }

    // 4 ranks on 2 nodes, killed after step 7; node 1 is lost with its memory; the 2 ranks of
    // node 0 go on from its snapshot of step 6.
    fs::remove_all(dir_);
    Plan killed = sliced(4, deterministic);
    killed.options.checkpoint_dir = ckpt_dir();
    killed.options.snapshots.every = 3;
    killed.options.snapshots.dir = memory();
    killed.options.snapshots.nodes = {0, 0, 1, 1};
    killed.crash_step = 7;
    train(killed);
    fs::remove_all(fs::path(memory()) / "node1");
    Plan survivors = killed;
    survivors.ranks = 2;
    survivors.crash_step = 0;
    survivors.options.snapshots.nodes = {0, 0};
    survivors.options.resume = Resume::automatic;
    const Result recovered = train(survivors);
    EXPECT_TRUE(recovered.from_memory) << recovered.note;
    EXPECT_EQ(recovered.first_step, 6);
    ASSERT_EQ(recovered.params.size(), whole.params.size());
    if (deterministic) {
      EXPECT_EQ(recovered.params, whole.params) << "differs by " << relative_difference(recovered.params, whole.params);
    } else {
      std::printf("normal mode, 4 ranks then 2 from memory: relative difference %.3g\n",
                  relative_difference(recovered.params, whole.params));
      EXPECT_LE(relative_difference(recovered.params, whole.params), 1e-4);
    }
  }
}

TEST_F(DeterministicTest, AGradientBeyondTheFixedPointRangeEndsTheRunOnEveryRank) {
  // 60 fraction bits leave |g| <= 2^2 / 12 slices: the first step's gradients exceed it.
  Plan p = sliced(2, true, 2);
  p.fraction_bits = 60;
  try {
    train(p);
    ADD_FAILURE() << "an out-of-range gradient was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeded the fixed-point range"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fixed_point_fraction_bits"), std::string::npos) << e.what();
  }
}

TEST_F(DeterministicTest, ZeroOneTrainsTheSameBitsAsStageZeroAndTwoIsRefused) {
  const Result one = train(sliced(1, true));
  for (int ranks : {2, 3, 4}) {
    SCOPED_TRACE("ranks " + std::to_string(ranks));
    Plan p = sliced(ranks, true);
    p.zero = 1;
    const Result r = train(p);
    EXPECT_EQ(r.params, one.params) << "differs by " << relative_difference(r.params, one.params);
  }
  Plan p = sliced(2, true, 1);
  p.zero = 2;
  try {
    train(p);
    ADD_FAILURE() << "deterministic with ZeRO-2 was not refused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("deterministic needs Replicate or ShardOptimizer (ZeRO-0 or 1), got ZeRO-2"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tutti::train
