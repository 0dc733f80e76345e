// Progress output of rank 0: a bar redrawn in place (for a terminal) or plain lines (for a
// log), at most one every `interval_s` seconds.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace example {

class Progress {
 public:
  Progress(bool enabled, double interval_s, std::int64_t total_steps, std::int64_t first_step, bool bar);
  // Call after every step; prints when the interval has passed (or `force`). loss < 0: none yet.
  // skipped: steps the loss scaler skipped so far (shown when there are any). mfu: model FLOPs
  // utilization (0..1; negative: not known, not shown).
  void update(std::int64_t step, int epoch, int epochs, double loss, double samples_per_s, std::int64_t skipped,
              double mfu, bool force = false);
  // Ends a bar line on a terminal before other output.
  void finish_line();

 private:
  bool enabled_;
  bool tty_;
  double interval_s_;
  std::int64_t total_;
  std::int64_t first_;
  std::chrono::steady_clock::time_point start_, last_;
  bool drawn_ = false;
};

// "1:02:03" or "2:03".
std::string format_duration(double seconds);

}  // namespace example
