// SGD with momentum, Nesterov momentum and (coupled, L2) weight decay, as PyTorch's
// torch.optim.SGD without dampening:
//   g = grad_scale · grad + weight_decay · w;  buf = momentum · buf + g (buf = g at first)
//   w -= lr · (nesterov ? g + momentum · buf : buf)
#pragma once

#include "tutti/optim/optimizer.h"

namespace tutti::optim {

struct SgdOptions {
  float lr = 0.01f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  // One group of parameters, or several (each with its own weight decay, see optimizer.h).
  SGD(std::vector<nn::Parameter*> params, SgdOptions options = {});
  SGD(std::vector<ParamGroup> groups, SgdOptions options = {});
  const SgdOptions& options() const { return options_; }

 protected:
  std::vector<std::string> state_names_impl() const override;
  float default_weight_decay() const override { return options_.weight_decay; }
  void update(const Segment& segment, float lr, float grad_scale, std::int64_t step_index) override;

 private:
  SgdOptions options_;
};

}  // namespace tutti::optim
