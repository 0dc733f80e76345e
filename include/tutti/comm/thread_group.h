// ThreadGroup: N ranks as N threads of one process, for unit tests of the code above the
// communicator (the reducer, DistributedDataParallel, ZeRO) without mpirun, as gloo's tests
// run ranks as threads. Each rank gets a Communicator (backend "thread", CPU tensors only) and
// a Bootstrap. The collectives keep the promises of communicator.h; on top, a test can make
// chosen collectives late, fail, or complete out of issue order (CollectiveFault), to check
// that the code above waits for what it reads and survives what it must.
//
//   tutti::ThreadGroup group(3);
//   group.inject({.seq = 2, .action = tutti::CollectiveFault::Action::delay, .delay = 20ms});
//   group.run([&](int rank) {
//     tutti::Communicator& comm = group.communicator(rank);
//     ...   // one rank's program: build a model, DistributedDataParallel(comm, model), train
//   });
//
// How a collective runs: when the last rank has issued collective #s, a helper thread reads
// every rank's input and computes every rank's result (halves in fp32, rounded once; sums in
// rank order, so results are the same on every rank and every run); each rank's output is
// written, and its Work completed, at that rank's completion time (at once, or as a fault
// says). A Work that is waited on longer than the communicator's timeout fails with
// TimeoutError naming the ranks that never issued the collective. Ranks that issue different
// collectives at one sequence number all fail with InvalidArgument naming both.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include "tutti/comm/bootstrap.h"
#include "tutti/comm/communicator.h"

namespace tutti {

struct CollectiveFault {
  enum class Action : std::uint8_t {
    delay,    // outputs written and the Work completed `delay` later than they could be
    fail,     // the Work fails with BackendError ("injected failure"); outputs untouched
    reorder,  // the Work completes only after the Works of the next `after` collectives of this
              // rank's communicator have (completion order differs from issue order), or,
              // when a thread waits for it first, right after the later ones already due
  };
  std::uint64_t seq = 1;  // which collective: its sequence number (1 for the first issued)
  int rank = -1;          // whose Work (-1: every rank's)
  Action action = Action::delay;
  std::chrono::milliseconds delay{0};
  int after = 1;
};

class ThreadGroup {
 public:
  // `options`: the communicators' (CommOptions::timeout bounds every wait on a Work, and on
  // the bootstrap, before it throws TimeoutError). abort_on_timeout is ignored: a thread group
  // never ends the process.
  explicit ThreadGroup(int size, CommOptions options = {});
  ~ThreadGroup();
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  int size() const;
  Communicator& communicator(int rank);
  Bootstrap& bootstrap(int rank);
  // Faults apply to collectives issued from now on; several may name one collective.
  void inject(CollectiveFault fault);
  void clear_faults();
  // Runs body(rank) on size() threads, each reporting its rank in tutti errors
  // (set_thread_error_rank), and joins them. If some threads threw, rethrows the exception of
  // the lowest such rank after every thread has ended.
  void run(const std::function<void(int rank)>& body);

  struct Impl;  // internal

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace tutti
