// train::Run with PowerSGD (a ddp::PowerSgdHook, whose state train::State registers), ranks as
// threads: the checkpoint file holds PowerSGD's state, so a run stopped mid-way (compressing)
// and resumed ends as the uninterrupted one, bit for bit; a resume from a memory snapshot, which
// keeps no PowerSGD state, restarts PowerSGD and note() says so; a run without PowerSGD resumes
// from the file and note() says that its PowerSGD state is not used.
#include <gtest/gtest.h>

#include <filesystem>

#include "train/train_program.h"
#include "tutti/io/checkpoint.h"

namespace tutti::train {
namespace {

using testing::Plan;
using testing::Result;
using testing::train;

class PowerSgdResumeTest : public testing::RunDirTest {
 protected:
  // 2 ranks, 10 steps, PowerSGD at rank 2 from step 3 (both weight matrices compressed).
  static Plan plan(std::int64_t steps) {
    Plan p{.ranks = 2};
    p.options.steps = steps;
    p.powersgd = ddp::PowerSgdOptions{.rank = 2, .start_step = 3};
    return p;
  }
};

TEST_F(PowerSgdResumeTest, TheFileResumesExactlyAndAMemorySnapshotRestartsSayingSo) {
  const Result whole = train(plan(10));
  Plan first = plan(6);
  first.options.checkpoint_dir = ckpt_dir();
  train(first);
  const io::Checkpoint ckpt = io::load_checkpoint(ckpt_dir() + "/checkpoint.tckp");
  EXPECT_EQ(get_int_scalar(ckpt.state, "powersgd.step"), 6);
  EXPECT_EQ(ckpt.state.count("powersgd.rank1.error.2.weight"), 1U) << "every rank's error, gathered to rank 0";
  Plan rest = plan(10);
  rest.options.checkpoint_dir = ckpt_dir();
  rest.options.resume = Resume::yes;
  const Result resumed = train(rest);
  EXPECT_EQ(resumed.first_step, 6);
  EXPECT_EQ(resumed.note, "");
  EXPECT_EQ(resumed.params, whole.params) << "the resumed PowerSGD run ends other than the uninterrupted one";
  Plan plain = rest;  // from the resumed run's last checkpoint (step 10)
  plain.powersgd.reset();
  plain.options.steps = 12;
  const Result without = train(plain);
  EXPECT_EQ(without.first_step, 10);
  EXPECT_NE(without.note.find("the checkpoint's 'powersgd.' state"), std::string::npos) << without.note;
  EXPECT_NE(without.note.find("is read by no part of this run: not used"), std::string::npos) << without.note;

  // Memory snapshots every 3 steps, killed after step 7: the resume takes step 6 from memory,
  // where PowerSGD's state is not, and says that PowerSGD starts afresh.
  std::filesystem::remove_all(dir_);
  Plan killed = plan(10);
  killed.options.checkpoint_dir = ckpt_dir();
  killed.options.snapshots.every = 3;
  killed.options.snapshots.dir = memory();
  killed.options.snapshots.nodes = {0, 1};
  killed.crash_step = 7;
  train(killed);
  Plan again = killed;
  again.crash_step = 0;
  again.options.resume = Resume::automatic;
  const Result from_memory = train(again);
  EXPECT_TRUE(from_memory.from_memory) << from_memory.note;
  EXPECT_NE(from_memory.note.find("memory snapshots keep no PowerSGD state: PowerSGD starts afresh"), std::string::npos)
      << from_memory.note;
  EXPECT_NE(from_memory.params, whole.params) << "PowerSGD restarted, yet the run ends as the uninterrupted one";
}

}  // namespace
}  // namespace tutti::train
