// PowerSgdHook: PowerSGD (src/ddp/powersgd.h) behind the CommHook interface. It checks the
// options and what the reducer offers, then hands every call to the algorithm.
#include <utility>

#include "powersgd.h"
#include "tutti/core/error.h"
#include "tutti/ddp/reducer.h"

namespace tutti::ddp {

PowerSgdHook::PowerSgdHook(PowerSgdOptions options) : options_(options) {
  TUTTI_CHECK_ARG(options_.rank >= 1, "PowerSgdHook: PowerSgdOptions::rank must be >= 1, got ", options_.rank);
  TUTTI_CHECK_ARG(options_.start_step >= 0, "PowerSgdHook: PowerSgdOptions::start_step must be >= 0, got ",
                  options_.start_step);
  TUTTI_CHECK_ARG(options_.min_compression_ratio >= 0,
                  "PowerSgdHook: PowerSgdOptions::min_compression_ratio must be >= 0, got ",
                  options_.min_compression_ratio);
}

PowerSgdHook::~PowerSgdHook() = default;

void PowerSgdHook::bind(const CommHookContext& context) {
  TUTTI_CHECK_ARG(impl_ == nullptr, "PowerSgdHook: registered twice; a hook serves one reducer (make one per model)");
  TUTTI_CHECK_ARG(context.options.sharding == GradientSharding::none,
                  "PowerSgdHook (PowerSGD) needs sharding none (DistributedDataParallel with Replicate): it compresses "
                  "allreduces, not reduce-scatters (ZeRO)");
  TUTTI_CHECK_ARG(context.buffer.dtype() == DType::f32 && context.wire == DType::f32,
                  "PowerSgdHook (PowerSGD) needs f32 gradients and grad_comm_dtype f32, got ",
                  name_of(context.buffer.dtype()), " and ", name_of(context.wire));
  TUTTI_CHECK_ARG(context.options.average, "PowerSgdHook (PowerSGD) needs ReducerOptions::average = true");
  plan_ = context.plan;
  impl_ = std::make_unique<PowerSgd>(context.comm, *plan_, context.buffer, options_);
}

PowerSgd& PowerSgdHook::bound(const char* what) const {
  TUTTI_CHECK(impl_ != nullptr, "PowerSgdHook::", what, ": the hook is not registered (register_comm_hook first)");
  return *impl_;
}

bool PowerSgdHook::active() const { return impl_ && impl_->active(); }
std::int64_t PowerSgdHook::launch(int bucket, const Stream& stream) { return bound("launch").launch(bucket, stream); }
std::int64_t PowerSgdHook::finish(const Stream& stream, double* run_ms) {
  return bound("finish").finish(stream, run_ms);
}
void PowerSgdHook::end_step() { bound("end_step").end_step(); }
std::int64_t PowerSgdHook::bytes() const { return impl_ ? impl_->bytes() : 0; }
std::int64_t PowerSgdHook::compressed_count() const { return impl_ ? impl_->compressed_count() : 0; }
std::int64_t PowerSgdHook::compressed_numel() const { return impl_ ? impl_->compressed_numel() : 0; }

StateDict PowerSgdHook::state_dict(const Stream& stream) {
  if (!impl_) return {};
  ErrorContext context("saving PowerSGD's state");
  return impl_->state_dict(*plan_, stream);
}

std::string PowerSgdHook::load_state_dict(const StateDict& state, const Stream& stream) {
  ErrorContext context("loading PowerSGD's state");
  return bound("load_state_dict").load_state_dict(*plan_, state, stream);
}

}  // namespace tutti::ddp
