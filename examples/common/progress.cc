#include "progress.h"

#include <algorithm>
#include <cmath>

namespace example {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  }
  return buf;
}

Progress::Progress(bool enabled, double interval_s, std::int64_t total_steps, std::int64_t first_step, bool bar)
    : enabled_(enabled),
      tty_(bar),
      interval_s_(interval_s),
      total_(total_steps),
      first_(first_step),
      start_(std::chrono::steady_clock::now()),
      last_(start_) {}

void Progress::update(std::int64_t step, int epoch, int epochs, double loss, double samples_per_s, std::int64_t skipped,
                      double mfu, bool force) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && std::chrono::duration<double>(now - last_).count() < interval_s_) return;
  last_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const std::int64_t done = step - first_;
  const double eta = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(total_ - step) : -1;
  char loss_text[32] = "-";
  if (loss >= 0 || !std::isfinite(loss)) std::snprintf(loss_text, sizeof loss_text, "%.4f", loss);
  char skipped_text[48] = "";
  if (skipped > 0) std::snprintf(skipped_text, sizeof skipped_text, " skipped %lld", static_cast<long long>(skipped));
  char mfu_text[32] = "";
  if (mfu >= 0) std::snprintf(mfu_text, sizeof mfu_text, " MFU %.1f%%", 100.0 * mfu);
  if (tty_) {
    const int width = 24;
    const int filled = total_ > 0 ? static_cast<int>(width * std::min<double>(1.0, double(step) / double(total_))) : 0;
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(width, '.');
    std::printf("\r[%s] epoch %d/%d step %lld/%lld loss %s%s %.0f samples/s%s ETA %s   ", bar.c_str(), epoch, epochs,
                static_cast<long long>(step), static_cast<long long>(total_), loss_text, skipped_text, samples_per_s,
                mfu_text, format_duration(eta).c_str());
    drawn_ = true;
  } else {
    std::printf("epoch %d/%d step %lld/%lld loss %s%s %.0f samples/s%s ETA %s\n", epoch, epochs,
                static_cast<long long>(step), static_cast<long long>(total_), loss_text, skipped_text, samples_per_s,
                mfu_text, format_duration(eta).c_str());
  }
  std::fflush(stdout);
}

void Progress::finish_line() {
  if (drawn_) {
    std::printf("\n");
    std::fflush(stdout);
    drawn_ = false;
  }
}

}  // namespace example
