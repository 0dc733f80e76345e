// The state of a ThreadGroup (see thread_group.h and thread_group.cc), shared by
// thread_group.cc (the collectives, the bootstrap) and thread_watch.cc (the watchdogs).
// Internal header.
#pragma once

#include "tutti/comm/thread_group.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/backend.h"
#include "comm/control_thread.h"
#include "comm/progress.h"
#include "comm/thread_reduce.h"
#include "comm/watchdog.h"
#include "comm/work_state.h"
#include "tutti/core/error.h"

namespace tutti {
namespace detail {

using Clock = std::chrono::steady_clock;

// A Work completed by the group's helper thread (or failed by a fault, a mismatch or a timeout).
class ThreadWork final : public Work::State {
 public:
  // watched: the rank's watchdog enforces the deadline; the wait's own limit is only a
  // backstop (several deadlines), so that a test whose watchdog does not act fails, not hangs.
  ThreadWork(CollectiveInfo info, double timeout_s, bool watched)
      : Work::State(std::move(info)), timeout_s_(watched ? 4 * timeout_s + 2 : timeout_s), watched_(watched) {}

  bool test() override {
    std::lock_guard lock(mutex_);
    if (error_) std::rethrow_exception(error_);
    return done_;
  }
  void wait() override {
    if (on_wait) on_wait();
    std::unique_lock lock(mutex_);
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
    if (!cv_.wait_until(lock, deadline, [&] { return done_ || error_ != nullptr; }) && watched_) {
      error_ = std::make_exception_ptr(TimeoutError("collective " + info().str() + " did not complete within " +
                                                        std::to_string(timeout_s_) + " s and no watchdog ended it",
                                                    "thread_group.cc", error_rank()));
    } else if (!done_ && !error_) {
      error_ = std::make_exception_ptr(TimeoutError(
          "TIMEOUT: collective " + info().str() + " did not complete within " + std::to_string(timeout_s_) + " s (" +
              (missing_.empty() ? std::string("every rank issued it") : "not issued by rank(s) " + missing_) + ")",
          "thread_group.cc", error_rank()));
    }
    if (error_) std::rethrow_exception(error_);
  }
  void complete() {
    std::lock_guard lock(mutex_);
    if (done_ || error_) return;
    done_ = true;
    cv_.notify_all();
  }
  void fail(std::exception_ptr e) {
    std::lock_guard lock(mutex_);
    if (done_ || error_) return;
    error_ = std::move(e);
    cv_.notify_all();
  }
  bool finished() {
    std::lock_guard lock(mutex_);
    return done_ || error_ != nullptr;
  }
  // Called when a thread starts waiting (before the lock): releases a reorder hold.
  std::function<void()> on_wait;
  void set_missing(std::string ranks) {
    std::lock_guard lock(mutex_);
    missing_ = std::move(ranks);
  }

 private:
  double timeout_s_;
  bool watched_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::string missing_;
};

inline bool same_call(const CollectiveInfo& a, const CollectiveInfo& b) {
  return a.kind == b.kind && a.op == b.op && a.dtype == b.dtype && a.count == b.count && a.root == b.root;
}

inline std::string info_without_label(CollectiveInfo info) {
  info.label.clear();
  return info.str();
}

// Every rank's sendrecv call (index = rank): "" when the peers form a permutation (rank r sends
// to s exactly when s receives from r), else an error naming the first pair that disagrees.
inline std::string sendrecv_peers_mismatch(const std::vector<Communicator::Collective>& calls) {
  for (std::size_t r = 0; r < calls.size(); ++r) {
    const int to = calls[r].info.send_to;
    const int back = calls[static_cast<std::size_t>(to)].info.recv_from;
    if (back == static_cast<int>(r)) continue;
    return "sendrecv peers inconsistent: rank " + std::to_string(r) + " issued " + info_without_label(calls[r].info) +
           " but rank " + std::to_string(to) + " issued " +
           info_without_label(calls[static_cast<std::size_t>(to)].info) + " (rank r must send to s exactly when " +
           "s receives from r)";
  }
  return "";
}

class RankWatch;

}  // namespace detail

struct ThreadGroup::Impl {
  using Clock = detail::Clock;
  using ThreadWork = detail::ThreadWork;
  using RankWatch = detail::RankWatch;
  struct Pending {
    std::vector<Communicator::Collective> calls;  // per rank (undefined info.seq 0 until issued)
    std::vector<std::shared_ptr<ThreadWork>> works;
    std::vector<bool> arrived;
    int count = 0;
  };
  struct Completion {  // rank r's Work of collective seq
    Clock::time_point at;
    int rank;
    std::uint64_t seq;
    std::shared_ptr<ThreadWork> work;
    Tensor output;
    std::vector<char> result;     // what the output receives (empty: nothing)
    std::exception_ptr error;     // fails instead
    std::uint64_t waits_for = 0;  // reorder: completes after this rank's Work of that seq
  };

  int size = 1;
  CommOptions options;
  double timeout_s = 300;
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::uint64_t, Pending> pending;
  std::vector<CollectiveFault> faults;
  std::deque<Completion> scheduled;
  std::set<std::pair<int, std::uint64_t>> waited;           // (rank, seq) a thread waits for before it was scheduled
  std::vector<std::uint64_t> completed_up_to;               // per rank: every Work with seq <= this is complete
  std::vector<std::vector<std::uint64_t>> completed_above;  // per rank: completed seqs beyond that
  bool stopping = false;
  std::thread helper;
  std::vector<std::unique_ptr<Communicator>> comms;
  std::vector<std::unique_ptr<Bootstrap>> boots;
  // node_groups: the k-th call's groups, by (k, 0 intra / 1 inter, color); per rank its calls.
  std::map<std::tuple<std::uint64_t, int, int>, std::shared_ptr<ThreadGroup>> subgroups;
  std::vector<std::uint64_t> node_group_calls;
  // The bootstrap's rendezvous: the k-th allgather of every rank meets the others' k-th.
  struct Exchange {
    std::vector<std::string> values;
    int deposited = 0, taken = 0;
  };
  std::map<std::uint64_t, Exchange> exchanges;
  std::vector<std::uint64_t> exchange_count;

  // ---- with watchdogs (under mutex unless said) ----
  bool watched = false;
  bool debug = false;
  std::unique_ptr<detail::ThreadControlHub> hub;
  std::vector<std::shared_ptr<detail::ProgressBoard>> boards;      // per rank (empty: none)
  std::vector<std::unique_ptr<detail::ControlChannel>> agreement;  // per rank, its thread's
  std::vector<std::shared_ptr<RankWatch>> watches;                 // per rank
  std::vector<std::unique_ptr<detail::Watchdog>> watchdogs;        // per rank
  struct Outstanding {
    std::shared_ptr<ThreadWork> work;
    Clock::time_point since;
  };
  std::vector<std::deque<Outstanding>> outstanding;  // per rank, in issue order
  std::vector<std::string> broken;                   // per rank: the report of a missed deadline
  std::optional<detail::InProcessEnd> end;

  void start_watchdogs();
  std::exception_ptr ended_error() const;
  // Rank `rank` issues `info` (its Work: `work`): in progress from now; agreed on first where
  // the mpi backend would. Returns the error to fail the Work with instead.
  std::exception_ptr issue_watched(int rank, const CollectiveInfo& info, const std::shared_ptr<ThreadWork>& work);
  // The watchdog of `rank`, every tick.
  void poll(int rank, detail::Watchdog& watchdog);
  // A rank's watchdog ended the job: every rank's Works fail.
  void on_end(const detail::InProcessEnd& e);
  // Rank `rank`'s body threw `error`: leave as a Job left by an exception does.
  void leave(int rank, const std::exception_ptr& error);

  bool is_complete(int rank, std::uint64_t seq) const;
  void mark_complete(int rank, std::uint64_t seq);

  // A thread waits for rank's Work of `seq`: a reorder hold on it ends (the Works after it that
  // are due complete first), so that a caller that waits before it issues more is not stuck.
  void release_hold(int rank, std::uint64_t seq);

  Work submit(int rank, Communicator::Collective c);

  // Under the lock: every rank has issued collective `seq`; schedule each rank's completion.
  void execute(std::uint64_t seq, Pending& p);

  // The helper thread: carries out due completions, in time order, respecting reorder holds.
  void run_helper();

  std::vector<std::string> allgather(int rank, std::string_view mine);
};

}  // namespace tutti
