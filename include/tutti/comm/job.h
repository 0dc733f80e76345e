// Job: the one object a program creates at start to join the job of all ranks.
//
// doc-test: run np=2
//   #include <tutti/tutti.h>
//   #include <cstdio>
//   int main(int argc, char** argv) {
//     auto job = tutti::init(argc, argv);                   // MPI, ranks, device, NCCL
//     const std::string summary = job.summary();            // COLLECTIVE: every rank calls it,
//     if (job.rank() == 0) std::fputs(summary.c_str(), stdout);  // one prints it
//     tutti::Tensor grad = tutti::Tensor::zeros({1024}, tutti::DType::f32, job.device());
//     job.communicator().allreduce(grad).wait();            // COLLECTIVE: the sum on every rank
//   }
//
// It works under mpirun/mpiexec, under Slurm's srun (whatever MPI the cluster has), and with
// no launcher at all (a world of one).
//
// Threads and MPI: tutti initializes MPI with MPI_THREAD_MULTIPLE, because the communication
// threads of the mpi backend call MPI while other threads may too (the summary, the debug
// checks of the nccl backend, the watchdog, the program's own MPI calls). Every tutti
// communicator uses its own duplicates of MPI_COMM_WORLD, so the program's own MPI traffic
// never mixes with tutti's. If the program initialized MPI itself at a lower thread level,
// the Job throws.
//
// When something goes wrong on one rank, the whole job ends within seconds and says why
// (docs/user-guide.md, "When things go wrong"):
// - Every wait on other ranks has the deadline CommOptions::timeout: the start-up (MPI_Init,
//   the communicators), every collective, check_same, summary, MPI_Finalize. A missed one ends
//   the job (exit code 14) with a report naming the ranks that had not got there and where
//   each rank was (the watchdog reads the other ranks' progress from shared memory, so even a
//   stopped process is located).
// - An exception that leaves the Job's scope on one rank (caught outside it, as in
//   `try { Job job(...); ... } catch (const std::exception& e) { print(e); }`): ~Job tells the
//   other ranks, which print that this rank failed (with its last tutti error) and end;
//   ~Job itself does not wait for them and does not finalize MPI, so the catch block runs and
//   prints; when the process exits, MPI_Abort(its exit status) ends whatever is left. If every
//   rank leaves alike (an error all ranks raise), they finish in an orderly way instead, with
//   MPI_Finalize at each process's exit: every rank's catch block has run (and printed) before
//   any rank can end the job (mpirun ends it at the first non-zero exit status).
// - An exception that escapes main (std::terminate): the message is printed with the rank,
//   the other ranks are told, and the job ends (exit code 134).
// - abort(reason): the program ends the job itself.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "tutti/comm/communicator.h"
#include "tutti/comm/groups.h"
#include "tutti/comm/mesh.h"
#include "tutti/core/device.h"

namespace tutti {

struct JobOptions {
  // "auto": GPU local_rank % (visible GPUs) when this process sees a GPU (CUDA_VISIBLE_DEVICES
  // is honored), else the CPU. "cpu", "cuda" (the same choice, but a missing GPU is an
  // error) or "cuda:N" (that GPU).
  std::string device = "auto";
  // Backend of communicator(): "auto" is nccl when the device is a GPU, the build has NCCL
  // and no two ranks of a node share a GPU (decided alike on every rank), else mpi (which
  // moves GPU tensors through pinned host memory). "mpi" or "nccl" force one ("nccl" throws
  // where it cannot work).
  std::string backend = "auto";
  // Open MPI's allreduce algorithm for the whole process (every communicator, tutti's and the
  // program's), set through Open MPI's MCA variables before MPI_Init:
  //   "default"             Open MPI's own choice (coll/tuned's fixed decision by ranks and size)
  //   "ring"                ring (reduce-scatter + allgather): bandwidth-optimal, 2(p-1) steps
  //   "segmented_ring"      the ring in segments (pipelined)
  //   "recursive_doubling"  log2(p) steps, each moving the whole buffer: for small messages
  //   "rabenseifner"        recursive halving + doubling: log steps, ring's bytes
  //   "reduce_bcast"        reduce to rank 0, then broadcast ("nonoverlapping")
  //   "han"                 hierarchical: within each node, then among nodes, then within
  // Unset (empty): TUTTI_MPI_ALLREDUCE if set, else "default". An MCA variable the
  // environment already sets (OMPI_MCA_coll_tuned_allreduce_algorithm, ...) wins. Needs the Job
  // to initialize MPI (throws otherwise); other MPI libraries ignore it. docs/multinode.md
  // compares the algorithms across nodes.
  std::string mpi_allreduce{};
  // Options of communicator() (timeout, debug, abort_on_timeout). The timeout is also the
  // deadline of the Job's start-up, of check_same and summary, and of MPI_Finalize.
  CommOptions comm{};
  // Preemption: true makes SIGTERM, SIGINT, SIGUSR1 and SIGUSR2 set stop_requested() instead
  // of ending the process (the handler does nothing else), so that the program can stop at a
  // step boundary, agreed by all ranks, with a checkpoint. A second signal of the same kind
  // acts as by default, and so does any while the job is failing. The handlers stay after the
  // Job ends, until the process exits: a launcher's signal may reach some ranks only after the
  // job agreed to stop and they left their Job (srun --signal reached the ranks of one emulated
  // node after those of the other had stopped the job and saved), and it must not kill a rank
  // that saved and is leaving.
  // After a stop signal, ~Job waits at most 3 s in MPI_Finalize, then
  // ends the process with 0: a launcher that sent SIGTERM (mpirun, Slurm) is taking the job
  // down and may never complete it. So let every rank wait (a barrier) until the checkpoint
  // is written before it leaves the Job.
  bool catch_stop_signals = false;
  // Threads of the CPU kernels' GEMMs in this process (kernels::set_cpu_threads). 0: leave
  // OpenBLAS alone when OPENBLAS_NUM_THREADS or OMP_NUM_THREADS is set, else the host's cores
  // divided by the ranks on it (at least 1), so that ranks sharing a host do not
  // oversubscribe its cores.
  int cpu_threads = 0;
};

class Job {
 public:
  // Collective over MPI_COMM_WORLD: initializes MPI (unless the program did; then the Job
  // will not finalize it), finds the local rank (MPI_Comm_split_type SHARED), chooses and
  // sets the device, sets error_rank(), and creates communicator() (for nccl: rank 0 makes
  // the unique id, MPI broadcasts it, every rank calls ncclCommInitRank). Blocks until every
  // rank has done so. One Job at a time per process; MPI allows no second one after the
  // first has finalized it. With the environment variable TUTTI_START_GATE=PATH (set by
  // tutti-launch for a job it starts ahead, to grow: docs/launcher.md), once all of that is
  // done rank 0 writes PATH.ready and every rank waits until PATH exists, within the start-up's
  // deadline: the program's own start-up then runs after the job it replaces has stopped. With
  // TUTTI_START_GATE_AT=run as well, the Job does not wait: pass_start_gate() does.
  Job(int& argc, char**& argv, JobOptions options = {});
  // Tears down in order: the communicators (each finishes the collectives issued so far,
  // within their deadline, then frees its NCCL comm, stream and thread), then the local MPI
  // communicator, then MPI_Finalize (if the Job initialized MPI; it waits for every rank, within
  // the deadline). If a collective missed its deadline without aborting (abort_on_timeout =
  // false), MPI is not finalized: a rank may be stuck inside it.
  // During exception unwinding (std::uncaught_exceptions() above its value at construction) it
  // never blocks on other ranks: it tells them this rank is leaving and waits at most about a
  // second for their answers. If every rank is leaving too, the teardown above follows (each
  // communicator given 2 s), except that MPI_Finalize (with its deadline) runs when the
  // process exits, after the program's catch blocks; else the communicators are abandoned
  // (NCCL comms aborted), MPI is not finalized, and MPI_Abort(exit status) ends the job when
  // the process exits (where the Job initialized MPI; a program that did must end its job
  // itself).
  ~Job();
  Job(Job&&) noexcept;
  Job& operator=(Job&&) noexcept;
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  // COLLECTIVE where it waits: the start gate of TUTTI_START_GATE_AT=run (see the constructor),
  // once; nothing otherwise. train::Run calls it before it reads the checkpoint, so that a job
  // started ahead has built its model and loaded its data at the gate (which holds the model's
  // memory twice on the devices while the old job runs: tutti-launch --prestart-until).
  void pass_start_gate();

  int rank() const;  // in MPI_COMM_WORLD
  int world_size() const;
  int local_rank() const;  // among the ranks on this host (shared-memory node)
  int local_size() const;
  // The number of hosts (shared-memory nodes, as MPI groups them: MPI_Comm_split_type SHARED)
  // that the job's ranks run on; the same on every rank. 1 on a single machine.
  int node_count() const;
  Device device() const;  // the device this rank computes on (current for this thread)
  const std::string& hostname() const;
  // Backend of communicator(): "mpi" or "nccl".
  std::string_view backend() const;
  // The JobOptions::mpi_allreduce in effect ("default", "ring", ...).
  const std::string& mpi_allreduce() const;
  // "MPI 3.1, Open MPI v4.1.4" and "2.28.9" (or "none" in a build without NCCL).
  std::string mpi_version() const;
  std::string nccl_version() const;

  // The job's communicator over all ranks, for tensors on device() (the mpi backend also
  // takes CPU tensors; for CPU tensors in a GPU job use cpu_communicator()). Not collective.
  Communicator& communicator();
  // A communicator for CPU tensors over all ranks (mpi): the same as communicator() in a job
  // whose backend is mpi, another one (made with the Job) in an nccl job. Not collective.
  Communicator& cpu_communicator();
  // COLLECTIVE: a new communicator over all ranks with its own options, thread or stream, and
  // sequence numbers (backend as in JobOptions::backend). The Job shuts it down before it
  // finalizes MPI; using it after that throws.
  std::shared_ptr<Communicator> new_communicator(CommOptions options, std::string_view backend = "auto");

  // COLLECTIVE: the node groups (groups.h): two new communicators, over the ranks of this node
  // (by local index) and over the ranks with this local index (by node), with `options` and
  // communicator()'s backend (nccl: ncclCommInitRank per group, its id broadcast over the
  // group's MPI communicator). Nodes are numbered by their lowest rank. ranks_per_node > 0
  // fakes the node map instead: consecutive blocks of that many ranks are the nodes (the last
  // may be smaller), to try the two levels on one machine and in tests. Their collectives have
  // deadlines and end the job on a failure like communicator()'s (the reports of a missed
  // deadline list every rank of the job); the Job shuts them down as it does
  // new_communicator()'s.
  NodeGroups node_groups(CommOptions options = {}, int ranks_per_node = 0);

  // COLLECTIVE: the ranks laid out on `dims` (mesh.h: row-major, the last dimension varying
  // fastest; one size may be kMeshRest), with a new communicator per dimension made as
  // node_groups' are (communicator()'s backend, `options`, the job's deadlines and reports).
  // Every rank must pass the same dimensions: checked first (check_same), so a rank that
  // differs gets InvalidArgument naming every rank's mesh instead of a wait. InvalidArgument,
  // on every rank alike, when the sizes do not multiply to world_size() (DeviceMesh::resolve).
  DeviceMesh mesh(std::vector<MeshDim> dims, CommOptions options = {});

  // COLLECTIVE, blocks: every rank's line (rank, host, local rank, device, backend) and the
  // versions of tutti, MPI, NCCL and CUDA, the same text on every rank. Print it on one rank.
  // Called on some ranks only while the others end their Jobs, it ends the job with a report
  // after about 5 s (when those ranks share the caller's host), else at the deadline.
  std::string summary() const;

  // COLLECTIVE, blocks (within the deadline): checks that every rank passes the same value for
  // `what`. If not, every rank throws InvalidArgument naming `what` and which ranks have which
  // value ("ranks disagree on training samples: 60000 on ranks 0, 2, 3; 59000 on rank 1").
  // For what ranks must agree on before they work together: the data set's size and
  // fingerprint, the number of steps, the flags that shape the run.
  void check_same(std::string_view what, std::string_view value);
  void check_same(std::string_view what, std::int64_t value);

  // Not collective: whether this process got a stop signal (JobOptions::catch_stop_signals),
  // and which one (0: none). Each rank knows only its own (mpirun forwards a signal to every
  // rank, but a scheduler or a user may signal one): to stop, use agree_stop().
  bool stop_requested() const;
  int stop_signal() const;

  // What the ranks agreed at a step boundary (agree_stop).
  struct StopAgreement {
    bool stop = false;  // some rank got a stop signal: every rank stops after this step
    int signal = 0;     // the signal the lowest such rank got (SIGTERM, ...); 0 when none
    int rank = -1;      // that rank; -1 when none
  };
  // COLLECTIVE, blocks: every rank calls it at the same point of the loop (after the same
  // step), and every rank gets the same answer: whether any rank got a stop signal so far,
  // and which signal the lowest such rank got. One allreduce of one integer on
  // cpu_communicator() (about 2 us at 2 ranks on one host, mpi; the training loop's own
  // collectives are unaffected). The protocol of a clean stop (docs/user-guide.md, "Preemption
  // and requeueing"): after each step, `if (job.agree_stop().stop)` write the checkpoint,
  // barrier, and exit with 75 (EX_TEMPFAIL) on rank 0, 0 elsewhere.
  StopAgreement agree_stop();

  // Ends the whole job now, from this rank, and does not return: prints "tutti [rank r]:
  // aborting the job: <reason>" once, tells every other rank (each prints that rank r aborted
  // and why), aborts the NCCL communicators and calls MPI_Abort(exit_code).
  [[noreturn]] void abort(std::string_view reason, int exit_code = 1);

  struct Impl;  // internal

 private:
  std::unique_ptr<Impl> impl_;
};

// The same as constructing a Job: `auto job = tutti::init(argc, argv);`.
Job init(int& argc, char**& argv, JobOptions options = {});

}  // namespace tutti
