// Learning-rate schedules: constant, linear warm-up, and cosine decay after a warm-up.
#pragma once

#include <cstdint>

namespace tutti::optim {

struct LrSchedule {
  enum class Kind : std::uint8_t { constant, linear_warmup, cosine };
  Kind kind = Kind::constant;
  float base_lr = 1e-3f;
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 0;  // cosine: the step at which min_lr is reached
  float min_lr = 0.0f;

  static LrSchedule constant(float lr) { return {Kind::constant, lr, 0, 0, 0.0f}; }
  // base_lr · (step + 1) / warmup_steps for the first warmup_steps steps, then base_lr.
  static LrSchedule linear_warmup(float lr, std::int64_t warmup_steps) {
    return {Kind::linear_warmup, lr, warmup_steps, 0, 0.0f};
  }
  // Linear warm-up, then min_lr + (base_lr - min_lr) · (1 + cos(pi · t)) / 2 with t going
  // from 0 to 1 between warmup_steps and total_steps, and min_lr after that.
  static LrSchedule cosine(float lr, std::int64_t warmup_steps, std::int64_t total_steps, float min_lr = 0.0f) {
    return {Kind::cosine, lr, warmup_steps, total_steps, min_lr};
  }

  // The learning rate of the step with 0-based index `step`.
  float at(std::int64_t step) const;
};

}  // namespace tutti::optim
