// The mpi backend: one communication thread per communicator carries out the collectives in
// issue order on the communicator's own MPI communicator (a duplicate, MPI_ERRORS_RETURN), so
// the caller keeps computing; the process's watchdog (comm/watchdog.h) enforces the deadline
// of the collective in progress.
//
// Counts that differ between ranks must never reach MPI's data movement (see kAgreeAboveBytes
// in backend.h): a collective that can move more than 1 KiB in one message is agreed on before
// any rank receives its data; up to 8 ranks in band (InBand, mpi_in_band.cc: allreduces carry
// it inside their own messages), above that with one small allreduce on a second duplicate
// communicator. Smaller ones travel eagerly, where MPI checks the size (MPI_ERR_TRUNCATE). In
// debug mode every collective is agreed on.
//
// A caller that waits for a CPU collective that has not started, while the thread is idle,
// runs it (and any before it) itself: same order, no hand-off (see Engine::run_until).
//
// Why blocking MPI calls on the communication thread: they use MPI's tuned algorithms (its
// nonblocking collectives are often slower, and progress only while polled), so a CPU
// allreduce costs what the raw MPI_Allreduce costs. The price is that a stuck call cannot be
// cancelled: the watchdog, not the thread, notices the missed deadline and ends the job (or
// fails the Work and marks the communicator broken; the thread then stays stuck in MPI).
//
// Data paths (mpi_collectives.cc):
// - f32, i32, i64 on the CPU: MPI on the tensors' memory (MPI_IN_PLACE when in place), no copy.
// - f16, bf16 reductions: converted to fp32 in chunks of kHalfChunk elements, reduced in fp32
//   (MPI_FLOAT), divided for avg, and rounded back once. Never summed as 16-bit integers. (A
//   user-defined MPI_Op on halves would round at every hop of the reduction tree.)
// - allgather, broadcast and sendrecv move bits and need no conversion.
// - GPU tensors: staged through a pinned host buffer (device -> host after the caller's
//   stream has produced the input, the CPU path, host -> device), on the thread's own stream.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <limits>
#include <optional>
#include <thread>

#include "comm/control_mpi.h"
#include "comm/mpi_engine.h"
#include "core/gpu_runtime.h"
#include "core/mpi_check.h"

namespace tutti::detail {
namespace mpi_engine {
namespace {

// The watchdog's clock: CLOCK_MONOTONIC (steady_clock's) at tick resolution, a few ns per
// read; deadlines are seconds.
Clock::time_point coarse_now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return Clock::time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
}

// The in-band agreement's tags (after sendrecv's, which take [0, 32768)) and its limits.
constexpr int kInBandFirstTag = 32768;
// Above this many ranks the agreement is one MPI_Allreduce on a communicator of its own (the
// in-band one sends size - 1 fingerprints per rank), and allreduces are MPI's.
constexpr int kInBandMaxRanks = 8;
constexpr std::int64_t kMaxInBandCount = std::numeric_limits<int>::max() / 2;

// The user chose Open MPI's allreduce algorithm (JobOptions::mpi_allreduce sets these before
// MPI_Init; so may the environment): allreduces stay MPI's.
bool mpi_algorithm_chosen() {
  const char* tuned = std::getenv("OMPI_MCA_coll_tuned_allreduce_algorithm");
  const char* han = std::getenv("OMPI_MCA_coll_han_priority");
  return (tuned != nullptr && *tuned != '\0' && std::strcmp(tuned, "0") != 0 && std::strcmp(tuned, "ignore") != 0) ||
         (han != nullptr && *han != '\0' && std::strcmp(han, "0") != 0);
}

void configure_in_band(Engine& e) {
  int* tag_ub = nullptr;
  int found = 0;
  TUTTI_MPI_CHECK(MPI_Comm_get_attr(e.comm, MPI_TAG_UB, &tag_ub, &found));
  const long long pairs = found && tag_ub != nullptr ? (static_cast<long long>(*tag_ub) + 1 - kInBandFirstTag) / 2 : 0;
  e.in_band_tags = e.size >= 2 && e.size <= kInBandMaxRanks ? static_cast<int>(std::max(0LL, pairs)) : 0;
  e.in_band_allreduce = e.in_band_tags > 0 && !mpi_algorithm_chosen();
}

}  // namespace

std::exception_ptr Engine::broken_error() {
  std::lock_guard lock(queue_mutex);
  return timeout_error("communicator unusable: an earlier collective missed its deadline (" + broken_report + ")");
}

void Engine::loop() {
  if (device.is_cuda()) gpu::set_device(device.index);
  // Idle, the thread naps (timed waits that no issuer needs to end) while collectives keep
  // coming, and sleeps (an issuer wakes it with a system call) after a quiet spell. So a
  // program that issues and at once waits, whose collectives the caller runs itself
  // (run_until), pays no wake-up per collective; one that issues and computes has its
  // collective started within a nap. Naps start short after the thread found work and grow
  // while it finds none (the callers run them), so that few wake-ups steal the CPU.
  constexpr auto kShortestNap = std::chrono::microseconds(100);
  constexpr auto kLongestNap = std::chrono::microseconds(3200);
  constexpr auto kQuietBeforeSleep = std::chrono::milliseconds(100);
  auto nap = kShortestNap;
  bool ran = false;
  for (;;) {
    {
      // After running one, spin briefly: asynchronous collectives often come in bursts.
      if (ran) {
        nap = kShortestNap;
        const auto spin_until = Clock::now() + std::chrono::microseconds(20);
        while (queued.load(std::memory_order_acquire) == 0 && Clock::now() < spin_until) std::this_thread::yield();
      }
      std::unique_lock lock(queue_mutex);
      auto ready = [&] { return abandoned || (!executing && (!queue.empty() || stopping)); };
      auto quiet = std::chrono::microseconds(0);
      std::uint64_t seen = issued_total;
      while (!ready()) {
        if (quiet < kQuietBeforeSleep) {
          queue_cv.wait_for(lock, nap);
          quiet = issued_total == seen ? quiet + nap : std::chrono::microseconds(0);
          seen = issued_total;
          if (!ready()) nap = std::min(nap * 2, kLongestNap);
        } else {
          sleeping.store(true, std::memory_order_release);
          queue_cv.wait(lock, [&] { return ready(); });
          sleeping.store(false, std::memory_order_relaxed);
          nap = kShortestNap;
        }
      }
      if (abandoned || queue.empty()) break;  // stopping, and everything issued is done
      std::shared_ptr<Op> op = begin_next();
      lock.unlock();
      run(op);
      lock.lock();
      end_current();
      ran = true;
    }
  }
  std::lock_guard lock(queue_mutex);
  thread_done = true;
  done_cv.notify_all();
}

std::shared_ptr<Op> Engine::begin_next() {
  std::shared_ptr<Op> op = std::move(queue.front());
  queue.pop_front();
  queued.fetch_sub(1, std::memory_order_release);
  current = op.get();
  started = coarse_now();
  executing = true;
  if (board) board->started(board_comm, op->info());
  return op;
}

void Engine::end_current() {
  current = nullptr;
  executing = false;
}

void Engine::run(const std::shared_ptr<Op>& op) {
  if (broken.load()) {
    op->work->fail(broken_error());
    return;
  }
  try {
    const Clock::time_point start = Clock::now();
    execute(*op);
    const Clock::time_point end = Clock::now();
    op->work->set_run_ms(std::chrono::duration<double, std::milli>(end - start).count());
    if (op->info().issued_ns != 0) {
      using std::chrono::nanoseconds;
      trace_collective(op->info(), "mpi", std::chrono::duration_cast<nanoseconds>(start.time_since_epoch()).count(),
                       std::chrono::duration_cast<nanoseconds>(end.time_since_epoch()).count());
    }
    if (board) board->completed(board_comm, op->info().seq);
    op->work->complete();
  } catch (...) {
    if (board) board->completed(board_comm, op->info().seq);
    op->work->fail(in_context(std::current_exception(), "running collective " + op->info().str() + " on backend mpi"));
  }
}

void Engine::run_until(const HostWork& work) {
  // Only where a stuck call may end the job: a caller stuck in MPI could not throw.
  if (!abort_on_timeout) return;
  std::unique_lock lock(queue_mutex);
  if (executing) return;  // the communication thread is running one
  while (!work.finished() && !queue.empty()) {
    const auto& c = queue.front()->c;
    const Tensor& any = c.output.defined() ? c.output : c.input;
    if (any.defined() && any.device().is_cuda()) break;  // staging is the thread's (its device, its stream)
    std::shared_ptr<Op> op = begin_next();
    lock.unlock();
    run(op);
    lock.lock();
    end_current();
  }
  const bool left = !queue.empty() || stopping;
  lock.unlock();
  if (left) queue_cv.notify_one();  // collectives issued after `work`: the thread's again
}

void Engine::poll(Watchdog& watchdog) {
  CollectiveInfo info;
  double waited = 0;
  std::size_t behind = 0;
  {
    std::lock_guard lock(queue_mutex);
    if (current == nullptr || broken.load()) return;
    waited = seconds_since(started);
    if (waited <= std::min(timeout_s, Watchdog::kAbandonedWait)) return;
    info = current->info();
    behind = queue.size();
  }
  // Without the lock: the report may wait for other hosts' answers.
  const std::optional<std::string> report =
      waited <= timeout_s
          ? watchdog.collective_abandoned("mpi", info, board_comm, size, timeout_s, waited, abort_on_timeout)
          : watchdog.collective_missed("mpi", info, board_comm, timeout_s, waited, behind, debug, abort_on_timeout);
  if (!report) return;  // a lower rank reports it, or the job is ending
  std::lock_guard lock(queue_mutex);
  if (current != nullptr && current->info().seq == info.seq) fail_broken(*report);
}

void Engine::fail_broken(const std::string& report) {
  if (!current || broken.load()) return;
  broken_report = report;
  broken.store(true);
  current->work->fail(timeout_error(report));
  // What was queued behind it fails too (the communication thread is stuck).
  for (auto& op : queue) op->work->fail(timeout_error("not started: " + report));
  queue.clear();
  queued.store(0);
}

void Engine::execute(Op& op) {
  const auto& c = op.c;
  std::optional<InBand> agreement;
  if (debug || largest_message_bytes(c.info, size) > kAgreeAboveBytes) {
    if (in_band_tags == 0) {
      agree(*check, c.info);
    } else {
      const int tag = kInBandFirstTag + 2 * static_cast<int>(c.info.seq % static_cast<std::uint64_t>(in_band_tags));
      agreement.emplace(comm, rank, size, fingerprint_of(c.info), tag);
      // Large allreduces carry it in band; MPI's collectives need it before their data.
      const bool carried = in_band_allreduce && c.info.kind == CollectiveKind::allreduce && c.info.count >= size &&
                           c.info.count <= kMaxInBandCount;
      if (carried) {
        band = &*agreement;
      } else {
        agreement->require_all();
      }
    }
  }
  struct Reset {
    InBand*& band;
    ~Reset() { band = nullptr; }
  } reset{band};
  const Tensor& any = c.output.defined() ? c.output : c.input;
  if (any.defined() && any.device().is_cuda()) {
    run_staged(op);
  } else {
    run_host(c);
  }
  // The fingerprints not yet taken came before the data that made the result: at hand.
  if (band != nullptr) band->require_all();
}

}  // namespace mpi_engine

namespace {

using mpi_engine::Engine;
using mpi_engine::Op;

class MpiBackend final : public Backend {
 public:
  MpiBackend(MPI_Comm parent, Device device, CommOptions options, int rank, int size, int board_comm)
      : Backend(rank, size, std::move(options)), engine_(std::make_shared<Engine>()) {
    Engine& e = *engine_;
    TUTTI_MPI_CHECK(MPI_Comm_dup(parent, &e.comm));
    TUTTI_MPI_CHECK(MPI_Comm_set_errhandler(e.comm, MPI_ERRORS_RETURN));
    e.rank = rank;
    e.size = size;
    mpi_engine::configure_in_band(e);
    if (e.in_band_tags == 0) e.check = make_mpi_control(parent);
    e.device = device;
    e.timeout_s = timeout_seconds();
    e.debug = debug();
    e.abort_on_timeout = this->options().abort_on_timeout;
    if (Watchdog* w = Watchdog::current()) {
      e.board = w->board();
      e.board_comm = board_comm;
      w->watch(engine_);
    }
    thread_ = std::thread([e = engine_] { e->loop(); });
  }
  ~MpiBackend() override { shutdown(std::numeric_limits<double>::infinity()); }

  std::string_view backend() const override { return "mpi"; }
  bool broken() const override { return engine_->broken.load(); }

  bool shutdown(double max_wait_s) noexcept override {
    Engine& e = *engine_;
    {
      std::unique_lock lock(e.queue_mutex);
      if (shut_down_) return clean_;
      e.stopping = true;
      e.queue_cv.notify_all();
      // Issued collectives finish first; a stuck one is ended by the watchdog (the job, or
      // this wait, through broken).
      const auto give_up = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(std::min(max_wait_s, 1e9)));
      while (!e.thread_done && !e.broken.load() && Clock::now() < give_up) {
        e.done_cv.wait_for(lock, std::chrono::milliseconds(20));
      }
      if (!e.thread_done) e.abandoned = true;
      e.queue_cv.notify_all();
    }
    if (e.thread_done) {
      thread_.join();
    } else {
      thread_.detach();  // stuck inside MPI; it keeps the engine alive
    }
    shut_down_ = true;
    clean_ = e.thread_done && !e.broken.load();
    if (clean_) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Comm_free(&e.comm);
      e.comm = MPI_COMM_NULL;
      e.check.reset();
      e.staging = Stream();
      e.pinned.reset();
    }
    return clean_;
  }

  void abandon() noexcept override {
    Engine& e = *engine_;
    {
      std::lock_guard lock(e.queue_mutex);
      if (shut_down_) return;
      e.stopping = true;
      e.abandoned = true;
    }
    e.queue_cv.notify_all();
    thread_.detach();  // idle, it ends at once; inside MPI, it stays there until the process ends
    shut_down_ = true;
    clean_ = false;
  }

 protected:
  Work do_allreduce(Collective c) override { return enqueue(std::move(c)); }
  Work do_reduce_scatter(Collective c) override { return enqueue(std::move(c)); }
  Work do_allgather(Collective c) override { return enqueue(std::move(c)); }
  Work do_broadcast(Collective c) override { return enqueue(std::move(c)); }
  Work do_barrier(Collective c) override { return enqueue(std::move(c)); }
  Work do_sendrecv(Collective c) override { return enqueue(std::move(c)); }

  void check_device(Device device, const CollectiveInfo& info) const override {
    if (device.is_cpu()) return;
    if (engine_->device.is_cuda() && device == engine_->device) return;
    TUTTI_THROW(BackendError, "Backend mpi of this communicator does not support tensors on ", device.str(),
                " (it serves the CPU", engine_->device.is_cuda() ? " and " + engine_->device.str() : std::string(),
                "): ", info.str());
  }

 private:
  // Takes the collective by rvalue reference: every move of it costs on the issue path.
  Work enqueue(Collective&& c) {
    Engine& e = *engine_;
    const Tensor& any = c.output.defined() ? c.output : c.input;
    std::shared_ptr<Event> input_ready;
    if (any.defined() && any.device().is_cuda()) {
      input_ready = std::make_shared<Event>(any.device());
      input_ready->record(c.stream);
    }
    auto op = std::make_shared<Op>(std::move(c));
    op->input_ready = std::move(input_ready);
    op->set_runner(engine_);
    Work work(op);
    if (e.broken.load()) {
      op->work->fail(e.broken_error());
      return work;
    }
    if (e.board) e.board->issued(e.board_comm, op->info().seq);
    {
      std::lock_guard lock(e.queue_mutex);
      TUTTI_CHECK(!e.stopping, "collective ", op->info().str(), " issued after the communicator was shut down");
      e.queue.push_back(std::move(op));
      e.queued.fetch_add(1, std::memory_order_release);
      ++e.issued_total;
    }
    if (e.sleeping.load(std::memory_order_acquire)) e.queue_cv.notify_one();
    return work;
  }

  std::shared_ptr<Engine> engine_;
  std::thread thread_;
  bool shut_down_ = false;
  bool clean_ = false;
};

}  // namespace

std::shared_ptr<Backend> make_mpi_backend(MPI_Comm parent, Device device, CommOptions options, int board_comm) {
  int rank = 0, size = 1;
  TUTTI_MPI_CHECK(MPI_Comm_rank(parent, &rank));
  TUTTI_MPI_CHECK(MPI_Comm_size(parent, &size));
  return std::make_shared<MpiBackend>(parent, device, std::move(options), rank, size, board_comm);
}

}  // namespace tutti::detail
