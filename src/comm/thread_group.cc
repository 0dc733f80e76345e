// In-process ranks (see thread_group.h).
//
// One Impl per group: a table of collectives in flight keyed by sequence number, filled as the
// ranks issue them; when the last rank has issued #s, its results are computed at once (by that
// rank's thread, under the lock) and each rank's completion is scheduled: now, later (delay) or
// after other collectives (reorder). A helper thread carries out the scheduled completions:
// it writes the rank's output and completes its Work, so outputs appear only at completion.
#include "tutti/comm/thread_group.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "comm/work_state.h"
#include "tutti/core/error.h"

namespace tutti {
namespace {

using Clock = std::chrono::steady_clock;

// A Work completed by the group's helper thread (or failed by a fault, a mismatch or a timeout).
class ThreadWork final : public Work::State {
 public:
  ThreadWork(CollectiveInfo info, double timeout_s) : Work::State(std::move(info)), timeout_s_(timeout_s) {}

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
    if (!cv_.wait_until(lock, deadline, [&] { return done_ || error_ != nullptr; })) {
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
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::string missing_;
};

float load(const Tensor& t, std::int64_t i) {
  switch (t.dtype()) {
    case DType::f32: return static_cast<const float*>(t.data())[i];
    case DType::f16: return half_bits_to_float(static_cast<const std::uint16_t*>(t.data())[i]);
    case DType::bf16: return bf16_bits_to_float(static_cast<const std::uint16_t*>(t.data())[i]);
    default: return 0;
  }
}

void store(std::vector<char>& out, DType dtype, std::int64_t i, float v) {
  switch (dtype) {
    case DType::f32: reinterpret_cast<float*>(out.data())[i] = v; break;
    case DType::f16: reinterpret_cast<std::uint16_t*>(out.data())[i] = float_to_half_bits(v); break;
    case DType::bf16: reinterpret_cast<std::uint16_t*>(out.data())[i] = float_to_bf16_bits(v); break;
    default: break;
  }
}

std::int64_t load_int(const Tensor& t, std::int64_t i) {
  return t.dtype() == DType::i32 ? static_cast<const std::int32_t*>(t.data())[i]
                                 : static_cast<const std::int64_t*>(t.data())[i];
}

void store_int(std::vector<char>& out, DType dtype, std::int64_t i, std::int64_t v) {
  if (dtype == DType::i32) {
    reinterpret_cast<std::int32_t*>(out.data())[i] = static_cast<std::int32_t>(v);
  } else {
    reinterpret_cast<std::int64_t*>(out.data())[i] = v;
  }
}

// op over ranks of elements [first, first + n) of every input, into `out` (n elements).
void reduce(const std::vector<Tensor>& inputs, ReduceOp op, DType dtype, std::int64_t first, std::int64_t n,
            std::vector<char>& out) {
  out.assign(static_cast<std::size_t>(n) * size_of(dtype), 0);
  const bool floating = is_floating(dtype);
  const int ranks = static_cast<int>(inputs.size());
  for (std::int64_t i = 0; i < n; ++i) {
    if (floating) {
      float acc = load(inputs[0], first + i);
      for (int r = 1; r < ranks; ++r) {
        const float v = load(inputs[static_cast<std::size_t>(r)], first + i);
        acc = op == ReduceOp::max ? std::max(acc, v) : op == ReduceOp::min ? std::min(acc, v) : acc + v;
      }
      if (op == ReduceOp::avg) acc /= static_cast<float>(ranks);
      store(out, dtype, i, acc);
    } else {
      std::int64_t acc = load_int(inputs[0], first + i);
      for (int r = 1; r < ranks; ++r) {
        const std::int64_t v = load_int(inputs[static_cast<std::size_t>(r)], first + i);
        acc = op == ReduceOp::max ? std::max(acc, v) : op == ReduceOp::min ? std::min(acc, v) : acc + v;
      }
      store_int(out, dtype, i, acc);
    }
  }
}

bool same_call(const CollectiveInfo& a, const CollectiveInfo& b) {
  return a.kind == b.kind && a.op == b.op && a.dtype == b.dtype && a.count == b.count && a.root == b.root;
}

std::string info_without_label(CollectiveInfo info) {
  info.label.clear();
  return info.str();
}

}  // namespace

struct ThreadGroup::Impl {
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
  // The bootstrap's rendezvous: the k-th allgather of every rank meets the others' k-th.
  struct Exchange {
    std::vector<std::string> values;
    int deposited = 0, taken = 0;
  };
  std::map<std::uint64_t, Exchange> exchanges;
  std::vector<std::uint64_t> exchange_count;

  bool is_complete(int rank, std::uint64_t seq) const {
    const auto r = static_cast<std::size_t>(rank);
    if (seq <= completed_up_to[r]) return true;
    const auto& above = completed_above[r];
    return std::find(above.begin(), above.end(), seq) != above.end();
  }
  void mark_complete(int rank, std::uint64_t seq) {
    const auto r = static_cast<std::size_t>(rank);
    completed_above[r].push_back(seq);
    auto& above = completed_above[r];
    for (bool moved = true; moved;) {
      moved = false;
      const auto it = std::find(above.begin(), above.end(), completed_up_to[r] + 1);
      if (it != above.end()) {
        above.erase(it);
        ++completed_up_to[r];
        moved = true;
      }
    }
  }

  // A thread waits for rank's Work of `seq`: a reorder hold on it ends (the Works after it that
  // are due complete first), so that a caller that waits before it issues more is not stuck.
  void release_hold(int rank, std::uint64_t seq) {
    std::lock_guard lock(mutex);
    for (auto it = scheduled.begin(); it != scheduled.end(); ++it) {
      if (it->rank != rank || it->seq != seq || it->waits_for == 0) continue;
      Completion c = std::move(*it);
      scheduled.erase(it);
      c.waits_for = 0;
      scheduled.push_back(std::move(c));
      cv.notify_all();
      return;
    }
    waited.insert({rank, seq});  // not scheduled yet: no hold when it is
  }

  Work submit(int rank, Communicator::Collective c) {
    auto work = std::make_shared<ThreadWork>(c.info, timeout_s);
    {
      const std::uint64_t seq = c.info.seq;
      work->on_wait = [this, rank, seq] { release_hold(rank, seq); };
    }
    std::unique_lock lock(mutex);
    Pending& p = pending[c.info.seq];
    if (p.calls.empty()) {
      p.calls.resize(static_cast<std::size_t>(size));
      p.works.resize(static_cast<std::size_t>(size));
      p.arrived.assign(static_cast<std::size_t>(size), false);
    }
    const auto r = static_cast<std::size_t>(rank);
    p.calls[r] = std::move(c);
    p.works[r] = work;
    p.arrived[r] = true;
    ++p.count;
    std::string missing;
    for (int q = 0; q < size; ++q) {
      if (!p.arrived[static_cast<std::size_t>(q)]) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
    }
    for (int q = 0; q < size; ++q) {
      if (p.works[static_cast<std::size_t>(q)]) p.works[static_cast<std::size_t>(q)]->set_missing(missing);
    }
    if (p.count == size) {
      const std::uint64_t seq = p.calls[0].info.seq;
      execute(seq, p);
      pending.erase(seq);
      cv.notify_all();
    }
    return Work(work);
  }

  // Under the lock: every rank has issued collective `seq`; schedule each rank's completion.
  void execute(std::uint64_t seq, Pending& p) {
    const Clock::time_point now = Clock::now();
    std::exception_ptr mismatch;
    for (int r = 1; r < size && !mismatch; ++r) {
      if (!same_call(p.calls[static_cast<std::size_t>(r)].info, p.calls[0].info)) {
        mismatch = std::make_exception_ptr(InvalidArgument(
            "collective mismatch: rank 0 issued " + info_without_label(p.calls[0].info) + " but rank " +
                std::to_string(r) + " issued " + info_without_label(p.calls[static_cast<std::size_t>(r)].info) +
                "; every rank must issue the same collectives in the same order",
            "thread_group.cc", -1));
      }
    }
    std::vector<Tensor> inputs;
    for (const auto& c : p.calls) inputs.push_back(c.input);
    const CollectiveInfo& info = p.calls[0].info;
    for (int r = 0; r < size; ++r) {
      const auto ri = static_cast<std::size_t>(r);
      Completion done;
      done.at = now;
      done.rank = r;
      done.seq = seq;
      done.work = p.works[ri];
      done.output = p.calls[ri].output;
      if (mismatch) {
        done.error = mismatch;
      } else {
        const std::int64_t n = info.count;
        switch (info.kind) {
          case CollectiveKind::allreduce: reduce(inputs, info.op, info.dtype, 0, n, done.result); break;
          case CollectiveKind::reduce_scatter: reduce(inputs, info.op, info.dtype, r * n, n, done.result); break;
          case CollectiveKind::allgather: {
            const std::size_t bytes = static_cast<std::size_t>(n) * size_of(info.dtype);
            done.result.resize(bytes * static_cast<std::size_t>(size));
            for (int q = 0; q < size; ++q) {
              std::memcpy(done.result.data() + bytes * static_cast<std::size_t>(q),
                          inputs[static_cast<std::size_t>(q)].data(), bytes);
            }
            break;
          }
          case CollectiveKind::broadcast: {
            const Tensor& src = inputs[static_cast<std::size_t>(info.root)];
            done.result.assign(static_cast<const char*>(src.data()),
                               static_cast<const char*>(src.data()) + src.nbytes());
            break;
          }
          case CollectiveKind::barrier: break;
        }
      }
      for (const CollectiveFault& f : faults) {
        if (f.seq != seq || (f.rank >= 0 && f.rank != r)) continue;
        switch (f.action) {
          case CollectiveFault::Action::delay: done.at += f.delay; break;
          case CollectiveFault::Action::fail:
            done.error = std::make_exception_ptr(BackendError(
                "injected failure of collective " + info.str() + " (CollectiveFault)", "thread_group.cc", r));
            break;
          case CollectiveFault::Action::reorder:
            if (waited.count({r, seq}) == 0) done.waits_for = seq + static_cast<std::uint64_t>(std::max(f.after, 1));
            break;
        }
      }
      scheduled.push_back(std::move(done));
    }
  }

  // The helper thread: carries out due completions, in time order, respecting reorder holds.
  void run_helper() {
    std::unique_lock lock(mutex);
    while (!stopping) {
      Clock::time_point next = Clock::time_point::max();
      bool progressed = false;
      for (auto it = scheduled.begin(); it != scheduled.end();) {
        const bool held = it->waits_for != 0 && !is_complete(it->rank, it->waits_for);
        if (held || it->at > Clock::now()) {
          if (!held) next = std::min(next, it->at);
          ++it;
          continue;
        }
        Completion c = std::move(*it);
        it = scheduled.erase(it);
        if (c.error) {
          c.work->fail(c.error);
        } else {
          if (!c.result.empty()) std::memcpy(c.output.data(), c.result.data(), c.result.size());
          c.work->complete();
        }
        mark_complete(c.rank, c.seq);
        waited.erase({c.rank, c.seq});
        progressed = true;
        break;  // a completion may release held ones: rescan from the start
      }
      if (progressed) continue;
      if (next == Clock::time_point::max()) {
        cv.wait(lock);
      } else {
        cv.wait_until(lock, next);
      }
    }
  }

  std::vector<std::string> allgather(int rank, std::string_view mine) {
    std::unique_lock lock(mutex);
    const std::uint64_t k = exchange_count[static_cast<std::size_t>(rank)]++;
    Exchange& e = exchanges[k];
    if (e.values.empty()) e.values.resize(static_cast<std::size_t>(size));
    e.values[static_cast<std::size_t>(rank)] = std::string(mine);
    ++e.deposited;
    cv.notify_all();
    const auto deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    if (!cv.wait_until(lock, deadline, [&] { return exchanges[k].deposited == size; })) {
      TUTTI_THROW(TimeoutError, "TIMEOUT: bootstrap exchange #", k + 1,
                  " of the thread group: not every rank came "
                  "within ",
                  timeout_s, " s");
    }
    Exchange& done = exchanges[k];
    std::vector<std::string> out = done.values;
    if (++done.taken == size) exchanges.erase(k);
    return out;
  }
};

namespace {

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup::Impl> group, int rank)
      : Communicator(rank, group->size, group->options), group_(std::move(group)) {}
  std::string_view backend() const override { return "thread"; }

 protected:
  void check_device(Device device, const CollectiveInfo& info) const override {
    if (device.is_cpu()) return;
    TUTTI_THROW(BackendError, "Backend thread does not support tensors on ", device.str(),
                " (in-process ranks serve CPU tensors): ", info.str());
  }
  Work do_allreduce(Collective c) override { return group_->submit(rank(), std::move(c)); }
  Work do_reduce_scatter(Collective c) override { return group_->submit(rank(), std::move(c)); }
  Work do_allgather(Collective c) override { return group_->submit(rank(), std::move(c)); }
  Work do_broadcast(Collective c) override { return group_->submit(rank(), std::move(c)); }
  Work do_barrier(Collective c) override { return group_->submit(rank(), std::move(c)); }

 private:
  std::shared_ptr<ThreadGroup::Impl> group_;
};

class ThreadBootstrap final : public Bootstrap {
 public:
  ThreadBootstrap(ThreadGroup::Impl* group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size; }
  std::vector<std::string> allgather(std::string_view mine) override { return group_->allgather(rank_, mine); }
  void barrier() override { (void)group_->allgather(rank_, ""); }

 private:
  ThreadGroup::Impl* group_;
  int rank_;
};

}  // namespace

ThreadGroup::ThreadGroup(int size, CommOptions options) : impl_(std::make_shared<Impl>()) {
  TUTTI_CHECK_ARG(size >= 1, "ThreadGroup: size must be >= 1, got ", size);
  Impl& g = *impl_;
  g.size = size;
  g.timeout_s = options.timeout_seconds();
  g.options = options;
  g.completed_up_to.assign(static_cast<std::size_t>(size), 0);
  g.completed_above.resize(static_cast<std::size_t>(size));
  g.exchange_count.assign(static_cast<std::size_t>(size), 0);
  for (int r = 0; r < size; ++r) {
    g.comms.push_back(std::make_unique<ThreadCommunicator>(impl_, r));
    g.boots.push_back(std::make_unique<ThreadBootstrap>(&g, r));
  }
  g.helper = std::thread([&g] { g.run_helper(); });
}

ThreadGroup::~ThreadGroup() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->helper.join();
  // The communicators hold the Impl: break the cycle.
  impl_->comms.clear();
}

int ThreadGroup::size() const { return impl_->size; }

Communicator& ThreadGroup::communicator(int rank) {
  TUTTI_CHECK_ARG(rank >= 0 && rank < impl_->size, "ThreadGroup: rank ", rank, " of ", impl_->size);
  return *impl_->comms[static_cast<std::size_t>(rank)];
}

Bootstrap& ThreadGroup::bootstrap(int rank) {
  TUTTI_CHECK_ARG(rank >= 0 && rank < impl_->size, "ThreadGroup: rank ", rank, " of ", impl_->size);
  return *impl_->boots[static_cast<std::size_t>(rank)];
}

void ThreadGroup::inject(CollectiveFault fault) {
  std::lock_guard lock(impl_->mutex);
  impl_->faults.push_back(fault);
}

void ThreadGroup::clear_faults() {
  std::lock_guard lock(impl_->mutex);
  impl_->faults.clear();
}

void ThreadGroup::run(const std::function<void(int rank)>& body) {
  const int n = impl_->size;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      set_thread_error_rank(r);
      try {
        body(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
      set_thread_error_rank(-1);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace tutti
