// What train::memory_plan needs to know of a decoder-only model to predict its bytes, asked of the
// model itself (gpt_layout, llama_layout in decoder_layout.cc: a model built for the plan, its
// parameters deferred) and read by one planner (memory_plan.cc): the parameters as the model
// registers them (what its flat plan cuts), the order in which backward places and reports their
// gradients (ZeRO-2's bucket pool), and the reusable buffers (Module::buffer) of one attention body
// and one MLP body, by (position in the body, slot), as the layers state them
// (Module::buffer_statements). Internal to src/train.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tutti/ddp/memory.h"
#include "tutti/ddp/reducer.h"
#include "tutti/nn/flat_plan.h"
#include "tutti/train/memory_plan.h"

namespace tutti::train::detail {

// One Module::buffer of a residual block's body.
struct BodyBuffer {
  int position;  // the layer's index in the body
  int slot;      // Module::buffer's slot
  std::int64_t bytes;
  bool forward;  // allocated by the forward pass (else by backward)
  bool held;     // a module of the body keeps a handle on it from forward to backward (its input, a
                 // saved statistic): a larger buffer in its slot cannot free it before then
};

struct Body {
  std::vector<BodyBuffer> buffers;
  std::int64_t bytes() const;
  // The bytes this body needs in (position, slot); 0 when it has none there.
  std::int64_t at(int position, int slot) const;
};

// One step of backward as the flat plan's gradients see it: a parameter's gradient is placed
// (grad_of) or reported ready (grad_ready), by index in `params` (the reducer's own type).
using GradEvent = ddp::GradientEvent;

struct DecoderLayout {
  std::string fingerprint;
  std::int64_t parameters = 0;  // the model's parameter_count()
  std::int64_t layers = 0;
  std::vector<nn::PlanParam> params;  // registration order
  std::vector<bool> split;            // per parameter: split over the tensor-parallel group (all false at tp 1)
  std::function<std::string(const std::string&)> gather_group;  // ZeRO-3's groups
  std::string resident;                                         // what the resident group holds, in words
  std::vector<GradEvent> backward_order;                        // one step's placements and reports
  Body attention, mlp;                                          // one layer's two bodies
  std::int64_t residual_bytes = 0;                              // each residual block's own buffers (y, dx)
  std::int64_t outside_bytes = 0;  // the layers' buffers outside the blocks (embedding, final norm)
  std::string outside_detail;
  std::int64_t sequence_bytes = 0;  // sequence parallelism's shared whole-batch buffers (0 without)
  std::string sequence_detail;
  std::int64_t logits_bytes = 0;  // the head's logits, the loss's gradient of them, the head's input gradient
  std::string logits_detail;
  std::int64_t eval_bytes = 0;   // evaluation between steps (logits gradient of its own loss, targets)
  std::int64_t gpu_scratch = 0;  // the largest stream-ordered scratch of a step's kernels (attention's)
  std::string gpu_scratch_detail;
};

// Asked of a model built for the plan (decoder_layout.cc).
DecoderLayout gpt_layout(const models::GptConfig& config, const PlanOptions& options);
DecoderLayout llama_layout(const models::LlamaConfig& config, const PlanOptions& options);

// One backward pass's gradient placements and reports for `model` whose parameters() are
// `params`, as tutti's layers make them (module_plan.cc).
std::vector<GradEvent> backward_events(const nn::Module& model, const std::vector<nn::Parameter*>& params);

// The plan of a layout (memory_plan's work once the model is described).
MemoryPlan plan_decoder(const DecoderLayout& layout, const PlanOptions& options);

// What every plan shares (memory_plan.cc), the decoders' and any module's (module_plan.cc):
// DistributedDataParallel's part, stated by each of its parts (ddp/memory.h), for `params` (their
// backward order and ZeRO-3's groups as given) trained with `options` over its data-parallel
// ranks, after checking the precision's dtypes (InvalidArgument); the optimizer's f32 values per
// element; the table's unit ("0.12 MiB"); a dtype's bytes.
ddp::MemoryPrediction predict_ddp(std::vector<nn::PlanParam> params, std::vector<GradEvent> backward_order,
                                  std::function<std::string(const std::string&)> gather_group, std::string resident,
                                  const PlanOptions& options);
int optimizer_states(const PlanOptions& options);
std::string human(std::int64_t bytes);
std::int64_t bytes_of(DType dtype);

// largest_micro_batch and fit_advice over any model: `plan` gives the plan of some options.
std::int64_t largest_micro_batch(const std::function<MemoryPlan(const PlanOptions&)>& plan, PlanOptions options,
                                 std::int64_t device_bytes, std::int64_t limit);
std::string fit_advice(const std::function<MemoryPlan(const PlanOptions&)>& plan, const PlanOptions& options,
                       std::int64_t device_bytes);

}  // namespace tutti::train::detail
