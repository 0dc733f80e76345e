// ThreadGroup: N ranks as N threads of one process, for unit tests of the code above the
// communicator (the reducer, DistributedDataParallel, ZeRO) without mpirun, as gloo's tests
// run ranks as threads. Each rank gets a Communicator (backend "thread", CPU tensors only) and
// a Bootstrap. The collectives keep the promises of communicator.h; on top, a test can make
// chosen collectives late, fail, or complete out of issue order (CollectiveFault), to check
// that the code above waits for what it reads and survives what it must.
//
// doc-test: fragment a sketch: one rank's program is elided
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
// collectives at one sequence number all fail with InvalidArgument naming both, as do ranks
// whose sendrecv peers do not form a permutation (which the real backends do not check).
//
// With ThreadGroupOptions::watchdog, each rank gets instead what a Job gives a rank under
// mpirun: a watchdog (the same code), a slot on a progress board, and a control channel to the
// other ranks' watchdogs. Then the deadline, the agreement before a collective (above 1 KiB,
// or every one in debug mode) and the end of a failing job are the watchdog's, as under
// mpirun; collectives whose calls differ but were not agreed on never complete (as a real
// transport would hang); and "ending the job" does not end the process: every rank's pending
// and later Works fail with the cause, and job_end() says which rank ended it and why. A rank
// whose body throws leaves as a Job left by an exception does (it tells the others, and ends
// the job unless they all leave alike).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tutti/comm/bootstrap.h"
#include "tutti/comm/communicator.h"
#include "tutti/comm/groups.h"
#include "tutti/comm/mesh.h"

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

struct ThreadGroupOptions {
  // The communicators' (CommOptions::timeout bounds every wait on a Work, and on the bootstrap,
  // before it throws TimeoutError). abort_on_timeout: with a watchdog, whether a missed
  // deadline ends the job (else the communicator fails its Works and is broken, as on the
  // real backends); without one it is ignored.
  CommOptions comm{};
  // Watch the ranks as a Job's are watched (see the top of this file).
  bool watchdog = false;
};

// How a job of thread ranks with watchdogs ended.
struct ThreadJobEnd {
  int rank = -1;        // whose watchdog ended it
  int exit_code = 0;    // what the process would have exited with under mpirun (14: a deadline)
  std::string cause{};  // the watchdog's message (a missed deadline: the whole report)
};

class ThreadGroup {
 public:
  // A thread group never ends the process.
  explicit ThreadGroup(int size, CommOptions options = {});
  ThreadGroup(int size, ThreadGroupOptions options);
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
  // With watchdogs: how the job ended, once a rank's watchdog ended it (else nullopt).
  std::optional<ThreadJobEnd> job_end() const;
  // COLLECTIVE over the group's ranks (each rank's thread calls it, with the same node_sizes):
  // rank `rank`'s node groups (groups.h) for a faked node map: node i holds node_sizes[i]
  // consecutive ranks (they must add up to size()). Each group is a ThreadGroup of its own,
  // made with this group's CommOptions (no watchdogs, no faults); the communicators keep it
  // alive.
  NodeGroups node_groups(int rank, const std::vector<int>& node_sizes);
  // COLLECTIVE over the group's ranks, with the same dimensions on each: rank `rank`'s device
  // mesh (mesh.h; Job::mesh's layout), each dimension's group a ThreadGroup of its own made as
  // node_groups' are. InvalidArgument as DeviceMesh::resolve says (the dimensions are not
  // compared across the threads: pass the same ones).
  DeviceMesh mesh(int rank, std::vector<MeshDim> dims);

  struct Impl;  // internal

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace tutti
