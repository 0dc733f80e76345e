// train::memory_plan for any model of tutti's layers (an MLP, a CNN): DistributedDataParallel's
// part (ddp::predict_memory), the batch, every layer's buffers as the layers state them
// (Module::buffer_bytes), the loss's gradient and the scalars.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "train/plan_layout.h"
#include "tutti/core/error.h"
#include "tutti/ddp/memory.h"
#include "tutti/nn/flat_plan.h"
#include "tutti/nn/transformer.h"
#include "tutti/train/memory_plan.h"

namespace tutti::train {

namespace {

// The root's parameters (`all`, named by their dotted paths) by their owner's path, in
// registration order, and by address.
struct ParameterIndex {
  std::map<std::string, std::vector<std::size_t>> by_owner;
  std::map<const nn::Parameter*, std::size_t> by_address;
  explicit ParameterIndex(const std::vector<nn::Parameter*>& all) {
    for (std::size_t i = 0; i < all.size(); ++i) {
      const std::string& name = all[i]->name;
      const std::size_t dot = name.rfind('.');
      by_address[all[i]] = i;
      if (all[i]->requires_grad) by_owner[dot == std::string::npos ? "" : name.substr(0, dot)].push_back(i);
    }
  }
};

// One backward pass's gradient placements and reports as tutti's layers make them: the layers
// from the last, each placing its own parameters' gradients in registration order, then
// reporting them ready in reverse (Linear: weight, bias placed; bias, weight ready); a tied layer
// (nn::TiedLinear) places its share of its owner's weight's gradient, which the owner reports. A
// module's own parameters are those of the root's list whose path is the module's `path` and a
// name: asking a child for its parameters() would rename them.
void add_backward_events(const nn::Module& module, const std::string& path, const std::vector<nn::Parameter*>& all,
                         const ParameterIndex& index, std::vector<ddp::GradientEvent>& order) {
  const auto& children = module.children();
  for (auto child = children.rbegin(); child != children.rend(); ++child)
    add_backward_events(*child->second, path.empty() ? child->first : path + "." + child->first, all, index, order);
  if (const auto* tied = dynamic_cast<const nn::TiedLinear*>(&module)) {
    const auto i = index.by_address.find(&tied->weight());
    if (i != index.by_address.end() && all[i->second]->requires_grad) order.push_back({false, i->second});
  }
  const auto own = index.by_owner.find(path);
  if (own == index.by_owner.end()) return;
  for (const std::size_t i : own->second) order.push_back({false, i});
  for (auto i = own->second.rbegin(); i != own->second.rend(); ++i) order.push_back({true, *i});
}

}  // namespace

std::vector<ddp::GradientEvent> detail::backward_events(const nn::Module& model,
                                                        const std::vector<nn::Parameter*>& params) {
  std::vector<ddp::GradientEvent> order;
  add_backward_events(model, "", params, ParameterIndex(params), order);
  return order;
}

MemoryPlan memory_plan(nn::Module& model, const Shape& sample, const PlanOptions& o) {
  TUTTI_CHECK_ARG(o.world_size >= 1 && o.zero_stage >= 0 && o.zero_stage <= 3 && o.micro_batch >= 1,
                  "memory_plan: world_size ", o.world_size, " (>= 1), zero_stage ", o.zero_stage,
                  " (0-3) and micro_batch ", o.micro_batch, " (>= 1) are out of range");
  TUTTI_CHECK_ARG(o.tensor_parallel == 1 && !o.sequence_parallel && o.recompute.mode == models::Recompute::Mode::none &&
                      !o.evaluation && !o.state_dict && o.checkpoint == PlanOptions::Checkpoint::none,
                  "memory_plan of a module: tensor parallelism, recomputation, evaluation, state dicts and "
                  "checkpoints are planned for models::Gpt and models::Llama only");
  const std::vector<nn::Parameter*> params = model.parameters();
  const ddp::MemoryPrediction held =
      detail::predict_ddp(nn::plan_params(params), detail::backward_events(model, params), {}, "", o);

  MemoryPlan m;
  for (const nn::Parameter* p : params) m.parameters += p->numel();
  m.flat_total = held.plan.total;
  m.shard = held.sharded ? held.plan.shard_numel : held.plan.total;
  m.buckets = static_cast<int>(held.plan.buckets.size());
  auto row = [&](std::string name, std::int64_t bytes, std::string detail) {
    m.rows.push_back({std::move(name), bytes, std::move(detail)});
  };
  for (const ddp::MemoryLine& line : held.lines) row(line.name, line.bytes, line.detail);
  Shape input{o.micro_batch};
  input.insert(input.end(), sample.begin(), sample.end());
  // The inputs and labels; and either the input cast to a half compute dtype (Module::forward's
  // slot -1 of the model), or in f32 the last step's inputs, which the first layer holds (its
  // saved input) until this step's forward.
  const std::int64_t inputs = numel_of(input);
  row("batch", o.batch_on_device ? inputs * 4 + o.micro_batch * 8 + inputs * detail::bytes_of(o.compute) : 0,
      "inputs " + shape_str(input) + " f32 and labels [" + std::to_string(o.micro_batch) + "] i64, + " +
          (o.compute == DType::f32 ? "the last step's inputs, which the first layer holds until this forward"
                                   : "the inputs cast to " + std::string(name_of(o.compute))));
  Shape out;
  const std::int64_t act = model.buffer_bytes(input, o.compute, out);
  row("activations", act,
      "every layer's buffers, as the layers state them (Module::buffer_bytes): " + detail::human(act));
  row("recompute workspace", 0, "no recomputation");
  row("logits", numel_of(out) * detail::bytes_of(o.compute),
      "the loss's gradient of the output " + shape_str(out) + " " + std::string(name_of(o.compute)));
  row("workspace", 16, "scalars: the loss, the reducer's flag, the gradient norm");
  return m;
}

}  // namespace tutti::train
