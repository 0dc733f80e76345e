// Stragglers: which rank is slow. Data parallelism hides it: every rank waits for the slowest in
// each collective, so every rank's step (and backward) looks equally long. What differs is the
// work a rank does before its first collective of a step (StepStats::compute_before_comm_ms)
// and its data loading. Every `every` steps the ranks share the means of both over the window
// (one small exchange, which a training loop can fold into a reduction it does anyway), and a
// rank slower than the median of the other ranks by more than `threshold` is reported.
//
//   obs::StragglerDetector stragglers(rank, world, obs::all_hosts(job.cpu_communicator(), host));
//   each step:  stragglers.add_step(stats.compute_before_comm_ms / 1e3, data_seconds);
//   when stragglers.due(step):  report = stragglers.exchange(job.cpu_communicator());
//               if (report.new_straggler && rank == 0) log(report.message());
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tutti/comm/communicator.h"

namespace tutti::obs {

struct StragglerOptions {
  int every = 50;             // steps between checks
  double threshold = 0.2;     // slower than the others' median by more than this fraction (0.2: 20%)
  double min_seconds = 1e-3;  // and by more than this much per step (ignore noise on tiny steps)
};

struct StragglerReport {
  bool checked = false;        // this call compared the ranks
  int rank = -1;               // the straggler (-1: none)
  std::string host;            // its host
  std::string what;            // "compute before the first collective" or "data loading"
  double seconds = 0;          // its mean per step
  double median_seconds = 0;   // the other ranks' median
  double slower_by = 0;        // seconds / median_seconds - 1 (0.5: 50% slower)
  bool new_straggler = false;  // the first report of this rank for this cause: log it (once)
  // Every rank's means, [rank] -> {compute before the first collective, data loading} seconds.
  std::vector<std::pair<double, double>> per_rank;
  // "straggler: rank 3 (node1) is 52% slower than the median of the other ranks in compute before
  // the first collective (31.2 ms vs 20.5 ms per step, steps 51-100)".
  std::string message() const;
  std::int64_t first_step = 0, last_step = 0;
};

class StragglerDetector {
 public:
  // hosts: every rank's host name, by rank (all_hosts), or empty.
  StragglerDetector(int rank, int world_size, std::vector<std::string> hosts = {}, StragglerOptions options = {});

  // This rank's times of one step (seconds).
  void add_step(std::int64_t step, double compute_before_comm_s, double data_s);
  // Whether the ranks should compare after `step` (every `every` steps, with steps recorded).
  bool due(std::int64_t step) const;

  // Folded into a reduction the loop does anyway: slot_count() floats, in which fill() writes this
  // rank's means at its own slots and zeros elsewhere; reduce them with SUM over the ranks (AVG:
  // pass scale = world size to analyze) and give the result to analyze(), which starts a new
  // window. Every rank gets the same report.
  int slot_count() const { return 2 * world_; }
  void fill(float* slots) const;
  StragglerReport analyze(const float* reduced, double scale = 1.0);
  // The same with one small allreduce of its own over `comm` (COLLECTIVE; CPU tensors).
  StragglerReport exchange(Communicator& comm);

  const StragglerOptions& options() const { return options_; }

 private:
  int rank_, world_;
  std::vector<std::string> hosts_;
  StragglerOptions options_;
  double compute_sum_ = 0, data_sum_ = 0;
  int steps_ = 0;
  std::int64_t first_step_ = -1, last_step_ = -1;
  int reported_rank_ = -1;
  std::string reported_what_;
};

// COLLECTIVE (CPU tensors): every rank's `host`, by rank.
std::vector<std::string> all_hosts(Communicator& comm, const std::string& host);

}  // namespace tutti::obs
