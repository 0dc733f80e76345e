// LossScaler: scales the loss so that fp16 gradients do not underflow, and unscales and
// checks the gradients before the optimizer steps.
//
// A step, split so that a data-parallel runtime can put its allreduce in the middle:
//   1. backward with the loss gradient multiplied by scale()  (CrossEntropyLoss grad_scale)
//   2. unscale_and_check(grads, divisor): one fused pass per buffer, grads *= 1/(scale·divisor)
//      and a device flag set if any element is inf or nan; no host sync. (The runtime that
//      divides by ranks and micro-batches folds that into `divisor`: ddp/ddp.h, "Gradient
//      scaling", says who divides by what.)
//   3. update(flag): reads the flag (the step's one host sync) and decides: on inf/nan the
//      step must be skipped and the scale backs off; after growth_interval good steps in a
//      row it grows. Returns whether to step.
// Defaults are PyTorch GradScaler's. Dynamic mode does all of the above; static mode keeps
// the scale fixed but still skips non-finite steps; off mode uses scale 1, never reads the
// flag and never skips (bf16 needs no scaling).
//
// Divergence: in dynamic mode, a non-finite step that would take the scale below min_scale
// throws tutti::Error ("the run diverged") instead of backing off further. Gradients that
// are inf/nan even at scale 1 do not come from fp16's narrow range but from the model or
// the data, and skipping on would only halve the scale until it is 0 (about 165 silent
// skips from 2^16). With the defaults the error comes after 17 non-finite steps in a row.
//
// With gradient clipping, keep the one host sync: optim::compute_grad_norm reads the global
// norm, which is inf or nan exactly when a gradient is; pass !norm.finite to update(bool)
// instead of reading the flag as well.
#pragma once

#include <cstdint>
#include <vector>

#include "tutti/core/state_dict.h"
#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"
#include "tutti/nn/parameter.h"

namespace tutti::amp {

enum class ScalerMode : std::uint8_t { dynamic, fixed, off };

struct LossScalerOptions {
  ScalerMode mode = ScalerMode::dynamic;
  float init_scale = 65536.0f;  // 2^16
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  std::int64_t growth_interval = 2000;
  // The floor of the dynamic scale (> 0; at most init_scale in dynamic mode, unused in the
  // others): backing off below it is an error that says the run diverged. Default 1, as
  // DeepSpeed's min_loss_scale: below 1 the scale would shrink gradients that overflow even
  // unscaled, and no scale cures that.
  float min_scale = 1.0f;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerOptions options = {});

  // The factor the loss gradient is multiplied by (1 when off).
  float scale() const { return scale_; }
  bool enabled() const { return options_.mode != ScalerMode::off; }
  const LossScalerOptions& options() const { return options_; }

  // Zeroes the found-inf flag, then, for each buffer (adjacent views merged), multiplies
  // it in place by 1 / (scale() · divisor) and sets the flag on inf or nan. Issued on
  // `stream`; no host sync. Returns the flag ([1] i32 on the gradients' device), valid until
  // the next call. In off mode it only divides by divisor (when not 1).
  const Tensor& unscale_and_check(const std::vector<Tensor>& grads, const Stream& stream = Stream(),
                                  float divisor = 1.0f);
  // The same over the parameters' defined gradients.
  const Tensor& unscale_and_check(const std::vector<nn::Parameter*>& params, const Stream& stream = Stream(),
                                  float divisor = 1.0f);

  // Reads the flag (waits for `stream`: the one host sync of the step) and calls
  // update(bool). In off mode it reads nothing and returns true.
  bool update(const Tensor& found_inf, const Stream& stream = Stream());
  // Decides the step from an already known flag. Returns true when the optimizer should
  // step, false when the step must be skipped (parameters and optimizer state untouched).
  // Throws tutti::Error when a dynamic scale would fall below min_scale (see the top of this
  // file); the message names the step, how many non-finite steps in a row led there and the
  // scale they started from. The scaler is left as it was before that step.
  bool update(bool found_inf);

  // Good steps in a row since the scale last changed, and skipped steps in total.
  std::int64_t growth_tracker() const { return growth_tracker_; }
  std::int64_t skipped_steps() const { return skipped_; }
  // Steps decided by update() (stepped or skipped), and non-finite steps in a row up to now.
  std::int64_t steps() const { return steps_; }
  std::int64_t nonfinite_streak() const { return streak_; }

  // "scale" (f32), "growth_tracker", "skipped_steps", "steps" and "nonfinite_streak" (i64).
  // Loading restores them.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 private:
  LossScalerOptions options_;
  float scale_;
  std::int64_t growth_tracker_ = 0;
  std::int64_t skipped_ = 0;
  std::int64_t steps_ = 0;
  std::int64_t streak_ = 0;
  Tensor found_;
};

}  // namespace tutti::amp
