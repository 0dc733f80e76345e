// The control channel between thread ranks (see control_thread.h).
#include "comm/control_thread.h"

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include "tutti/core/error.h"

namespace tutti::detail {

struct ThreadControlHub::State {
  int size = 1;
  std::function<void(const InProcessEnd&)> on_end;
  mutable std::mutex mutex;
  std::condition_variable cv;
  // Channels are numbered: 0 is the first; the k-th duplicate of channel c is one number for
  // every rank (ranks duplicate in the same order).
  int next_channel = 1;
  std::map<std::pair<int, int>, int> duplicates;                    // (channel, k) -> channel
  std::map<std::pair<int, int>, std::deque<ControlMessage>> inbox;  // (channel, rank)
  struct Agreement {
    std::vector<Fingerprint> all;
    std::vector<bool> arrived;
    int count = 0, taken = 0;
  };
  std::map<std::pair<int, std::uint64_t>, Agreement> agreements;  // (channel, k)
  std::optional<InProcessEnd> end;

  bool same_everywhere(const Agreement& a) const {
    for (const Fingerprint& f : a.all) {
      const Fingerprint& g = a.all.front();
      if (f.seq != g.seq || f.count != g.count || f.kind != g.kind || f.op != g.op || f.dtype != g.dtype ||
          f.root != g.root) {
        return false;
      }
    }
    return true;
  }
  // Under the lock, once every rank deposited agreement k: what rank gets (empty: all same).
  std::vector<Fingerprint> take(std::pair<int, std::uint64_t> key) {
    Agreement& a = agreements[key];
    std::vector<Fingerprint> out = same_everywhere(a) ? std::vector<Fingerprint>{} : a.all;
    if (++a.taken == size) agreements.erase(key);
    return out;
  }
  [[noreturn]] void throw_ended() const {
    TUTTI_THROW(BackendError, "the job ended (", end->cause.substr(0, end->cause.find('\n')), ")");
  }
};

namespace {

using State = ThreadControlHub::State;

class ThreadPendingAgreement final : public PendingAgreement {
 public:
  ThreadPendingAgreement(std::shared_ptr<State> s, std::pair<int, std::uint64_t> key) : s_(std::move(s)), key_(key) {}
  bool test() override {
    std::lock_guard lock(s_->mutex);
    if (done_) return true;
    if (s_->end) s_->throw_ended();
    if (s_->agreements[key_].count < s_->size) return false;
    result_ = s_->take(key_);
    return done_ = true;
  }
  std::vector<Fingerprint> result() override { return result_; }

 private:
  std::shared_ptr<State> s_;
  std::pair<int, std::uint64_t> key_;
  bool done_ = false;
  std::vector<Fingerprint> result_;
};

class ThreadControl final : public ControlChannel {
 public:
  ThreadControl(std::shared_ptr<State> s, int id, int rank) : s_(std::move(s)), id_(id), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->size; }

  void send(int to, int tag, std::shared_ptr<const std::vector<char>> bytes) override {
    std::lock_guard lock(s_->mutex);
    if (closed_ || to < 0 || to >= s_->size) return;
    s_->inbox[{id_, to}].push_back(ControlMessage{rank_, tag, *bytes});
  }

  std::optional<ControlMessage> poll() override {
    std::lock_guard lock(s_->mutex);
    auto& q = s_->inbox[{id_, rank_}];
    if (closed_ || q.empty()) return std::nullopt;
    ControlMessage m = std::move(q.front());
    q.pop_front();
    return m;
  }

  std::vector<Fingerprint> agree(const Fingerprint& mine) override {
    const auto key = deposit(mine);
    std::unique_lock lock(s_->mutex);
    s_->cv.wait(lock, [&] { return s_->end || s_->agreements[key].count == s_->size; });
    if (s_->end) s_->throw_ended();  // the job ended: as a killed process, never return
    return s_->take(key);
  }

  std::unique_ptr<PendingAgreement> start_agree(const Fingerprint& mine) override {
    return std::make_unique<ThreadPendingAgreement>(s_, deposit(mine));
  }

  std::unique_ptr<ControlChannel> duplicate() override {
    std::lock_guard lock(s_->mutex);
    const std::pair<int, int> key{id_, duplicated_++};
    auto it = s_->duplicates.find(key);
    if (it == s_->duplicates.end()) it = s_->duplicates.emplace(key, s_->next_channel++).first;
    return std::make_unique<ThreadControl>(s_, it->second, rank_);
  }

  const char* how_it_ends() const override { return "in-process: every rank's Works fail"; }

  void end_job(const std::string& cause, int exit_code) noexcept override {
    std::function<void(const InProcessEnd&)> on_end;
    InProcessEnd end{rank_, exit_code, cause};
    {
      std::lock_guard lock(s_->mutex);
      if (s_->end) return;
      s_->end = end;
      on_end = s_->on_end;
    }
    s_->cv.notify_all();
    if (on_end) on_end(end);
  }
  void end_job_at_exit(const std::string& cause, int exit_code) noexcept override { end_job(cause, exit_code); }

  void close(bool) noexcept override {
    std::lock_guard lock(s_->mutex);
    closed_ = true;
  }

 private:
  std::pair<int, std::uint64_t> deposit(const Fingerprint& mine) {
    std::lock_guard lock(s_->mutex);
    const std::pair<int, std::uint64_t> key{id_, agreed_++};
    State::Agreement& a = s_->agreements[key];
    if (a.all.empty()) {
      a.all.resize(static_cast<std::size_t>(s_->size));
      a.arrived.assign(static_cast<std::size_t>(s_->size), false);
    }
    a.all[static_cast<std::size_t>(rank_)] = mine;
    a.arrived[static_cast<std::size_t>(rank_)] = true;
    ++a.count;
    s_->cv.notify_all();
    return key;
  }

  std::shared_ptr<State> s_;
  int id_;
  int rank_;
  std::uint64_t agreed_ = 0;
  int duplicated_ = 0;
  bool closed_ = false;
};

}  // namespace

ThreadControlHub::ThreadControlHub(int size, std::function<void(const InProcessEnd&)> on_end)
    : state_(std::make_shared<State>()) {
  state_->size = size;
  state_->on_end = std::move(on_end);
}

ThreadControlHub::~ThreadControlHub() {
  std::lock_guard lock(state_->mutex);
  state_->on_end = nullptr;
}

std::unique_ptr<ControlChannel> ThreadControlHub::channel(int rank) {
  return std::make_unique<ThreadControl>(state_, 0, rank);
}

std::optional<InProcessEnd> ThreadControlHub::ended() const {
  std::lock_guard lock(state_->mutex);
  return state_->end;
}

}  // namespace tutti::detail
