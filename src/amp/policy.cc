#include "tutti/amp/policy.h"

#include "tutti/nn/module.h"

namespace tutti::amp {

LossScalerOptions Policy::default_scaler() const {
  LossScalerOptions options;
  options.mode = compute == DType::f16 ? ScalerMode::dynamic : ScalerMode::off;
  return options;
}

void apply(const Policy& policy, nn::Module& model) {
  TUTTI_CHECK_ARG(policy.master == DType::f32, "amp::apply: master weights must be f32, got ", name_of(policy.master));
  model.set_precision(policy.compute, policy.grad);
  model.set_grad_comm_dtype(policy.comm);
}

}  // namespace tutti::amp
