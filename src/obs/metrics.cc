#include "tutti/obs/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tutti/core/error.h"
#include "tutti/version.h"

namespace tutti::obs {
namespace {

bool valid_name(std::string_view name) {
  if (name.empty()) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

// A label value: backslash, double quote and newline escaped, as the text format wants.
std::string label_value(std::string_view v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

// Go's %g-like formatting that Prometheus parses: NaN, +Inf, -Inf, or 17 significant digits.
std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

// ---- the registry ----------------------------------------------------------------------------

MetricRegistry::MetricRegistry(MetricLabels labels) : labels_(std::move(labels)) {
  label_text_ = "job=\"" + label_value(labels_.job) + "\",rank=\"" + std::to_string(labels_.rank) + "\",local_rank=\"" +
                std::to_string(labels_.local_rank) + "\",host=\"" + label_value(labels_.host) + "\"";
}

void MetricRegistry::define(std::string_view name, MetricType type, std::string_view help) {
  TUTTI_CHECK_ARG(valid_name(name), "MetricRegistry: '", name, "' is not a Prometheus metric name");
  TUTTI_CHECK_ARG(type != MetricType::counter || name.ends_with("_total"), "MetricRegistry: counter '", name,
                  "' must end in _total");
  std::lock_guard lock(mutex_);
  const auto it = metrics_.find(name);
  if (it != metrics_.end()) {
    TUTTI_CHECK_ARG(it->second.type == type, "MetricRegistry: '", name, "' defined again with another type");
    return;
  }
  metrics_.emplace(std::string(name), Metric{type, std::string(help), {}});
}

MetricRegistry::Metric& MetricRegistry::find(std::string_view name) {
  const auto it = metrics_.find(name);
  TUTTI_CHECK_ARG(it != metrics_.end(), "MetricRegistry: '", name, "' was never defined");
  return it->second;
}

void MetricRegistry::set(std::string_view name, double value, std::string_view extra) {
  std::lock_guard lock(mutex_);
  find(name).series[std::string(extra)] = value;
}

void MetricRegistry::add(std::string_view name, double delta, std::string_view extra) {
  TUTTI_CHECK_ARG(delta >= 0, "MetricRegistry: counter '", name, "' given a negative increment ", delta);
  std::lock_guard lock(mutex_);
  Metric& m = find(name);
  TUTTI_CHECK_ARG(m.type == MetricType::counter, "MetricRegistry::add: '", name, "' is not a counter");
  m.series[std::string(extra)] += delta;
}

double MetricRegistry::value(std::string_view name, std::string_view extra) const {
  std::lock_guard lock(mutex_);
  const auto it = metrics_.find(name);
  if (it == metrics_.end()) return NAN;
  const auto s = it->second.series.find(std::string(extra));
  return s == it->second.series.end() ? NAN : s->second;
}

std::string MetricRegistry::text() const {
  std::lock_guard lock(mutex_);
  std::string out;
  for (const auto& [name, m] : metrics_) {
    if (m.series.empty()) continue;
    out += "# HELP " + name + " " + m.help + "\n";
    out += "# TYPE " + name + (m.type == MetricType::counter ? " counter\n" : " gauge\n");
    for (const auto& [extra, v] : m.series) {
      out += name + "{" + label_text_ + (extra.empty() ? "" : "," + extra) + "} " + number(v) + "\n";
    }
  }
  return out;
}

// ---- training metrics ------------------------------------------------------------------------

TrainingMetrics::TrainingMetrics(MetricLabels labels, TrainingMetricsOptions options)
    : registry_(std::move(labels)), options_(std::move(options)) {
  using T = MetricType;
  MetricRegistry& r = registry_;
  r.define("tutti_info", T::gauge, "Always 1; the labels say what runs (tutti version, backend, device).");
  r.define("tutti_steps_total", T::counter, "Optimizer steps done by this rank.");
  r.define("tutti_samples_total", T::counter, "Samples this rank trained on.");
  r.define("tutti_tokens_total", T::counter, "Tokens this rank trained on (token models only).");
  r.define("tutti_train_seconds_total", T::counter, "Wall time spent in training steps.");
  r.define("tutti_step", T::gauge, "The last step done.");
  r.define("tutti_step_seconds", T::gauge, "Wall time of the last step.");
  r.define("tutti_data_seconds", T::gauge, "Time the last step spent loading data.");
  r.define("tutti_throughput_samples_per_second", T::gauge, "Samples per second of this rank in the last step.");
  r.define("tutti_throughput_tokens_per_second", T::gauge, "Tokens per second of this rank in the last step.");
  r.define("tutti_tflops", T::gauge, "Model TFLOP/s this rank achieved in the last step (training FLOPs).");
  r.define("tutti_mfu", T::gauge,
           "Model FLOPs utilization of the last step: achieved FLOP/s over the device's peak (0..1).");
  r.define("tutti_peak_flops", T::gauge, "The peak FLOP/s MFU is measured against.");
  r.define("tutti_loss", T::gauge, "Training loss of the last step.");
  r.define("tutti_loss_scale", T::gauge, "The dynamic loss scale (1 without one).");
  r.define("tutti_skipped_steps_total", T::counter, "Steps the loss scaler skipped (non-finite gradients).");
  r.define("tutti_reduced_bytes_total", T::counter, "Gradient bytes this rank sent into collectives.");
  r.define("tutti_step_reduced_bytes", T::gauge, "Gradient bytes reduced in the last step.");
  r.define("tutti_bus_bandwidth_bytes_per_second", T::gauge,
           "Bus bandwidth of the last step's gradient collectives (nccl-tests' busbw).");
  r.define("tutti_bus_bandwidth_gbs", T::gauge,
           "The same in GB/s, as NCCL's inspector names it (nccl_bus_bandwidth_gbs).");
  r.define("tutti_comm_seconds", T::gauge, "Time the last step's gradient collectives were in flight.");
  r.define("tutti_exposed_comm_seconds", T::gauge,
           "Time the last step waited for communication after backward (not hidden).");
  r.define("tutti_exposed_comm_seconds_total", T::counter, "Time waited for communication after backward, all steps.");
  r.define("tutti_compute_before_comm_seconds", T::gauge,
           "Time from the step's start to its first collective (a straggler shows here).");
  r.define("tutti_checkpoint_save_seconds", T::gauge, "Time of the last checkpoint save.");
  r.define("tutti_checkpoint_saves_total", T::counter, "Checkpoint saves.");
  r.define("tutti_memory_device_bytes", T::gauge, "Device memory in use by this rank.");
  r.define("tutti_memory_host_bytes", T::gauge, "Resident set size of this rank's process.");
  r.define("tutti_straggler_rank", T::gauge,
           "The rank found slower than the median by more than the threshold (-1: none).");
  r.define("tutti_straggler_slowdown_ratio", T::gauge,
           "How much slower the straggler is than the median (0.5: 50% slower).");
  r.define("tutti_is_straggler", T::gauge, "1 when this rank is the straggler.");
  r.define("tutti_straggler_reports_total", T::counter, "Checks that found a straggler.");
  r.define("tutti_run_attempts", T::gauge, "Attempts of this run: 1, plus one per relaunch that resumed it.");
  r.define("tutti_run_rank_hours", T::gauge, "Ranks x hours of the run's attempts (GPU-hours on GPUs).");
  r.define("tutti_goodput_ratio", T::gauge, "Time of the steps the run's state holds / the run's wall time (0..1).");
  r.define("tutti_lost_to_failures_seconds", T::gauge,
           "Time before this attempt that left nothing in the state (redone steps, failures, restarts).");
  r.define("tutti_run_cost", T::gauge, "The run's cost so far: its rank-hours x the price of one (--price-per-hour).");
  r.set("tutti_info", 1,
        "version=\"" + std::string(tutti::version()) + "\",backend=\"" + label_value(options_.backend) +
            "\",device=\"" + label_value(options_.device) + "\"");
  // Counters start at 0, so that rate() has a first point.
  for (const char* c : {"tutti_steps_total", "tutti_samples_total", "tutti_train_seconds_total",
                        "tutti_skipped_steps_total", "tutti_reduced_bytes_total", "tutti_exposed_comm_seconds_total",
                        "tutti_checkpoint_saves_total", "tutti_straggler_reports_total"}) {
    r.add(c, 0);
  }
  r.set("tutti_straggler_rank", -1);
  r.set("tutti_is_straggler", 0);
  if (options_.peak_flops > 0) r.set("tutti_peak_flops", options_.peak_flops);
}

void TrainingMetrics::set_peak_flops(double flops) {
  TUTTI_CHECK_ARG(flops >= 0, "TrainingMetrics::set_peak_flops: ", flops, " FLOP/s is negative");
  options_.peak_flops = flops;
  if (flops > 0) registry_.set("tutti_peak_flops", flops);
}

void TrainingMetrics::observe_step(const StepRecord& s) {
  MetricRegistry& r = registry_;
  r.add("tutti_steps_total", 1);
  r.add("tutti_samples_total", static_cast<double>(s.samples));
  if (s.tokens > 0) r.add("tutti_tokens_total", static_cast<double>(s.tokens));
  r.add("tutti_train_seconds_total", std::max(0.0, s.step_seconds));
  r.set("tutti_step", static_cast<double>(s.step));
  r.set("tutti_step_seconds", s.step_seconds);
  r.set("tutti_data_seconds", s.data_seconds);
  if (s.step_seconds > 0) {
    r.set("tutti_throughput_samples_per_second", static_cast<double>(s.samples) / s.step_seconds);
    if (s.tokens > 0) r.set("tutti_throughput_tokens_per_second", static_cast<double>(s.tokens) / s.step_seconds);
    if (s.flops > 0) {
      const double flops_per_s = s.flops / s.step_seconds;
      r.set("tutti_tflops", flops_per_s / 1e12);
      if (options_.peak_flops > 0) r.set("tutti_mfu", flops_per_s / options_.peak_flops);
    }
  }
  if (s.loss >= 0 || std::isnan(s.loss)) r.set("tutti_loss", s.loss);
  r.set("tutti_loss_scale", s.loss_scale);
  if (s.skipped) r.add("tutti_skipped_steps_total", 1);
  r.add("tutti_reduced_bytes_total", static_cast<double>(s.ddp.bytes_reduced));
  r.set("tutti_step_reduced_bytes", static_cast<double>(s.ddp.bytes_reduced));
  r.set("tutti_bus_bandwidth_bytes_per_second", s.ddp.busbw_gbs * 1e9);
  r.set("tutti_bus_bandwidth_gbs", s.ddp.busbw_gbs);
  r.set("tutti_comm_seconds", s.ddp.comm_ms * 1e-3);
  r.set("tutti_exposed_comm_seconds", s.ddp.exposed_comm_ms * 1e-3);
  r.add("tutti_exposed_comm_seconds_total", std::max(0.0, s.ddp.exposed_comm_ms * 1e-3));
  r.set("tutti_compute_before_comm_seconds", s.ddp.compute_before_comm_ms * 1e-3);
  r.set("tutti_memory_host_bytes", static_cast<double>(host_memory_bytes()));
}

void TrainingMetrics::observe_checkpoint(double seconds) {
  registry_.set("tutti_checkpoint_save_seconds", seconds);
  registry_.add("tutti_checkpoint_saves_total", 1);
}

void TrainingMetrics::observe_accounting(const train::Accounting& a, bool priced) {
  registry_.set("tutti_run_attempts", a.attempts);
  registry_.set("tutti_run_rank_hours", a.rank_hours);
  registry_.set("tutti_goodput_ratio", a.goodput);
  registry_.set("tutti_lost_to_failures_seconds", a.lost_seconds);
  if (priced) registry_.set("tutti_run_cost", a.cost);
}

void TrainingMetrics::observe_straggler(int rank, double slower_by, bool this_rank) {
  registry_.set("tutti_straggler_rank", rank);
  registry_.set("tutti_straggler_slowdown_ratio", rank >= 0 ? slower_by : 0.0);
  registry_.set("tutti_is_straggler", this_rank ? 1 : 0);
  if (rank >= 0) registry_.add("tutti_straggler_reports_total", 1);
}

void TrainingMetrics::set_device_memory(std::int64_t bytes) {
  registry_.set("tutti_memory_device_bytes", static_cast<double>(bytes));
}

std::int64_t host_memory_bytes() {
  std::ifstream statm("/proc/self/statm");
  long long pages = 0, resident = 0;
  if (!(statm >> pages >> resident)) return 0;
  return static_cast<std::int64_t>(resident) * static_cast<std::int64_t>(sysconf(_SC_PAGESIZE));
}

// ---- the textfile exporter -------------------------------------------------------------------

TextfileExporter::TextfileExporter(const MetricRegistry& registry, std::string path, double interval_s)
    : registry_(registry), path_(std::move(path)), interval_s_(interval_s) {
  TUTTI_CHECK_ARG(interval_s_ > 0, "TextfileExporter: interval must be positive, got ", interval_s_);
  write_now();  // a bad path fails here, not silently in the thread
  thread_ = std::thread([this] {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      cv_.wait_for(lock, std::chrono::duration<double>(interval_s_), [this] { return stopping_; });
      if (stopping_) break;
      lock.unlock();
      try {
        write_now();
      } catch (...) {
        // A full disk or a removed directory: try again at the next interval.
      }
      lock.lock();
    }
  });
}

TextfileExporter::~TextfileExporter() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  try {
    write_now();
  } catch (...) {
  }
}

void TextfileExporter::write_now() {
  const std::string text = registry_.text();
  const std::filesystem::path target(path_);
  std::string hidden = ".";  // (appended, not concatenated: GCC 12 warns falsely on "." + string)
  hidden += target.filename().string();
  hidden += ".tmp";
  const std::filesystem::path tmp = target.parent_path() / hidden;
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    TUTTI_CHECK(f.good(), "TextfileExporter: cannot write ", tmp.string(), " (", std::strerror(errno), ")");
    f << text;
    f.flush();
    TUTTI_CHECK(f.good(), "TextfileExporter: writing ", tmp.string(), " failed (", std::strerror(errno), ")");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, target, ec);
  TUTTI_CHECK(!ec, "TextfileExporter: cannot rename ", tmp.string(), " to ", path_, " (", ec.message(), ")");
}

}  // namespace tutti::obs
