// The --json summary of a trainer's run (docs/user-guide.md, "The JSON summary"), written by
// rank 0 however the run ends, wherever the process can still write: "status" says how.
//
//   "completed"  the run did what it was asked (every figure of the run)
//   "diverged"   the training loss stopped being finite (exit code 3): the step, the loss, and the
//                last finite loss with its step
//   "stopped"    a stop signal ended it at a step boundary (exit code 75): the step, the signal,
//                the checkpoint to resume from
//   "failed"     an error (exit code 1 and the others of a failed job): its message
//
// Each one also carries what the run had set with fields() by then (the model, the ranks, ...)
// and "steps", the steps done. A process that is killed (SIGKILL, or ended by tutti after
// another rank failed) writes nothing.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace example {

class RunSummary {
 public:
  // path: --json ("": no summary). Until set_rank() only the process that its launcher calls
  // rank 0 (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK or SLURM_PROCID; none: a process alone)
  // writes, so that an error before the job has started is still summarized once.
  explicit RunSummary(std::string path);

  // Once the job knows its rank: only rank 0 writes. Throws (InvalidArgument) on rank 0 when the
  // path cannot be written: better at the start than at the end of a run.
  void set_rank(int rank);
  // The run's figures, as they become known (the trainers set the run's shape at the start).
  nlohmann::json& fields() { return fields_; }
  // After every step: the steps done and the step's loss (the last finite one is kept; a
  // negative loss is none yet, as after resuming from a checkpoint without one).
  void set_step(std::int64_t steps, double loss);

  void completed() { write("completed"); }
  void diverged();                                                         // at the step and loss of the last set_step
  void stopped(const std::string& signal, const std::string& checkpoint);  // checkpoint "": none
  void failed(const std::string& error);

 private:
  void write(const char* status);
  std::string path_;
  bool writer_;
  nlohmann::json fields_ = nlohmann::json::object();
  std::int64_t steps_ = 0, last_finite_step_ = -1;
  double loss_ = 0, last_finite_loss_ = 0;
  bool written_ = false;
};

// "SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2"; else "a signal".
const char* signal_name(int sig);

}  // namespace example
