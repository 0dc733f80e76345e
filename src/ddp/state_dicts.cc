// DdpState (ddp/ddp_state.h): DistributedDataParallel's checkpoints and flat parameter vector.
// The strategy that holds the state answers (strategy.h); this only orders them after the
// gathers in flight.
#include "ddp/strategy.h"
#include "tutti/core/error.h"
#include "tutti/ddp/ddp.h"

namespace tutti::ddp {

void DdpState::synchronize_parameters() { ddp_.strategy_->synchronize_parameters(); }

StateDict DdpState::model_state_dict() { return ddp_.strategy_->model_state_dict(); }

void DdpState::load_model_state_dict(const StateDict& state) { ddp_.strategy_->load_model_state_dict(state); }

StateDict DdpState::optimizer_state_dict(optim::Optimizer& optimizer) {
  return ddp_.strategy_->optimizer_state_dict(optimizer);
}

void DdpState::load_optimizer_state_dict(optim::Optimizer& optimizer, const StateDict& state) {
  optimizer.load_state_dict(state);
}

StateDict DdpState::model_state_views() { return ddp_.strategy_->model_state_views(); }

StateDict DdpState::optimizer_state_views(optim::Optimizer& optimizer) {
  return ddp_.strategy_->optimizer_state_views(optimizer);
}

StateParts DdpState::model_state_parts() { return ddp_.strategy_->model_state_parts(); }

StateParts DdpState::optimizer_state_parts(optim::Optimizer& optimizer) {
  return ddp_.strategy_->optimizer_state_parts(optimizer);
}

Tensor DdpState::parameters_flat() {
  synchronize_parameters();
  return ddp_.strategy_->parameters_flat();
}

void DdpState::load_parameters_flat(const Tensor& flat) {
  const std::int64_t total = ddp_.reducer_->plan().total;
  TUTTI_CHECK_ARG(flat.dtype() == DType::f32 && flat.numel() == total, "load_parameters_flat: got ", flat.str(),
                  " but the plan holds ", total, " f32 values");
  synchronize_parameters();
  nn::Module& model = ddp_.model_;
  const Stream& stream = model.stream();
  const Tensor values = flat.device() == model.device() ? flat.view(0, {total}) : flat.to(model.device(), stream);
  ddp_.strategy_->load_parameters_flat(values);
  if (values.data() != flat.data()) stream.synchronize();  // before the copy on this device goes
  for (nn::Parameter* p : ddp_.params_) p->initialized = true;
}

}  // namespace tutti::ddp
