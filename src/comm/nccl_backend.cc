// The nccl backend (compiled only where the build has NCCL): GPU tensors, collectives issued
// in order on the communicator's own high-priority stream, after the caller's stream (an
// event, no host sync). A Work is an event recorded after the collective on that stream.
//
// Deadlines and asynchronous NCCL errors: Work::wait polls its event, the communicator's
// async error and its deadline; the process's watchdog (comm/watchdog.h) does the same for
// collectives nobody waits on. A missed deadline or an NCCL error ends the job (the watchdog
// aborts every NCCL comm, then its control channel ends the job) after the report, or with abort_on_timeout = false
// aborts the NCCL comm (which frees the stuck stream) and fails the Work and every later one.
// A Job that an exception unwinds through aborts its NCCL comms instead of destroying them.
//
// Counts that differ between ranks: NCCL moves data through its own buffers (tutti registers
// no user buffer with it), and each rank's kernels write only into that rank's own output
// within its own count, so a mismatch hangs (and the deadline ends it) or yields wrong values,
// but writes past no buffer. Debug mode agrees on every collective before issuing it.
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <thread>

#include "comm/backend.h"
#include "comm/progress.h"
#include "comm/watchdog.h"
#include "comm/work_state.h"
#include "core/gpu_runtime.h"
#include "core/nccl_check.h"

namespace tutti::detail {
namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
  }
  return ncclFloat32;
}

// NCCL reduces halves in their own type, ring step by ring step; unlike the mpi backend this
// rounds at every step (NCCL offers no wider accumulation for f16 and bf16).
ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

cudaStream_t as_stream(const Stream& s) { return static_cast<cudaStream_t>(s.native()); }

struct NcclEngine;

class NcclWork final : public Work::State {
 public:
  NcclWork(CollectiveInfo info, std::shared_ptr<NcclEngine> engine, Communicator::Collective keep)
      : Work::State(std::move(info)), engine_(std::move(engine)), keep_(std::move(keep)), issued_(Clock::now()) {}

  bool test() override;
  void wait() override;
  void wait(const Stream& stream) override;

  Event done;  // recorded after the collective on the communicator's stream
  // Observed complete (event done) or failed; then the tensors are let go.
  bool poll();
  void fail(std::exception_ptr error);
  Clock::time_point issued() const { return issued_; }

 private:
  void rethrow_if_failed();
  std::shared_ptr<NcclEngine> engine_;
  std::mutex mutex_;
  Communicator::Collective keep_;  // keeps the tensors alive until the collective is done
  std::exception_ptr error_;
  bool complete_ = false;
  Clock::time_point issued_;
};

struct NcclEngine final : Watched {
  // Atomic: a failure path (any thread) takes it away, exactly once, to abort it.
  std::atomic<ncclComm_t> comm{nullptr};
  std::unique_ptr<ControlChannel> agreement;  // debug fingerprints
  Device device;
  Stream stream;
  double timeout_s = 300;
  bool abort_on_timeout = true;
  bool debug = false;
  std::shared_ptr<ProgressBoard> board;
  int board_comm = -1;
  int size = 1;  // the communicator's ranks

  std::mutex mutex;  // outstanding, broken_report
  std::deque<std::shared_ptr<NcclWork>> outstanding;
  std::atomic<bool> broken{false};
  std::string broken_report;

  // The communicator's async error, as a report ("" when none).
  std::string async_error() {
    const ncclComm_t c = comm.load();
    if (c == nullptr || broken.load()) return "";
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(c, &async) != ncclSuccess || async == ncclSuccess || async == ncclInProgress) {
      return "";
    }
    return std::string("NCCL asynchronous error ") + nccl_result_name(async) + ": " + ncclGetErrorString(async) +
           " (last NCCL message: " + ncclGetLastError(c) + ")";
  }

  // Ends the job with `report`, or (abort_on_timeout = false) aborts the NCCL comm and fails
  // every outstanding Work. `timeout` says which exception the Works get.
  void fatal(const std::string& report, bool timeout) {
    if (abort_on_timeout) {
      // The watchdog aborts every NCCL comm (abort_now) before MPI ends the processes.
      if (Watchdog* w = Watchdog::current()) w->end_job(report, kExitTimeout);
      if (const ncclComm_t c = comm.exchange(nullptr)) ncclCommAbort(c);
      std::fprintf(stderr, "tutti [rank %d]: %s Ending the job.\n", error_rank(), report.c_str());
      if (agreement) agreement->end_job(report, kExitTimeout);
      std::_Exit(kExitTimeout);
    }
    std::deque<std::shared_ptr<NcclWork>> failing;
    {
      std::lock_guard lock(mutex);
      if (broken.exchange(true)) return;
      broken_report = report;
      failing.swap(outstanding);
    }
    if (const ncclComm_t c = comm.exchange(nullptr)) ncclCommAbort(c);
    for (auto& w : failing) {
      w->fail(timeout ? timeout_error(report)
                      : std::make_exception_ptr(BackendError(report, strip_path(__FILE__), error_rank())));
    }
  }

  std::exception_ptr broken_error() {
    std::lock_guard lock(mutex);
    return timeout_error("communicator unusable after an earlier failure (" + broken_report + ")");
  }

  // Checks `w` (and the comm) once: returns true when it is complete. Reports a missed
  // deadline or an async error through fatal().
  bool check(NcclWork& w) {
    if (w.poll()) {
      if (board) board->completed(board_comm, w.info().seq);
      return true;
    }
    if (std::string err = async_error(); !err.empty()) {
      fatal(err + " during collective " + w.info().str(), /*timeout=*/false);
      return w.poll();
    }
    const double waited = seconds_since(w.issued());
    if (waited > timeout_s && !broken.load()) {
      std::size_t behind = 0;
      {
        std::lock_guard lock(mutex);
        behind = outstanding.empty() ? 0 : outstanding.size() - 1;
      }
      if (Watchdog* wd = Watchdog::current()) {
        // Ends the job (abort_on_timeout), or gives the report to fail the Works with; nothing
        // while a lower rank is expected to report it.
        if (auto report = wd->collective_missed("nccl", w.info(), board_comm, timeout_s, waited, behind, debug,
                                                abort_on_timeout)) {
          fatal(*report, /*timeout=*/true);
        }
      }
      return w.poll();
    }
    if (waited > Watchdog::kAbandonedWait && !broken.load()) {
      if (Watchdog* wd = Watchdog::current()) {
        if (auto report =
                wd->collective_abandoned("nccl", w.info(), board_comm, size, timeout_s, waited, abort_on_timeout)) {
          fatal(*report, /*timeout=*/true);
          return w.poll();
        }
      }
    }
    return false;
  }

  // The watchdog's check, every tick: let go of what is done, check the oldest of the rest.
  void poll(Watchdog&) override {
    std::shared_ptr<NcclWork> oldest;
    {
      std::lock_guard lock(mutex);
      if (broken.load()) return;
      while (!outstanding.empty() && outstanding.front()->poll()) {
        if (board) board->completed(board_comm, outstanding.front()->info().seq);
        outstanding.pop_front();
      }
      if (outstanding.empty()) return;
      oldest = outstanding.front();
    }
    try {
      check(*oldest);
    } catch (const std::exception& e) {
      // A CUDA error while polling: as fatal as an NCCL one.
      fatal(std::string("error while watching collective ") + oldest->info().str() + ": " + e.what(),
            /*timeout=*/false);
    }
  }

  // The job is ending: free the GPU from whatever kernel waits for the other ranks.
  void abort_now() noexcept override {
    if (const ncclComm_t c = comm.exchange(nullptr)) ncclCommAbort(c);
  }
};

bool NcclWork::poll() {
  std::lock_guard lock(mutex_);
  if (complete_ || error_) return true;
  if (!done.query()) return false;
  complete_ = true;
  keep_ = Communicator::Collective{};
  return true;
}

void NcclWork::fail(std::exception_ptr error) {
  std::lock_guard lock(mutex_);
  if (complete_ || error_) return;
  error_ = std::move(error);
}

void NcclWork::rethrow_if_failed() {
  std::lock_guard lock(mutex_);
  if (error_) std::rethrow_exception(error_);
}

bool NcclWork::test() {
  const bool finished = engine_->check(*this);
  rethrow_if_failed();
  return finished;
}

void NcclWork::wait() {
  // Polls (NCCL offers no blocking wait with a deadline): yield first, then sleep a little.
  for (int i = 0; !engine_->check(*this); ++i) {
    if (i < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  rethrow_if_failed();
}

void NcclWork::wait(const Stream& stream) {
  if (stream.device().is_cpu()) return wait();  // the host waits
  TUTTI_CHECK_ARG(stream.device() == done.device(), "Work::wait(stream): collective ", info().str(), " ran on ",
                  done.device().str(), " but the stream is on ", stream.device().str());
  rethrow_if_failed();
  done.wait(stream);
}

class NcclBackend final : public Backend {
 public:
  NcclBackend(Bootstrap& bootstrap, std::unique_ptr<ControlChannel> agreement, Device device, CommOptions options,
              int rank, int size, int board_comm)
      : Backend(rank, size, std::move(options)), engine_(std::make_shared<NcclEngine>()) {
    TUTTI_CHECK_ARG(device.is_cuda(), "the nccl backend needs a GPU device, got ", device.str());
    device.require_available();
    NcclEngine& e = *engine_;
    e.device = device;
    e.timeout_s = timeout_seconds();
    e.abort_on_timeout = this->options().abort_on_timeout;
    e.debug = debug();
    e.agreement = std::move(agreement);
    gpu::set_device(device.index);
    ncclUniqueId id{};
    if (rank == 0) TUTTI_NCCL_CHECK(ncclGetUniqueId(&id));
    const std::string id_bytes =
        bootstrap.broadcast(std::string_view(reinterpret_cast<const char*>(&id), sizeof id), 0);
    TUTTI_CHECK(id_bytes.size() == sizeof id, "the NCCL unique id arrived with ", id_bytes.size(), " bytes");
    std::memcpy(&id, id_bytes.data(), sizeof id);
    {
      ErrorContext context("creating the NCCL communicator of rank " + std::to_string(rank) + " of " +
                           std::to_string(size) + " on " + device.str());
      ncclComm_t c = nullptr;
      TUTTI_NCCL_CHECK(ncclCommInitRank(&c, size, id, rank));
      e.comm.store(c);
    }
    e.stream = Stream::create(device, /*high_priority=*/true);
    if (Watchdog* w = Watchdog::current()) {
      e.board = w->board();
      e.board_comm = board_comm;
      e.size = size;
      w->watch(engine_);
    }
  }
  ~NcclBackend() override { shutdown(std::numeric_limits<double>::infinity()); }

  std::string_view backend() const override { return "nccl"; }
  bool broken() const override { return engine_->broken.load(); }

  bool shutdown(double max_wait_s) noexcept override {
    NcclEngine& e = *engine_;
    if (shut_down_) return clean_;
    shut_down_ = true;
    // Issued collectives finish first (their deadlines bound the wait, and max_wait_s).
    const auto give_up = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(std::min(max_wait_s, 1e9)));
    bool waited_out = false;
    for (;;) {
      std::shared_ptr<NcclWork> w;
      {
        std::lock_guard lock(e.mutex);
        while (!e.outstanding.empty() && e.outstanding.front()->poll()) e.outstanding.pop_front();
        if (e.outstanding.empty() || e.broken.load()) break;
        w = e.outstanding.front();
      }
      if (Clock::now() > give_up) {
        waited_out = true;
        break;
      }
      try {
        e.check(*w);
      } catch (...) {
        // reported through the Work; nothing to add at teardown
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (waited_out) {
      abandon_comm();
      clean_ = false;
      return false;
    }
    if (!e.broken.load()) {
      try {
        gpu::set_device(e.device.index);
      } catch (...) {
      }
      if (const ncclComm_t c = e.comm.exchange(nullptr)) ncclCommDestroy(c);
      e.stream = Stream();
    }
    if (e.agreement) e.agreement->close(/*free=*/!e.broken.load());
    clean_ = !e.broken.load();
    return clean_;
  }

  void abandon() noexcept override {
    if (shut_down_) return;
    shut_down_ = true;
    clean_ = false;
    abandon_comm();
  }

 protected:
  void check_device(Device device, const CollectiveInfo& info) const override {
    if (device == engine_->device) return;
    TUTTI_THROW(BackendError, "Backend nccl does not support tensors on ", device.str(), " (this communicator serves ",
                engine_->device.str(), "; use Job::cpu_communicator() for CPU tensors): ", info.str());
  }

  Work do_allreduce(Collective c) override {
    return run(std::move(c), [](const Collective& c, ncclComm_t comm, cudaStream_t s) {
      return ncclAllReduce(c.input.data(), c.output.data(), static_cast<std::size_t>(c.output.numel()),
                           nccl_type(c.output.dtype()), nccl_op(c.info.op), comm, s);
    });
  }
  Work do_reduce_scatter(Collective c) override {
    return run(std::move(c), [](const Collective& c, ncclComm_t comm, cudaStream_t s) {
      return ncclReduceScatter(c.input.data(), c.output.data(), static_cast<std::size_t>(c.output.numel()),
                               nccl_type(c.output.dtype()), nccl_op(c.info.op), comm, s);
    });
  }
  Work do_allgather(Collective c) override {
    return run(std::move(c), [](const Collective& c, ncclComm_t comm, cudaStream_t s) {
      return ncclAllGather(c.input.data(), c.output.data(), static_cast<std::size_t>(c.input.numel()),
                           nccl_type(c.input.dtype()), comm, s);
    });
  }
  Work do_broadcast(Collective c) override {
    return run(std::move(c), [](const Collective& c, ncclComm_t comm, cudaStream_t s) {
      const void* send = c.input.defined() ? c.input.data() : c.output.data();
      return ncclBroadcast(send, c.output.data(), static_cast<std::size_t>(c.output.numel()),
                           nccl_type(c.output.dtype()), c.info.root, comm, s);
    });
  }
  Work do_barrier(Collective c) override {
    // A one-element allreduce on the stream: complete when every rank has issued it.
    if (!barrier_buffer_.defined()) barrier_buffer_ = Tensor::zeros({1}, DType::f32, engine_->device);
    c.input = c.output = barrier_buffer_;
    // A barrier has no tensor to say which stream it follows: the default stream, as documented
    // for a CallOptions without one (found by the emulated device: a CPU stream threw here).
    if (!c.stream.device().is_cuda()) c.stream = Stream::default_for(engine_->device);
    return run(std::move(c), [](const Collective& c, ncclComm_t comm, cudaStream_t s) {
      return ncclAllReduce(c.input.data(), c.output.data(), 1, ncclFloat32, ncclSum, comm, s);
    });
  }
  // One NCCL group of a send and a receive (to itself too, which NCCL allows). UNVERIFIED on a
  // real GPU so far: checked on the emulated device only (its ncclSend/ncclRecv over MPI).
  Work do_sendrecv(Collective c) override {
    return run(std::move(c), [](const Collective& c, ncclComm_t comm, cudaStream_t s) {
      const auto n = static_cast<std::size_t>(c.output.numel());
      const ncclDataType_t type = nccl_type(c.output.dtype());
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      r = ncclSend(c.input.data(), n, type, c.info.send_to, comm, s);
      if (r == ncclSuccess) r = ncclRecv(c.output.data(), n, type, c.info.recv_from, comm, s);
      const ncclResult_t end = ncclGroupEnd();  // always closes the group
      return r != ncclSuccess ? r : end;
    });
  }

 private:
  template <typename Launch>
  Work run(Collective c, Launch launch) {
    NcclEngine& e = *engine_;
    CollectiveInfo info = c.info;
    if (e.broken.load()) return HostWork::failed(info, e.broken_error());
    auto what = [&] { return "issuing collective " + info.str() + " on backend nccl"; };
    if (e.board) {
      e.board->issued(e.board_comm, info.seq);
      e.board->started(e.board_comm, info);
    }
    if (debug()) {
      // A mismatch fails the Work (as on the mpi backend), not the call.
      bool in_time = true;
      try {
        in_time = agree_polled(*e.agreement, info, e.timeout_s);
      } catch (...) {
        return HostWork::failed(info, in_context(std::current_exception(), what()));
      }
      if (!in_time) {
        // Some rank never reached this collective's agreement.
        std::optional<std::string> report;
        for (Watchdog* wd = Watchdog::current(); wd != nullptr && !report;) {
          report = wd->collective_missed("nccl", info, e.board_comm, e.timeout_s, e.timeout_s + Watchdog::kDeferReport,
                                         0, true, e.abort_on_timeout);
          if (!report) std::this_thread::sleep_for(Watchdog::kTick);
        }
        e.fatal(report.value_or("TIMEOUT: collective " + info.str() + " (its debug agreement)") +
                    " (in the debug agreement before the collective)",
                /*timeout=*/true);
        return HostWork::failed(info, e.broken_error());
      }
    }
    Event traced_begin;
    try {
      const ncclComm_t comm = e.comm.load();
      TUTTI_CHECK(comm != nullptr, "collective ", info.str(), " issued after the communicator was shut down");
      Event ready(e.device);
      ready.record(c.stream);
      ready.wait(e.stream);
      // Traced: the span on the communication stream, from when it could start to its end.
      if (info.issued_ns != 0) {
        traced_begin = Event(e.device, /*enable_timing=*/true);
        traced_begin.record(e.stream);
      }
      const bool empty = c.info.kind != CollectiveKind::barrier && c.info.count == 0;
      if (!empty) TUTTI_NCCL_CHECK(launch(c, comm, as_stream(e.stream)));
    } catch (...) {
      std::rethrow_exception(in_context(std::current_exception(), what()));
    }
    auto work = std::make_shared<NcclWork>(info, engine_, std::move(c));
    work->done = Event(e.device, /*enable_timing=*/info.issued_ns != 0);
    work->done.record(e.stream);
    if (info.issued_ns != 0) trace_collective_on_device(info, traced_begin, work->done);
    {
      std::lock_guard lock(e.mutex);
      e.outstanding.push_back(work);
    }
    return Work(work);
  }

  // Aborts the NCCL comm (frees the GPU from kernels that wait for other ranks); the agreement
  // channel is left alone (a rank may still be inside MPI with it).
  void abandon_comm() noexcept {
    NcclEngine& e = *engine_;
    {
      std::lock_guard lock(e.mutex);
      e.broken.store(true);
      e.broken_report = "the Job was left by an exception";
    }
    e.abort_now();
  }

  std::shared_ptr<NcclEngine> engine_;
  Tensor barrier_buffer_;
  bool shut_down_ = false;
  bool clean_ = false;
};

}  // namespace

std::shared_ptr<Backend> make_nccl_backend_impl(Bootstrap& bootstrap, std::unique_ptr<ControlChannel> agreement,
                                                Device device, CommOptions options, int board_comm) {
  return std::make_shared<NcclBackend>(bootstrap, std::move(agreement), device, std::move(options), bootstrap.rank(),
                                       bootstrap.size(), board_comm);
}

std::string nccl_version_impl() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
}

}  // namespace tutti::detail
