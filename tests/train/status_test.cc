// train::Run's status file and accounting (src/train/run_status.cc), with ranks as threads: the
// file follows a run (running, then how it ended) with the step and the last complete
// checkpoint; a run killed and resumed is the second attempt of the same run, its accounting
// carried over from the file (rank-hours summed, the time that left nothing in the state
// counted as lost); $TUTTI_RESUME replaces RunOptions::resume (a launcher's say); the summary
// holds the accounting and the cost; a status file that cannot be written is refused at once;
// docs/launcher.md names every key.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "train/train_program.h"
#include "tutti/core/error.h"
#include "tutti/io/checkpoint.h"

namespace tutti::train {
namespace {

using testing::Plan;
using testing::Result;
using testing::train;

class StatusTest : public testing::RunDirTest {
 protected:
  std::string status() const { return (dir_ / "status.json").string(); }
  nlohmann::json read_json(const std::string& path) const {
    std::ifstream in(path);
    return nlohmann::json::parse(in);
  }
  Plan plan(std::int64_t steps) const {
    Plan p{.ranks = 2};
    p.options.steps = steps;
    p.options.checkpoint_dir = ckpt_dir();
    p.options.checkpoint_every = 2;
    p.options.checkpoint_mode = io::CheckpointMode::sync;  // the status then names the step's checkpoint
    p.options.status_file = status();
    return p;
  }
};

// Sets an environment variable for one scope.
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name); }
  const char* name;
};

TEST_F(StatusTest, AKilledRunAndItsResumeAreTwoAttemptsOfOneRunInTheStatusFile) {
  Plan first = plan(9);
  first.crash_step = 5;  // after the checkpoint of step 4, one step more, then gone without finish()
  train(first);
  const nlohmann::json killed = read_json(status());
  EXPECT_EQ(killed["format"], "tutti-status 1");
  EXPECT_EQ(killed["state"], "failed");
  EXPECT_NE(killed["message"].get<std::string>().find("left at step 5 without finish()"), std::string::npos)
      << killed.dump();
  EXPECT_EQ(killed["step"], 5);
  EXPECT_EQ(killed["checkpoint_step"], 4);
  EXPECT_EQ(killed["checkpoint"], ckpt_dir() + "/checkpoint.tckp");
  EXPECT_TRUE(killed["resumed_from"].is_null());
  EXPECT_EQ(killed["ranks"], 2);
  const nlohmann::json& a1 = killed["accounting"];
  EXPECT_EQ(a1["attempts"], 1);
  EXPECT_GT(a1["useful_seconds"].get<double>(), 0);
  EXPECT_EQ(a1["lost_seconds"], 0);
  // The checkpoint holds the training time of its 4 steps: less than the 5 steps done.
  const double saved_useful = static_cast<double>(get_int_scalar(
                                  io::load_checkpoint(ckpt_dir() + "/checkpoint.tckp").state, "train.useful_us")) /
                              1e6;
  EXPECT_GT(saved_useful, 0);
  EXPECT_LE(saved_useful, a1["useful_seconds"].get<double>() + 1e-3);

  // The relaunch, 0.3 s later, with resume asked by the environment (as tutti-launch does) over
  // RunOptions::resume = no.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ScopedEnv resume("TUTTI_RESUME", "auto");
  ScopedEnv id("TUTTI_ATTEMPT_ID", "attempt-2");
  const Result second = train(plan(9));
  EXPECT_TRUE(second.resumed);
  EXPECT_EQ(second.first_step, 4);
  const nlohmann::json done = read_json(status());
  EXPECT_EQ(done["state"], "completed");
  EXPECT_EQ(done["exit_code"], 0);
  EXPECT_EQ(done["step"], 9);
  EXPECT_EQ(done["first_step"], 4);
  EXPECT_EQ(done["resumed_from"], "checkpoint");
  EXPECT_EQ(done["checkpoint_step"], 9);
  EXPECT_EQ(done["attempt_id"], "attempt-2");
  EXPECT_EQ(done["run_started_unix"], killed["run_started_unix"]);
  EXPECT_GT(done["first_step_done_unix"].get<double>(), done["attempt_started_unix"].get<double>());
  const nlohmann::json& a2 = done["accounting"];
  EXPECT_EQ(a2["attempts"], 2);
  // Lost: everything before the relaunch that the checkpoint does not hold, the 0.3 s between included.
  const double before = done["attempt_started_unix"].get<double>() - done["run_started_unix"].get<double>();
  EXPECT_GE(before, 0.3);
  EXPECT_NEAR(a2["lost_seconds"].get<double>(), before - saved_useful, 2e-3);  // ms in the file
  EXPECT_GT(a2["useful_seconds"].get<double>(), saved_useful);
  EXPECT_GT(a2["rank_hours"].get<double>(), a1["rank_hours"].get<double>());
  EXPECT_LE(a2["goodput"].get<double>(), 1.0);
  EXPECT_NEAR(a2["goodput"].get<double>(), a2["useful_seconds"].get<double>() / a2["wall_seconds"].get<double>(), 1e-6);
}

TEST_F(StatusTest, ARunStartedAfreshBeginsItsOwnAccounting) {
  train(plan(3));
  const nlohmann::json first = read_json(status());
  EXPECT_EQ(first["state"], "completed");
  Plan again = plan(3);
  again.options.overwrite = true;
  train(again);
  const nlohmann::json second = read_json(status());
  EXPECT_EQ(second["accounting"]["attempts"], 1);
  EXPECT_GT(second["run_started_unix"].get<double>(), first["run_started_unix"].get<double>());
}

TEST_F(StatusTest, TheSummaryHoldsTheAccountingAndTheCost) {
  Plan p = plan(4);
  std::filesystem::create_directories(dir_);
  p.summary = (dir_ / "summary.json").string();
  p.options.price_per_hour = 2.5;
  p.options.work_per_step = 24;  // samples of the global batch
  train(p);
  const nlohmann::json s = read_json(p.summary);
  EXPECT_EQ(s["status"], "completed");
  EXPECT_EQ(s["attempts"], 1);
  const double rank_hours = s["rank_hours"].get<double>();
  EXPECT_GT(rank_hours, 0);
  // 2 ranks for the run's wall time, at most (the summary is written a moment later).
  EXPECT_LE(rank_hours, 2 * s["wall_seconds"].get<double>() / 3600 * 1.01 + 1e-9);
  EXPECT_DOUBLE_EQ(s["cost"].get<double>(), 2.5 * rank_hours);
  EXPECT_NEAR(s["cost_per_million_samples"].get<double>(), s["cost"].get<double>() / (4 * 24 / 1e6), 1e-12);
  EXPECT_GT(s["goodput"].get<double>(), 0);
  EXPECT_LE(s["goodput"].get<double>(), 1);
}

TEST_F(StatusTest, TheEnvironmentsResumeAndAnUnwritableStatusFileAreCheckedAtTheStart) {
  {
    ScopedEnv resume("TUTTI_RESUME", "sometimes");
    try {
      train(plan(2));
      ADD_FAILURE() << "a bad $TUTTI_RESUME was taken";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("$TUTTI_RESUME is 'sometimes'"), std::string::npos) << e.what();
    }
  }
  {
    // $TUTTI_STATUS_FILE names it when RunOptions::status_file does not; a file in its way is no folder.
    std::filesystem::create_directories(dir_);
    std::ofstream((dir_ / "blocker").string()) << "x";
    const std::string bad = (dir_ / "blocker" / "status.json").string();
    ScopedEnv file("TUTTI_STATUS_FILE", bad.c_str());
    Plan p = plan(2);
    p.options.status_file.clear();
    try {
      train(p);
      ADD_FAILURE() << "an unwritable status file was taken";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("the status file " + bad), std::string::npos) << e.what();
    }
  }
}

TEST_F(StatusTest, EveryKeyOfTheStatusIsDocumented) {
  train(plan(2));
  const nlohmann::json s = read_json(status());
  std::ifstream in(std::string(TUTTI_SOURCE_DIR) + "/docs/launcher.md");
  std::stringstream docs;
  docs << in.rdbuf();
  ASSERT_FALSE(docs.str().empty());
  std::vector<std::string> keys;
  for (const auto& [key, value] : s.items()) keys.push_back(key);
  for (const auto& [key, value] : s["accounting"].items()) keys.push_back(key);
  EXPECT_GE(keys.size(), 30u);
  for (const std::string& key : keys) {
    EXPECT_NE(docs.str().find("`" + key + "`"), std::string::npos) << "docs/launcher.md does not name `" << key << "`";
  }
}

}  // namespace
}  // namespace tutti::train
