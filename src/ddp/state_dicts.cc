// DistributedDataParallel's checkpoints and flat parameter vector: the strategy that holds the
// state answers (strategy.h); the frame only orders them after the gathers in flight.
#include "ddp/strategy.h"
#include "tutti/core/error.h"
#include "tutti/ddp/ddp.h"

namespace tutti::ddp {

StateDict DistributedDataParallel::model_state_dict() { return strategy_->model_state_dict(); }

void DistributedDataParallel::load_model_state_dict(const StateDict& state) { strategy_->load_model_state_dict(state); }

StateDict DistributedDataParallel::optimizer_state_dict(optim::Optimizer& optimizer) {
  return strategy_->optimizer_state_dict(optimizer);
}

void DistributedDataParallel::load_optimizer_state_dict(optim::Optimizer& optimizer, const StateDict& state) {
  optimizer.load_state_dict(state);
}

StateDict DistributedDataParallel::model_state_views() { return strategy_->model_state_views(); }

StateDict DistributedDataParallel::optimizer_state_views(optim::Optimizer& optimizer) {
  return strategy_->optimizer_state_views(optimizer);
}

StateParts DistributedDataParallel::model_state_parts() { return strategy_->model_state_parts(); }

StateParts DistributedDataParallel::optimizer_state_parts(optim::Optimizer& optimizer) {
  return strategy_->optimizer_state_parts(optimizer);
}

Tensor DistributedDataParallel::parameters_flat() {
  synchronize_parameters();
  return strategy_->parameters_flat();
}

void DistributedDataParallel::load_parameters_flat(const Tensor& flat) {
  const std::int64_t total = reducer_->plan().total;
  TUTTI_CHECK_ARG(flat.dtype() == DType::f32 && flat.numel() == total, "load_parameters_flat: got ", flat.str(),
                  " but the plan holds ", total, " f32 values");
  synchronize_parameters();
  const Stream& stream = model_.stream();
  const Tensor values = flat.device() == model_.device() ? flat.view(0, {total}) : flat.to(model_.device(), stream);
  strategy_->load_parameters_flat(values);
  if (values.data() != flat.data()) stream.synchronize();  // before the copy on this device goes
  for (nn::Parameter* p : params_) p->initialized = true;
}

}  // namespace tutti::ddp
