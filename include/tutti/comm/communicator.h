// Communicator: the five collectives that data parallelism needs (allreduce, reduce_scatter,
// allgather, broadcast, barrier) and one point-to-point exchange (sendrecv, for replicating
// state to another rank), over Tensors, behind one interface whose backend is chosen at run
// time (tutti::Job picks it; see job.h):
//
//   "nccl"  GPU tensors, NCCL on a dedicated high-priority CUDA stream of the communicator.
//   "mpi"   CPU tensors, MPI on a dedicated communication thread of the communicator; GPU
//           tensors through pinned host memory (copy to the host, reduce there, copy back),
//           for builds without NCCL and for several ranks that share one GPU.
//
// Promises every backend keeps:
// - Every collective is COLLECTIVE over the communicator: every rank must issue the same
//   collectives, with the same counts, dtypes, ops and roots, in the same order (sendrecv's
//   peers differ per rank: see there). They are carried out in the order they are issued,
//   identically on every rank. Issue them from one thread (or order the issuing threads
//   yourself).
// - Every collective is ASYNCHRONOUS: the call returns at once with a Work handle and never
//   blocks on other ranks (debug mode on the nccl backend is the one exception, see
//   CommOptions::debug). The tensors must stay unchanged (inputs) and unread (outputs) until
//   the Work is complete; the Work keeps their storage alive until then.
// - Every collective has a deadline (CommOptions::timeout). One that misses it ends the whole
//   job (MPI_Abort, exit code 14; ncclCommAbort first on nccl) after printing to stderr one
//   report, from the lowest waiting rank: the collective (sequence number, kind, op, count,
//   dtype, who issued it), how long it waited, which ranks had not reached it and where every
//   rank was (its last collective, or its phase: starting, finalizing...; "stopped" for a
//   process stopped by SIGSTOP). The other ranks print one line naming that rank.
// - Counts or dtypes that differ between ranks never make a backend write past a buffer: the
//   mpi backend agrees on every collective that can move more than 1 KiB in one message
//   before moving its data (one small allreduce; a mismatch fails the collective on every rank
//   with an InvalidArgument naming both; sendrecv's peers are not part of it), and smaller
//   ones travel as MPI eager messages, whose size MPI checks (MPI_ERR_TRUNCATE, or the
//   deadline when the ranks wait for each other). NCCL writes each rank's output within its
//   own count. Debug mode agrees on every collective.
//   LIMIT: below 1 KiB, without debug mode, calls that differ only in what their bytes mean
//   are NOT detected: 10 x f32 on one rank and 10 x i32 on another (40 B each) complete with
//   meaningless values and no error (the check would cost a round trip on every small
//   collective). Set TUTTI_DEBUG=1 (CommOptions::debug) to have every collective compared.
// - Half types (f16, bf16): the mpi backend reduces them in fp32 and rounds once at the end
//   (never adds them as 16-bit integers); nccl uses NCCL's kernels, which add in fp32 but
//   store the half type between the steps of a ring.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"

namespace tutti {

// How allreduce and reduce_scatter combine the ranks' values. avg is the sum divided by the
// number of ranks, computed in the tensor's float type (fp32 for halves); it is defined for
// float dtypes only (an integer avg throws InvalidArgument: truncate or round it yourself).
enum class ReduceOp : std::uint8_t { sum, avg, max, min };
std::string_view name_of(ReduceOp op);

enum class CollectiveKind : std::uint8_t { allreduce, reduce_scatter, allgather, broadcast, barrier, sendrecv };
std::string_view name_of(CollectiveKind kind);

// What a collective is; carried into its Work, its error messages and its timeout report.
struct CollectiveInfo {
  std::uint64_t seq = 0;  // 1, 2, 3... per communicator, in issue order (0: no collective)
  CollectiveKind kind = CollectiveKind::barrier;
  ReduceOp op = ReduceOp::sum;  // allreduce and reduce_scatter only
  DType dtype = DType::f32;
  // Elements per rank that every rank must agree on: the tensor's for allreduce and
  // broadcast, the output's for reduce_scatter, the input's for allgather and sendrecv (input
  // and output have it), 0 for barrier.
  std::int64_t count = 0;
  int root = -1;  // broadcast only
  // sendrecv only (else -1): this rank's peers. They differ per rank, so unlike the fields
  // above they are not compared across ranks (not in the agreement nor in debug mode).
  int send_to = -1;
  int recv_from = -1;
  std::string label;  // who issued it ("ddp bucket 3"); may be empty
  // When it was issued (steady clock, ns) while a trace was recording (trace::on()), else 0:
  // the backends then record its span (docs/observability.md).
  std::int64_t issued_ns = 0;
  // "#17 allreduce(sum) 262144 x f32 (1.0 MiB) issued by 'ddp bucket 3'".
  std::string str() const;
};

// Options of a communicator. Unset fields take their value from the environment, so a run can
// be adjusted without recompiling; a field set in code wins over the environment.
struct CommOptions {
  // Deadline of every collective, from when it starts (on the mpi backend: when the
  // communication thread takes it up; on nccl: when it is issued). Unset: the environment
  // variable TUTTI_TIMEOUT_S (seconds, may be fractional), else 300 s.
  std::optional<std::chrono::duration<double>> timeout;
  // Debug mode: before each collective the ranks compare its fingerprint (sequence number,
  // kind, op, count, dtype, root) and a mismatch fails the collective on every rank with an
  // error naming the ranks and both descriptions, instead of hanging or returning garbage.
  // Costs one small allreduce per collective (and an allgather on a mismatch); on nccl the
  // issuing call then blocks until all ranks have issued the collective. (Without debug mode
  // the mpi backend does the same for collectives above 1 KiB.) Unset: on when the
  // environment has TUTTI_DEBUG=1.
  std::optional<bool> debug;
  // What a missed deadline does: true (the default) prints the report and ends the whole
  // job. false makes the Work (and every later one) throw TimeoutError instead; the
  // communicator is then unusable and the process must end without MPI_Finalize (a rank may
  // still be stuck inside MPI): for tests and for programs that want to report first.
  bool abort_on_timeout = true;

  // The values in effect (options, then environment, then defaults). Throw InvalidArgument
  // on a malformed environment variable.
  double timeout_seconds() const;
  bool debug_enabled() const;
};

// Per-call options.
struct CallOptions {
  // Who issued the collective, for error messages and timeout reports ("ddp bucket 3").
  std::string label;
  // GPU tensors only: the stream whose work produced the inputs (and will read the outputs
  // after Work::wait(stream)). The collective starts after the work issued to it so far,
  // without blocking the host. Default (a CPU Stream): the device's default stream.
  Stream stream;
};

// A handle on an issued collective. Copies share the same collective. A default-constructed
// Work is complete.
class Work {
 public:
  class State;  // backend-specific; internal
  Work() = default;
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}

  // Non-blocking: true when the collective has completed (its outputs may be read on the
  // host, or on any stream for GPU tensors). Throws the collective's error if it failed.
  bool test() const;
  // Blocks the host until the collective completes; throws its error if it failed (the
  // deadline bounds the wait). Not collective by itself. On the mpi backend, when the
  // communication thread is idle, the waiting thread carries out the CPU collectives queued
  // up to this one itself (in issue order), which spares a hand-off between threads.
  void wait() const;
  // Makes `stream` wait for the collective without blocking the host where the backend can
  // (nccl: an event wait on the device); elsewhere it is wait(). Then work issued to `stream`
  // may read the outputs.
  void wait(const Stream& stream) const;
  // What the collective is (seq 0 for a default-constructed Work).
  const CollectiveInfo& info() const;
  // Milliseconds the collective itself ran, from when it started (not while it waited in the
  // queue) to its completion, once it has completed on a backend that measures it (mpi);
  // empty otherwise (nccl, not complete yet, failed).
  std::optional<double> run_ms() const;

 private:
  std::shared_ptr<State> state_;
};

// The interface. Get one from tutti::Job (job.communicator(), job.new_communicator()).
//
// Tensor rules shared by all collectives: defined, contiguous (every Tensor is), all on one
// device that the backend serves; f32, f16, bf16, i32, i64. "In place" means input and output
// are the same tensor (allreduce, broadcast), or the output is the input's rank-th chunk
// (reduce_scatter: output = input.view(rank * n, {n})), or the input is the output's rank-th
// chunk (allgather: input = output.view(rank * n, {n})). Argument errors throw
// InvalidArgument at the call, before anything is issued, and are the same on every rank
// only if the arguments are.
class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // "mpi" or "nccl".
  virtual std::string_view backend() const = 0;
  int rank() const { return rank_; }
  int size() const { return size_; }
  // The options in effect (resolved: timeout and debug set).
  double timeout_seconds() const { return timeout_s_; }
  bool debug() const { return debug_; }
  const CommOptions& options() const { return options_; }

  // Collective. tensor = op over ranks of tensor (in place).
  Work allreduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum, const CallOptions& call = {});
  // Collective. output = op over ranks of input; same dtype and numel (output may be input).
  Work allreduce(const Tensor& input, const Tensor& output, ReduceOp op = ReduceOp::sum, const CallOptions& call = {});
  // Collective. input holds size() * n elements; output (n elements) gets chunk rank() of
  // op over ranks of input. In place: output = input.view(rank() * n, {n}) (the rest of
  // input is left unchanged).
  Work reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op = ReduceOp::sum,
                      const CallOptions& call = {});
  // Collective. input holds n elements; output (size() * n) gets rank r's input at chunk r.
  // In place: input = output.view(rank() * n, {n}).
  Work allgather(const Tensor& input, const Tensor& output, const CallOptions& call = {});
  // Collective. tensor on every rank = tensor on `root` (in place).
  Work broadcast(const Tensor& tensor, int root, const CallOptions& call = {});
  // Collective. output on every rank = input on `root` (input is read on root only; other
  // ranks may pass an undefined input).
  Work broadcast(const Tensor& input, const Tensor& output, int root, const CallOptions& call = {});
  // Collective. Completes when every rank has issued it (and everything issued before it
  // has completed on this rank).
  Work barrier(const CallOptions& call = {});
  // Collective: every rank calls it (at the same point of its sequence), with an input and an
  // output of the same dtype and count, the same on every rank. Each rank sends `input` to rank
  // `send_to` and receives into `output` the input of rank `recv_from`. The peers must form a
  // permutation: rank r sends to s exactly when s receives from r (a ring rotation, pairwise
  // swaps, or a rank exchanging with itself: send_to == recv_from == rank() copies input to
  // output). input and output must not overlap. Checked at the call (InvalidArgument): peers
  // are ranks of the communicator, and send_to == rank() exactly when recv_from == rank().
  // Checked across ranks like any collective: the kind, count and dtype (agreed on above 1 KiB,
  // or always in debug mode; below, mpi fails the rank that receives a message of another
  // size). NOT checked across ranks on mpi and nccl: that the peers form a permutation;
  // inconsistent peers leave a receive unmatched, and the deadline ends the job (a ThreadGroup
  // without watchdogs fails every rank's Work with InvalidArgument instead).
  Work sendrecv(const Tensor& input, const Tensor& output, int send_to, int recv_from, const CallOptions& call = {});

  // For backends: one validated collective as they get it: its info (seq is the next sequence
  // number), its tensors (undefined where the collective has none; for broadcast off the
  // root, input is undefined) and the caller's stream (GPU tensors: the stream whose work
  // produced the inputs; the device's default stream when the call named none).
  struct Collective {
    CollectiveInfo info;
    Tensor input;
    Tensor output;
    Stream stream;
  };

 protected:
  // `options` are resolved here (timeout, debug).
  Communicator(int rank, int size, CommOptions options);

  // What the backends implement. They are called with the issue lock held, so calls arrive
  // in issue order. The defaults throw BackendError "Backend <name> does not support <what>".
  virtual Work do_allreduce(Collective c);
  virtual Work do_reduce_scatter(Collective c);
  virtual Work do_allgather(Collective c);
  virtual Work do_broadcast(Collective c);
  virtual Work do_barrier(Collective c);
  virtual Work do_sendrecv(Collective c);
  // Throws BackendError unless the backend serves tensors on `device`; the default accepts all.
  virtual void check_device(Device device, const CollectiveInfo& info) const;
  [[noreturn]] void unsupported(std::string_view what) const;

 private:
  CollectiveInfo make_info(CollectiveKind kind, ReduceOp op, DType dtype, std::int64_t count, int root,
                           const CallOptions& call) const;
  Collective make_collective(CollectiveInfo info, Tensor input, Tensor output, const CallOptions& call) const;
  void check_tensor(const char* role, const Tensor& t, const CollectiveInfo& info) const;
  // Assigns the sequence number and hands the collective to the backend, under the lock.
  Work issue(Collective c, Work (Communicator::*run)(Collective));

  int rank_;
  int size_;
  CommOptions options_;
  double timeout_s_;
  bool debug_;
  std::mutex issue_mutex_;
  std::uint64_t next_seq_ = 1;
};

}  // namespace tutti
