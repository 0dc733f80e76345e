// Summary: the machine-readable summary of a training run, one JSON object in one file,
// written once by rank 0 however the run ends. "status" says how:
//
//   "completed"  the run did what it was asked (with every figure the program set)
//   "diverged"   the training loss stopped being finite (exit code 3): the step, the loss
//                ("nan", "inf" or "-inf": JSON has no such numbers), and the last finite loss
//                with its step ("last_finite_loss", "last_finite_step"; null when none)
//   "stopped"    a stop signal ended it at a step boundary (exit code 75): the step, the
//                signal ("SIGTERM", ...), the checkpoint to resume from (null: none)
//   "failed"     an error: its message ("error")
//
// Each also carries "steps" (the steps done) and what the program set() by then. A process
// that is killed (SIGKILL, or ended by tutti after another rank failed) writes nothing.
//
// Make it first in main(), before the Job, so that an error anywhere is summarized, and hand
// it to the train::Run (RunOptions::summary), which sets the rank, the steps and the ending:
//
// doc-test: fragment a sketch: the run is elided
//   tutti::train::Summary summary("run.json");
//   try { ... run(..., {.summary = &summary}) ... }
//   catch (const std::exception& e) { summary.failed(e.what()); throw; }
//
// The file is written to a temporary beside it and renamed over it: a reader never sees half
// a summary. Keys are written in sorted order. Not thread-safe; nothing here is collective.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>

namespace tutti::train {

class Summary {
 public:
  // path: "" writes nothing (every call is then a no-op). Until set_rank() only the process
  // that its launcher calls rank 0 (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK or SLURM_PROCID;
  // none: a process alone) writes, so that an error before the job has started is summarized
  // once.
  explicit Summary(std::string path = "");

  // Once the job knows its rank: only rank 0 writes. On rank 0, throws InvalidArgument when
  // the path cannot be written ("--json PATH: cannot write there (...)"): better at the start
  // than at the end of a run.
  void set_rank(int rank);

  // The run's figures, as they become known. A later set of the same key replaces it.
  void set(const std::string& key, std::string_view value);  // a JSON string (invalid UTF-8 -> U+FFFD)
  void set(const std::string& key, const char* value) { set(key, std::string_view(value)); }
  template <class T>
  requires std::is_arithmetic_v<T>
  void set(const std::string& key, T value) {
    if constexpr (std::is_same_v<T, bool>) {
      set_json(key, value ? "true" : "false");
    } else if constexpr (std::is_integral_v<T>) {
      set_json(key, std::to_string(value));
    } else {
      set_number(key, static_cast<double>(value));
    }
  }
  void set_null(const std::string& key) { set_json(key, "null"); }
  // Raw JSON text (an array, an object), not checked.
  void set_json(const std::string& key, std::string json);
  bool has(const std::string& key) const { return fields_.count(key) != 0; }

  // After every step: the steps done and the step's loss (the last finite one is kept; a
  // negative loss is none yet, as after resuming from a checkpoint without one).
  void set_step(std::int64_t steps, double loss);

  // The ending. Only the first one is written: an error while another ending is written
  // keeps the first.
  void completed();
  void diverged();                                                         // at the step and loss of the last set_step
  void stopped(const std::string& signal, const std::string& checkpoint);  // checkpoint "": none
  void failed(const std::string& error);

  const std::string& path() const { return path_; }
  bool written() const { return written_; }

 private:
  void set_number(const std::string& key, double value);  // non-finite: null
  void write(const char* status);
  std::string path_;
  bool writer_;
  std::map<std::string, std::string> fields_;  // key -> JSON text
  std::int64_t steps_ = 0, last_finite_step_ = -1;
  double loss_ = 0, last_finite_loss_ = 0;
  bool written_ = false;
};

// s as a JSON string literal, quotes included; bytes that are not UTF-8 become U+FFFD.
std::string json_quote(std::string_view s);

}  // namespace tutti::train
