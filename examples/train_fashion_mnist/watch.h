// train_fashion_mnist's view of the job from outside (docs/observability.md): the timeline,
// Prometheus metrics, stragglers, and --debug-slow, which makes one rank slow on purpose.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <tutti/tutti.h>

#include "../common/progress.h"
#include "flags.h"

namespace fmnist {

class Watch {
 public:
  // COLLECTIVE: the timeline's clock alignment and the ranks' host names.
  Watch(tutti::Job& job, const Flags& f, double peak_flops);

  std::unique_ptr<tutti::obs::TraceSession> trace;       // --trace / TUTTI_TRACE
  std::unique_ptr<tutti::obs::TrainingMetrics> metrics;  // --metrics-file / --metrics-port

  // --debug-slow: on its rank, busy-waits between a micro-step's forward and backward (RANK:P%:
  // in the first micro-step of a step only).
  void debug_slow(int micro, const tutti::Stream& stream);

  // Stragglers: on the steps that compare the ranks, the step's loss allreduce carries this many
  // more floats (0 on the others).
  int sync_slots(std::int64_t step) const;
  // After the step's backward: its times, and on a comparing step this rank's figures written
  // into `slots` (sync_slots(step) floats of the step's sync tensor).
  void after_step(std::int64_t step, const tutti::ddp::StepStats& stats, double data_s, tutti::Tensor slots,
                  const tutti::Stream& stream);
  // After the allreduce (AVG over the ranks) of a comparing step: compares, and rank 0 names a
  // new straggler on stderr.
  void after_sync(std::int64_t step, const tutti::Tensor& slots, const tutti::Stream& stream,
                  example::Progress& progress);

  std::int64_t straggler_reports() const { return straggler_reports_; }
  const std::string& last_straggler() const { return last_straggler_; }

 private:
  int rank_, world_;
  std::unique_ptr<tutti::obs::TextfileExporter> metrics_file_;
  std::unique_ptr<tutti::obs::HttpExporter> metrics_http_;
  std::optional<tutti::obs::StragglerDetector> stragglers_;
  std::int64_t straggler_reports_ = 0;
  std::string last_straggler_;
  int slow_rank_ = -1;
  double slow_ms_ = 0;        // a fixed busy wait ...
  double slow_fraction_ = 0;  // ... or this fraction of the compute before the first collective
  double last_compute_ms_ = 0, last_slow_ms_ = 0, step_slow_ms_ = 0;
};

// The textfile of this rank: "%r" replaced by the rank, else "-rank<R>" before the extension when
// there are several ranks (node_exporter reads every *.prom file of its directory).
std::string metrics_path_of(const std::string& path, int rank, int world);

}  // namespace fmnist
