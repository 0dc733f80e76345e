// The backends as the Job sees them, their factories, and what they share (the timeout
// report, the debug fingerprints, the MPI datatypes). Internal header.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "tutti/comm/communicator.h"

namespace tutti::detail {

class Backend : public Communicator {
 public:
  using Communicator::Communicator;
  // Finishes the collectives issued so far (their deadlines bound it), then frees the
  // backend's thread, stream, NCCL comm and MPI communicator. Idempotent; a collective issued
  // afterwards throws. After a missed deadline (broken()), it frees nothing that a stuck
  // thread could still touch.
  virtual void shutdown() noexcept = 0;
  // True once a collective missed its deadline without ending the job.
  virtual bool broken() const = 0;
};

// The mpi backend over a duplicate of `parent` (collective over parent). `device` is the GPU
// it stages GPU tensors through (cpu: it takes CPU tensors only).
std::shared_ptr<Backend> make_mpi_backend(MPI_Comm parent, Device device, CommOptions options);
// The nccl backend on `device` (a GPU), bootstrapped over `parent` (collective over parent).
// Throws BackendError in a build without NCCL.
std::shared_ptr<Backend> make_nccl_backend(MPI_Comm parent, Device device, CommOptions options);
bool built_with_nccl();
// "2.28.9", or "none".
std::string nccl_version();

// ---- shared by the backends -----------------------------------------------------------

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t);

// The report of a collective that missed its deadline (without the "tutti [rank r]" prefix).
std::string timeout_report(std::string_view backend, const CollectiveInfo& info, double timeout_s,
                           double waited_s, std::size_t queued_behind);
// Prints "tutti [rank r]: <report>" to stderr and ends the job with MPI_Abort.
[[noreturn]] void end_job(const std::string& report);
// A TimeoutError carrying `report`, as an exception_ptr for a Work to rethrow.
std::exception_ptr timeout_error(const std::string& report);

// `error` with "(while <what>)" added to its message when it is a tutti error (same type);
// other exceptions unchanged. Used instead of an ErrorContext on the hot path: it costs only
// when something failed.
std::exception_ptr in_context(std::exception_ptr error, const std::string& what);

// Debug mode: exchanges the fingerprint of `info` over `comm` (an MPI_Iallgather, polled until
// every rank has reached the same point or `timeout_s` has passed) and throws InvalidArgument
// naming the first rank whose fingerprint differs from rank 0's, with both descriptions.
// Returns false when the deadline passed (the exchange is then still pending on `comm`).
bool check_fingerprints(MPI_Comm comm, const CollectiveInfo& info, double timeout_s);

}  // namespace tutti::detail
