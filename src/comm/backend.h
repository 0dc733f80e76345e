// The backends as the Job sees them, their factories, and what they share (the agreement on
// a collective before its data moves, errors). The deadlines are the watchdog's
// (comm/watchdog.h). Internal header.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/control.h"
#include "tutti/comm/bootstrap.h"
#include "tutti/comm/communicator.h"

namespace tutti::detail {

class Backend : public Communicator {
 public:
  using Communicator::Communicator;
  // Finishes the collectives issued so far, waiting at most max_wait_s (and their deadlines
  // bound it too), then frees the backend's thread, stream, NCCL comm and MPI communicators.
  // Returns false when it gave up waiting or a collective had missed its deadline (broken()):
  // then it has freed nothing that a stuck thread could still touch, and MPI must not be
  // finalized. Idempotent; a collective issued afterwards throws.
  virtual bool shutdown(double max_wait_s) noexcept = 0;
  // Leaves at once, without waiting for anything (an exception ends the Job on this rank only):
  // frees nothing a stuck thread could touch; nccl aborts its NCCL comm.
  virtual void abandon() noexcept = 0;
  // True once a collective missed its deadline without ending the job.
  virtual bool broken() const = 0;
};

// The mpi backend is made by the MPI world (bootstrap_mpi.h), which owns the MPI communicators.
// The nccl backend on `device` (a GPU): its unique id travels over `bootstrap`, its debug-mode
// agreements over `agreement` (a channel of its own: ControlChannel::duplicate; collective
// over both, which span the same ranks). `board_comm`: its slot on the progress board (-1:
// none), the same number on every rank. Throws BackendError in a build without NCCL.
std::shared_ptr<Backend> make_nccl_backend(Bootstrap& bootstrap, std::unique_ptr<ControlChannel> agreement,
                                           Device device, CommOptions options, int board_comm = -1);
bool built_with_nccl();
// "2.28.9", or "none".
std::string nccl_version();

// ---- shared by the backends -----------------------------------------------------------

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t);

// A TimeoutError carrying `report`, as an exception_ptr for a Work to rethrow.
std::exception_ptr timeout_error(const std::string& report);

// `error` with "(while <what>)" added to its message when it is a tutti error (same type);
// other exceptions unchanged. Used instead of an ErrorContext on the hot path: it costs only
// when something failed.
std::exception_ptr in_context(std::exception_ptr error, const std::string& what);

// Agreement before the data moves. Every rank must pass MPI the same counts: where they differ,
// Open MPI 4.1 writes past the receiving buffer (its ob1 protocol for messages above the eager
// limit, 4 KiB over shared memory, reads the sender's whole message into the receive buffer
// with process_vm_readv, CMA, without checking it against the posted size; messages sent
// eagerly are checked and fail with MPI_ERR_TRUNCATE). So the mpi backend agrees on every
// collective that can move more than kAgreeAboveBytes in one message before any rank receives
// its data (in band up to 8 ranks: mpi_engine.h's InBand; above, with agree() on a
// communicator of its own, so that the agreement never matches another collective's data),
// and on every collective in debug mode.
inline constexpr std::size_t kAgreeAboveBytes = 1024;
// The most bytes one MPI message of collective `c` can carry (halves counted as the fp32 the
// mpi backend reduces them in).
std::size_t largest_message_bytes(const CollectiveInfo& info, int world_size);
// Blocking: the ranks compare the fingerprint of `info` (sequence number, kind, op, dtype,
// count, root) over `channel` (MPI: one small MPI_Allreduce of the values and their
// negations); where they differ, every rank throws InvalidArgument naming the first rank that
// differs from rank 0, with both descriptions.
void agree(ControlChannel& channel, const CollectiveInfo& info);
// The same exchange, polled (for a caller thread that must not block in the transport):
// returns false when `timeout_s` passed first (the channel is then unusable).
bool agree_polled(ControlChannel& channel, const CollectiveInfo& info, double timeout_s);

// What the agreement compares of `info`, whether two are the same, and the error when they are
// not: InvalidArgument naming the first rank whose fingerprint differs from rank 0's, with both
// descriptions (`all`: every rank's, index = rank).
Fingerprint fingerprint_of(const CollectiveInfo& info);
bool same(const Fingerprint& a, const Fingerprint& b);
[[noreturn]] void throw_mismatch(const std::vector<Fingerprint>& all);

}  // namespace tutti::detail
