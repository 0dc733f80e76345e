#include "tutti/amp/loss_scaler.h"

#include <cmath>

#include "tutti/kernels/cast.h"
#include "tutti/kernels/elementwise.h"

namespace tutti::amp {

LossScaler::LossScaler(LossScalerOptions options)
    : options_(options), scale_(options.mode == ScalerMode::off ? 1.0f : options.init_scale) {
  TUTTI_CHECK_ARG(options.init_scale > 0, "LossScaler: init_scale must be positive, got ", options.init_scale);
  TUTTI_CHECK_ARG(options.growth_factor >= 1, "LossScaler: growth_factor must be >= 1, got ", options.growth_factor);
  TUTTI_CHECK_ARG(options.backoff_factor > 0 && options.backoff_factor <= 1,
                  "LossScaler: backoff_factor must be in (0, 1], got ", options.backoff_factor);
  TUTTI_CHECK_ARG(options.growth_interval >= 1, "LossScaler: growth_interval must be >= 1, got ",
                  options.growth_interval);
  TUTTI_CHECK_ARG(
      options.min_scale > 0 && (options.mode != ScalerMode::dynamic || options.min_scale <= options.init_scale),
      "LossScaler: min_scale must be in (0, init_scale = ", options.init_scale, "], got ", options.min_scale);
}

const Tensor& LossScaler::unscale_and_check(const std::vector<Tensor>& grads, const Stream& stream, float divisor) {
  TUTTI_CHECK_ARG(divisor > 0, "LossScaler::unscale_and_check: divisor must be positive, got ", divisor);
  const std::vector<Tensor> buffers = nn::coalesce_views(grads);
  const Device device = buffers.empty() ? stream.device() : buffers.front().device();
  if (!found_.defined() || found_.device() != device) found_ = Tensor::empty({1}, DType::i32, device);
  found_.zero(stream);
  const float inv = 1.0f / (scale_ * divisor);
  if (!enabled() && inv == 1.0f) return found_;
  for (const Tensor& g : buffers) kernels::unscale_and_check(g, inv, found_, stream);
  return found_;
}

const Tensor& LossScaler::unscale_and_check(const std::vector<nn::Parameter*>& params, const Stream& stream,
                                            float divisor) {
  std::vector<Tensor> grads;
  for (nn::Parameter* p : params) {
    if (p->grad.defined()) grads.push_back(p->grad);
  }
  return unscale_and_check(grads, stream, divisor);
}

bool LossScaler::update(const Tensor& found_inf, const Stream& stream) {
  if (!enabled()) return update(false);
  TUTTI_CHECK_ARG(found_inf.defined() && found_inf.numel() == 1, "LossScaler::update: flag must be one element, got ",
                  found_inf.str());
  stream.synchronize();
  return update(found_inf.to_ints()[0] != 0);
}

bool LossScaler::update(bool found_inf) {
  if (options_.mode == ScalerMode::off) return true;
  if (found_inf) {
    const bool dynamic = options_.mode == ScalerMode::dynamic;
    const float next = dynamic ? scale_ * options_.backoff_factor : scale_;
    if (dynamic && next < options_.min_scale) {
      // Every step of the streak backed the scale off once: where it started.
      const double start = scale_ / std::pow(double{options_.backoff_factor}, static_cast<double>(streak_));
      TUTTI_THROW(Error, "LossScaler: the run diverged: ", streak_ + 1,
                  " step(s) in a row had inf/nan gradients, the last (step ", steps_ + 1,
                  ", counting every update) at loss scale ", scale_, " after the scale fell from ", start,
                  " while the others were skipped (", skipped_,
                  " skipped in all before it); backing off again would "
                  "take the scale to ",
                  next, ", below its floor min_scale = ", options_.min_scale,
                  ". Gradients that overflow at that scale come from the model, the data or the learning rate, not "
                  "from fp16's range: lower the learning rate, check the inputs and labels, or resume from an "
                  "earlier checkpoint");
    }
    ++steps_;
    ++streak_;
    ++skipped_;
    growth_tracker_ = 0;
    scale_ = next;
    return false;
  }
  ++steps_;
  streak_ = 0;
  if (options_.mode == ScalerMode::dynamic && ++growth_tracker_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
  return true;
}

StateDict LossScaler::state_dict() const {
  return {{"scale", scalar_tensor(scale_)},
          {"growth_tracker", int_scalar_tensor(growth_tracker_)},
          {"skipped_steps", int_scalar_tensor(skipped_)},
          {"steps", int_scalar_tensor(steps_)},
          {"nonfinite_streak", int_scalar_tensor(streak_)}};
}

void LossScaler::load_state_dict(const StateDict& state) {
  const double scale = get_scalar(state, "scale");
  TUTTI_CHECK_ARG(scale > 0, "LossScaler::load_state_dict: scale must be positive, got ", scale);
  scale_ = options_.mode == ScalerMode::off ? 1.0f : static_cast<float>(scale);
  growth_tracker_ = get_int_scalar(state, "growth_tracker");
  skipped_ = get_int_scalar(state, "skipped_steps");
  steps_ = get_int_scalar(state, "steps");
  streak_ = get_int_scalar(state, "nonfinite_streak");
}

}  // namespace tutti::amp
