#include "tutti/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace tutti::optim {

float LrSchedule::at(std::int64_t step) const {
  const double s = static_cast<double>(std::max<std::int64_t>(step, 0));
  if (kind != Kind::constant && warmup_steps > 0 && step < warmup_steps) {
    return static_cast<float>(base_lr * (s + 1.0) / static_cast<double>(warmup_steps));
  }
  if (kind != Kind::cosine) return base_lr;
  const double span = static_cast<double>(total_steps - warmup_steps);
  const double t = span <= 0 ? 1.0 : std::min(1.0, (s - static_cast<double>(warmup_steps)) / span);
  constexpr double kPi = 3.14159265358979323846;
  return static_cast<float>(min_lr + (base_lr - min_lr) * 0.5 * (1.0 + std::cos(kPi * t)));
}

}  // namespace tutti::optim
