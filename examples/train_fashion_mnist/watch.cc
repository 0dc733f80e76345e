#include "watch.h"

#include <chrono>
#include <cstdio>
#include <vector>

namespace fmnist {

std::string metrics_path_of(const std::string& path, int rank, int world) {
  if (const auto at = path.find("%r"); at != std::string::npos) {
    return path.substr(0, at) + std::to_string(rank) + path.substr(at + 2);
  }
  if (world == 1) return path;
  const auto dot = path.rfind('.');
  const auto slash = path.rfind('/');
  const bool has_ext = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  const std::string stem = has_ext ? path.substr(0, dot) : path, ext = has_ext ? path.substr(dot) : "";
  return stem + "-rank" + std::to_string(rank) + ext;
}

Watch::Watch(tutti::Job& job, const Flags& f, double peak_flops) : rank_(job.rank()), world_(job.world_size()) {
  tutti::obs::TraceOptions o = tutti::obs::TraceOptions::from_env();
  if (!f.trace.empty()) o.dir = f.trace;
  o.host = job.hostname();
  if (!o.dir.empty()) trace = std::make_unique<tutti::obs::TraceSession>(job.cpu_communicator(), o);
  if (!f.metrics_file.empty() || f.metrics_port > 0) {
    tutti::obs::MetricLabels labels{"train_fashion_mnist", job.rank(), job.local_rank(), job.hostname()};
    metrics = std::make_unique<tutti::obs::TrainingMetrics>(
        labels, tutti::obs::TrainingMetricsOptions{peak_flops, std::string(job.backend()), job.device().str()});
    if (!f.metrics_file.empty()) {
      metrics_file_ = std::make_unique<tutti::obs::TextfileExporter>(
          metrics->registry(), metrics_path_of(f.metrics_file, job.rank(), world_), f.metrics_interval);
    }
    if (f.metrics_port > 0) {
      metrics_http_ =
          std::make_unique<tutti::obs::HttpExporter>(metrics->registry(), f.metrics_port + job.local_rank());
    }
  }
  if (f.straggler_every > 0 && world_ > 1) {
    tutti::obs::StragglerOptions so;
    so.every = f.straggler_every;
    so.threshold = f.straggler_threshold;
    stragglers_.emplace(job.rank(), world_, tutti::obs::all_hosts(job.cpu_communicator(), job.hostname()), so);
  }
  if (!f.debug_slow.empty()) {
    const auto colon = f.debug_slow.find(':');
    TUTTI_CHECK_ARG(colon != std::string::npos && colon + 1 < f.debug_slow.size(), "--debug-slow ", f.debug_slow,
                    ": expected RANK:MS or RANK:P%");
    slow_rank_ = std::stoi(f.debug_slow.substr(0, colon));
    const std::string amount = f.debug_slow.substr(colon + 1);
    if (amount.back() == '%') {
      slow_fraction_ = std::stod(amount.substr(0, amount.size() - 1)) / 100.0;
    } else {
      slow_ms_ = std::stod(amount);
    }
  }
}

void Watch::debug_slow(int micro, const tutti::Stream& stream) {
  if (rank_ != slow_rank_ || (slow_fraction_ > 0 && micro > 0)) return;
  stream.synchronize();
  // RANK:P% (once a step): P% of the last step's compute before its first collective without
  // the wait itself, so that the rank's figure is (1 + P/100) times what it would be.
  const double ms = slow_fraction_ > 0 ? slow_fraction_ * (last_compute_ms_ - last_slow_ms_) : slow_ms_;
  step_slow_ms_ += ms;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(ms);
  while (std::chrono::steady_clock::now() < until) {
  }
}

int Watch::sync_slots(std::int64_t step) const {
  return stragglers_ && stragglers_->due(step) ? stragglers_->slot_count() : 0;
}

void Watch::after_step(std::int64_t step, const tutti::ddp::StepStats& stats, double data_s, tutti::Tensor slots,
                       const tutti::Stream& stream) {
  last_compute_ms_ = stats.compute_before_comm_ms;
  last_slow_ms_ = step_slow_ms_;
  step_slow_ms_ = 0;
  if (!stragglers_) return;
  stragglers_->add_step(step, stats.compute_before_comm_ms * 1e-3, data_s);
  if (!stragglers_->due(step)) return;
  std::vector<float> mine(static_cast<std::size_t>(stragglers_->slot_count()));
  stragglers_->fill(mine.data());
  slots.copy_from(tutti::Tensor::from_floats(mine, {stragglers_->slot_count()}).to(slots.device(), stream), stream);
}

void Watch::after_sync(std::int64_t step, const tutti::Tensor& slots, const tutti::Stream& stream,
                       example::Progress& progress) {
  if (!stragglers_ || !stragglers_->due(step)) return;
  // The allreduce averaged the slots: analyze with the world size as the scale.
  stream.synchronize();
  const tutti::Tensor reduced = slots.to(tutti::Device::cpu(), stream);
  const tutti::obs::StragglerReport report = stragglers_->analyze(reduced.data_as<float>(), world_);
  if (report.rank >= 0) {
    ++straggler_reports_;
    last_straggler_ = report.message();
    if (report.new_straggler && rank_ == 0) {
      progress.finish_line();
      std::fprintf(stderr, "train_fashion_mnist: %s\n", last_straggler_.c_str());
    }
  }
  if (metrics) metrics->observe_straggler(report.rank, report.slower_by, report.rank == rank_);
}

}  // namespace fmnist
