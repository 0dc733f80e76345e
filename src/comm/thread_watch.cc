// A ThreadGroup's watchdogs (ThreadGroupOptions::watchdog): one Watchdog per rank, a progress
// board, the control channel between the ranks (control_thread.h), and each rank's
// communicator watched as the mpi backend is.
#include "comm/thread_group_impl.h"

namespace tutti {
namespace detail {

// What a rank's watchdog watches: that rank's communicator.
class RankWatch final : public Watched {
 public:
  RankWatch(ThreadGroup::Impl* group, int rank) : group_(group), rank_(rank) {}
  void poll(Watchdog& watchdog) override { group_->poll(rank_, watchdog); }

 private:
  ThreadGroup::Impl* group_;
  int rank_;
};

}  // namespace detail

void ThreadGroup::Impl::start_watchdogs() {
  const auto n = static_cast<std::size_t>(size);
  hub = std::make_unique<detail::ThreadControlHub>(size, [this](const detail::InProcessEnd& e) { on_end(e); });
  boards = detail::ProgressBoard::open_in_process(size);
  outstanding.resize(n);
  broken.resize(n);
  for (int r = 0; r < size; ++r) {
    const auto ri = static_cast<std::size_t>(r);
    std::shared_ptr<detail::ControlChannel> control = hub->channel(r);
    agreement.push_back(control->duplicate());
    watches.push_back(std::make_shared<detail::RankWatch>(this, r));
    auto w = std::make_unique<detail::Watchdog>(/*process_wide=*/false);
    if (!boards.empty()) {
      boards[ri]->set_phase(detail::Phase::running);
      w->set_board(boards[ri]);
    }
    w->attach(std::move(control));
    w->watch(watches[ri]);
    watchdogs.push_back(std::move(w));
  }
}

std::exception_ptr ThreadGroup::Impl::ended_error() const {
  const std::string text = "rank " + std::to_string(end->rank) + " ended the job: " + end->cause;
  if (end->exit_code == detail::kExitTimeout)
    return std::make_exception_ptr(TimeoutError(text, "thread_group.cc", error_rank()));
  return std::make_exception_ptr(BackendError(text, "thread_group.cc", error_rank()));
}

std::exception_ptr ThreadGroup::Impl::issue_watched(int rank, const CollectiveInfo& info,
                                                    const std::shared_ptr<ThreadWork>& work) {
  const auto r = static_cast<std::size_t>(rank);
  {
    std::lock_guard lock(mutex);
    if (end) return ended_error();
    if (!broken[r].empty()) {
      return detail::timeout_error("communicator unusable: an earlier collective missed its deadline (" + broken[r] +
                                   ")");
    }
    outstanding[r].push_back(Outstanding{work, Clock::now()});
  }
  if (!boards.empty()) {
    boards[r]->issued(0, info.seq);
    boards[r]->started(0, info);
  }
  // As the mpi backend: counts that differ must not reach the data movement.
  if (debug || detail::largest_message_bytes(info, size) > detail::kAgreeAboveBytes) {
    try {
      // Bounded (a few deadlines): a stuck agreement is the watchdog's to report first.
      if (!detail::agree_polled(*agreement[r], info, 4 * timeout_s + 2)) {
        return detail::timeout_error("TIMEOUT: the agreement on collective " + info.str() + " never completed");
      }
    } catch (...) {
      return detail::in_context(std::current_exception(),
                                "agreeing on collective " + info.str() + " on backend thread");
    }
  }
  return nullptr;
}

void ThreadGroup::Impl::poll(int rank, detail::Watchdog& watchdog) {
  const auto r = static_cast<std::size_t>(rank);
  CollectiveInfo info;
  double waited = 0;
  std::size_t behind = 0;
  {
    std::lock_guard lock(mutex);
    auto& q = outstanding[r];
    while (!q.empty() && q.front().work->finished()) q.pop_front();
    if (q.empty() || !broken[r].empty() || end) return;
    waited = std::chrono::duration<double>(Clock::now() - q.front().since).count();
    if (waited <= timeout_s) return;
    info = q.front().work->info();
    behind = q.size() - 1;
  }
  // Without the lock: ending the job fails every rank's Works (on_end).
  const std::optional<std::string> report =
      watchdog.collective_missed("thread", info, 0, timeout_s, waited, behind, debug, options.abort_on_timeout);
  if (!report) return;  // a lower rank reports it, or the job is ending
  std::lock_guard lock(mutex);
  broken[r] = *report;
  for (auto& o : outstanding[r]) o.work->fail(detail::timeout_error(*report));
  outstanding[r].clear();
}

void ThreadGroup::Impl::on_end(const detail::InProcessEnd& e) {
  std::lock_guard lock(mutex);
  end = e;
  const std::exception_ptr error = ended_error();
  for (auto& q : outstanding) {
    for (auto& o : q) o.work->fail(error);
  }
  for (auto& [seq, p] : pending) {
    for (auto& w : p.works) {
      if (w) w->fail(error);
    }
  }
  for (auto& c : scheduled) c.work->fail(error);
  cv.notify_all();
}

void ThreadGroup::Impl::leave(int rank, const std::exception_ptr& error) {
  std::string what = "an exception of unknown type";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  detail::Watchdog& w = *watchdogs[static_cast<std::size_t>(rank)];
  if (!w.leave(1.0, what)) w.left(1);
}

}  // namespace tutti
