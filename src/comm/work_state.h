// Work::State: what a Work handle points to. Internal header.
//
// HostWork is the state of a collective completed by a host thread (the mpi backend's
// communication thread, or a collective that failed before it was issued). The first outcome
// wins: a collective failed by the watchdog stays failed if MPI ever returns from it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

#include "tutti/comm/communicator.h"

namespace tutti {

class Work::State {
 public:
  explicit State(CollectiveInfo info) : info_(std::move(info)) {}
  virtual ~State() = default;
  virtual bool test() = 0;
  virtual void wait() = 0;
  virtual void wait(const Stream& stream) { wait(); }
  const CollectiveInfo& info() const { return info_; }
  // The collective's own run time (Work::run_ms), negative while unknown. A backend sets it
  // before it marks the collective complete, so a waiter that saw completion sees it too.
  double run_ms() const { return run_ms_.load(std::memory_order_acquire); }
  void set_run_ms(double ms) { run_ms_.store(ms, std::memory_order_release); }

 private:
  CollectiveInfo info_;
  std::atomic<double> run_ms_{-1.0};
};

namespace detail {

class HostWork;

// Records the span of a traced collective (info.issued_ns != 0) on the trace's communication
// lane: from when it started running (start_ns; 0: from its issue) to end_ns, with its kind,
// count, dtype, bytes and backend.
void trace_collective(const CollectiveInfo& info, std::string_view backend, std::int64_t start_ns, std::int64_t end_ns);
// The same for a collective on a GPU stream, between two timing events recorded on it.
void trace_collective_on_device(const CollectiveInfo& info, const Event& begin, const Event& end);

// A backend that lets a waiting caller run queued collectives itself.
class WorkRunner {
 public:
  virtual ~WorkRunner() = default;
  // Runs queued collectives in order until `work` has finished, where it can; returns at
  // once where it cannot (then the backend's thread runs them).
  virtual void run_until(const HostWork& work) = 0;
};

class HostWork : public Work::State {
 public:
  using Work::State::State;
  // A Work that has already failed with `error`.
  static Work failed(CollectiveInfo info, std::exception_ptr error);

  // Outcomes; the first one wins, later ones are ignored.
  void complete();
  void fail(std::exception_ptr error);
  bool finished() const { return status_.load(std::memory_order_acquire) != kPending; }
  void set_runner(std::weak_ptr<WorkRunner> runner) { runner_ = std::move(runner); }

  bool test() override;
  // Spins briefly (a small collective completes in microseconds, and waking a sleeping
  // thread costs more), then sleeps until the outcome. The watchdog of the backend bounds it.
  void wait() override;

 private:
  static constexpr int kPending = 0, kDone = 1, kFailed = 2;
  void rethrow_if_failed() const;

  std::atomic<int> status_{kPending};
  std::exception_ptr error_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::atomic<bool> has_sleeper_{false};
  std::weak_ptr<WorkRunner> runner_;
};

}  // namespace detail
}  // namespace tutti
