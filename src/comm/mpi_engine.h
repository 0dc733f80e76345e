// The mpi backend's engine: what its communication thread and the callers share (see
// mpi_backend.cc for the threads and the queue, mpi_collectives.cc for the data paths).
// Internal header of the mpi backend.
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/backend.h"
#include "comm/control.h"
#include "comm/progress.h"
#include "comm/watchdog.h"
#include "comm/work_state.h"

namespace tutti::detail {

// The mpi backend over duplicates of `parent` (collective over parent). `device` is the GPU
// it stages GPU tensors through (cpu: it takes CPU tensors only). `board_comm`: its slot on
// the progress board (-1: none); the same number on every rank.
std::shared_ptr<Backend> make_mpi_backend(MPI_Comm parent, Device device, CommOptions options, int board_comm = -1);

namespace mpi_engine {

// One collective's agreement carried in band, on the data's own communicator (mpi_in_band.cc).
// At the start every rank sends its fingerprint to every other rank (32-byte eager messages)
// and posts the receives of theirs. The data path waits for a peer's fingerprint before it
// posts a receive from that peer (so every message it receives has the size it posts), and
// each of its waits also takes the fingerprints that arrive meanwhile: the ranks agree without
// a round of their own, and no rank waits for any rank that it does not exchange data with. A
// fingerprint that differs: the rank waits for all of them (every rank sends its fingerprint
// before any data) and throws the agreement's InvalidArgument (throw_mismatch), as every rank
// does; receives still posted are cancelled. Collectives that MPI carries out call
// require_all() before their data: the same agreement as one round of point-to-point messages.
class InBand {
 public:
  // `tag`: this collective's tags are tag (fingerprints) and tag + 1 (data).
  InBand(MPI_Comm comm, int rank, int size, const Fingerprint& mine, int tag);
  InBand(const InBand&) = delete;
  InBand& operator=(const InBand&) = delete;
  ~InBand();
  // Blocks until every rank's fingerprint has arrived; throws the mismatch where one differs.
  void require_all();
  // Sends `scount` elements to `peer` and receives exactly `rcount` from it, once its
  // fingerprint has arrived and equals this rank's.
  void exchange(int peer, const void* send, std::int64_t scount, void* recv, std::int64_t rcount, MPI_Datatype type);
  void send(int peer, const void* buf, std::int64_t count, MPI_Datatype type);
  void recv(int peer, void* buf, std::int64_t count, MPI_Datatype type);

 private:
  void require(int peer);
  void arrived(int peer);
  // Waits for the data requests (reqs_[size_], reqs_[size_ + 1]), taking fingerprints meanwhile.
  void wait_data(std::int64_t rcount, MPI_Datatype type, int peer);
  [[noreturn]] void mismatch();
  MPI_Comm comm_;
  int rank_, size_, tag_;
  Fingerprint mine_;
  std::vector<Fingerprint> theirs_;
  std::vector<MPI_Request> reqs_;   // [0, size): fingerprint receives; [size]: data receive; [size + 1]: data send
  std::vector<MPI_Request> sends_;  // fingerprint sends
  std::vector<char> seen_;
  int missing_ = 0;
};

// Rabenseifner's allreduce (Open MPI's coll/tuned algorithm 6, which its default picks from
// 8 KiB at 4-7 ranks and from 256 KiB at 2-3) over `band`: `count` elements of `dtype` (f32,
// i32, i64; avg is sum here) from `in` into `out` (the same pointer: in place; else they must
// not overlap). `scratch` grows to half the buffer where the algorithm needs it.
void allreduce_in_band(InBand& band, int rank, int size, const void* in, void* out, std::int64_t count, DType dtype,
                       ReduceOp op, std::vector<char>& scratch);

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
  std::unique_ptr<ControlChannel> check;  // the agreement before the data above kInBandMaxRanks
  int in_band_tags = 0;                   // how many tag pairs the in-band agreement cycles through (0: none)
  bool in_band_allreduce = false;         // large allreduces run Rabenseifner's algorithm in band
  InBand* band = nullptr;                 // the current collective's, where its data path runs in band
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
  std::vector<char> scratch;
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
  void sendrecv(const Tensor& in, const Tensor& out, const CollectiveInfo& info);
  std::exception_ptr broken_error();
  // The collective in progress missed its deadline and the job goes on (abort_on_timeout =
  // false): fail it and everything queued behind it and mark the communicator broken. Call
  // with queue_mutex held.
  void fail_broken(const std::string& report);
};

}  // namespace mpi_engine
}  // namespace tutti::detail
