// plan_state.h: a flat vector in a plan's layout <-> its entries by parameter name.
#include "ddp/plan_state.h"

#include "tutti/core/error.h"

namespace tutti::ddp {

StateDict named_of_flat(const nn::FlatPlan& plan, const Tensor& flat, const Stream& stream) {
  StateDict out;
  for (const nn::PlanEntry& e : plan.entries) out[e.name] = flat.view(e.offset, e.shape).to(Device::cpu(), stream);
  return out;
}

StateDict named_views_of_flat(const nn::FlatPlan& plan, const Tensor& flat) {
  StateDict out;
  for (const nn::PlanEntry& e : plan.entries) out[e.name] = flat.view(e.offset, e.shape);
  return out;
}

Tensor flat_of_named(const nn::FlatPlan& plan, const StateDict& state, const std::string& prefix, std::string_view call,
                     std::string_view missing_hint) {
  Tensor host = Tensor::zeros({plan.total}, DType::f32);
  for (const nn::PlanEntry& e : plan.entries) {
    const auto it = state.find(prefix + e.name);
    TUTTI_CHECK_ARG(it != state.end(), call, ": no entry for parameter '", prefix, e.name, "'", missing_hint);
    TUTTI_CHECK_ARG(it->second.shape() == e.shape && it->second.dtype() == DType::f32, call, ": '", prefix, e.name,
                    "' is ", it->second.str(), " but the parameter is ", shape_str(e.shape), " f32");
    host.view(e.offset, e.shape).copy_from(it->second);
  }
  return host;
}

}  // namespace tutti::ddp
