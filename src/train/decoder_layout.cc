// The layouts memory_plan reads (plan_layout.h), asked of the model itself: a Gpt or Llama built
// for the plan's tensor-parallel rank (its parameters deferred: nothing allocated; its group a
// stand-in that issues nothing), whose layers state their own buffers (Module::buffer_statements)
// beside the code that allocates them, as do the loss (CrossEntropyLoss::buffer_bytes), the
// sequence-parallel split (SequenceParallel::planned_workspace_bytes) and the attention's GPU
// kernels (CausalSelfAttention::gpu_scratch_bytes). Nothing here restates a layer's buffers.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "train/plan_layout.h"
#include "tutti/comm/communicator.h"
#include "tutti/models/gpt.h"
#include "tutti/models/llama.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/loss.h"
#include "tutti/nn/parameter.h"
#include "tutti/nn/sequential.h"
#include "tutti/nn/transformer.h"
#include "tutti/parallel/sequence_parallel.h"

namespace tutti::train::detail {

std::int64_t bytes_of(DType d) { return static_cast<std::int64_t>(size_of(d)); }

std::int64_t Body::bytes() const {
  std::int64_t n = 0;
  for (const BodyBuffer& b : buffers) n += b.bytes;
  return n;
}

std::int64_t Body::at(int position, int slot) const {
  for (const BodyBuffer& b : buffers) {
    if (b.position == position && b.slot == slot) return b.bytes;
  }
  return 0;
}

namespace {

using nn::BufferStatement;

// The tensor-parallel group of a model built only to be asked: rank 0 of `size` ranks (every rank
// of a group holds the same shapes). Any collective throws BackendError (the default of
// Communicator's do_* methods): building a model issues none.
class PlanningGroup final : public Communicator {
 public:
  explicit PlanningGroup(int size) : Communicator(0, size, CommOptions{}) {}
  std::string_view backend() const override { return "plan"; }
};

std::int64_t sum(const std::vector<BufferStatement>& statements) {
  std::int64_t n = 0;
  for (const BufferStatement& s : statements) n += s.bytes;
  return n;
}

// The buffers of a residual block's body fed `shape`, by (position, slot); held where a module of
// the body keeps a handle on them from forward to backward: the layer's own saved ones, and an
// output that the next layer takes as its input (every layer keeps its input). Also the largest
// GPU scratch of its attention.
Body body_of(const nn::Residual& block, Shape shape, DType compute, std::int64_t& gpu_scratch,
             nn::AttentionKernel& kernel) {
  Body body;
  const nn::Sequential& layers = block.body();
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const nn::Module& layer = layers[i];
    Shape out;
    for (const BufferStatement& s : layer.buffer_statements(shape, compute, out)) {
      const bool forward = s.kind != BufferStatement::Kind::backward;
      const bool held =
          s.kind == BufferStatement::Kind::saved || (s.kind == BufferStatement::Kind::output && i + 1 < layers.size());
      body.buffers.push_back({static_cast<int>(i), s.slot, s.bytes, forward, held});
    }
    if (const auto* attention = dynamic_cast<const nn::CausalSelfAttention*>(&layer)) {
      gpu_scratch = std::max(gpu_scratch, attention->gpu_scratch_bytes(shape, compute));
      kernel = attention->options().kernel;
    }
    shape = std::move(out);
  }
  return body;
}

// kernels/cuda/linear.cu's bound per stream: its workspace is what cuBLASLt's chosen algorithm
// asks for, at most this.
constexpr std::int64_t kCublasLtWorkspace = 32 << 20;

// The layout of `model` (a decoder: embed, blocks of alternating attention and MLP residuals,
// the final norm, the head) trained with `o`.
DecoderLayout layout_of(models::CausalLm& model, std::int64_t parameters, const PlanOptions& o) {
  model.set_precision(o.compute, o.grad);
  const std::int64_t T = o.seq_len, B = o.micro_batch, N = B * T, tp = o.tensor_parallel;
  // As a forward of [B, T] tokens decides (the embeddings call begin): whether the rows split.
  parallel::SequenceParallel* const sequence = model.sequence_parallel();
  if (sequence != nullptr) sequence->begin(B, T);
  DecoderLayout d;
  d.fingerprint = model.fingerprint();
  d.parameters = parameters;
  d.layers = model.layers();
  // The parameters as the model registers them; split: those with a slice of a whole tensor.
  const std::vector<nn::Parameter*> params = model.parameters();
  d.params = nn::plan_params(params);
  for (const nn::Parameter* p : params) d.split.push_back(!p->init_slice.full.empty());
  d.backward_order = backward_events(model, params);

  // The layers in forward order, each fed the previous one's output shape.
  Shape shape{B, T};
  nn::AttentionKernel kernel = nn::AttentionKernel::flash;
  std::int64_t attention_scratch = 0, width = 0;
  for (const auto& [name, child] : model.children()) {
    Shape out;
    if (name == "blocks") {
      const auto& blocks = dynamic_cast<const nn::Sequential&>(*child);
      TUTTI_CHECK(blocks.size() == static_cast<std::size_t>(2 * d.layers) && blocks.size() >= 2,
                  "memory_plan: ", d.fingerprint, " has ", blocks.size(), " residual blocks for ", d.layers, " layers");
      const auto& attention = dynamic_cast<const nn::Residual&>(blocks[0]);
      const auto& mlp = dynamic_cast<const nn::Residual&>(blocks[1]);
      d.attention = body_of(attention, shape, o.compute, attention_scratch, kernel);
      d.mlp = body_of(mlp, shape, o.compute, attention_scratch, kernel);
      d.residual_bytes = sum(attention.buffer_statements(shape, o.compute, out));
      width = shape.back();  // the residual stream's
    } else if (name == "head") {
      // The logits, the head's input gradient, and the loss's gradient of the logits (with its row
      // statistics where the vocabulary is split); an evaluation's loss between steps, + targets.
      const std::int64_t head = sum(child->buffer_statements(shape, o.compute, out));
      const std::int64_t loss = model.make_loss()->buffer_bytes(out, o.compute);
      d.logits_bytes = head + loss;
      d.logits_detail = shape_str(out) + " " + std::string(name_of(o.compute)) +
                        " and the loss's gradient of them, + the head's input gradient";
      if (tp > 1) d.logits_detail += " (the vocabulary's 1/" + std::to_string(tp) + ")";
      d.eval_bytes = loss + N * 4 + 16;
    } else {
      d.outside_bytes += sum(child->buffer_statements(shape, o.compute, out));
      d.outside_detail += (d.outside_detail.empty() ? "the buffers of " : " and ") + name;
    }
    shape = std::move(out);
  }
  const std::int64_t shared = model.shared_buffer_bytes(T);
  d.outside_bytes += shared;
  if (shared) d.outside_detail += ", + the table the layers share";
  if (sequence != nullptr && sequence->active()) {
    d.sequence_bytes = sequence->planned_workspace_bytes(width, o.compute);
    d.sequence_detail = "2 x [" + std::to_string(N) + ", " + std::to_string(width) +
                        "]: the gathered rows and the partial sums, shared by the split layers";
  }
  d.gpu_scratch = attention_scratch + kCublasLtWorkspace;
  d.gpu_scratch_detail = std::string(kernel == nn::AttentionKernel::materialized
                                         ? "attention backward's scratch (q, k, v, dy, dq, dk, dv and the T x T dP)"
                                         : "tiled attention's scratch (head-major q, k, v, dy, dq and one tile of "
                                           "scores)") +
                         " + cuBLASLt's workspace (not in Storage's count)";
  return d;
}

// The model for the plan: built under DeferredParameters (nothing allocated), split over a
// stand-in group of tensor_parallel ranks where there are several.
template <typename Model, typename Config>
std::unique_ptr<Model> build(const Config& config, const PlanOptions& o, std::unique_ptr<PlanningGroup>& group) {
  nn::DeferredParameters defer;
  if (o.tensor_parallel == 1) return std::make_unique<Model>(config);
  group = std::make_unique<PlanningGroup>(static_cast<int>(o.tensor_parallel));
  return std::make_unique<Model>(config, *group,
                                 models::TensorParallelOptions{.sequence_parallel = o.sequence_parallel});
}

}  // namespace

DecoderLayout gpt_layout(const models::GptConfig& config, const PlanOptions& o) {
  std::unique_ptr<PlanningGroup> group;
  const std::unique_ptr<models::Gpt> model = build<models::Gpt>(config, o, group);
  DecoderLayout d = layout_of(*model, config.parameter_count(), o);
  d.gather_group = models::CausalLm::gather_group;
  d.resident = "embeddings, ln_f";
  return d;
}

DecoderLayout llama_layout(const models::LlamaConfig& config, const PlanOptions& o) {
  std::unique_ptr<PlanningGroup> group;
  const std::unique_ptr<models::Llama> model = build<models::Llama>(config, o, group);
  DecoderLayout d = layout_of(*model, config.parameter_count(), o);
  d.gather_group = models::Llama::gather_groups(config);
  d.resident = config.tied_head ? "the embedding (the tied head's weight), the final norm" : "the final norm";
  return d;
}

}  // namespace tutti::train::detail
