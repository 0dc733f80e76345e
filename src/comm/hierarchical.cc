// The hierarchical allreduce (tutti/comm/groups.h): a Communicator over the world whose
// allreduce is three steps on the node groups, and whose other collectives are the world's.
//
// Who issues the steps: each group's collectives must be issued in the same order on every
// rank, from one thread. For nccl groups the caller's thread issues all three at once, chained
// on a stream of this communicator (each step's Work waited for on that stream, so the host
// never blocks). Elsewhere (mpi, thread ranks) a step must complete before the next may read
// its output, so a thread of this communicator takes the allreduces in issue order and runs
// their steps one after another, waiting for each; the caller gets a Work that this thread
// completes, and goes on computing meanwhile (as with a flat allreduce).
#include "tutti/comm/groups.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/backend.h"
#include "comm/work_state.h"
#include "tutti/core/error.h"

namespace tutti {

std::string NodeGroups::sizes_str() const {
  std::string s;
  for (std::size_t i = 0; i < node_sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(node_sizes[i]);
  return s;
}

namespace {

class HierarchicalComm final : public Communicator {
 public:
  HierarchicalComm(Communicator& world, NodeGroups groups)
      : Communicator(world.rank(), world.size(), world.options()),
        world_(world),
        g_(std::move(groups)),
        name_("hierarchical(" + std::string(world.backend()) + ")"),
        forward_(g_.intra->size() == 1 || g_.inter->size() == 1),
        on_device_(g_.intra->backend() == "nccl"),
        error_rank_(error_rank()) {}

  ~HierarchicalComm() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();  // the allreduces issued so far finish first
  }

  std::string_view backend() const override { return name_; }

 protected:
  Work do_allreduce(Collective c) override {
    if (forward_) return world_.allreduce(c.input, c.output, c.info.op, call_of(c));
    if (on_device_) return chain_on_device(c);
    auto work = std::make_shared<detail::HostWork>(c.info);
    {
      std::lock_guard lock(mutex_);
      TUTTI_CHECK(!stopping_, "collective ", c.info.str(), " issued after the communicator was shut down");
      queue_.push_back(Item{std::move(c), work});
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    }
    cv_.notify_one();
    return Work(work);
  }
  Work do_reduce_scatter(Collective c) override {
    return world_.reduce_scatter(c.input, c.output, c.info.op, call_of(c));
  }
  Work do_allgather(Collective c) override { return world_.allgather(c.input, c.output, call_of(c)); }
  Work do_broadcast(Collective c) override { return world_.broadcast(c.input, c.output, c.info.root, call_of(c)); }
  Work do_barrier(Collective c) override { return world_.barrier(call_of(c)); }
  Work do_sendrecv(Collective c) override {
    return world_.sendrecv(c.input, c.output, c.info.send_to, c.info.recv_from, call_of(c));
  }

 private:
  struct Item {
    Collective c;
    std::shared_ptr<detail::HostWork> work;
  };
  // The parts of an allreduce of n elements: the first shard · L elements go through the three
  // steps (this rank's shard is `mine`), the tail (< L elements) through two allreduces.
  struct Parts {
    Tensor whole, mine, tail;
  };

  static CallOptions call_of(const Collective& c) { return CallOptions{c.info.label, c.stream}; }

  Parts parts_of(const Collective& c) const {
    const int size = g_.intra->size();
    const std::int64_t n = c.output.numel(), shard = n / size, body = shard * size;
    Parts p;
    if (shard > 0) {
      p.whole = c.output.view(0, {body});
      p.mine = c.output.view(g_.intra->rank() * shard, {shard});
    }
    if (body < n) p.tail = c.output.view(body, {n - body});
    return p;
  }

  static std::string step_label(const Collective& c, const char* step) {
    return c.info.label.empty() ? std::string(step) : c.info.label + " [" + step + "]";
  }

  // nccl: every step issued now; each waits for the previous one on side_.
  Work chain_on_device(const Collective& c) {
    if (!side_.device().is_cuda()) side_ = Stream::create(c.output.device(), /*high_priority=*/true);
    if (c.input.data() != c.output.data()) Tensor(c.output).copy_from(c.input, c.stream);
    const Parts p = parts_of(c);
    const ReduceOp op = c.info.op;
    Work w;
    CallOptions call{std::string(), c.stream};  // the first step starts after the caller's stream
    auto next = [&](const char* step) {
      if (w.info().seq != 0) {
        w.wait(side_);
        call.stream = side_;
      }
      call.label = step_label(c, step);
      return &call;
    };
    if (p.whole.defined()) {
      w = g_.intra->reduce_scatter(p.whole, p.mine, op, *next("node reduce-scatter"));
      w = g_.inter->allreduce(p.mine, op, *next("across nodes"));
      w = g_.intra->allgather(p.mine, p.whole, *next("node all-gather"));
    }
    if (p.tail.defined()) {
      w = g_.intra->allreduce(p.tail, op, *next("node tail"));
      w = g_.inter->allreduce(p.tail, op, *next("across nodes, tail"));
    }
    return w;
  }

  // mpi and thread ranks: the body in up to kSegments segments, pipelined: every segment's
  // reduce-scatter is issued at once (the node's communicator runs them in order); as each
  // completes, its step across nodes is issued, and as that completes, its all-gather. So the
  // link carries segment s while the node reduces segment s + 1 and gathers segment s - 1. The
  // issue order on each group is fixed (all reduce-scatters, then all all-gathers; the steps
  // across nodes in segment order), the same on every rank whatever the timing.
  static constexpr int kSegments = 4;
  static constexpr std::int64_t kSegmentBytes = 1 << 20;  // at least this much per segment

  void run_steps(const Collective& c) {
    if (c.input.data() != c.output.data()) Tensor(c.output).copy_from(c.input, c.stream);
    const Parts p = parts_of(c);
    const ReduceOp op = c.info.op;
    auto call = [&](const char* step) { return CallOptions{step_label(c, step), c.stream}; };
    if (p.whole.defined()) {
      // Segment s: elements [size · b(s), size · b(s + 1)) of the body, b(s) = shard · s / k; each
      // is allreduced in three steps of its own.
      const std::int64_t size = g_.intra->size(), rank = g_.intra->rank(), shard = p.mine.numel();
      const auto k = static_cast<int>(std::clamp<std::int64_t>(p.whole.nbytes() / kSegmentBytes, 1, kSegments));
      std::vector<Tensor> whole, mine;
      std::vector<Work> work;
      for (int s = 0; s < k; ++s) {
        const std::int64_t b = shard * s / k, n = shard * (s + 1) / k - b;
        whole.push_back(c.output.view(size * b, {size * n}));
        mine.push_back(c.output.view(size * b + rank * n, {n}));
        work.push_back(g_.intra->reduce_scatter(whole.back(), mine.back(), op, call("node reduce-scatter")));
      }
      std::vector<Work> across;
      for (int s = 0; s < k; ++s) {
        work[static_cast<std::size_t>(s)].wait();
        across.push_back(g_.inter->allreduce(mine[static_cast<std::size_t>(s)], op, call("across nodes")));
      }
      for (int s = 0; s < k; ++s) {
        const auto i = static_cast<std::size_t>(s);
        across[i].wait();
        work[i] = g_.intra->allgather(mine[i], whole[i], call("node all-gather"));
      }
      for (const Work& w : work) w.wait();
    }
    if (p.tail.defined()) {
      g_.intra->allreduce(p.tail, op, call("node tail")).wait();
      g_.inter->allreduce(p.tail, op, call("across nodes, tail")).wait();
    }
  }

  void loop() {
    set_thread_error_rank(error_rank_);
    for (;;) {
      Item item;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        run_steps(item.c);
        item.work->complete();
      } catch (...) {
        item.work->fail(
            detail::in_context(std::current_exception(), "the hierarchical allreduce " + item.c.info.str()));
      }
    }
  }

  Communicator& world_;
  const NodeGroups g_;
  const std::string name_;
  const bool forward_;    // one node, or one rank per node: world's allreduce is the same
  const bool on_device_;  // nccl groups: chained on side_
  const int error_rank_;
  Stream side_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace

std::shared_ptr<Communicator> hierarchical_communicator(Communicator& world, const NodeGroups& groups) {
  TUTTI_CHECK_ARG(groups.intra && groups.inter && !groups.node_sizes.empty(),
                  "hierarchical_communicator: the NodeGroups have no communicators (make them with "
                  "Job::node_groups or ThreadGroup::node_groups)");
  bool equal = true;
  for (int s : groups.node_sizes) equal = equal && s == groups.node_sizes.front();
  TUTTI_CHECK_ARG(equal, "the hierarchical allreduce needs the same number of ranks on every node, but this job has ",
                  groups.sizes_str(), " rank(s) on its ", groups.node_count(),
                  " nodes (use the flat allreduce, or place as many ranks on every node)");
  TUTTI_CHECK_ARG(
      groups.intra->size() * groups.inter->size() == world.size() && groups.intra->size() == groups.node_sizes.front(),
      "hierarchical_communicator: groups of ", groups.intra->size(), " (node) and ", groups.inter->size(),
      " (across nodes) rank(s) do not split a world of ", world.size(), " ranks into ", groups.node_count(),
      " nodes of ", groups.node_sizes.front());
  return std::make_shared<HierarchicalComm>(world, groups);
}

}  // namespace tutti
