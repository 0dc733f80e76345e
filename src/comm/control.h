// The control channel: what the watchdog and the agreement before a collective need from the
// ranks' transport, and nothing more. Internal header.
//
//   - short messages to one rank, polled for without blocking (the watchdog's protocol:
//     "I am ending the job", "an exception is leaving my Job", "where are you?");
//   - the agreement on a collective's fingerprint (blocking, or started and polled);
//   - ending the job.
//
// Implementations: MPI (control_mpi.h: a duplicate of MPI_COMM_WORLD per channel, MPI_Abort)
// and the in-process ranks of a ThreadGroup (control_thread.h: queues between threads; ending
// the job fails every rank's pending Work and records the cause, the test process lives on).
// The Watchdog and the backends see only this interface, so the same watchdog code runs under
// mpirun and in a thread-rank unit test.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tutti::detail {

// What every rank must agree on of a collective (its label may differ). Plain bytes: it
// travels as it is.
struct Fingerprint {
  std::uint64_t seq = 0;
  std::int64_t count = 0;
  std::int32_t kind = 0, op = 0, dtype = 0, root = -1;
};

struct ControlMessage {
  int from = -1;
  int tag = 0;
  std::vector<char> bytes;
};

// An agreement started without blocking (ControlChannel::start_agree).
class PendingAgreement {
 public:
  virtual ~PendingAgreement() = default;
  // True once every rank's fingerprint has been compared; never blocks.
  virtual bool test() = 0;
  // After test() returned true: as ControlChannel::agree.
  virtual std::vector<Fingerprint> result() = 0;
};

class ControlChannel {
 public:
  virtual ~ControlChannel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // ---- messages (one thread at a time: the watchdog serializes them) ----
  // Sends `bytes` to rank `to` without blocking; delivery goes on in the background (progressed
  // by poll()). A message that cannot be sent is dropped: the watchdog's protocol tolerates it.
  virtual void send(int to, int tag, std::shared_ptr<const std::vector<char>> bytes) = 0;
  // The next message that has arrived, if any; never blocks.
  virtual std::optional<ControlMessage> poll() = 0;

  // ---- agreement (each backend on a channel of its own: see duplicate) ----
  // COLLECTIVE, blocks: empty when every rank passed the same fingerprint, else every rank's
  // (index = rank).
  virtual std::vector<Fingerprint> agree(const Fingerprint& mine) = 0;
  // The same exchange, started without blocking. A pending agreement that is dropped before it
  // completed leaves its channel unusable (the backend is broken then anyway).
  virtual std::unique_ptr<PendingAgreement> start_agree(const Fingerprint& mine) = 0;
  // COLLECTIVE (every rank, in the same order): a channel over the same ranks whose traffic
  // never meets this one's.
  virtual std::unique_ptr<ControlChannel> duplicate() = 0;

  // ---- ending ----
  // How end_job ends the job, for the watchdog's line: "MPI_Abort".
  virtual const char* how_it_ends() const = 0;
  // Ends the job now with `exit_code`; `cause` is what the watchdog printed. MPI: MPI_Abort
  // (returns only if MPI is not up). In-process: fails every rank's pending and future Works
  // with `cause`, records it for the test, and returns. Any thread.
  virtual void end_job(const std::string& cause, int exit_code) noexcept = 0;
  // This rank's program is being left by an exception that the other ranks do not share: end
  // the job when this rank's process ends (MPI: MPI_Abort at exit, so that the program's catch
  // still prints; in-process: the rank's thread has ended already, so now).
  virtual void end_job_at_exit(const std::string& cause, int exit_code) noexcept = 0;
  // No more messages or agreements (before MPI_Finalize). free = false: leave the transport's
  // resources alone (another thread may still be inside it). Idempotent.
  virtual void close(bool free) noexcept = 0;
};

}  // namespace tutti::detail
