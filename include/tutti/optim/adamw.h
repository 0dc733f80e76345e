// AdamW (Loshchilov & Hutter): Adam with bias correction and decoupled weight decay, as
// PyTorch's torch.optim.AdamW:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g²
//   w -= lr · (weight_decay · w + (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps))
#pragma once

#include "tutti/optim/optimizer.h"

namespace tutti::optim {

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

class AdamW : public Optimizer {
 public:
  // One group of parameters, or several (each with its own weight decay, see optimizer.h).
  AdamW(std::vector<nn::Parameter*> params, AdamWOptions options = {});
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options = {});
  const AdamWOptions& options() const { return options_; }

 protected:
  // "exp_avg" (m) and "exp_avg_sq" (v), PyTorch's names.
  std::vector<std::string> state_names_impl() const override;
  float default_weight_decay() const override { return options_.weight_decay; }
  void update(const Segment& segment, float lr, float grad_scale, std::int64_t step_index) override;

 private:
  AdamWOptions options_;
};

}  // namespace tutti::optim
