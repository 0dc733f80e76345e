// The control channel between the thread ranks of a ThreadGroup (see control.h): messages are
// queues between threads, an agreement is a rendezvous, and ending the job calls back into the
// group (which fails every rank's Works with the cause) instead of ending the process.
// Internal header.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "comm/control.h"

namespace tutti::detail {

// How a job of thread ranks ended: which rank's watchdog ended it, with which exit code (the
// Job's under mpirun: kExitTimeout...), and the watchdog's message.
struct InProcessEnd {
  int rank = -1;
  int exit_code = 0;
  std::string cause;
};

// What the channels of one group share. Thread-safe.
class ThreadControlHub {
 public:
  // on_end: called once, on the thread that ends the job, after the end is recorded.
  ThreadControlHub(int size, std::function<void(const InProcessEnd&)> on_end);
  ~ThreadControlHub();
  ThreadControlHub(const ThreadControlHub&) = delete;
  ThreadControlHub& operator=(const ThreadControlHub&) = delete;

  // Rank r's end of the group's first channel.
  std::unique_ptr<ControlChannel> channel(int rank);
  // The end, once some rank ended the job.
  std::optional<InProcessEnd> ended() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace tutti::detail
