#include "tutti/optim/adamw.h"

#include "tutti/kernels/optimizer.h"

namespace tutti::optim {

AdamW::AdamW(std::vector<nn::Parameter*> params, AdamWOptions options)
    : AdamW(std::vector<ParamGroup>{ParamGroup{std::move(params), std::nullopt}}, options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options) : Optimizer(std::move(groups)), options_(options) {
  TUTTI_CHECK_ARG(options.lr >= 0 && options.eps >= 0 && options.weight_decay >= 0, "AdamW: lr ", options.lr, ", eps ",
                  options.eps, ", weight_decay ", options.weight_decay, " must be >= 0");
  TUTTI_CHECK_ARG(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1, "AdamW: betas (",
                  options.beta1, ", ", options.beta2, ") must be in [0, 1)");
  base_lr_ = options.lr;
}

std::vector<std::string> AdamW::state_names_impl() const { return {"exp_avg", "exp_avg_sq"}; }

void AdamW::update(const Segment& segment, float lr, float grad_scale, std::int64_t step_index) {
  kernels::AdamWParams p;
  p.lr = lr;
  p.beta1 = options_.beta1;
  p.beta2 = options_.beta2;
  p.eps = options_.eps;
  p.weight_decay = segment.weight_decay;
  p.step = step_index;
  p.grad_scale = grad_scale;
  kernels::adamw_update(segment.value, segment.grad, segment.state[0], segment.state[1], segment.compute, p, stream());
}

}  // namespace tutti::optim
