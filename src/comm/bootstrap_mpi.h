// The MPI side of a Job: MPI_Init and MPI_Finalize, the Job's duplicates of MPI_COMM_WORLD (the
// world and this host's ranks) as Bootstraps, the control channel and the mpi backend over
// them. The one place the Job meets MPI; this header is free of mpi.h, so that nothing else in
// the communication layer needs it. Internal header.
#pragma once

#include <memory>
#include <string>

#include "comm/backend.h"
#include "comm/control.h"
#include "tutti/comm/bootstrap.h"

namespace tutti::detail {

class MpiWorld {
 public:
  static bool initialized();
  static bool finalized();
  // MPI is initialized and not finalized.
  static bool usable();
  // MPI_Init_thread(MPI_THREAD_MULTIPLE). Returns the thread level MPI provides, and whether it
  // is enough.
  static int init_thread_multiple(int& argc, char**& argv);
  // The thread level of an MPI that the program initialized.
  static int query_thread();
  static bool thread_multiple(int provided);
  static void finalize();
  // "MPI 3.1, Open MPI v4.1.4"
  static std::string version();
  // COLLECTIVE over MPI_COMM_WORLD: the watchdog's control channel (right after MPI_Init).
  static std::unique_ptr<ControlChannel> make_control();

  // COLLECTIVE over MPI_COMM_WORLD: duplicates it (MPI_ERRORS_RETURN) for the Job's bootstrap,
  // and splits it by shared-memory host.
  MpiWorld();
  // Frees the communicators if MPI is still usable and free_comms() was not told otherwise.
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  Bootstrap& world();
  Bootstrap& local();  // the ranks of this host
  // COLLECTIVE: a control channel over a new duplicate of the world (a backend's agreements).
  std::unique_ptr<ControlChannel> control();
  // COLLECTIVE: the mpi backend over duplicates of the world.
  std::shared_ptr<Backend> make_mpi_backend(Device device, CommOptions options, int board_comm);
  // COLLECTIVE over the world: a backend (nccl, else mpi) over the ranks that pass the same
  // `color`, ranked by `key` (MPI_Comm_split).
  std::shared_ptr<Backend> make_split_backend(int color, int key, bool nccl, Device device, CommOptions options,
                                              int board_comm);
  // Frees the Job's communicators now (before MPI_Finalize), or (free = false) forgets them:
  // another thread may still be inside MPI.
  void release(bool free) noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tutti::detail
