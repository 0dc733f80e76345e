// Stragglers: which rank is slow. Data parallelism hides it: every rank waits for the slowest in
// each collective, so every rank's step (and backward) looks equally long. What differs is the
// work a rank does before its first collective of a step (StepStats::compute_before_comm_ms)
// and its data loading. Every `every` steps (a window) the ranks share, for both, the median of
// their steps in the window and how much their steps scatter around it (one small exchange,
// which a training loop can fold into a reduction it does anyway). A rank is named a straggler
// only when it is the slowest, out of the noise, in `confirm_windows` windows in a row: slower
// than the median of the other ranks by more than `threshold` and by more than `min_seconds` per
// step, and ahead of the next slowest rank by more than `noise_factor` times the noise, the
// ranks' typical step-to-step scatter (the median over the ranks of each rank's robust standard
// deviation, 1.4826 x its median absolute deviation), or the slowest rank's own scatter where that
// is larger (a rank that another process preempts on part of its steps scatters by about as much
// as its median moved; a rank slower on every step does not). Medians, not means: a step that another
// process preempted moves a mean, not a median. (On a 2-core machine shared with other jobs,
// one window of 50 steps measured one rank 27% "slower" than the other while both ran the same
// code: means over one window; see docs/observability.md.)
//
// doc-test: fragment a sketch of when each call comes
//   obs::StragglerDetector stragglers(rank, world, obs::all_hosts(job.cpu_communicator(), host));
//   each step:  stragglers.add_step(step, stats.compute_before_comm_ms / 1e3, data_seconds);
//   when stragglers.due(step):  report = stragglers.exchange(job.cpu_communicator());
//               if (report.new_straggler && rank == 0) log(report.message());
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tutti/comm/communicator.h"

namespace tutti::obs {

struct StragglerOptions {
  int every = 50;             // steps in a window (between checks)
  double threshold = 0.2;     // slower than the others' median by more than this fraction (0.2: 20%)
  double min_seconds = 1e-3;  // and by more than this much per step (ignore noise on tiny steps)
  double noise_factor = 3.0;  // and ahead of the next slowest by this many times the noise (above)
  int confirm_windows = 2;    // the same rank, for the same cause, in this many windows in a row
};

// One rank's figures of one window, for one cause (seconds per step).
struct WindowFigures {
  double median = 0;  // the median of its steps
  double noise = 0;   // their robust standard deviation: 1.4826 x the median absolute deviation
};

struct StragglerReport {
  bool checked = false;        // this call compared the ranks
  int rank = -1;               // the straggler, confirmed over confirm_windows windows (-1: none)
  std::string host;            // its host
  std::string what;            // "compute before the first collective" or "data loading"
  double seconds = 0;          // its median per step in this window
  double median_seconds = 0;   // the other ranks' median
  double slower_by = 0;        // seconds / median_seconds - 1 (0.5: 50% slower)
  double noise_seconds = 0;    // the noise its lead over the next slowest rank was compared with
  int windows = 0;             // windows in a row in which this rank was the slow one
  bool new_straggler = false;  // the first report of this rank for this cause: log it (once)
  // The slowest rank of this window that passed every test (-1: none), before confirmation:
  // equal to `rank` once it has been so for confirm_windows windows in a row.
  int candidate = -1;
  // Every rank's figures, [rank] -> {compute before the first collective, data loading}.
  std::vector<std::pair<WindowFigures, WindowFigures>> per_rank;
  // "straggler: rank 3 (node1) is 52% slower than the median of the other ranks in compute before
  // the first collective (31.2 ms vs 20.5 ms per step, noise 0.4 ms, 2 windows, steps 51-150)".
  std::string message() const;
  std::int64_t first_step = 0, last_step = 0;  // the windows in a row that name it (or this window)
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
  // rank's figures at its own slots and zeros elsewhere; reduce them with SUM over the ranks (AVG:
  // pass scale = world size to analyze) and give the result to analyze(), which starts a new
  // window. Every rank gets the same report.
  int slot_count() const { return 4 * world_; }
  void fill(float* slots) const;
  StragglerReport analyze(const float* reduced, double scale = 1.0);
  // The same with one small allreduce of its own over `comm` (COLLECTIVE; CPU tensors).
  StragglerReport exchange(Communicator& comm);

  const StragglerOptions& options() const { return options_; }

 private:
  struct Streak {  // the candidate of the last windows, for one cause
    int rank = -1;
    int windows = 0;
    std::int64_t first_step = -1;
  };
  int rank_, world_;
  std::vector<std::string> hosts_;
  StragglerOptions options_;
  std::vector<double> compute_, data_;  // this window's steps
  std::int64_t first_step_ = -1, last_step_ = -1;
  Streak streak_[2];
  int reported_rank_ = -1;
  std::string reported_what_;
};

// The median and robust standard deviation of `values` (0, 0 when empty).
WindowFigures window_figures(std::vector<double> values);

// COLLECTIVE (CPU tensors): every rank's `host`, by rank.
std::vector<std::string> all_hosts(Communicator& comm, const std::string& host);

}  // namespace tutti::obs
