// The mpi backend: one communication thread per communicator carries out the collectives in
// issue order on the communicator's own MPI communicator (a duplicate, MPI_ERRORS_RETURN), so
// the caller keeps computing; the process's watchdog (comm/watchdog.h) enforces the deadline
// of the collective in progress.
//
// Counts that differ between ranks must never reach MPI's data movement (see kAgreeAboveBytes
// in backend.h): a collective that can move more than 1 KiB in one message is agreed on first,
// with one small allreduce on a second duplicate communicator; smaller ones travel eagerly,
// where MPI checks the size (MPI_ERR_TRUNCATE). In debug mode every collective is agreed on.
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
// Data paths:
// - f32, i32, i64 on the CPU: MPI on the tensors' memory (MPI_IN_PLACE when in place), no copy.
// - f16, bf16 reductions: converted to fp32 in chunks of kHalfChunk elements, reduced in fp32
//   (MPI_FLOAT), divided for avg, and rounded back once. Never summed as 16-bit integers. (A
//   user-defined MPI_Op on halves would round at every hop of the reduction tree.)
// - allgather and broadcast move bits and need no conversion.
// - GPU tensors: staged through a pinned host buffer (device -> host after the caller's
//   stream has produced the input, the CPU path, host -> device), on the thread's own stream.
#include <algorithm>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <deque>
#include <limits>
#include <thread>
#include <vector>

#include "comm/backend.h"
#include "comm/progress.h"
#include "comm/watchdog.h"
#include "comm/work_state.h"
#include "core/gpu_runtime.h"
#include "core/mpi_check.h"

namespace tutti::detail {
namespace {

constexpr std::int64_t kHalfChunk = std::int64_t{1} << 22;  // elements per fp32 round of halves
constexpr std::int64_t kMaxMpiCount = INT_MAX;

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f16: return MPI_UINT16_T;  // moved as bits; reductions go through fp32
    case DType::bf16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::avg: return MPI_SUM;  // then divided
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

bool is_half(DType d) { return d == DType::f16 || d == DType::bf16; }

int as_count(std::int64_t n, const char* what) {
  TUTTI_CHECK_ARG(n <= kMaxMpiCount, what, ": ", n, " elements per rank exceed what one MPI call can move (",
                  kMaxMpiCount, "); split the tensor");
  return static_cast<int>(n);
}

void half_to_float(DType d, const std::uint16_t* in, float* out, std::int64_t n) {
  if (d == DType::f16) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = half_bits_to_float(in[i]);
  } else {
    // bf16 is the top half of an fp32: exact by a shift.
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint32_t bits = static_cast<std::uint32_t>(in[i]) << 16;
      std::memcpy(&out[i], &bits, sizeof bits);
    }
  }
}

void float_to_half(DType d, const float* in, std::uint16_t* out, std::int64_t n) {
  if (d == DType::f16) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = float_to_half_bits(in[i]);
  } else {
    for (std::int64_t i = 0; i < n; ++i) out[i] = float_to_bf16_bits(in[i]);
  }
}

void divide(float* x, std::int64_t n, int by) {
  const float d = static_cast<float>(by);
  for (std::int64_t i = 0; i < n; ++i) x[i] /= d;
}

// The watchdog's clock: CLOCK_MONOTONIC (steady_clock's) at tick resolution, a few ns per
// read; deadlines are seconds.
Clock::time_point coarse_now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return Clock::time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
}

const char* byte_ptr(const Tensor& t) { return static_cast<const char*>(t.data()); }

bool overlap(const char* a, std::size_t a_bytes, const char* b, std::size_t b_bytes) {
  return a_bytes > 0 && b_bytes > 0 && a < b + b_bytes && b < a + a_bytes;
}

bool overlap(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return false;
  return overlap(byte_ptr(a), a.nbytes(), byte_ptr(b), b.nbytes());
}

// A queued collective is its own Work state (one allocation per collective).
struct Op final : HostWork {
  // The info moves to the Work state (the label with it; c.info keeps the rest).
  explicit Op(Communicator::Collective&& collective) : HostWork(std::move(collective.info)), c(std::move(collective)) {}
  Communicator::Collective c;
  std::shared_ptr<Event> input_ready;  // GPU tensors: recorded on the caller's stream
  HostWork* work = this;
};

// Everything the threads touch. The threads hold it by shared_ptr, so a thread stuck in MPI
// after a missed deadline never outlives what it uses.
struct Engine final : WorkRunner, Watched {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm check = MPI_COMM_NULL;  // the agreement before the data (never matches data traffic)
  std::shared_ptr<ProgressBoard> board;
  int board_comm = -1;
  int rank = 0;
  int size = 1;
  Device device;  // the GPU that GPU tensors are staged from (cpu: none)
  double timeout_s = 300;
  bool debug = false;
  bool abort_on_timeout = true;

  std::mutex queue_mutex;
  std::condition_variable queue_cv;
  std::deque<std::shared_ptr<Op>> queue;
  std::atomic<std::size_t> queued{0};
  std::uint64_t issued_total = 0;     // under queue_mutex
  std::atomic<bool> sleeping{false};  // in an untimed wait: an issuer must wake it
  bool stopping = false;
  bool abandoned = false;  // the Job left by an exception: run nothing more
  // Someone runs a collective (the thread, or a waiting caller in run_until): collectives are
  // taken from the front of the queue only while nobody is, so they run one at a time, in
  // issue order, whoever runs them.
  bool executing = false;
  bool thread_done = false;
  std::condition_variable done_cv;

  // The collective in progress, for the watchdog (under queue_mutex too: the runner sets it
  // while it holds the lock to pop anyway, so watching costs no lock of its own). A plain
  // pointer (no reference count to touch per collective): the runner holds the op alive
  // from begin_next until after end_current, and a thread stuck in MPI holds it forever.
  Op* current = nullptr;
  Clock::time_point started;
  std::atomic<bool> broken{false};
  std::string broken_report;

  // Scratch of the communication thread.
  std::vector<float> f32_a, f32_b;
  std::shared_ptr<Storage> pinned;
  Stream staging;

  void loop();
  // The watchdog's check, every tick: the collective in progress against its deadline.
  void poll(Watchdog& watchdog) override;
  // Takes the front of the queue and makes it current (executing). With queue_mutex held.
  std::shared_ptr<Op> begin_next();
  // The current collective is done (not executing). With queue_mutex held.
  void end_current();
  // Carries out `op` (begun with begin_next) into its Work. Call without queue_mutex.
  void run(const std::shared_ptr<Op>& op);
  // A caller waiting for `work` runs the CPU collectives at the front of the queue up to it
  // itself, when the communication thread is idle: a collective issued and waited for at once
  // then costs what the raw MPI call costs, with no hand-off between threads.
  void run_until(const HostWork& work) override;
  void execute(Op& op);
  void run_host(const Communicator::Collective& c);
  void run_staged(Op& op);
  void allreduce(const Tensor& in, const Tensor& out, ReduceOp op);
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op);
  void allgather(const Tensor& in, const Tensor& out);
  void broadcast(const Tensor& in, const Tensor& out, int root);
  std::exception_ptr broken_error();
  // The collective in progress missed its deadline and the job goes on (abort_on_timeout =
  // false): fail it and everything queued behind it and mark the communicator broken. Call
  // with queue_mutex held.
  void fail_broken(const std::string& report);
};

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
    if (waited <= timeout_s) return;
    info = current->info();
    behind = queue.size();
  }
  // Without the lock: the report may wait for other hosts' answers.
  const std::optional<std::string> report =
      watchdog.collective_missed("mpi", info, board_comm, timeout_s, waited, behind, debug, abort_on_timeout);
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
  if (debug || largest_message_bytes(c.info, size) > kAgreeAboveBytes) agree(check, c.info);
  const Tensor& any = c.output.defined() ? c.output : c.input;
  if (any.defined() && any.device().is_cuda()) {
    run_staged(op);
  } else {
    run_host(c);
  }
}

void Engine::run_host(const Communicator::Collective& c) {
  switch (c.info.kind) {
    case CollectiveKind::allreduce: return allreduce(c.input, c.output, c.info.op);
    case CollectiveKind::reduce_scatter: return reduce_scatter(c.input, c.output, c.info.op);
    case CollectiveKind::allgather: return allgather(c.input, c.output);
    case CollectiveKind::broadcast: return broadcast(c.input, c.output, c.info.root);
    case CollectiveKind::barrier: TUTTI_MPI_CHECK(MPI_Barrier(comm)); return;
  }
}

void Engine::allreduce(const Tensor& in, const Tensor& out, ReduceOp op) {
  const std::int64_t n = out.numel();
  const DType dt = out.dtype();
  if (is_half(dt)) {
    const std::int64_t chunk = std::min(n, kHalfChunk);
    if (static_cast<std::int64_t>(f32_a.size()) < chunk) f32_a.resize(static_cast<std::size_t>(chunk));
    const auto* src = static_cast<const std::uint16_t*>(in.data());
    auto* dst = static_cast<std::uint16_t*>(out.data());
    for (std::int64_t off = 0; off < n || (n == 0 && off == 0); off += chunk) {
      const std::int64_t m = std::min(chunk, n - off);
      half_to_float(dt, src + off, f32_a.data(), m);
      TUTTI_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, f32_a.data(), static_cast<int>(m), MPI_FLOAT, mpi_op(op), comm));
      if (op == ReduceOp::avg) divide(f32_a.data(), m, size);
      float_to_half(dt, f32_a.data(), dst + off, m);
      if (n == 0) break;
    }
    return;
  }
  // The hot path of small collectives: the pointers and sizes are read once.
  const std::int64_t es = static_cast<std::int64_t>(size_of(dt));
  char* const out_ptr = static_cast<char*>(out.data());
  const char* const in_ptr = byte_ptr(in);
  const std::size_t bytes = static_cast<std::size_t>(n * es);
  const bool in_place = in_ptr == out_ptr;
  const bool overlapping = !in_place && overlap(in_ptr, bytes, out_ptr, bytes);
  if (overlapping) std::memmove(out_ptr, in_ptr, bytes);
  const bool use_in_place = in_place || overlapping;
  const MPI_Datatype type = mpi_type(dt);
  const std::int64_t chunk = kMaxMpiCount / 2;
  for (std::int64_t off = 0; off < n || (n == 0 && off == 0); off += chunk) {
    const std::int64_t m = std::min(chunk, n - off);
    char* o = out_ptr + off * es;
    const void* i = use_in_place ? MPI_IN_PLACE : in_ptr + off * es;
    TUTTI_MPI_CHECK(MPI_Allreduce(i, o, static_cast<int>(m), type, mpi_op(op), comm));
    if (n == 0) break;
  }
  if (op == ReduceOp::avg) divide(static_cast<float*>(out.data()), n, size);  // f32 (ints refused)
}

void Engine::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  const std::int64_t n = out.numel();
  const int count = as_count(n, "reduce_scatter");
  const DType dt = out.dtype();
  if (is_half(dt)) {
    const std::int64_t total = in.numel();
    if (static_cast<std::int64_t>(f32_a.size()) < total) f32_a.resize(static_cast<std::size_t>(total));
    if (static_cast<std::int64_t>(f32_b.size()) < n) f32_b.resize(static_cast<std::size_t>(n));
    half_to_float(dt, static_cast<const std::uint16_t*>(in.data()), f32_a.data(), total);
    TUTTI_MPI_CHECK(MPI_Reduce_scatter_block(f32_a.data(), f32_b.data(), count, MPI_FLOAT, mpi_op(op), comm));
    if (op == ReduceOp::avg) divide(f32_b.data(), n, size);
    float_to_half(dt, f32_b.data(), static_cast<std::uint16_t*>(out.data()), n);
    return;
  }
  if (overlap(in, out)) {
    // In place: MPI may not read and write the same buffer; reduce into scratch.
    std::vector<char> scratch(out.nbytes());
    TUTTI_MPI_CHECK(MPI_Reduce_scatter_block(in.data(), scratch.data(), count, mpi_type(dt), mpi_op(op), comm));
    std::memcpy(out.data(), scratch.data(), out.nbytes());
  } else {
    TUTTI_MPI_CHECK(MPI_Reduce_scatter_block(in.data(), out.data(), count, mpi_type(dt), mpi_op(op), comm));
  }
  if (op == ReduceOp::avg) divide(static_cast<float*>(out.data()), n, size);
}

void Engine::allgather(const Tensor& in, const Tensor& out) {
  const int count = as_count(in.numel(), "allgather");
  const MPI_Datatype type = mpi_type(in.dtype());
  const char* my_chunk = byte_ptr(out) + static_cast<std::size_t>(rank) * in.nbytes();
  if (in.nbytes() > 0 && byte_ptr(in) == my_chunk) {
    TUTTI_MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, count, type, out.data(), count, type, comm));
  } else if (overlap(in, out)) {
    const std::vector<char> copy(byte_ptr(in), byte_ptr(in) + in.nbytes());
    TUTTI_MPI_CHECK(MPI_Allgather(copy.data(), count, type, out.data(), count, type, comm));
  } else {
    TUTTI_MPI_CHECK(MPI_Allgather(in.data(), count, type, out.data(), count, type, comm));
  }
}

void Engine::broadcast(const Tensor& in, const Tensor& out, int root) {
  if (rank == root && in.data() != out.data()) std::memmove(out.data(), in.data(), out.nbytes());
  const std::int64_t n = out.numel();
  const std::size_t es = size_of(out.dtype());
  const std::int64_t chunk = kMaxMpiCount / 2;
  for (std::int64_t off = 0; off < n || (n == 0 && off == 0); off += chunk) {
    const std::int64_t m = std::min(chunk, n - off);
    TUTTI_MPI_CHECK(MPI_Bcast(static_cast<char*>(out.data()) + off * static_cast<std::int64_t>(es), static_cast<int>(m),
                              mpi_type(out.dtype()), root, comm));
    if (n == 0) break;
  }
}

// GPU tensors: one pinned host buffer holds host twins of input and output. Where the two
// overlap (the in-place forms) the twins overlap the same way, so the CPU path sees the same
// aliasing as the caller's tensors.
void Engine::run_staged(Op& op) {
  const auto& c = op.c;
  if (c.info.kind == CollectiveKind::barrier) return run_host(c);
  if (op.input_ready) op.input_ready->synchronize();
  if (!staging.device().is_cuda()) staging = Stream::create(c.output.device(), /*high_priority=*/true);

  const Tensor& in = c.input;
  const Tensor& out = c.output;
  const char* lo = byte_ptr(out);
  const char* hi = byte_ptr(out) + out.nbytes();
  const bool shared = in.defined() && (overlap(in, out) || in.data() == out.data());
  if (shared) {
    lo = std::min(lo, byte_ptr(in));
    hi = std::max(hi, byte_ptr(in) + in.nbytes());
  }
  const std::size_t span = static_cast<std::size_t>(hi - lo);
  const std::size_t in_bytes = (in.defined() && !shared) ? in.nbytes() : 0;
  const std::size_t need = span + in_bytes + 64;
  if (!pinned || pinned->nbytes() < need) pinned = Storage::allocate(need, Device::cpu(), /*pinned=*/true);
  char* base = static_cast<char*>(pinned->data());
  auto twin = [&](const Tensor& t, char* at) { return Tensor::wrap(at, t.shape(), t.dtype(), Device::cpu()); };

  Tensor host_out = twin(out, base + (byte_ptr(out) - lo));
  Tensor host_in;
  if (shared) {
    host_in = twin(in, base + (byte_ptr(in) - lo));
    gpu::memcpy_async(base, lo, span, staging.native());
  } else if (in.defined()) {
    char* at = base + ((span + 63) / 64) * 64;
    host_in = twin(in, at);
    gpu::memcpy_async(at, in.data(), in.nbytes(), staging.native());
  }
  staging.synchronize();
  run_host(Communicator::Collective{c.info, host_in, host_out, Stream()});
  gpu::memcpy_async(out.data(), host_out.data(), out.nbytes(), staging.native());
  staging.synchronize();
}

class MpiBackend final : public Backend {
 public:
  MpiBackend(MPI_Comm parent, Device device, CommOptions options, int rank, int size, int board_comm)
      : Backend(rank, size, std::move(options)), engine_(std::make_shared<Engine>()) {
    Engine& e = *engine_;
    TUTTI_MPI_CHECK(MPI_Comm_dup(parent, &e.comm));
    TUTTI_MPI_CHECK(MPI_Comm_set_errhandler(e.comm, MPI_ERRORS_RETURN));
    TUTTI_MPI_CHECK(MPI_Comm_dup(parent, &e.check));
    TUTTI_MPI_CHECK(MPI_Comm_set_errhandler(e.check, MPI_ERRORS_RETURN));
    e.rank = rank;
    e.size = size;
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
      if (!finalized) {
        MPI_Comm_free(&e.comm);
        MPI_Comm_free(&e.check);
      }
      e.comm = e.check = MPI_COMM_NULL;
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
