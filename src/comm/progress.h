// The progress board: where each rank of a host records how far it has got (its phase, and per
// communicator the last collective it issued, started and completed), in a small file mapped
// by every rank of the host. Internal header.
//
// Why shared memory: the watchdog of a waiting rank must be able to say which rank never
// reached a collective and where that rank is, also when that rank cannot answer (stopped by
// SIGSTOP, spinning outside MPI, stuck in a system call). Reading another process's mapping
// needs nothing from it. Writing costs a few stores per collective and no communication.
// Ranks on other hosts are asked through the watchdog's control channel; any live rank of a
// host answers for all of that host's ranks (see watchdog.h).
//
// Each rank writes only its own slot; readers copy a slot (fields are atomics, the label is
// guarded by a per-slot version counter) and tolerate a torn read of a slot being written:
// it only feeds a diagnostic.
//
// The file is opened before MPI_Init when the launcher says who is who (Open MPI: in the job's
// session directory, which mpirun removes; Slurm: /dev/shm), else after it (named by local
// rank 0 over the host's Bootstrap), and unlinked as soon as every rank of the host has mapped it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tutti/comm/bootstrap.h"
#include "tutti/comm/communicator.h"

namespace tutti::detail {

// Where a rank is in the life of its Job.
enum class Phase : std::uint32_t {
  absent = 0,  // no sign of the rank (its slot was never written)
  starting,    // in the Job's constructor, before MPI_Init
  mpi_init,    // inside MPI_Init
  bootstrap,   // MPI is up; making the communicators
  running,     // the Job is made
  leaving,     // an exception is unwinding through its Job, or it is ending the job
  left,        // its Job ended by an error every rank raised; MPI_Finalize waits for the exit
  finalizing,  // in MPI_Finalize
  finished,    // past MPI_Finalize
};
const char* name_of(Phase phase);

inline constexpr int kBoardComms = 8;   // communicators tracked per rank (the rest go unrecorded)
inline constexpr int kBoardLabel = 40;  // bytes of a collective's label kept

// One communicator's progress on one rank (plain copy for readers and messages).
struct CommSnapshot {
  std::uint64_t issued = 0;     // last sequence number the program issued
  std::uint64_t started = 0;    // last one the backend started (mpi: its thread took it up)
  std::uint64_t completed = 0;  // last one known complete
  std::int64_t started_ns = 0;  // CLOCK_MONOTONIC of the start of `started` (host-local)
  std::uint64_t info_seq = 0;   // the collective described by the fields below
  std::int64_t count = 0;
  std::int32_t kind = 0, op = 0, dtype = 0, root = -1;
  char label[kBoardLabel] = {};
  std::string describe() const;  // "#7 allreduce(sum) 10 x f32 (40 B) issued by 'x'"
};

struct RankSnapshot {
  std::int32_t rank = -1;
  std::uint32_t pid = 0;
  Phase phase = Phase::absent;
  std::int64_t phase_ns = 0;  // CLOCK_MONOTONIC of the phase's start (host-local)
  double phase_age_s = 0;     // filled by whoever took the snapshot (ages travel between hosts)
  double started_age_s[kBoardComms] = {};
  bool stopped = false;  // the process is stopped (SIGSTOP/SIGTSTP), seen in /proc
  bool gone = false;     // the slot names a process that no longer exists
  bool remote = false;   // came from another host through the control channel
  CommSnapshot comm[kBoardComms];
};

// Nanoseconds of CLOCK_MONOTONIC (comparable between processes of one host).
std::int64_t monotonic_ns();

class ProgressBoard {
 public:
  // Opens (creating if needed) the board of this host from the launcher's environment, before
  // MPI exists. Empty when the environment does not say enough (no launcher, an unknown one).
  static std::unique_ptr<ProgressBoard> open_from_launcher();
  // After MPI_Init: opens the board named by local rank 0 (collective over `local`, the ranks
  // of this host), unless `existing` is already open. Then every rank of the host has it
  // mapped and local rank 0 unlinks the file. `world_rank`, `world_size`: of the job.
  static std::shared_ptr<ProgressBoard> open_after_init(std::shared_ptr<ProgressBoard> existing, Bootstrap& local,
                                                        int world_rank, int world_size);
  // One board per rank of an in-process group (thread ranks), all mapping one file that is
  // already unlinked. Empty where no file could be made.
  static std::vector<std::shared_ptr<ProgressBoard>> open_in_process(int size);
  ~ProgressBoard();
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // This rank's writes.
  void set_phase(Phase phase);
  Phase phase() const;
  void issued(int comm, std::uint64_t seq);
  void started(int comm, const CollectiveInfo& info);
  void completed(int comm, std::uint64_t seq);
  // A copy of rank r's slot, if this host's board has seen rank r.
  std::optional<RankSnapshot> read(int rank) const;
  // Every rank of this host that has a slot here.
  std::vector<RankSnapshot> read_host() const;
  // Removes the file (its mapping stays valid).
  void unlink_file();

 private:
  struct Slot;
  ProgressBoard(std::string path, void* map, std::size_t bytes, int rank, int size, bool private_only);
  static std::unique_ptr<ProgressBoard> open_file(const std::string& path, int rank, int size);
  Slot* slot(int rank) const;

  std::string path_;
  void* map_;
  std::size_t bytes_;
  int rank_;
  int size_;
  bool private_only_;
};

}  // namespace tutti::detail
