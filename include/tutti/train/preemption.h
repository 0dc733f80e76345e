// Preemption notices: clouds announce that they will take a spot (preemptible) machine back
// before they do. AWS gives two minutes (instance metadata, spot/instance-action), GCE about
// 30 s (metadata, instance/preempted), Azure a Scheduled Event of type "Preempt" (at least
// 30 s). A PreemptionWatcher polls one such source from a thread of its own. train::Run uses
// it (RunOptions::preemption): on a notice on any rank, every rank stops after the current
// step, with a memory snapshot (when they are on) and then the checkpoint file, and the run's
// Outcome and status file name the doomed hosts, which tutti-launch leaves out of its relaunch
// (docs/launcher.md, "Spot notices").
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace tutti::train {

struct PreemptionOptions {
  // Where notices come from ("": nowhere, no thread):
  //   "aws"    http://169.254.169.254/latest/meta-data/spot/instance-action (IMDSv2: a token is
  //            asked first): an answer 200 is a notice ({"action": "terminate", "time": ...}),
  //            404 is none
  //   "gce"    http://metadata.google.internal/computeMetadata/v1/instance/preempted (header
  //            Metadata-Flavor: Google): "TRUE" is a notice
  //   "azure"  http://169.254.169.254/metadata/scheduledevents?api-version=2020-07-01 (header
  //            Metadata: true): an event of EventType "Preempt" is a notice
  //   "http://HOST[:PORT]/PATH"  any service of your own: an answer 200 whose body is not
  //            empty, "FALSE", "false" or "0" is a notice
  //   "file:PATH"  a notice once the file exists (tests, or a node agent that writes one); an
  //            empty file counts one poll later (its writer may be between creating and
  //            writing it: the notice then quotes what it wrote)
  // "{host}" in a URL or a path is replaced by this host's name (one service for many nodes).
  // URLs need tutti built with cpp-httplib (libcpp-httplib-dev); plain HTTP only, as the
  // metadata services are.
  std::string source;
  double poll_seconds = 2;     // between two polls (> 0)
  double timeout_seconds = 1;  // for one HTTP request (> 0): a source that does not answer is no notice
};

// Whether a source's answer is a notice: `kind` is "aws", "gce", "azure" or "url" (any other
// URL), `status` the HTTP status, `body` the answer. Not collective; no I/O.
bool is_preemption_notice(std::string_view kind, int status, std::string_view body);

class PreemptionWatcher {
 public:
  // Starts polling when options.source is set (`host`: this machine's name for "{host}").
  // Throws InvalidArgument for a source it does not know, bad numbers, and a URL source in a
  // build without cpp-httplib.
  PreemptionWatcher(PreemptionOptions options, std::string host);
  ~PreemptionWatcher();  // stops the thread (within one HTTP timeout)
  PreemptionWatcher(const PreemptionWatcher&) = delete;
  PreemptionWatcher& operator=(const PreemptionWatcher&) = delete;

  bool active() const { return !source_.empty(); }
  // A notice was seen (and stays seen). Thread-safe.
  bool noticed() const { return noticed_.load(std::memory_order_acquire); }
  // What the source said with the notice ("" before one); the last poll's failure ("" when the
  // source answered: a source that cannot be reached never stops a run, but says why here).
  std::string notice() const;
  std::string last_error() const;
  const std::string& source() const { return source_; }  // with {host} replaced

 private:
  void poll_loop();
  bool poll_once();  // true on a notice
  PreemptionOptions options_;
  std::string source_;
  std::string kind_;  // aws, gce, azure, url, file
  std::atomic<bool> noticed_{false};
  mutable std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::string notice_, error_;
  bool empty_file_seen_ = false;  // "file:": the file existed, empty, at the last poll
  std::thread thread_;
};

}  // namespace tutti::train
