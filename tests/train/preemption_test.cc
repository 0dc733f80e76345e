// Preemption notices (train/preemption.h, src/train/preemption.cc): what counts as a notice in
// each cloud's answer; the watcher on a file and on an HTTP service that plays the metadata
// server; and train::Run with ranks as threads: a notice on one rank stops every rank after the
// same step with a memory snapshot and the checkpoint of that step, names the host in the
// Outcome and the status file, and the resumed run ends as the uninterrupted one.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "train/train_program.h"
#include "tutti/core/error.h"
#include "tutti/train/preemption.h"

#ifdef TUTTI_TEST_HTTP  // tests/train/CMakeLists.txt: tutti built with cpp-httplib
#include <httplib.h>
#endif

namespace tutti::train {
namespace {

using testing::Plan;
using testing::Result;
using testing::train;

TEST(PreemptionNotice, EachCloudsAnswer) {
  // AWS: 404 until an action is scheduled, then 200 with it.
  EXPECT_FALSE(is_preemption_notice("aws", 404, "<html>Not Found</html>"));
  EXPECT_TRUE(is_preemption_notice("aws", 200, R"({"action": "terminate", "time": "2026-12-06T14:30:00Z"})"));
  // GCE: "FALSE" until the preemption, "TRUE" then.
  EXPECT_FALSE(is_preemption_notice("gce", 200, "FALSE"));
  EXPECT_TRUE(is_preemption_notice("gce", 200, "TRUE\n"));
  // Azure: scheduled events; only a Preempt is one.
  EXPECT_FALSE(is_preemption_notice("azure", 200, R"({"DocumentIncarnation": 1, "Events": []})"));
  EXPECT_FALSE(is_preemption_notice("azure", 200, R"({"Events": [{"EventType": "Reboot"}]})"));
  EXPECT_TRUE(is_preemption_notice(
      "azure", 200, R"({"Events": [{"EventId": "A", "EventType": "Preempt", "ResourceType": "VirtualMachine"}]})"));
  EXPECT_FALSE(is_preemption_notice("azure", 200, "not json"));
  // A service of one's own.
  EXPECT_FALSE(is_preemption_notice("url", 200, ""));
  EXPECT_FALSE(is_preemption_notice("url", 200, "false"));
  EXPECT_FALSE(is_preemption_notice("url", 503, "TRUE"));
  EXPECT_TRUE(is_preemption_notice("url", 200, "reclaimed in 30 s"));
}

TEST(PreemptionWatcher, RefusesWhatItDoesNotKnow) {
  try {
    PreemptionWatcher w({.source = "ftp://x"}, "h");
    ADD_FAILURE() << "an unknown source was taken";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("none of aws, gce, azure"), std::string::npos) << e.what();
  }
  EXPECT_THROW(PreemptionWatcher({.source = "file:/x", .poll_seconds = 0}, "h"), InvalidArgument);
  PreemptionWatcher off({}, "h");
  EXPECT_FALSE(off.active());
  EXPECT_FALSE(off.noticed());
}

TEST(PreemptionWatcher, SeesAFileNamedForItsHost) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tutti_notice_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  PreemptionWatcher w({.source = "file:" + (dir / "notice-{host}").string(), .poll_seconds = 0.01}, "node7");
  EXPECT_EQ(w.source(), (dir / "notice-node7").string());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(w.noticed());
  std::ofstream(dir / "notice-node6") << "another host's";
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(w.noticed());
  std::ofstream(dir / "notice-node7") << "terminate";
  for (int i = 0; i < 200 && !w.noticed(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(w.noticed());
  // The file is created before it is written: a poll between the two sees it empty and waits
  // one poll (this test failed once in 46 runs under load when the first sight counted).
  EXPECT_NE(w.notice().find("terminate"), std::string::npos) << w.notice();
  // A file that stays empty is a notice too, one poll later.
  PreemptionWatcher empty({.source = "file:" + (dir / "empty").string(), .poll_seconds = 0.01}, "node7");
  std::ofstream(dir / "empty").close();
  for (int i = 0; i < 200 && !empty.noticed(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(empty.noticed());
  std::filesystem::remove_all(dir);
}

#ifdef TUTTI_TEST_HTTP
TEST(PreemptionWatcher, PollsAnHttpServiceThatPlaysTheMetadataServer) {
  // GCE's answer: FALSE, then TRUE after 5 polls; the header GCE requires, checked.
  httplib::Server server;
  std::atomic<int> polls{0};
  std::atomic<bool> header_seen{true};
  server.Get("/computeMetadata/v1/instance/preempted", [&](const httplib::Request& req, httplib::Response& res) {
    if (req.get_header_value("Metadata-Flavor") != "Google") header_seen = false;
    res.set_content(++polls > 5 ? "TRUE" : "FALSE", "text/plain");
  });
  server.Get("/node3/spot", [&](const httplib::Request&, httplib::Response& res) { res.status = 404; });
  const int port = server.bind_to_any_port("127.0.0.1");
  std::thread serve([&] { server.listen_after_bind(); });
  const std::string base = "http://127.0.0.1:" + std::to_string(port);
  {
    PreemptionWatcher w({.source = base + "/computeMetadata/v1/instance/preempted", .poll_seconds = 0.01}, "h");
    for (int i = 0; i < 500 && !w.noticed(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_TRUE(w.noticed());
    EXPECT_GE(polls.load(), 6);
    EXPECT_NE(w.notice().find("TRUE"), std::string::npos) << w.notice();
    // A 404 is no notice; a port nobody listens on is no notice either, and says why.
    PreemptionWatcher none({.source = base + "/{host}/spot", .poll_seconds = 0.01}, "node3");
    PreemptionWatcher away({.source = "http://127.0.0.1:1/x", .poll_seconds = 0.01, .timeout_seconds = 0.2}, "h");
    // Until `away`'s first poll has given up (0.2 s, more on a loaded machine), `none` polling
    // meanwhile. It was a fixed 0.3 s: the one timing this test rested on, and the test failed
    // once under ctest -j4 (its output not kept, so the cause is a guess).
    for (int i = 0; i < 500 && away.last_error().empty(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_FALSE(none.noticed());
    EXPECT_TRUE(none.last_error().empty()) << none.last_error();
    EXPECT_FALSE(away.noticed());
    EXPECT_NE(away.last_error().find("no answer"), std::string::npos) << away.last_error();
  }
  server.stop();
  serve.join();
}
#endif

class PreemptionRunTest : public testing::RunDirTest {};

TEST_F(PreemptionRunTest, ANoticeOnOneRankStopsEveryRankWithASnapshotAndACheckpointOfTheSameStep) {
  Plan p{.ranks = 3, .zero = 1};
  p.options.steps = 200;
  p.options.checkpoint_dir = ckpt_dir();
  p.options.snapshots.every = 50;
  p.options.snapshots.dir = memory();
  p.options.snapshots.nodes = {0, 1, 2};
  p.options.status_file = (dir_ / "status.json").string();
  p.options.preemption = {.source = "file:" + (dir_ / "notice-{host}").string(), .poll_seconds = 0.001};
  p.notice_rank = 1;
  p.notice_step = 4;
  p.notice_file = (dir_ / "notice-rank1").string();
  std::filesystem::create_directories(dir_);
  const Result stopped = train(p);
  const std::int64_t step = stopped.steps[0];
  EXPECT_GE(step, 4);
  EXPECT_LT(step, 200);
  for (const Outcome& o : stopped.outcomes) {
    EXPECT_EQ(o.status, Outcome::Status::stopped);
    EXPECT_EQ(o.preempted_hosts, (std::vector<std::string>{"rank1"}));
    EXPECT_EQ(o.signal, 0);
  }
  EXPECT_EQ(stopped.outcomes[0].exit_code, 75);
  EXPECT_NE(stopped.outcomes[0].message.find("by a preemption notice for rank1 (on rank 1)"), std::string::npos)
      << stopped.outcomes[0].message;
  // The memory snapshot and the checkpoint of the stop step: nothing is lost either way.
  EXPECT_EQ(stopped.snapshot_steps.back(), step);
  EXPECT_EQ(stopped.checkpoint_steps.back(), step);
  std::ifstream in(p.options.status_file);
  const nlohmann::json status = nlohmann::json::parse(in);
  EXPECT_EQ(status["state"], "stopped");
  EXPECT_EQ(status["preempted_hosts"], nlohmann::json::array({"rank1"}));
  EXPECT_EQ(status["checkpoint_step"], step);
  // Resumed on the two others, 8 steps more: as an uninterrupted 2-rank run (only the order of
  // the sums over ranks differs before the stop).
  Plan rest{.ranks = 2, .zero = 1};
  rest.options.steps = step + 8;
  rest.options.checkpoint_dir = ckpt_dir();
  rest.options.resume = Resume::yes;
  const Result resumed = train(rest);
  EXPECT_EQ(resumed.first_step, step);
  const Result whole = train({.ranks = 2, .zero = 1, .options = {.steps = step + 8}});
  EXPECT_LE(testing::relative_difference(resumed.params, whole.params), 1e-5);
}

}  // namespace
}  // namespace tutti::train
