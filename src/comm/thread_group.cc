// In-process ranks (see thread_group.h).
//
// One Impl per group: a table of collectives in flight keyed by sequence number, filled as the
// ranks issue them; when the last rank has issued #s, its results are computed at once (by that
// rank's thread, under the lock) and each rank's completion is scheduled: now, later (delay) or
// after other collectives (reorder). A helper thread carries out the scheduled completions:
// it writes the rank's output and completes its Work, so outputs appear only at completion.
//
// With watchdogs (ThreadGroupOptions::watchdog) each rank also has a Watchdog, a slot on a
// progress board and a control channel (control_thread.h); its communicator is Watched like
// the mpi backend: a collective is in progress from its issue until its Work completes, and the
// watchdog checks it against the deadline every tick.
#include "comm/thread_group_impl.h"

namespace tutti {

using detail::Clock;
using detail::ThreadWork;

bool ThreadGroup::Impl::is_complete(int rank, std::uint64_t seq) const {
  const auto r = static_cast<std::size_t>(rank);
  if (seq <= completed_up_to[r]) return true;
  const auto& above = completed_above[r];
  return std::find(above.begin(), above.end(), seq) != above.end();
}

void ThreadGroup::Impl::mark_complete(int rank, std::uint64_t seq) {
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

void ThreadGroup::Impl::release_hold(int rank, std::uint64_t seq) {
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

Work ThreadGroup::Impl::submit(int rank, Communicator::Collective c) {
  auto work = std::make_shared<ThreadWork>(c.info, timeout_s, watched);
  {
    const std::uint64_t seq = c.info.seq;
    work->on_wait = [this, rank, seq] { release_hold(rank, seq); };
  }
  if (watched) {
    if (std::exception_ptr e = issue_watched(rank, c.info, work)) {
      work->fail(std::move(e));
      return Work(work);
    }
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

void ThreadGroup::Impl::execute(std::uint64_t seq, Pending& p) {
  const Clock::time_point now = Clock::now();
  std::exception_ptr mismatch;
  for (int r = 1; r < size && !mismatch; ++r) {
    if (!detail::same_call(p.calls[static_cast<std::size_t>(r)].info, p.calls[0].info)) {
      // Watched, the calls were agreed on where a real backend would agree: the rest never
      // completes, as a real transport would hang, and the deadline ends it.
      if (watched) return;
      mismatch = std::make_exception_ptr(InvalidArgument(
          "collective mismatch: rank 0 issued " + detail::info_without_label(p.calls[0].info) + " but rank " +
              std::to_string(r) + " issued " + detail::info_without_label(p.calls[static_cast<std::size_t>(r)].info) +
              "; every rank must issue the same collectives in the same order",
          "thread_group.cc", -1));
    }
  }
  if (!mismatch && p.calls[0].info.kind == CollectiveKind::sendrecv) {
    if (std::string why = detail::sendrecv_peers_mismatch(p.calls); !why.empty()) {
      if (watched) return;  // as above: a real transport leaves a receive unmatched
      mismatch = std::make_exception_ptr(InvalidArgument(why, "thread_group.cc", -1));
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
        case CollectiveKind::allreduce: detail::reduce(inputs, info.op, info.dtype, 0, n, done.result); break;
        case CollectiveKind::reduce_scatter: detail::reduce(inputs, info.op, info.dtype, r * n, n, done.result); break;
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
          done.result.assign(static_cast<const char*>(src.data()), static_cast<const char*>(src.data()) + src.nbytes());
          break;
        }
        case CollectiveKind::barrier: break;
        case CollectiveKind::sendrecv: {
          const Tensor& src = inputs[static_cast<std::size_t>(p.calls[ri].info.recv_from)];
          done.result.assign(static_cast<const char*>(src.data()), static_cast<const char*>(src.data()) + src.nbytes());
          break;
        }
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

void ThreadGroup::Impl::run_helper() {
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
      if (!boards.empty()) boards[static_cast<std::size_t>(c.rank)]->completed(0, c.seq);
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

std::vector<std::string> ThreadGroup::Impl::allgather(int rank, std::string_view mine) {
  std::unique_lock lock(mutex);
  const std::uint64_t k = exchange_count[static_cast<std::size_t>(rank)]++;
  Exchange& e = exchanges[k];
  if (e.values.empty()) e.values.resize(static_cast<std::size_t>(size));
  e.values[static_cast<std::size_t>(rank)] = std::string(mine);
  ++e.deposited;
  cv.notify_all();
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  if (!cv.wait_until(lock, deadline, [&] { return exchanges[k].deposited == size || end; })) {
    TUTTI_THROW(TimeoutError, "TIMEOUT: bootstrap exchange #", k + 1,
                " of the thread group: not every rank came "
                "within ",
                timeout_s, " s");
  }
  if (end && exchanges[k].deposited < size) std::rethrow_exception(ended_error());
  Exchange& done = exchanges[k];
  std::vector<std::string> out = done.values;
  if (++done.taken == size) exchanges.erase(k);
  return out;
}

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
  Work do_sendrecv(Collective c) override { return group_->submit(rank(), std::move(c)); }

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

ThreadGroup::ThreadGroup(int size, CommOptions options) : ThreadGroup(size, ThreadGroupOptions{options, false}) {}

ThreadGroup::ThreadGroup(int size, ThreadGroupOptions group_options) : impl_(std::make_shared<Impl>()) {
  TUTTI_CHECK_ARG(size >= 1, "ThreadGroup: size must be >= 1, got ", size);
  Impl& g = *impl_;
  const CommOptions& options = group_options.comm;
  g.size = size;
  g.timeout_s = options.timeout_seconds();
  g.options = options;
  g.watched = group_options.watchdog;
  g.debug = options.debug_enabled();
  g.completed_up_to.assign(static_cast<std::size_t>(size), 0);
  g.completed_above.resize(static_cast<std::size_t>(size));
  g.exchange_count.assign(static_cast<std::size_t>(size), 0);
  g.node_group_calls.assign(static_cast<std::size_t>(size), 0);
  for (int r = 0; r < size; ++r) {
    g.comms.push_back(std::make_unique<ThreadCommunicator>(impl_, r));
    g.boots.push_back(std::make_unique<ThreadBootstrap>(&g, r));
  }
  g.helper = std::thread([&g] { g.run_helper(); });
  if (g.watched) g.start_watchdogs();
}

ThreadGroup::~ThreadGroup() {
  impl_->watchdogs.clear();  // their threads poll the group
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->helper.join();
  // The communicators hold the Impl: break the cycle.
  impl_->comms.clear();
  impl_->subgroups.clear();
}

namespace {

// Under g.mutex: rank `rank`'s communicator in the group of `size` thread ranks that `key`
// (call, kind, color) names, made by the first of its members to ask.
std::shared_ptr<Communicator> subgroup(ThreadGroup::Impl& g, const std::tuple<std::uint64_t, int, int>& key, int size,
                                       int rank) {
  std::shared_ptr<ThreadGroup>& sub = g.subgroups[key];
  if (!sub) sub = std::make_shared<ThreadGroup>(size, g.options);
  return std::shared_ptr<Communicator>(sub, &sub->communicator(rank));
}

}  // namespace

NodeGroups ThreadGroup::node_groups(int rank, const std::vector<int>& node_sizes) {
  Impl& g = *impl_;
  TUTTI_CHECK_ARG(rank >= 0 && rank < g.size, "ThreadGroup::node_groups: rank ", rank, " of ", g.size);
  NodeGroups out;
  out.node_sizes = node_sizes;
  int total = 0, local = -1;
  for (int i = 0; i < out.node_count(); ++i) {
    TUTTI_CHECK_ARG(node_sizes[static_cast<std::size_t>(i)] > 0, "ThreadGroup::node_groups: node ", i, " has ",
                    node_sizes[static_cast<std::size_t>(i)], " ranks");
    if (rank >= total && rank < total + node_sizes[static_cast<std::size_t>(i)]) {
      out.node = i;
      local = rank - total;
    }
    total += node_sizes[static_cast<std::size_t>(i)];
  }
  TUTTI_CHECK_ARG(total == g.size, "ThreadGroup::node_groups: nodes of ", out.sizes_str(), " ranks hold ", total,
                  " ranks, the group has ", g.size);
  // Across nodes: the nodes that have a rank of this local index, in node order.
  int inter_size = 0, inter_rank = 0;
  for (int i = 0; i < out.node_count(); ++i) {
    if (node_sizes[static_cast<std::size_t>(i)] <= local) continue;
    if (i == out.node) inter_rank = inter_size;
    ++inter_size;
  }
  std::lock_guard lock(g.mutex);
  const std::uint64_t call = g.node_group_calls[static_cast<std::size_t>(rank)]++;
  out.intra = subgroup(g, {call, 0, out.node}, node_sizes[static_cast<std::size_t>(out.node)], local);
  out.inter = subgroup(g, {call, 1, local}, inter_size, inter_rank);
  return out;
}

DeviceMesh ThreadGroup::mesh(int rank, std::vector<MeshDim> dims) {
  Impl& g = *impl_;
  TUTTI_CHECK_ARG(rank >= 0 && rank < g.size, "ThreadGroup::mesh: rank ", rank, " of ", g.size);
  dims = DeviceMesh::resolve(std::move(dims), g.size);
  const std::vector<int> at = DeviceMesh::coordinates(dims, rank);
  std::vector<std::shared_ptr<Communicator>> groups;
  std::lock_guard lock(g.mutex);
  const std::uint64_t call = g.node_group_calls[static_cast<std::size_t>(rank)]++;
  for (std::size_t d = 0; d < dims.size(); ++d) {
    // Kinds 0 and 1 are node_groups' intra and inter; a mesh's dimension d is kind 2 + d.
    const int dim = static_cast<int>(d);
    groups.push_back(subgroup(g, {call, 2 + dim, DeviceMesh::color(dims, rank, dim)}, dims[d].size, at[d]));
  }
  return DeviceMesh(std::move(dims), rank, std::move(groups));
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
        if (impl_->watched) impl_->leave(r, errors[static_cast<std::size_t>(r)]);
      }
      set_thread_error_rank(-1);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

std::optional<ThreadJobEnd> ThreadGroup::job_end() const {
  std::lock_guard lock(impl_->mutex);
  if (!impl_->end) return std::nullopt;
  return ThreadJobEnd{impl_->end->rank, impl_->end->exit_code, impl_->end->cause};
}

}  // namespace tutti
