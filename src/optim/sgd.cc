#include "tutti/optim/sgd.h"

#include "tutti/kernels/optimizer.h"

namespace tutti::optim {

SGD::SGD(std::vector<nn::Parameter*> params, SgdOptions options)
    : SGD(std::vector<ParamGroup>{ParamGroup{std::move(params), std::nullopt}}, options) {}

SGD::SGD(std::vector<ParamGroup> groups, SgdOptions options) : Optimizer(std::move(groups)), options_(options) {
  TUTTI_CHECK_ARG(options.lr >= 0 && options.momentum >= 0 && options.weight_decay >= 0, "SGD: lr ", options.lr,
                  ", momentum ", options.momentum, ", weight_decay ", options.weight_decay, " must be >= 0");
  TUTTI_CHECK_ARG(!options.nesterov || options.momentum > 0, "SGD: Nesterov momentum needs momentum > 0");
  base_lr_ = options.lr;
}

std::vector<std::string> SGD::state_names_impl() const {
  if (options_.momentum == 0.0f) return {};
  return {"momentum_buffer"};
}

void SGD::update(const Segment& segment, float lr, float grad_scale, std::int64_t step_index) {
  kernels::SgdParams p;
  p.lr = lr;
  p.momentum = options_.momentum;
  p.weight_decay = segment.weight_decay;
  p.nesterov = options_.nesterov;
  p.grad_scale = grad_scale;
  kernels::sgd_update(segment.value, segment.grad, segment.state.empty() ? Tensor() : segment.state[0], segment.compute,
                      p, /*first_step=*/step_index == 1, stream());
}

}  // namespace tutti::optim
