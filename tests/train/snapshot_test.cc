// train::Run's memory snapshots (RunOptions::snapshots.every, src/train/snapshots.h) with ranks
// as threads on pretended nodes (RunOptions::snapshots.nodes: each node's memory is a folder):
// a run killed after a step resumes from memory where no checkpoint file has that step, at any
// ZeRO stage and on another number of ranks, ending as the uninterrupted run; a lost node's
// parts come from the buddies' copies; a node and its buddy lost, or a corrupt snapshot, fall
// back to the file and say so; too little memory is refused before the first step; a new run
// never takes an older run's memory; a run that ends frees it.
// The auto interval: at most 2% of the time, or Young and Daly's with an MTBF.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "train/snapshots.h"
#include "train/train_program.h"
#include "tutti/core/error.h"
#include "tutti/io/checkpoint.h"

namespace tutti::train {
namespace {

namespace fs = std::filesystem;
using testing::Plan;
using testing::relative_difference;
using testing::Result;
using testing::train;

class SnapshotTest : public testing::RunDirTest {
 protected:
  // The run's folder on node `n`.
  fs::path node_folder(int n) const {
    const fs::path node = fs::path(memory()) / ("node" + std::to_string(n));
    for (const auto& e : fs::directory_iterator(node)) return e.path();
    return {};
  }
  std::vector<std::string> files(int n) const {
    std::vector<std::string> out;
    const fs::path folder = node_folder(n);
    if (folder.empty()) return out;
    for (const auto& e : fs::directory_iterator(folder)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  // A run with memory snapshots every 3 steps and no checkpoint file before its end.
  Plan plan(int ranks, int zero, std::vector<int> nodes, Resume resume = Resume::no) const {
    Plan p{.ranks = ranks, .zero = zero};
    p.options.steps = 9;
    p.options.checkpoint_dir = ckpt_dir();
    p.options.resume = resume;
    p.options.snapshots.every = 3;
    p.options.snapshots.dir = memory();
    p.options.snapshots.nodes = std::move(nodes);
    return p;
  }
};

TEST_F(SnapshotTest, AKilledRunResumesFromMemoryAtEveryStageAndEndsAsTheUninterruptedOne) {
  for (int zero : {0, 1, 2}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    fs::remove_all(dir_);
    const Result whole = train({.ranks = 4, .zero = zero, .options = {.steps = 9}});
    Plan killed = plan(4, zero, {0, 0, 1, 1});
    killed.crash_step = 7;
    const Result k = train(killed);
    EXPECT_EQ(k.snapshot_steps, (std::vector<std::int64_t>{3, 6}));
    EXPECT_FALSE(fs::exists(ckpt_dir() + "/checkpoint.tckp"));  // only memory holds step 6
    // Stage 0: the lowest rank of each node writes the whole state; ZeRO: every rank its part
    // and its buddy's (on the other node).
    if (zero == 0) {
      EXPECT_EQ(files(0), std::vector<std::string>{"part-0-of-1.tsnap"});
      EXPECT_EQ(files(1), std::vector<std::string>{"part-0-of-1.tsnap"});
    } else {
      // Each beside the previous snapshot's (step 3): see ANodeLostWhileASnapshotIsWritten...
      EXPECT_EQ(files(0), (std::vector<std::string>{"part-0-of-4.prev.tsnap", "part-0-of-4.tsnap",
                                                    "part-1-of-4.prev.tsnap", "part-1-of-4.tsnap",
                                                    "part-2-of-4.buddy.prev.tsnap", "part-2-of-4.buddy.tsnap",
                                                    "part-3-of-4.buddy.prev.tsnap", "part-3-of-4.buddy.tsnap"}));
      EXPECT_EQ(files(1), (std::vector<std::string>{"part-0-of-4.buddy.prev.tsnap", "part-0-of-4.buddy.tsnap",
                                                    "part-1-of-4.buddy.prev.tsnap", "part-1-of-4.buddy.tsnap",
                                                    "part-2-of-4.prev.tsnap", "part-2-of-4.tsnap",
                                                    "part-3-of-4.prev.tsnap", "part-3-of-4.tsnap"}));
    }
    EXPECT_GT(k.snapshot_bytes, 0u);

    const Result resumed = train(plan(4, zero, {0, 0, 1, 1}, Resume::automatic));
    EXPECT_TRUE(resumed.from_memory) << resumed.note;
    EXPECT_EQ(resumed.first_step, 6);
    EXPECT_NE(resumed.note.find("from memory"), std::string::npos) << resumed.note;
    EXPECT_NE(resumed.note.find("no checkpoint file"), std::string::npos) << resumed.note;
    EXPECT_EQ(resumed.outcomes[0].status, Outcome::Status::completed);
    ASSERT_EQ(resumed.params.size(), whole.params.size());
    EXPECT_EQ(resumed.params, whole.params) << "the run resumed from memory ends other than the uninterrupted one";
    // The run ended: its memory is free again.
    EXPECT_TRUE(files(0).empty());
    EXPECT_TRUE(files(1).empty());
  }
}

TEST_F(SnapshotTest, ALostNodesPartsComeFromTheBuddiesOnAnotherNumberOfRanks) {
  for (int zero : {1, 2}) {
    SCOPED_TRACE("zero " + std::to_string(zero));
    fs::remove_all(dir_);
    const Result whole = train({.ranks = 2, .zero = zero, .options = {.steps = 9}});
    Plan killed = plan(4, zero, {0, 0, 1, 1});
    killed.crash_step = 8;
    train(killed);
    fs::remove_all(fs::path(memory()) / "node1");  // the node is gone, with its memory
    // The job goes on with the survivors: 2 ranks on node 0, stage 1 whatever it was.
    Plan survivors = plan(2, 1, {0, 0}, Resume::automatic);
    const Result resumed = train(survivors);
    EXPECT_TRUE(resumed.from_memory) << resumed.note;
    EXPECT_EQ(resumed.first_step, 6);
    EXPECT_NE(resumed.note.find("4 part(s), 2 of them a buddy's copy"), std::string::npos) << resumed.note;
    EXPECT_LE(relative_difference(resumed.params, whole.params), 1e-5);  // only the order of sums differs
  }
}

// A node lost while the snapshot of step 6 was being written: node 0 had written its own parts
// of step 6, but its copies of node 1's parts (the buddy's) were still those of step 3 (the
// launcher's kill in cluster_test.launcher_node_killed_memory hit such a moment once, and the
// relaunch started afresh). The previous files keep step 3 whole: the run resumes there.
TEST_F(SnapshotTest, ANodeLostWhileASnapshotIsWrittenResumesFromThePreviousOne) {
  const Result whole = train({.ranks = 2, .zero = 1, .options = {.steps = 9}});
  Plan killed = plan(4, 1, {0, 0, 1, 1});
  killed.crash_step = 7;
  train(killed);
  fs::remove_all(fs::path(memory()) / "node1");
  const fs::path node0 = node_folder(0);
  for (const char* part : {"part-2-of-4", "part-3-of-4"}) {  // the copies of step 6 never arrived
    fs::rename(node0 / (std::string(part) + ".buddy.prev.tsnap"), node0 / (std::string(part) + ".buddy.tsnap"));
  }
  const Result resumed = train(plan(2, 1, {0, 0}, Resume::automatic));
  EXPECT_TRUE(resumed.from_memory) << resumed.note;
  EXPECT_EQ(resumed.first_step, 3);
  EXPECT_NE(resumed.note.find("step 3: 4 part(s), 2 of them a buddy's copy"), std::string::npos) << resumed.note;
  EXPECT_LE(relative_difference(resumed.params, whole.params), 1e-5);  // only the order of sums differs
}

TEST_F(SnapshotTest, ANodeAndItsBuddyLostFallBackToTheFileSayingHowManyStepsAreLost) {
  // 3 nodes of one rank: rank r's buddy is rank r + 1's node. A checkpoint file every 4 steps,
  // snapshots every 3: killed after step 7, memory holds step 6, the file step 4.
  Plan killed = plan(3, 1, {0, 1, 2});
  killed.options.checkpoint_every = 4;
  killed.crash_step = 7;
  train(killed);
  fs::remove_all(fs::path(memory()) / "node1");
  fs::remove_all(fs::path(memory()) / "node2");  // part 1's own copy and its buddy's
  const Result resumed = train(plan(3, 1, {0, 1, 2}, Resume::automatic));
  EXPECT_FALSE(resumed.from_memory);
  EXPECT_EQ(resumed.first_step, 4);
  EXPECT_NE(resumed.note.find("memory snapshots reach step 6"), std::string::npos) << resumed.note;
  EXPECT_NE(resumed.note.find("the checkpoint file at step 4 is used, 2 step(s) lost"), std::string::npos)
      << resumed.note;
  const Result whole = train({.ranks = 3, .zero = 1, .options = {.steps = 9}});
  EXPECT_EQ(resumed.params, whole.params);
}

TEST_F(SnapshotTest, ACorruptSnapshotIsCaughtByItsChecksumAndTheFileIsUsed) {
  Plan killed = plan(2, 0, {0, 1});
  killed.options.checkpoint_every = 5;
  killed.crash_step = 7;  // memory: step 6 (one whole copy per node); the file: step 5
  train(killed);
  fs::remove_all(fs::path(memory()) / "node1");
  const fs::path part = node_folder(0) / "part-0-of-1.tsnap";
  {
    std::fstream f(part, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(part) / 2));
    f.put('\x5a');
  }
  const Result resumed = train(plan(2, 0, {0, 1}, Resume::automatic));
  EXPECT_FALSE(resumed.from_memory);
  EXPECT_EQ(resumed.first_step, 5);
  EXPECT_NE(resumed.note.find("checksum mismatch"), std::string::npos) << resumed.note;
  EXPECT_NE(resumed.note.find(part.string()), std::string::npos) << resumed.note;
}

TEST_F(SnapshotTest, TooLittleMemoryIsRefusedBeforeTheFirstStep) {
  Plan p = plan(2, 1, {0, 1});
  p.hooks.snapshot_free_bytes = [](const std::string&) { return std::uint64_t{4096}; };
  try {
    train(p);
    ADD_FAILURE() << "too little memory was not refused";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("memory snapshots need"), std::string::npos) << what;
    EXPECT_NE(what.find("but only 0.0 MiB are free"), std::string::npos) << what;
    EXPECT_NE(what.find("--snapshot-every 0"), std::string::npos) << what;
  }
  EXPECT_TRUE(files(0).empty());
  EXPECT_FALSE(fs::exists(ckpt_dir() + "/checkpoint.tckp"));
  // One node short: every rank refuses (none is left to wait at its next collective).
  p.hooks.snapshot_free_bytes = [](const std::string& dir) {
    return dir.find("/node1/") != std::string::npos ? std::uint64_t{4096} : std::uint64_t{1} << 40;
  };
  p.options.overwrite = true;
  try {
    train(p);
    ADD_FAILURE() << "one node's too little memory was not refused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("memory snapshots"), std::string::npos) << e.what();
  }
}

TEST_F(SnapshotTest, ANewRunNeverTakesAnOlderRunsMemory) {
  Plan killed = plan(2, 0, {0, 1});
  killed.crash_step = 4;
  train(killed);
  ASSERT_FALSE(files(0).empty());
  // The checkpoint folder (and the run id in it) is deleted: a resume starts afresh, and the
  // older run's memory is freed.
  fs::remove_all(ckpt_dir());
  const Result fresh = train(plan(2, 0, {0, 1}, Resume::automatic));
  EXPECT_FALSE(fresh.resumed);
  EXPECT_EQ(fresh.first_step, 0);
  const Result whole = train({.ranks = 2, .options = {.steps = 9}});
  EXPECT_EQ(fresh.params, whole.params);
}

TEST_F(SnapshotTest, AutoTakesTheFirstAfterStep5AndThenEveryKStepsAgreedByTheRanks) {
  Plan p = plan(3, 1, {0, 1, 2});
  p.options.steps = 40;
  p.options.snapshots.every = kSnapshotAuto;
  const Result r = train(p);
  ASSERT_FALSE(r.snapshot_steps.empty());
  EXPECT_EQ(r.snapshot_steps[0], 5);
  const std::int64_t k = r.snapshot_every[0];
  EXPECT_GE(k, 1);
  for (int rank = 1; rank < 3; ++rank) EXPECT_EQ(r.snapshot_every[rank], k) << "rank " << rank;
  for (std::size_t i = 1; i < r.snapshot_steps.size(); ++i) EXPECT_EQ(r.snapshot_steps[i] % k, 0) << "K " << k;
  // A snapshot every K steps costs at most 2% of the training time, so it is never each step
  // for a model this small (a step is a few hundred microseconds, a snapshot more).
  EXPECT_GT(k, 1);
}

TEST(MemorySnapshots, AutoIntervalIsTheCostBoundOrYoungAndDalysWithAnMtbf) {
  using detail::auto_snapshot_interval;
  // A 0.5 s snapshot and 0.1 s steps: at most 2% of the time is one every 250 steps.
  EXPECT_EQ(auto_snapshot_interval(0.5, 0.1, 0.02, 0), 250);
  // With an MTBF of an hour: every sqrt(2 x 0.5 x 3600) = 60 s, 600 steps; of a day: 2940 s.
  EXPECT_EQ(auto_snapshot_interval(0.5, 0.1, 0.02, 3600), 600);
  EXPECT_EQ(auto_snapshot_interval(0.5, 0.1, 0.02, 86400), 2939);
  // Failures so frequent that the optimum is below a step: every step; a free snapshot too.
  EXPECT_EQ(auto_snapshot_interval(0.5, 0.1, 0.02, 1e-3), 1);
  EXPECT_EQ(auto_snapshot_interval(0, 0.1, 0.02, 0), 1);
}

TEST_F(SnapshotTest, AutoWithAnMtbfSnapshotsMoreOftenWhenNodesFailMoreOften) {
  Plan p = plan(2, 1, {0, 1});
  p.options.steps = 12;
  p.options.snapshots.every = kSnapshotAuto;
  // A failure every picosecond: sqrt(2 x C x 1e-12) rounds to 0 steps for any snapshot under
  // 10 s and step over 10 us: a snapshot every step. (1e-6 gave 2 on a loaded machine, where a
  // 0.5 s snapshot beside 0.5 ms steps made sqrt(2 x 0.5 x 1e-6) two steps.)
  p.options.snapshots.mtbf = 1e-12;
  const Result often = train(p);
  EXPECT_EQ(often.snapshot_every[0], 1);
  EXPECT_EQ(often.snapshot_steps, (std::vector<std::int64_t>{5, 6, 7, 8, 9, 10, 11}));
  fs::remove_all(ckpt_dir());
  p.options.snapshots.mtbf = 1e9;  // one in 30 years: far apart
  const Result rarely = train(p);
  EXPECT_GT(rarely.snapshot_every[0], 12);
  EXPECT_EQ(rarely.snapshot_steps, (std::vector<std::int64_t>{5}));
}

TEST(MemorySnapshots, AssembleRefusesPartsThatDoNotCoverTheWhole) {
  using detail::MemorySnapshots;
  const Tensor a = Tensor::from_floats({1, 2, 3, 4, 5, 6}, {2, 3});
  const StateDict first = MemorySnapshots::encode({{"w", {a.view(0, {4}), 0, {2, 3}}}});
  const StateDict second = MemorySnapshots::encode({{"w", {a.view(4, {2}), 4, {2, 3}}}});
  const StateDict whole = MemorySnapshots::assemble({second, first}, "test");
  EXPECT_EQ(whole.at("w").shape(), (Shape{2, 3}));
  EXPECT_EQ(whole.at("w").to_floats(), a.to_floats());
  try {
    MemorySnapshots::assemble({first}, "test");
    ADD_FAILURE() << "a missing part was not refused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("lacks elements [4, 6) of 'w'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tutti::train
