// The watchdog (see watchdog.h): deadlines, the control channel between ranks, ending the job.
#include "comm/watchdog.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/last_error.h"
#include "tutti/core/error.h"

namespace tutti::detail {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<Watchdog*> the_watchdog{nullptr};

// Tags on the control channel (a communicator of its own: no clash with anything else).
constexpr int kTagNotice = 1;         // i32 kind, then the text
constexpr int kTagAck = 2;            // i32: 1 leaving too, 0 not
constexpr int kTagStatusRequest = 3;  // i32 0
constexpr int kTagStatusReply = 4;    // RankSnapshot[k]
constexpr int kNoticeEnding = 1;      // the sender is ending the job (the channel's end follows)
constexpr int kNoticeLeaving = 2;     // an exception is unwinding through the sender's Job

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

std::string first_line(const std::string& s, std::size_t max = 1500) {
  std::string out = s.substr(0, s.find('\n'));
  if (out.size() > max) out = out.substr(0, max) + "...";
  return out;
}

std::shared_ptr<std::vector<char>> bytes_of(const void* p, std::size_t n) {
  auto v = std::make_shared<std::vector<char>>(n);
  if (n > 0) std::memcpy(v->data(), p, n);
  return v;
}

std::shared_ptr<std::vector<char>> int_message(std::int32_t x) { return bytes_of(&x, sizeof x); }

}  // namespace

std::atomic<bool> job_failing{false};

Watchdog::Watchdog(bool process_wide) : process_wide_(process_wide) {
  rank_.store(error_rank());
  if (process_wide_) the_watchdog.store(this);
  thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  detach();
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  Watchdog* self = this;
  the_watchdog.compare_exchange_strong(self, nullptr);
}

Watchdog* Watchdog::current() { return the_watchdog.load(); }

void Watchdog::set_rank(int rank, int size) {
  rank_.store(rank);
  size_.store(size);
  std::lock_guard lock(control_mutex_);
  answered_.assign(static_cast<std::size_t>(std::max(size, 0)), -1);
}

void Watchdog::set_board(std::shared_ptr<ProgressBoard> board) {
  std::lock_guard lock(mutex_);
  board_ = std::move(board);
}

void Watchdog::set_hosts(std::vector<std::string> hosts) {
  std::lock_guard lock(mutex_);
  // On one host the names add nothing to a report: keep none.
  const bool one_host =
      std::all_of(hosts.begin(), hosts.end(), [&](const std::string& h) { return h == hosts.front(); });
  hosts_ = one_host ? std::vector<std::string>{} : std::move(hosts);
}

std::string Watchdog::host_of(int rank) const {
  std::lock_guard lock(mutex_);
  return rank >= 0 && static_cast<std::size_t>(rank) < hosts_.size() ? hosts_[static_cast<std::size_t>(rank)] : "";
}

std::shared_ptr<ProgressBoard> Watchdog::board() const {
  std::lock_guard lock(mutex_);
  return board_;
}

// ---- regions ------------------------------------------------------------------------------

Watchdog::Region Watchdog::region(std::string what, double timeout_s, Phase min_phase) {
  std::lock_guard lock(mutex_);
  const std::uint64_t id = next_region_++;
  regions_.push_back(RegionEntry{id, std::move(what), timeout_s, Clock::now(), min_phase, std::nullopt});
  return Region(this, id);
}

Watchdog::Region Watchdog::quiet_region(std::string what, double timeout_s, std::string note, int exit_code) {
  std::lock_guard lock(mutex_);
  const std::uint64_t id = next_region_++;
  regions_.push_back(RegionEntry{id, std::move(what), timeout_s, Clock::now(), Phase::absent,
                                 std::make_pair(std::move(note), exit_code)});
  return Region(this, id);
}

Watchdog::Region::~Region() {
  if (watchdog_ == nullptr) return;
  std::lock_guard lock(watchdog_->mutex_);
  auto& r = watchdog_->regions_;
  r.erase(std::remove_if(r.begin(), r.end(), [&](const RegionEntry& e) { return e.id == id_; }), r.end());
}

void Watchdog::Region::set_what(std::string what) {
  if (watchdog_ == nullptr) return;
  std::lock_guard lock(watchdog_->mutex_);
  for (auto& e : watchdog_->regions_) {
    if (e.id == id_) e.what = std::move(what);
  }
}

void Watchdog::watch(std::weak_ptr<Watched> backend) {
  std::lock_guard lock(mutex_);
  watched_.push_back(std::move(backend));
}

// ---- the thread ---------------------------------------------------------------------------

void Watchdog::loop() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    cv_.wait_for(lock, kTick);
    if (stop_) break;
    lock.unlock();
    check_regions();
    poll_backends();
    if (attached_.load()) {
      std::lock_guard control(control_mutex_);
      if (attached_.load()) {
        drain();
        answer_notices();
      }
    }
    if (peer_failed_.load() && !ending_.load() && channel_up_.load() && peer_kill_overdue()) {
      // The failed rank has not ended the job (it may be stuck itself, or cut off from the
      // launcher): end it from here.
      print_line("the failed rank did not end the job within " + seconds(since(peer_failed_at_)) +
                 "; ending it from here.");
      ending_.store(true);
      control_->end_job("the failed rank did not end the job", kExitPeerFailed);
      if (process_wide_) std::_Exit(kExitPeerFailed);
    }
    lock.lock();
  }
}

bool Watchdog::peer_kill_overdue() {
  if (since(peer_failed_at_) > kPeerKillWait) return true;
  // Under mpirun the launcher kills every rank within ~0.1 s of an MPI_Abort; a rank still
  // here well after the ending rank's process is gone was not reached by it.
  if (!peer_gone_at_) {
    const auto b = board();
    if (auto s = b ? b->read(peer_failed_from_) : std::nullopt; s && s->gone) peer_gone_at_ = Clock::now();
  }
  return peer_gone_at_ && since(*peer_gone_at_) > kPeerGoneWait;
}

std::vector<int> Watchdog::ranks_that_left(double min_age_s, int board_comm, std::uint64_t seq) {
  std::vector<int> left;
  const auto b = board();
  if (!b) return left;
  const auto me = b->read(rank_.load());
  if (!me || me->phase != Phase::running) return left;  // finalizing itself, or leaving
  for (int r = 0; r < size_.load(); ++r) {
    const auto s = r == rank_.load() ? std::nullopt : b->read(r);
    if (!s || (s->phase != Phase::finalizing && s->phase != Phase::finished) || s->phase_age_s < min_age_s) continue;
    // In a collective: only a rank that never started it (one that did may have finished it).
    if (board_comm >= 0 && board_comm < kBoardComms && s->comm[board_comm].started >= seq) continue;
    left.push_back(r);
  }
  return left;
}

namespace {

std::string left_sentence(const std::vector<int>& left) {
  std::string s = left.size() == 1 ? " Rank" : " Ranks";
  for (std::size_t i = 0; i < left.size(); ++i) s += (i ? ", " : " ") + std::to_string(left[i]);
  return s + (left.size() == 1 ? " has ended its Job" : " have ended their Jobs") +
         " (in MPI_Finalize) without it: a call that every rank must make was made by some ranks only "
         "(Job::summary, a state dict under ZeRO, a collective under `if (job.rank() == 0)`?).";
}

}  // namespace

void Watchdog::check_regions() {
  std::optional<RegionEntry> expired, oldest;
  {
    std::lock_guard lock(mutex_);
    for (const auto& r : regions_) {
      if (since(r.started) > r.timeout_s) expired = r;
      if (!r.quiet && (!oldest || r.started < oldest->started)) oldest = r;
    }
  }
  if (ending_.load()) return;
  if (!expired && oldest && since(oldest->started) > kAbandonedWait) {
    // Long before the deadline: a rank of this host that left will never come. Named: every rank
    // that left, also one that left a moment after the first (a loaded run once named rank 2
    // alone, where ranks 1 and 2 had both been in MPI_Finalize for 5.0 s).
    if (!ranks_that_left(kAbandonedWait).empty()) {
      const std::vector<int> left = ranks_that_left(0.0);
      const std::vector<RankSnapshot> all = gather_progress();
      end_job("TIMEOUT: " + oldest->what + " cannot complete." + left_sentence(left) + " Ended after " +
                  seconds(since(oldest->started)) + " of its deadline of " + seconds(oldest->timeout_s) + "." +
                  "\n  Where each rank is:" + where_everyone_is(all, -1, 0, oldest->min_phase, nullptr),
              kExitTimeout);
    }
    return;
  }
  if (!expired) return;
  if (expired->quiet) {
    print_line(expired->quiet->first);
    if (process_wide_) std::_Exit(expired->quiet->second);
    return;
  }
  if (since(expired->started) < expired->timeout_s + kDeferReport) {
    // A lower rank of this host waiting alike, or already ending the job, reports it.
    if (auto b = board()) {
      const auto me = b->read(rank_.load());
      for (int r = 0; r < rank_.load() && me; ++r) {
        const auto s = b->read(r);
        if (s && (s->phase == Phase::leaving || (!s->stopped && !s->gone && s->phase == me->phase))) return;
      }
    }
  }
  std::string report = "TIMEOUT: " + expired->what + " did not complete within its deadline of " +
                       seconds(expired->timeout_s) + " (TUTTI_TIMEOUT_S or CommOptions::timeout).";
  if (auto b = board()) {
    // A rank of this host ending the job already reported why (this rank may only have been
    // stopped until the launcher's kill continued it): one line, not a report that blames it.
    for (int r = 0; r < size_.load(); ++r) {
      const auto s = r == rank_.load() ? std::nullopt : b->read(r);
      if (s && s->phase == Phase::leaving) {
        end_job(report + " Rank " + std::to_string(r) + " of this host is ending the job already: its report says why.",
                kExitTimeout);
        return;
      }
    }
  }
  std::vector<int> not_there, stopped;
  const std::vector<RankSnapshot> all = gather_progress();
  const std::string where = where_everyone_is(all, -1, 0, expired->min_phase, &not_there, &stopped);
  if (!not_there.empty()) {
    report += " Not there:";
    for (int r : not_there) report += " rank " + std::to_string(r);
    report += ".";
  }
  report += stopped_sentence(stopped);
  report += silent_hosts(all);
  report += "\n  Where each rank is:" + where;
  end_job(report, kExitTimeout);
}

void Watchdog::poll_backends() {
  std::vector<std::shared_ptr<Watched>> alive;
  {
    std::lock_guard lock(mutex_);
    watched_.erase(std::remove_if(watched_.begin(), watched_.end(), [](const auto& w) { return w.expired(); }),
                   watched_.end());
    for (auto& w : watched_) {
      if (auto b = w.lock()) alive.push_back(std::move(b));
    }
  }
  for (auto& b : alive) {
    try {
      b->poll(*this);
    } catch (const std::exception& e) {
      end_job(std::string("error while watching a communicator: ") + e.what(), kExitTimeout);
    }
  }
}

// ---- the control channel ------------------------------------------------------------------

void Watchdog::attach(std::shared_ptr<ControlChannel> control) {
  std::lock_guard lock(control_mutex_);
  if (control_) return;  // once
  set_rank(control->rank(), control->size());
  control_ = std::move(control);
  attached_.store(true);
  channel_up_.store(true);
}

void Watchdog::detach(bool free_comm) noexcept {
  std::lock_guard lock(control_mutex_);
  if (!attached_.exchange(false)) return;
  control_->close(free_comm);
}

void Watchdog::send(int to, int tag, std::shared_ptr<const std::vector<char>> data) {
  control_->send(to, tag, std::move(data));
}

void Watchdog::notify_all(int kind, const std::string& text) {
  std::vector<char> buf(sizeof(std::int32_t) + text.size());
  const std::int32_t k = kind;
  std::memcpy(buf.data(), &k, sizeof k);
  std::memcpy(buf.data() + sizeof k, text.data(), text.size());
  auto shared = std::make_shared<const std::vector<char>>(std::move(buf));
  for (int r = 0; r < size_.load(); ++r) {
    if (r != rank_.load()) send(r, kTagNotice, shared);
  }
}

void Watchdog::drain() {
  while (std::optional<ControlMessage> m = control_->poll()) {
    const int from = m->from;
    const std::vector<char>& buf = m->bytes;
    std::int32_t head = 0;
    if (buf.size() >= sizeof head) std::memcpy(&head, buf.data(), sizeof head);
    switch (m->tag) {
      case kTagNotice: {
        Notice n{from, head, std::string(buf.begin() + static_cast<long>(std::min(buf.size(), sizeof head)), buf.end()),
                 Clock::now()};
        if (static_cast<std::size_t>(from) < answered_.size())
          answered_[static_cast<std::size_t>(from)] = head == kNoticeLeaving ? 1 : 0;
        notices_.push_back(std::move(n));
        break;
      }
      case kTagAck:
        if (static_cast<std::size_t>(from) < answered_.size() && answered_[static_cast<std::size_t>(from)] != 1) {
          answered_[static_cast<std::size_t>(from)] = head;
        }
        break;
      case kTagStatusRequest: {
        std::vector<RankSnapshot> mine;
        if (auto b = board()) mine = b->read_host();
        for (auto& s : mine) s.remote = true;
        send(from, kTagStatusReply, bytes_of(mine.data(), mine.size() * sizeof(RankSnapshot)));
        break;
      }
      case kTagStatusReply: {
        std::vector<RankSnapshot> theirs(buf.size() / sizeof(RankSnapshot));
        if (!theirs.empty()) std::memcpy(theirs.data(), buf.data(), theirs.size() * sizeof(RankSnapshot));
        status_replies_.push_back(std::move(theirs));
        break;
      }
      default: break;
    }
  }
}

void Watchdog::answer_notices() {
  for (auto& n : notices_) {
    if (n.answered) continue;
    if (leaving_.load() || ending_.load()) {
      send(n.from, kTagAck, int_message(1));
      n.answered = true;
      continue;
    }
    // A leaving rank gets kLeaveGrace: this rank's own Job may be about to leave too (an
    // error every rank raises alike), and then no line about the other is wanted.
    if (n.kind == kNoticeEnding || since(n.received) >= kLeaveGrace) {
      if (!printed_peer_) {
        print_line((n.kind == kNoticeEnding ? "rank " + std::to_string(n.from) + " is ending the job: "
                                            : "rank " + std::to_string(n.from) + " failed: ") +
                   n.text + " [this rank ends with it]");
        printed_peer_ = true;
      }
      send(n.from, kTagAck, int_message(0));
      n.answered = true;
      if (!peer_failed_.load()) {
        peer_failed_at_ = Clock::now();
        peer_failed_from_ = n.from;
        peer_failed_.store(true);
        if (process_wide_) job_failing.store(true);
        if (auto b = board()) b->set_phase(Phase::leaving);
      }
    }
  }
}

void Watchdog::wait_for_answers(double wait_s) {
  const auto start = Clock::now();
  const auto b = board();
  for (;;) {
    drain();
    answer_notices();
    bool all = true;
    for (int r = 0; r < size_.load() && all; ++r) {
      if (r == rank_.load() || answered_[static_cast<std::size_t>(r)] >= 0) continue;
      // A stopped or vanished process of this host will not answer.
      if (b) {
        if (auto s = b->read(r); s && (s->stopped || s->gone)) continue;
      }
      all = false;
    }
    if (all || since(start) > wait_s) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// ---- ending -------------------------------------------------------------------------------

void Watchdog::print_line(const std::string& text) {
  std::fprintf(stderr, "tutti [rank %d]: %s\n", rank_.load(), text.c_str());
  std::fflush(stderr);
}

void Watchdog::end_job(const std::string& message, int exit_code) {
  bool expected = false;
  if (!ending_.compare_exchange_strong(expected, true)) {
    if (!process_wide_) return;
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // the first caller ends the process
  }
  if (process_wide_) job_failing.store(true);
  // "Ending..." closes the first line; a report's details follow it.
  const std::string ending =
      channel_up_.load() ? " Ending the job (" + std::string(control_->how_it_ends()) + ")." : " Ending this rank.";
  const auto eol = message.find('\n');
  print_line(eol == std::string::npos ? message + ending : message.substr(0, eol) + ending + message.substr(eol));
  if (auto b = board()) b->set_phase(Phase::leaving);
  const bool attached = attached_.load();
  if (attached) {
    std::lock_guard lock(control_mutex_);
    std::fill(answered_.begin(), answered_.end(), -1);
    notify_all(kNoticeEnding, first_line(message));
  }
  std::vector<std::shared_ptr<Watched>> alive;
  {
    std::lock_guard lock(mutex_);
    for (auto& w : watched_) {
      if (auto b = w.lock()) alive.push_back(std::move(b));
    }
  }
  for (auto& b : alive) b->abort_now();
  if (attached) {
    std::lock_guard lock(control_mutex_);
    wait_for_answers(kAckWait);
  }
  if (channel_up_.load()) control_->end_job(message, exit_code);
  // Before the channel is up (or if it did not end the process): this process at least.
  if (process_wide_) std::_Exit(exit_code);
}

bool Watchdog::leave(double wait_s, std::optional<std::string> error) {
  if (size_.load() <= 1) return true;
  if (!attached_.load() || peer_failed_.load() || ending_.load()) return false;
  leaving_.store(true);
  if (process_wide_) job_failing.store(true);
  if (auto b = board()) b->set_phase(Phase::leaving);
  if (!error) error = recent_error(2.0);
  std::string text;
  if (error) {
    text = "an exception left its Job; the last tutti error there: " + first_line(*error);
  } else {
    text = "an exception that is not a tutti error left its Job (its own output says which)";
  }
  std::lock_guard lock(control_mutex_);
  left_cause_ = "rank " + std::to_string(rank_.load()) + " failed: " + text;
  notify_all(kNoticeLeaving, text);
  wait_for_answers(wait_s);
  for (int r = 0; r < size_.load(); ++r) {
    if (r != rank_.load() && answered_[static_cast<std::size_t>(r)] != 1) return false;
  }
  return true;
}

void Watchdog::left(int exit_code) {
  if (!channel_up_.load()) return;
  std::string cause;
  {
    std::lock_guard lock(control_mutex_);
    cause = left_cause_;
  }
  control_->end_job_at_exit(cause, exit_code);
}

// ---- reports ------------------------------------------------------------------------------

std::vector<RankSnapshot> Watchdog::gather_progress() {
  const int n = std::max(size_.load(), 1);
  std::vector<RankSnapshot> all(static_cast<std::size_t>(n));
  if (auto b = board()) {
    for (const auto& s : b->read_host()) {
      if (s.rank >= 0 && s.rank < n) all[static_cast<std::size_t>(s.rank)] = s;
    }
  }
  auto missing = [&] {
    std::vector<int> m;
    for (int r = 0; r < n; ++r) {
      if (all[static_cast<std::size_t>(r)].rank < 0) m.push_back(r);
    }
    return m;
  };
  std::vector<int> ask = missing();
  if (ask.empty() || !attached_.load()) return all;
  // Other hosts: any live rank there answers for all of its host.
  std::lock_guard lock(control_mutex_);
  if (!attached_.load()) return all;
  status_replies_.clear();
  for (int r : ask) send(r, kTagStatusRequest, int_message(0));
  const auto start = Clock::now();
  while (!ask.empty() && since(start) < kStatusWait) {
    drain();
    answer_notices();
    for (const auto& reply : status_replies_) {
      for (const auto& s : reply) {
        if (s.rank >= 0 && s.rank < n && all[static_cast<std::size_t>(s.rank)].rank < 0)
          all[static_cast<std::size_t>(s.rank)] = s;
      }
    }
    status_replies_.clear();
    ask = missing();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return all;
}

std::string Watchdog::where_everyone_is(const std::vector<RankSnapshot>& all, int board_comm, std::uint64_t seq,
                                        Phase min_phase, std::vector<int>* not_there, std::vector<int>* stopped) {
  std::string out;
  const bool collective = board_comm >= 0 && board_comm < kBoardComms && seq > 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const RankSnapshot& s = all[i];
    const int r = static_cast<int>(i);
    const std::string host = host_of(r);
    std::string line = "\n    rank " + std::to_string(r) + (host.empty() ? "" : " (" + host + ")") + ": ";
    bool there = true;
    if (s.rank < 0) {
      line += channel_up_.load() ? "no answer (stopped, hung outside MPI, or its host is unreachable)"
                                 : "no sign of it on this host (it has not started its Job, or runs elsewhere)";
      there = false;
    } else if (!collective || s.phase != Phase::running) {
      line += std::string(name_of(s.phase));
      if (s.phase != Phase::absent) line += " for " + seconds(s.phase_age_s);
      there = !collective && s.phase >= min_phase && s.phase != Phase::leaving;
    } else {
      const CommSnapshot& c = s.comm[board_comm];
      if (c.completed >= seq) {
        line += "completed it";
      } else if (c.started >= seq) {
        line += "in it for " + seconds(s.started_age_s[board_comm]);
      } else {
        there = false;
        if (c.started == 0) {
          line += "not there: no collective started on this communicator yet";
        } else {
          line += "not there: last in " + c.describe();
          line += c.completed >= c.started ? " (completed)"
                                           : " (still in it, for " + seconds(s.started_age_s[board_comm]) + ")";
        }
        if (c.issued > c.started) line += "; issued up to #" + std::to_string(c.issued);
      }
    }
    if (s.rank >= 0 && s.stopped) {
      line += " [process " + std::to_string(s.pid) + " is stopped (SIGSTOP, a debugger?)]";
      if (stopped != nullptr) stopped->push_back(r);
    }
    if (s.rank >= 0 && s.gone) line += " [process " + std::to_string(s.pid) + " is gone]";
    if (!there && not_there != nullptr) not_there->push_back(r);
    out += line;
  }
  return out;
}

std::string Watchdog::silent_hosts(const std::vector<RankSnapshot>& all) {
  if (!channel_up_.load()) return "";
  const std::string mine = host_of(rank_.load());
  // Hosts in the order of their first rank; a host is silent when none of its ranks answered.
  std::vector<std::pair<std::string, std::vector<int>>> hosts;
  std::vector<bool> answered;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const std::string host = host_of(static_cast<int>(i));
    if (host.empty() || host == mine) continue;
    auto it = std::find_if(hosts.begin(), hosts.end(), [&](const auto& h) { return h.first == host; });
    if (it == hosts.end()) {
      hosts.push_back({host, {}});
      answered.push_back(false);
      it = hosts.end() - 1;
    }
    it->second.push_back(static_cast<int>(i));
    if (all[i].rank >= 0) answered[static_cast<std::size_t>(it - hosts.begin())] = true;
  }
  std::string out;
  for (std::size_t h = 0; h < hosts.size(); ++h) {
    if (answered[h]) continue;
    out += " Host " + hosts[h].first + " (rank" + (hosts[h].second.size() > 1 ? "s" : "");
    for (std::size_t k = 0; k < hosts[h].second.size(); ++k)
      out += (k ? ", " : " ") + std::to_string(hosts[h].second[k]);
    out += ") did not answer within " + seconds(kStatusWait) +
           ": it is unreachable (down, or its network is), or every rank there is stuck.";
  }
  return out;
}

std::string stopped_sentence(const std::vector<int>& stopped) {
  if (stopped.empty()) return "";
  std::string s = " Stopped:";
  for (std::size_t i = 0; i < stopped.size(); ++i) s += (i ? ", rank " : " rank ") + std::to_string(stopped[i]);
  return s + " (SIGSTOP, a debugger?): " + (stopped.size() == 1 ? "its process does" : "their processes do") +
         " not run until continued (SIGCONT).";
}

std::string timeout_headline(std::string_view backend, const CollectiveInfo& info, double timeout_s, double waited_s,
                             std::size_t queued_behind, bool debug, const std::vector<int>& not_there,
                             const std::vector<int>& stopped) {
  char times[96];
  std::snprintf(times, sizeof times, "within its deadline of %.1f s (waited %.1f s)", timeout_s, waited_s);
  std::string s =
      "TIMEOUT: collective " + info.str() + " on backend " + std::string(backend) + " did not complete " + times;
  if (queued_behind > 0) s += "; " + std::to_string(queued_behind) + " more collective(s) queued behind it";
  s += ".";
  if (!not_there.empty()) {
    s += " Not reached by";
    for (std::size_t i = 0; i < not_there.size(); ++i) s += (i ? ", rank " : " rank ") + std::to_string(not_there[i]);
    s += ".";
  } else if (!stopped.empty()) {
    // Every rank reached it, and one cannot finish it while it does not run.
  } else if (debug) {
    // Debug mode compared every collective before it ran.
    s += " Debug mode (TUTTI_DEBUG) is on and found no mismatch, and every rank is in this collective: MPI or "
         "the network between the ranks is stuck.";
  } else {
    s += " Every rank reached a collective with this number, so some rank issued a different one (run with "
         "TUTTI_DEBUG=1 to compare them).";
  }
  return s + stopped_sentence(stopped);
}

std::optional<std::string> Watchdog::collective_abandoned(std::string_view backend, const CollectiveInfo& info,
                                                          int board_comm, int comm_size, double timeout_s,
                                                          double waited_s, bool abort_job) {
  if (ending_.load() || peer_failed_.load() || waited_s < kAbandonedWait || comm_size != size_.load())
    return std::nullopt;
  const std::vector<int> left = ranks_that_left(0.0, board_comm, info.seq);
  if (left.empty()) return std::nullopt;
  const std::vector<RankSnapshot> all = gather_progress();
  const std::string report =
      "TIMEOUT: collective " + info.str() + " on backend " + std::string(backend) + " cannot complete." +
      left_sentence(left) + " Ended after " + seconds(waited_s) + " of its deadline of " + seconds(timeout_s) + "." +
      "\n  Where each rank is:" + where_everyone_is(all, board_comm, info.seq, Phase::running, nullptr);
  if (abort_job) {
    end_job(report, kExitTimeout);
    return std::nullopt;
  }
  return report;
}

std::optional<std::string> Watchdog::collective_missed(std::string_view backend, const CollectiveInfo& info,
                                                       int board_comm, double timeout_s, double waited_s,
                                                       std::size_t queued_behind, bool debug, bool abort_job) {
  if (abort_job && attached_.load()) {
    // Another rank may have reported it already.
    std::lock_guard lock(control_mutex_);
    if (attached_.load()) {
      drain();
      answer_notices();
    }
  }
  if (ending_.load() || (abort_job && peer_failed_.load())) return std::nullopt;
  const std::vector<RankSnapshot> all = gather_progress();
  // The gathering (up to kStatusWait) answers notices: a lower rank may have reported meanwhile.
  if (ending_.load() || (abort_job && peer_failed_.load())) return std::nullopt;
  if (abort_job && waited_s < timeout_s + kDeferReport && board_comm >= 0 && board_comm < kBoardComms) {
    // A lower rank waiting in the same collective (or already ending the job) reports it.
    for (int r = 0; r < rank_.load() && r < static_cast<int>(all.size()); ++r) {
      const RankSnapshot& s = all[static_cast<std::size_t>(r)];
      const CommSnapshot& c = s.comm[board_comm];
      const bool waiting = s.phase == Phase::running && c.started == info.seq && c.completed < info.seq;
      if (s.rank >= 0 && !s.stopped && (waiting || s.phase == Phase::leaving)) return std::nullopt;
    }
  }
  std::vector<int> not_there, stopped;
  const std::string where = where_everyone_is(all, board_comm, info.seq, Phase::running, &not_there, &stopped);
  const std::string report =
      timeout_headline(backend, info, timeout_s, waited_s, queued_behind, debug, not_there, stopped) +
      silent_hosts(all) + "\n  Where each rank is:" + where;
  if (abort_job) {
    end_job(report, kExitTimeout);
    return std::nullopt;  // thread ranks: the job has ended (every Work failed with the report)
  }
  return report;
}

}  // namespace tutti::detail
