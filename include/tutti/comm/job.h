// Job: the one object a program creates at start to join the job of all ranks.
//
//   int main(int argc, char** argv) {
//     auto job = tutti::init(argc, argv);          // MPI, ranks, device, NCCL
//     if (job.rank() == 0) std::fputs(job.summary().c_str(), stdout);   // summary is collective
//     job.communicator().allreduce(grad).wait();
//   }
//
// It works under mpirun/mpiexec, under Slurm's srun (whatever MPI the cluster has), and with
// no launcher at all (a world of one).
//
// Threads and MPI: tutti initializes MPI with MPI_THREAD_MULTIPLE, because the communication
// threads of the mpi backend call MPI while other threads may too (the summary, the debug
// checks of the nccl backend, the abort after a missed deadline, the program's own MPI
// calls). Every tutti communicator uses its own duplicate of MPI_COMM_WORLD, so the
// program's own MPI traffic never mixes with tutti's. If the program initialized MPI itself
// at a lower thread level, the Job throws.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "tutti/comm/communicator.h"
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
  // Options of communicator() (timeout, debug, abort_on_timeout).
  CommOptions comm;
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
  // first has finalized it.
  Job(int& argc, char**& argv, JobOptions options = {});
  // Tears down in order: the communicators (each finishes the collectives issued so far,
  // within their deadline, then frees its NCCL comm, stream and thread), then the local MPI
  // communicator, then MPI_Finalize (if the Job initialized MPI). The same during exception
  // unwinding. If a collective missed its deadline without aborting (abort_on_timeout =
  // false), MPI is not finalized: a rank may be stuck inside it.
  ~Job();
  Job(Job&&) noexcept;
  Job& operator=(Job&&) noexcept;
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  int rank() const;         // in MPI_COMM_WORLD
  int world_size() const;
  int local_rank() const;   // among the ranks on this host (shared-memory node)
  int local_size() const;
  Device device() const;    // the device this rank computes on (current for this thread)
  const std::string& hostname() const;
  // Backend of communicator(): "mpi" or "nccl".
  std::string_view backend() const;
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

  // COLLECTIVE, blocks: every rank's line (rank, host, local rank, device, backend) and the
  // versions of tutti, MPI, NCCL and CUDA, the same text on every rank. Print it on one rank.
  std::string summary() const;

  struct Impl;  // internal

 private:
  std::unique_ptr<Impl> impl_;
};

// The same as constructing a Job: `auto job = tutti::init(argc, argv);`.
Job init(int& argc, char**& argv, JobOptions options = {});

}  // namespace tutti
