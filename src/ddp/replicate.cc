// Replicate (ZeRO stage 0): every rank holds every whole tensor, so the state is the model's and
// the optimizer's own, read in place; gradients are allreduced into one flat buffer.
#include "core/format_bytes.h"
#include "ddp/strategy.h"
#include "tutti/core/error.h"
#include "tutti/kernels/cast.h"
#include "tutti/kernels/reduce.h"

namespace tutti::ddp {

using tutti::detail::format_count;
namespace {

class ReplicateStrategy final : public ShardingStrategy {
 public:
  using ShardingStrategy::ShardingStrategy;

  int stage() const override { return 0; }
  bool sharded() const override { return false; }
  GradientSharding gradient_sharding() const override { return GradientSharding::none; }

  optim::FlatTarget target(const std::weak_ptr<int>& /*alive*/) override {
    // The whole plan, one span: one fused call per run of a weight decay.
    nn::Module& model = ctx_.model;
    const std::int64_t total = plan().total;
    optim::FlatTarget target;
    optim::FlatSpan all;
    all.begin = 0;
    all.end = total;
    all.value = model.storage().values().view(0, {total});
    all.grad = reducer_->buffer().view(0, {total});
    if (model.storage().compute_copies().defined()) all.compute = model.storage().compute_copies().view(0, {total});
    target.spans.push_back(std::move(all));
    return target;
  }

  void grad_squares(const Tensor& sq, const Stream& stream) override {
    kernels::sum_squares(reducer_->buffer(), sq, /*accumulate=*/false, stream);
  }

  void memory(DdpMemory& m) const override { whole_model_bytes(m); }

  StateDict model_state_dict() override { return ctx_.model.state_dict(); }
  void load_model_state_dict(const StateDict& state) override { ctx_.model.load_state_dict(state); }
  StateDict optimizer_state_dict(optim::Optimizer& optimizer) override { return optimizer.state_dict(); }

  StateDict model_state_views() override {
    TUTTI_CHECK_ARG(!ctx_.model.storage().masters_released(),
                    "model_state_views: the model's fp32 values were released: use model_state_dict()");
    StateDict out = ctx_.model.extra_state();
    for (nn::Parameter* p : ctx_.params) out[p->name] = p->value;
    return out;
  }

  StateDict optimizer_state_views(optim::Optimizer& optimizer) override {
    TUTTI_CHECK_ARG(&optimizer == attached_, "optimizer_state_views: needs the optimizer attached (whole state ",
                    "tensors in this object's flat layout); here not attached: use optimizer_state_dict()");
    StateDict out;
    out["step"] = int_scalar_tensor(optimizer.steps());
    // The attached optimizer's state is one span over the whole plan: plan offsets.
    for_each_optimizer_state(optimizer, [&](const std::string& key, std::size_t k, const nn::PlanEntry& e) {
      out[key] = optimizer.flat_state(k).view(e.offset, e.shape);
    });
    return out;
  }

  StateParts model_state_parts() override { return whole_parts(model_state_views()); }
  StateParts optimizer_state_parts(optim::Optimizer& optimizer) override {
    return whole_parts(&optimizer == attached_ ? optimizer_state_views(optimizer) : optimizer.state_dict());
  }

  Tensor parameters_flat() override {
    const std::int64_t total = plan().total;
    Tensor out = Tensor::empty({total}, DType::f32, ctx_.model.device());
    out.copy_from(ctx_.model.storage().values().view(0, {total}), ctx_.model.stream());
    return out;
  }

  void load_parameters_flat(const Tensor& values) override {
    const nn::FlatStorage& s = ctx_.model.storage();
    const std::int64_t total = plan().total;
    s.values().view(0, {total}).copy_from(values, ctx_.model.stream());
    if (s.compute_copies().defined()) kernels::cast(values, s.compute_copies().view(0, {total}), ctx_.model.stream());
  }
};

}  // namespace

GradientSharding predict_replicate(const PlannedModel& m, MemoryPrediction& p) {
  // As flatten (values, compute copies), the span target() binds and the optimizer's state on it.
  const std::int64_t total = m.plan.total;
  const bool half = m.in.compute != DType::f32;
  const std::int64_t numel = numel_of(m.in.params);
  if (half) {
    p.lines[0] = {"parameters", total * static_cast<std::int64_t>(size_of(m.in.compute)),
                  std::string(name_of(m.in.compute)) + " compute copies, " + format_count(total) + " elements"};
    p.lines[1] = {"master weights", total * 4, "f32"};
  } else {
    p.lines[0] = {"parameters", total * 4,
                  "f32 values, " + format_count(total) + " elements (" + format_count(numel) + " + padding)"};
    p.lines[1] = {"master weights", 0, "none: the f32 values are the masters"};
  }
  p.lines[2] = {"gathered parameters", 0, "none: the parameters are whole"};
  p.lines[4] = {"optimizer state", m.in.optimizer_states * total * 4, std::to_string(m.in.optimizer_states) + " x f32"};
  return GradientSharding::none;
}

std::unique_ptr<ShardingStrategy> make_replicate(StrategyContext context) {
  return std::make_unique<ReplicateStrategy>(context);
}

}  // namespace tutti::ddp
