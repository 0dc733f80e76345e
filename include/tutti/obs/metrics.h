// Metrics for Prometheus: what each rank of a training job reports, in the Prometheus text
// exposition format (version 0.0.4), two ways: a file for node_exporter's textfile collector,
// rewritten atomically every few seconds (TextfileExporter), and an HTTP /metrics endpoint
// (HttpExporter). docs/observability.md lists every metric and what it means.
//
// Conventions (Prometheus's): names start with tutti_, values are in base units (seconds,
// bytes, ratios 0..1), counters end in _total and only grow; every sample carries the labels
// job, rank, local_rank and host. Where a name is already charted elsewhere its unit is kept
// beside the base-unit one: tutti_bus_bandwidth_gbs (NCCL inspector's nccl_bus_bandwidth_gbs),
// tutti_tflops and tutti_mfu (torchtitan's throughput/tflops/mfu).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tutti/ddp/reducer.h"
#include "tutti/train/accounting.h"

namespace tutti::obs {

struct MetricLabels {
  std::string job = "tutti";  // the job's name (Prometheus's own `job` label comes from the scrape config)
  int rank = 0;
  int local_rank = 0;
  std::string host;
};

enum class MetricType : std::uint8_t { gauge, counter };

// Named values with help texts, rendered as Prometheus text. Thread-safe: the exporters read
// it while the training loop writes it.
class MetricRegistry {
 public:
  explicit MetricRegistry(MetricLabels labels);

  // Declares a metric (again: the same type, or InvalidArgument). Names: [a-zA-Z_:][a-zA-Z0-9_:]*.
  void define(std::string_view name, MetricType type, std::string_view help);
  // A gauge's value; `extra` labels (`key="value"` pairs, comma-separated, already escaped)
  // make a series of its own.
  void set(std::string_view name, double value, std::string_view extra = {});
  // Adds delta (>= 0, else InvalidArgument) to a counter.
  void add(std::string_view name, double delta, std::string_view extra = {});
  // The current value (NaN when never set).
  double value(std::string_view name, std::string_view extra = {}) const;
  // Every metric that has a value, in the text format: # HELP, # TYPE, then one line per series.
  std::string text() const;
  const MetricLabels& labels() const { return labels_; }

 private:
  struct Metric {
    MetricType type;
    std::string help;
    std::map<std::string, double> series;  // extra labels -> value
  };
  Metric& find(std::string_view name);
  MetricLabels labels_;
  std::string label_text_;  // job="...",rank="0",...
  mutable std::mutex mutex_;
  std::map<std::string, Metric, std::less<>> metrics_;
};

// What one optimizer step did, as a training loop knows it.
struct StepRecord {
  std::int64_t step = 0;     // steps done so far (1 after the first)
  double step_seconds = 0;   // wall time of the step on this rank
  double data_seconds = 0;   // of which loading data
  std::int64_t samples = 0;  // samples this rank trained on in the step
  std::int64_t tokens = 0;   // tokens, where it applies (0: not reported)
  double loss = -1;          // the step's loss (negative: not known)
  double loss_scale = 1;
  bool skipped = false;  // the loss scaler skipped the step
  ddp::StepStats ddp;    // ddp.reducer().last_stats(): bytes, bandwidth, waits, compute before comm
  double flops = 0;      // model FLOPs this rank did in the step (0: unknown; see obs/mfu.h)
};

struct TrainingMetricsOptions {
  double peak_flops = 0;  // this rank's device peak, FLOP/s, for tutti_mfu (0: no MFU)
  std::string backend;    // tutti_info's labels
  std::string device;
};

// The registry filled from StepRecords: the metrics of docs/observability.md.
class TrainingMetrics {
 public:
  TrainingMetrics(MetricLabels labels, TrainingMetricsOptions options = {});
  void observe_step(const StepRecord& r);
  void observe_checkpoint(double seconds);
  // The run's accounting so far (train::Run::accounting()): attempts, rank-hours, goodput, the
  // time lost to failures, and with `priced` (a price per rank-hour given) the cost.
  void observe_accounting(const train::Accounting& a, bool priced);
  // Stragglers found by obs::StragglerDetector (straggler.h): the rank (-1: none), how much
  // slower than the median (ratio - 1), and whether this rank is the one.
  void observe_straggler(int rank, double slower_by, bool this_rank);
  // A new peak for tutti_peak_flops and the MFU of the steps after it (a measured CPU ceiling
  // probed again: obs::remeasure_peak). 0: no MFU from here on.
  void set_peak_flops(double flops);
  // Device memory in use (bytes); host memory (resident set) is read at each step.
  void set_device_memory(std::int64_t bytes);
  MetricRegistry& registry() { return registry_; }
  const MetricRegistry& registry() const { return registry_; }

 private:
  MetricRegistry registry_;
  TrainingMetricsOptions options_;
};

// Rewrites `path` with the registry's text every interval_s seconds, atomically (a temporary
// file in the same directory, then rename: node_exporter's textfile collector never reads half
// a file), from a thread of its own; once more when destroyed. The path should end in .prom.
class TextfileExporter {
 public:
  TextfileExporter(const MetricRegistry& registry, std::string path, double interval_s = 10.0);
  ~TextfileExporter();
  TextfileExporter(const TextfileExporter&) = delete;
  TextfileExporter& operator=(const TextfileExporter&) = delete;
  // Writes now (throws on an I/O error; the thread's own writes report nothing and retry later).
  void write_now();
  const std::string& path() const { return path_; }

 private:
  const MetricRegistry& registry_;
  std::string path_;
  double interval_s_;
  std::mutex mutex_;
  std::condition_variable_any cv_;
  bool stopping_ = false;
  std::thread thread_;
};

// Serves GET /metrics (the registry's text, Content-Type text/plain; version=0.0.4) on
// address:port from a thread of its own, with Debian's cpp-httplib. Port 0 takes a free port
// (port() says which). Throws BackendError when the port cannot be bound, and when tutti was
// built without cpp-httplib (available() is false then).
class HttpExporter {
 public:
  HttpExporter(const MetricRegistry& registry, int port, std::string address = "0.0.0.0");
  ~HttpExporter();
  HttpExporter(const HttpExporter&) = delete;
  HttpExporter& operator=(const HttpExporter&) = delete;
  int port() const { return port_; }
  static bool available();
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

// This process's resident set size in bytes (Linux /proc/self/statm; 0 where unknown).
std::int64_t host_memory_bytes();

}  // namespace tutti::obs
