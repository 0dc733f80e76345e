// What the example trainers (train_fashion_mnist, train_gpt) share beyond the library: the
// precision flags, the parameters' checksum their JSON reports, start-up warnings. (Their
// shared flags: run_flags.h; run control: tutti::train::Run.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tutti/tutti.h>

namespace example {

// "fp32", "bf16" or "fp16" (the flags' values, checked by CLI11) as a DType.
tutti::DType dtype_flag(const std::string& name);

// The amp policy of --precision, with --grad-comm (empty: the precision's own) as the dtype
// gradients travel in.
tutti::amp::Policy precision_policy(const std::string& precision, const std::string& grad_comm);

// crc32 of every tensor's name and bytes, in name order: equal runs hold bit-identical models.
std::uint32_t parameters_crc32(const tutti::StateDict& model_state);

// Rank 0 of a job on the CPU: prints "<program>: warning: ..." to stderr when OpenBLAS runs
// kernels older than the CPU (tutti::kernels::cpu_blas_info()).
void warn_if_blas_kernels_are_old(const tutti::Job& job, const char* program);

// Rank 0's account of the run's checkpoints and memory snapshots (train::StepEnd's fields): what
// to say when one was skipped or waited for the write in flight, or when --snapshot-every auto
// chose its interval, and the figures for the summary.
class CheckpointLog {
 public:
  // After each end_step(): "" or a line for the log, e.g. "checkpoint of step 40 skipped: the
  // one of step 30 is still being written" or "checkpoint of step 40 waited 1.2 s for the write
  // of step 30".
  std::string observe(const tutti::train::StepEnd& end);
  // "checkpoints", "checkpoints_skipped", "checkpoint_stall_median_s" (the step's hold,
  // median over the checkpoints of this run), "checkpoint_stall_max_s"; "snapshots",
  // "snapshot_every", "snapshot_stall_median_s".
  void summarize(tutti::train::Summary& summary) const;

 private:
  std::vector<double> stalls_;
  std::int64_t skipped_ = 0;
  std::vector<double> snapshot_stalls_;
  std::int64_t snapshot_every_ = 0;
};

}  // namespace example
