// How a job ends, judged as a whole mpiexec by check_exit.cmake (a job that times out cannot
// end with a clean MPI_Finalize, so this cannot be a GoogleTest of comm_test).
//
// A rank that never joins a collective: the others end with the timeout report within the
// deadline, and the report names the collective. The last rank skips the allreduce and
// sleeps past the deadline, so it is alive (and in no collective) while the others time out.
//   comm_exit_test throw <deadline_s>   abort_on_timeout = false: the waiting ranks catch
//       TimeoutError, check it, print "TIMEOUT-CHECK rank R: OK" (or "FAILED: why") and _exit.
//   comm_exit_test abort <deadline_s>   the default: the watchdog prints the report and
//       calls MPI_Abort; the wrapper checks the report and that the job ended in time.
// An exception that unwinds through the Job while collectives are still in flight:
//   comm_exit_test unwind <deadline_s>  every rank issues collectives it never waits for,
//       then throws; the Job's destructor finishes them and leaves MPI_Finalize to the
//       process's exit (after the catch block, which finds MPI still up), and mpiexec exits
//       with 0 (it does not when a rank ends without MPI_Finalize).
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tutti/comm/job.h"

namespace {

// Issues collectives and leaves without waiting for them: by an exception.
void issue_and_throw(tutti::Job& job, std::vector<tutti::Tensor>& keep) {
  tutti::Communicator& comm = job.communicator();
  for (int i = 0; i < 20; ++i) {
    keep.push_back(tutti::Tensor::from_floats(std::vector<float>(1000 + i, 1.0f), {1000 + i}));
    comm.allreduce(keep.back(), tutti::ReduceOp::sum, {.label = "in flight at unwind"});
  }
  throw std::runtime_error("something went wrong in the training step");
}

int unwind(int argc, char** argv, double deadline) {
  std::vector<tutti::Tensor> keep;  // outlives the Job: the Work handles keep them alive anyway
  int rank = -1, size = 0;
  try {
    tutti::JobOptions options;
    options.device = "cpu";
    options.comm.timeout = std::chrono::duration<double>(deadline);
    tutti::Job job(argc, argv, options);
    rank = job.rank();
    size = job.world_size();
    issue_and_throw(job, keep);
  } catch (const std::runtime_error& e) {
    // The Job is gone: its collectives finished; MPI is finalized when this process exits
    // (every rank's catch block runs first; mpiexec's exit status says they all finalized).
    int finalized = 0;
    MPI_Finalized(&finalized);
    bool sums_right = true;
    for (const auto& t : keep) {
      for (float v : t.to_floats()) sums_right = sums_right && v == static_cast<float>(size);
    }
    std::printf("UNWIND-CHECK rank %d: %s\n", rank,
                !finalized && sums_right
                    ? "OK"
                    : (finalized ? "FAILED: MPI finalized before the catch" : "FAILED: wrong sums"));
    return !finalized && sums_right ? 0 : 1;
  }
  std::printf("UNWIND-CHECK rank %d: FAILED: no exception\n", rank);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s throw|abort|unwind DEADLINE_S\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const double deadline = std::atof(argv[2]);
  if (mode == "unwind") return unwind(argc, argv, deadline);
  tutti::JobOptions options;
  options.device = "cpu";
  options.comm.timeout = std::chrono::duration<double>(deadline);
  options.comm.abort_on_timeout = mode == "abort";
  tutti::Job job(argc, argv, options);
  tutti::Communicator& comm = job.communicator();
  const int rank = job.rank();
  const bool missing = rank == job.world_size() - 1;

  // The waiting ranks meet again after their checks (on a communicator of their own: tutti's
  // is broken then), so none exits, and makes mpiexec end the others, before all reported.
  MPI_Comm waiters = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, missing ? MPI_UNDEFINED : 0, rank, &waiters);
  comm.barrier({.label = "start"}).wait();  // #1: every rank is here
  if (missing) {
    std::printf("TIMEOUT-CHECK rank %d: skipping collective #2\n", rank);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::duration<double>(mode == "abort" ? 60.0 : deadline + 3.0));
    std::_Exit(0);
  }
  const auto x = tutti::Tensor::zeros({1000}, tutti::DType::f32);
  const auto start = std::chrono::steady_clock::now();
  std::string verdict;
  try {
    comm.allreduce(x, tutti::ReduceOp::sum, {.label = "timeout-test bucket 7"}).wait();
    verdict = "FAILED: the allreduce completed without the last rank";
  } catch (const tutti::TimeoutError& e) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string what = e.what();
    verdict = "OK";
    for (const char* piece : {"TIMEOUT", "#2 allreduce(sum) 1000 x f32", "issued by 'timeout-test bucket 7'",
                              "backend mpi", "deadline of"}) {
      if (what.find(piece) == std::string::npos) verdict = std::string("FAILED: '") + piece + "' missing in: " + what;
    }
    if (what.find("[rank " + std::to_string(rank) + "]") == std::string::npos) verdict = "FAILED: no rank in: " + what;
    if (waited < deadline * 0.9 || waited > deadline + 2.0) {
      verdict = "FAILED: timed out after " + std::to_string(waited) + " s, deadline " + std::to_string(deadline);
    }
    // Later collectives fail at once: the communicator is unusable.
    try {
      comm.barrier().wait();
      verdict = "FAILED: a collective after the timeout succeeded";
    } catch (const tutti::TimeoutError&) {
    }
  } catch (const std::exception& e) {
    verdict = std::string("FAILED: unexpected error: ") + e.what();
  }
  std::printf("TIMEOUT-CHECK rank %d: %s\n", rank, verdict.c_str());
  std::fflush(stdout);
  MPI_Barrier(waiters);
  // MPI cannot be finalized: the communication thread is stuck in the allreduce.
  std::_Exit(verdict == "OK" ? 0 : 1);
}
