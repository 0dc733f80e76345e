// The watchdog: the one deadline mechanism of a job, and how a job ends when something goes
// wrong on one rank. Internal header.
//
// One per process, made by the Job before MPI_Init and destroyed after MPI_Finalize (and one
// per rank of a ThreadGroup made with watchdogs). Its thread wakes every kTick and
//   - checks the deadlines of blocking regions: the Job's start-up (MPI_Init, the
//     communicators, the NCCL id exchange), its own blocking MPI calls, MPI_Finalize;
//   - polls every backend (Watched) for collectives past their deadline (and NCCL's
//     asynchronous errors);
//   - listens on the control channel (comm/control.h: under mpirun a duplicate of
//     MPI_COMM_WORLD, for thread ranks queues between threads) for the other ranks:
//     "I am ending the job because...", "an exception is leaving my Job", "where are you?".
//
// Ending the job (end_job): print the cause once, with this rank's number; tell every other
// rank why, wait (at most kAckWait) until they have printed that they end because of this
// rank; abort the NCCL communicators; the channel ends the job (MPI: MPI_Abort, and Open MPI
// kills every rank within about 0.1 s; thread ranks: every rank's Works fail with the cause,
// the process lives on). Before a channel is attached: _exit, unless the watchdog is told not
// to end its process (thread ranks).
//
// A rank told that another rank is ending prints one line naming that rank and its cause and
// waits for the launcher to end it; if nothing has ended it after kPeerKillWait, it ends the
// job itself; after kPeerGoneWait already when the ending rank runs on this host and its
// process is gone (its MPI_Abort did not reach the launcher: this host is cut off).
//
// Which rank reports a missed deadline: every rank waiting in the collective sees the deadline
// pass at about the same time; the lowest of them reports at once and the others give it
// kDeferReport to do so (then they print one line each, not N reports).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/control.h"
#include "comm/progress.h"
#include "tutti/comm/communicator.h"

namespace tutti::detail {

// Exit codes of a job that tutti ends (given to MPI_Abort; recorded by thread ranks).
inline constexpr int kExitTimeout = 14;     // a deadline was missed
inline constexpr int kExitPeerFailed = 13;  // another rank failed, and did not end the job itself
inline constexpr int kExitUncaught = 134;   // an exception escaped (std::terminate), as abort() would

// True once this process is ending the job, leaving it, or was told that another rank failed:
// then a stop signal (JobOptions::catch_stop_signals) must end the process as by default (the
// launcher's SIGTERM is how the job ends), not ask for a clean stop. Read by signal handlers.
extern std::atomic<bool> job_failing;

class Watchdog;

// The first line of the report of collective `info` that missed its deadline: what, how long,
// who had not reached it (not_there) and whose process is stopped (stopped), else what that
// means (suggesting TUTTI_DEBUG=1 only when debug mode is off).
std::string timeout_headline(std::string_view backend, const CollectiveInfo& info, double timeout_s, double waited_s,
                             std::size_t queued_behind, bool debug, const std::vector<int>& not_there,
                             const std::vector<int>& stopped = {});
// " Stopped: rank 1, rank 3 (SIGSTOP, a debugger?): ..." for a report, or "" when none is.
std::string stopped_sentence(const std::vector<int>& stopped);

// A backend, as the watchdog sees it.
class Watched {
 public:
  virtual ~Watched() = default;
  // On the watchdog's thread, every tick: checks the backend's deadlines (nccl: also its
  // asynchronous errors) and reports what it finds (Watchdog::collective_missed,
  // Watchdog::end_job). Must not block on other ranks.
  virtual void poll(Watchdog& watchdog) = 0;
  // The job is ending: free what a stuck device holds (nccl: ncclCommAbort), without blocking.
  virtual void abort_now() noexcept {}
};

class Watchdog {
 public:
  static constexpr auto kTick = std::chrono::milliseconds(20);
  static constexpr double kAckWait = 1.0;       // s an ending rank waits for the others' "printed"
  static constexpr double kLeaveGrace = 0.2;    // s a told rank waits to see whether it is leaving too
  static constexpr double kPeerKillWait = 3.0;  // s a told rank waits to be ended before it ends the job
  static constexpr double kPeerGoneWait = 1.0;  // the same, once the ending rank's process is gone
  static constexpr double kStatusWait = 1.0;    // s a report waits for other hosts' progress
  // s a rank lets a lower waiting rank report a timeout: longer than kStatusWait, since the lower
  // rank's report first waits that long for a stopped rank's answer (with equal waits, the two
  // ranks of a loaded run both reported, 0.1 s apart).
  static constexpr double kDeferReport = kStatusWait + 1.0;
  // s after which a wait that a rank of this host can no longer join (it ended its Job, and
  // has been in MPI_Finalize this long) is reported, long before the deadline: a call made by
  // some ranks only (Job::summary, a collective under `if (rank == 0)`).
  static constexpr double kAbandonedWait = 5.0;

  // process_wide: the process's watchdog (the Job's): Watchdog::current() returns it, it sets
  // job_failing, and ending the job ends this process if the channel did not. Otherwise (one
  // of the thread ranks of a ThreadGroup) it touches nothing beyond its channel and backends.
  explicit Watchdog(bool process_wide = true);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The process's watchdog (the Job's), or nullptr.
  static Watchdog* current();

  // ---- deadlines of blocking regions ----
  class Region {
   public:
    Region() = default;
    Region(Region&& other) noexcept : watchdog_(other.watchdog_), id_(other.id_) { other.watchdog_ = nullptr; }
    Region& operator=(Region&&) = delete;
    ~Region();
    // What the region is doing now (for the report).
    void set_what(std::string what);

   private:
    friend class Watchdog;
    Region(Watchdog* w, std::uint64_t id) : watchdog_(w), id_(id) {}
    Watchdog* watchdog_ = nullptr;
    std::uint64_t id_ = 0;
  };
  // While the Region lives, `what` must end within timeout_s, else the job ends with a report
  // of where every rank is (exit kExitTimeout), naming as "not there" the ranks whose phase
  // is below min_phase.
  [[nodiscard]] Region region(std::string what, double timeout_s, Phase min_phase = Phase::running);
  // A region whose expiry is no fault: print `note` and end this process with exit_code,
  // without a report and without ending the job (MPI_Finalize after a stop signal, while the
  // launcher that sent it is taking the job down and no longer serves MPI_Finalize's fence).
  [[nodiscard]] Region quiet_region(std::string what, double timeout_s, std::string note, int exit_code);

  // ---- backends ----
  void watch(std::weak_ptr<Watched> backend);

  // ---- life ----
  // This rank's number, for messages before the channel is up (from the launcher, or -1).
  void set_rank(int rank, int size);
  // Every rank's host name (index = rank), so that reports can name each rank's host and a
  // host that stopped answering ("Host node1 (ranks 2, 3) did not answer"). Ignored when every
  // rank runs on one host.
  void set_hosts(std::vector<std::string> hosts);
  // The progress board of this host (may be null: a world of one, no shared memory).
  void set_board(std::shared_ptr<ProgressBoard> board);
  std::shared_ptr<ProgressBoard> board() const;
  // The control channel, which only the watchdog uses; it takes rank and size from it. From
  // now on the watchdog listens to the other ranks and the channel ends the job.
  void attach(std::shared_ptr<ControlChannel> control);
  // True once a channel was attached (also after detach: it can still end the job).
  bool channel_up() const { return channel_up_.load(); }
  // Stops every use of the channel by the watchdog (before MPI_Finalize); frees the channel's
  // resources unless told not to (a job left without finalizing: another thread may be inside
  // MPI). The channel can still end the job.
  void detach(bool free_comm = true) noexcept;

  // ---- when things go wrong ----
  // A collective of `backend` missed its deadline. Builds the report (which ranks had not
  // reached it, where every rank is). abort_job: ends the job with it (unless a lower rank is
  // expected to report: to be called again on a later tick) and returns nullopt. Otherwise
  // returns the report, for the backend to fail its Works with.
  std::optional<std::string> collective_missed(std::string_view backend, const CollectiveInfo& info, int board_comm,
                                               double timeout_s, double waited_s, std::size_t queued_behind, bool debug,
                                               bool abort_job);
  // A collective waited in for more than kAbandonedWait, before its deadline: if a rank of
  // this host ended its Job without starting it, it never completes; then as collective_missed
  // (the report says so). Otherwise nullopt and nothing happens. Only for communicators of
  // every rank (comm_size == the job's size): the board does not say who is in a group.
  std::optional<std::string> collective_abandoned(std::string_view backend, const CollectiveInfo& info, int board_comm,
                                                  int comm_size, double timeout_s, double waited_s, bool abort_job);
  // Ends the whole job now (see the top of this file). Any thread; a second caller waits for
  // the first to finish (process-wide watchdog) or returns at once. Returns only where the
  // channel ends the job without ending the process (thread ranks).
  void end_job(const std::string& message, int exit_code);
  // An exception is unwinding through this rank's Job: tells every other rank (with `error`,
  // else the last tutti error of this process, if recent) and waits at most wait_s for their
  // answers. Returns true when every other rank is leaving too (an orderly end is then
  // possible); else call left().
  bool leave(double wait_s, std::optional<std::string> error = std::nullopt);
  // After leave() returned false: the job ends when this rank's process does (the channel's
  // end_job_at_exit), with the cause leave() sent.
  void left(int exit_code);
  // Another rank has failed and this one was told (it is waiting to be ended).
  bool peer_failed() const { return peer_failed_.load(); }

 private:
  struct RegionEntry {
    std::uint64_t id;
    std::string what;
    double timeout_s;
    std::chrono::steady_clock::time_point started;
    Phase min_phase;
    std::optional<std::pair<std::string, int>> quiet;  // note and exit code of a quiet_region
  };
  struct Notice {
    int from;
    int kind;
    std::string text;
    std::chrono::steady_clock::time_point received;
    bool answered = false;
  };
  void loop();
  void check_regions();
  // The ranks of this host that ended their Jobs (in MPI_Finalize for at least min_age_s, and
  // with board_comm >= 0, without starting its collective `seq`): they will never join what
  // this rank waits in. Empty when this rank is not running itself.
  std::vector<int> ranks_that_left(double min_age_s, int board_comm = -1, std::uint64_t seq = 0);
  void poll_backends();
  bool peer_kill_overdue();  // whether a told rank stops waiting for the launcher (loop thread)
  // With control_mutex_ held: receive and handle whatever the other ranks sent.
  void drain();
  void answer_notices();
  void send(int to, int tag, std::shared_ptr<const std::vector<char>> data);
  void notify_all(int kind, const std::string& text);
  // Waits until every rank in `ranks` answered (acks_ or a leaving notice) or wait_s passed.
  void wait_for_answers(double wait_s);
  // Every rank's progress: this host's board, then the other hosts through the control
  // channel (at most kStatusWait). Index = rank; a missing entry has rank -1.
  std::vector<RankSnapshot> gather_progress();
  // One line per rank: where it is; with a collective (board_comm >= 0, seq > 0), whether it
  // reached it; else its phase (ranks below min_phase are not there).
  std::string where_everyone_is(const std::vector<RankSnapshot>& all, int board_comm, std::uint64_t seq,
                                Phase min_phase, std::vector<int>* not_there, std::vector<int>* stopped = nullptr);
  // " Host node1 (ranks 2, 3) did not answer: ..." for every host none of whose ranks answered
  // (other hosts only), or "".
  std::string silent_hosts(const std::vector<RankSnapshot>& all);
  std::string host_of(int rank) const;
  void print_line(const std::string& text);

  mutable std::mutex mutex_;  // regions_, watched_, board_, hosts_, stop_
  std::condition_variable cv_;
  std::vector<RegionEntry> regions_;
  std::uint64_t next_region_ = 1;
  std::vector<std::weak_ptr<Watched>> watched_;
  std::shared_ptr<ProgressBoard> board_;
  std::vector<std::string> hosts_;
  bool stop_ = false;

  const bool process_wide_;
  std::atomic<int> rank_{-1};
  std::atomic<int> size_{0};
  std::atomic<bool> channel_up_{false};

  // The control channel; every message on it under control_mutex_.
  std::recursive_mutex control_mutex_;
  std::shared_ptr<ControlChannel> control_;  // set once by attach, never reset
  std::atomic<bool> attached_{false};
  std::string left_cause_;
  std::list<Notice> notices_;
  std::vector<int> answered_;  // per rank: -1 none, 0 ending because of us / not leaving, 1 leaving too
  std::vector<std::vector<RankSnapshot>> status_replies_;
  bool printed_peer_ = false;

  std::atomic<bool> leaving_{false};
  std::atomic<bool> ending_{false};
  std::atomic<bool> peer_failed_{false};
  std::chrono::steady_clock::time_point peer_failed_at_;
  int peer_failed_from_ = -1;                                          // the rank whose notice set peer_failed_
  std::optional<std::chrono::steady_clock::time_point> peer_gone_at_;  // when that rank was seen gone
  std::chrono::steady_clock::time_point deferred_since_{};
  bool deferring_ = false;

  std::thread thread_;
};

}  // namespace tutti::detail
