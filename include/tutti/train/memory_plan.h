// How many bytes one rank's device holds to train a models::Gpt or models::Llama, predicted without
// building it: what train_gpt --plan prints (docs/gpt.md, "Planning memory"); and for any model of
// tutti's layers whose layers state their buffers (Module::buffer_bytes), such as an MLP or a CNN.
//
// doc-test: wrap-main
//   tutti::train::PlanOptions o{.world_size = 8, .zero_stage = 1, .compute = tutti::DType::bf16,
//                                .grad_comm = tutti::DType::bf16, .micro_batch = 16};
//   o.recompute = tutti::models::Recompute::parse("blocks");
//   const auto config = tutti::models::GptConfig::preset("gpt2-1558m");
//   const tutti::train::MemoryPlan plan = tutti::train::memory_plan(config, o);
//   plan.total();  // bytes at the peak of a training step on each rank
//
// The figures are the sizes of the tensors tutti allocates (Storage: what Storage::peak_bytes
// counts), derived from the code that allocates them: the flat plan of DistributedDataParallel
// (nn::make_flat_plan with the same options), the reducer's buffers and ZeRO-2's bucket pool,
// ZeRO-3's shards, gather buffers and resident group,
// the optimizer's flat state, and each layer's reusable buffers (Module::buffer) and the
// recompute workspace. Not counted: the CUDA context, cuBLAS's and the collectives' own
// workspaces, host memory, and the allocator's rounding; a GPU needs that margin on top.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tutti/core/dtype.h"
#include "tutti/models/gpt.h"
#include "tutti/models/llama.h"

namespace tutti::train {

// What is trained, and how: the options of DistributedDataParallel, the precision policy and
// the optimizer that train_gpt takes from its flags.
struct PlanOptions {
  int world_size = 1;  // ranks (>= 1)
  // Ranks per tensor-parallel group (train_gpt --tp): each holds its heads', MLP features' and
  // vocabulary's slices, so 1/tp of the logits (models::Gpt(config, group), models::Llama(config,
  // group)); DistributedDataParallel
  // runs over world_size / tensor_parallel ranks; the rows "state dict" and "checkpoint" count
  // the whole tensors gathered over the group too (parallel::whole_state_dict; a checkpoint's
  // gathers the optimizer's state as well, train::State::tensor_parallel).
  int tensor_parallel = 1;
  // TensorParallelOptions::sequence_parallel (the norms' and the residual stream's rows 1/tp
  // where the micro-batch's rows divide, and the split layers' two shared whole-batch buffers);
  // InvalidArgument at tensor_parallel 1.
  bool sequence_parallel = false;
  int zero_stage = 0;            // ddp::sharding_of_stage: 0, 1, 2 or 3 (with the model's gather groups)
  DType compute = DType::f32;    // amp::Policy::compute: activations and compute copies
  DType grad = DType::f32;       // amp::Policy::grad: the gradient buffers
  DType grad_comm = DType::f32;  // amp::Policy::comm: what the reducer sends
  models::Recompute recompute;   // CausalLm::set_recompute's policy
  std::int64_t micro_batch = 1;  // sequences per rank per micro-batch (B)
  std::int64_t seq_len = 0;      // tokens per sequence (T); 0: the context
  enum class Optimizer : std::uint8_t { adamw, sgd, sgd_momentum } optimizer = Optimizer::adamw;
  double bucket_cap_mb = 25.0;       // DdpOptions::bucket_cap_mb
  double first_bucket_cap_mb = 1.0;  // DdpOptions::first_bucket_cap_mb
  bool deterministic = false;        // DdpOptions::deterministic (its exact-sum accumulator)
  bool batch_on_device = true;       // count the micro-batch's tokens and targets ([B, T] i32 each)
  // On a GPU: also count the CUDA kernels' own transient memory, which Storage does not track
  // (attention's stream-ordered scratch: kernels::flash_attention_gpu_scratch_bytes, or with the
  // materialized kernel (7·B·T·C + B·heads·T²) compute elements; and cuBLASLt's workspace, counted at
  // its 32 MiB bound: what the algorithm cuBLASLt picks asks for, often none),
  // as the row "GPU kernel scratch".
  bool gpu = false;
  // Between steps (not during one): a separate loss evaluates micro-batches of micro_batch
  // sequences (train_gpt's validation): its logits gradient, the targets (the inputs take the
  // training batch's place in the embedding) and a few scalars, as the row "evaluation".
  bool evaluation = false;
  // Between steps: DdpState::model_state_dict (train_gpt's final checksum), which
  // with ZeRO 1-2 in half precision, and at ZeRO-3, gathers the f32 values whole on the device
  // for a moment (on the CPU, where host memory is the device's, every stage holds the f32 values
  // whole: a copy, or the gather itself), as the row "state dict".
  bool state_dict = false;
  // The device is the CPU: host memory is the device's, so the host copies of state dicts and
  // checkpoints count (Storage::peak_bytes(Device::cpu()) sees them).
  bool cpu = false;
  // Checkpoints (train::Run, io::CheckpointWriter in this mode), as the row "checkpoint". With
  // ZeRO the state is gathered whole, one f32 vector at a time on a GPU, all of it (the values and
  // the optimizer's state) on the CPU until its write ends. On the CPU at stage 0 an async writer
  // copies the state into buffers it keeps from the first checkpoint on (a row counted on top of
  // every later step); a sync one writes the live tensors.
  enum class Checkpoint : std::uint8_t { none, sync, async } checkpoint = Checkpoint::none;
};

// One line of the plan: a name ("optimizer state"), its bytes on each rank, and how they
// come about ("2 x 4 B x 421,120 (shard of 842,496)").
struct MemoryRow {
  std::string name;
  std::int64_t bytes = 0;
  std::string detail;
  bool between_steps = false;  // held between steps, on top of what a step keeps (see total())
  bool kept = false;           // between steps, and kept from then on (a checkpoint writer's buffers)
};

struct MemoryPlan {
  // In this order, each present even when 0 bytes: parameters, master weights, gathered
  // parameters (ZeRO-3's two gather buffers and resident group), gradients,
  // optimizer state, communication buffers, batch, activations (the layers' buffers kept
  // between forward and backward and their gradients, all layers), recompute workspace,
  // logits (the head's logits, the loss's gradient of them and the head's input gradient),
  // workspace (scalars: the loss, norms, flags), and with PlanOptions::gpu the GPU kernel
  // scratch (the only row Storage::peak_bytes does not see); then the between-step rows of
  // PlanOptions::evaluation, state_dict and checkpoint.
  std::vector<MemoryRow> rows;
  // Activations of one layer (attention and MLP blocks) as kept with and without this plan's
  // recomputation, for the table (bytes for the micro-batch; the checkpointed figure is the
  // layer's when both its blocks recompute).
  std::int64_t layer_bytes_kept = 0;
  std::int64_t layer_bytes_checkpointed = 0;
  std::int64_t parameters = 0;  // models::GptConfig::parameter_count()
  std::int64_t flat_total = 0;  // elements of the flat plan, padding included
  std::int64_t shard = 0;       // elements of one rank's shard (flat_total without ZeRO)
  int buckets = 0;              // the flat plan's buckets
  // Bytes of the recompute workspace row that only the first step holds (superseded buffers).
  std::int64_t first_step_extra = 0;

  // Sum of the step's rows: every tensor alive at the peak of a training step (after the first
  // forward and backward nothing the step allocates is freed: the step reuses the buffers).
  std::int64_t step_total() const;
  // The peak: step_total(), or after the first step (step_total() - first_step_extra) plus the
  // kept rows and the largest other between-step row, whichever is more.
  std::int64_t total() const;
  // The bytes of the row named `name`; 0 when there is none.
  std::int64_t bytes(const std::string& name) const;
  // A table: one row per line, bytes in MiB/GiB, the detail, and the total.
  std::string str() const;
};

// The plan of `config` trained with `options`. Throws InvalidArgument for options DDP or the
// model would refuse (zero_stage outside 0-3, world_size < 1, micro_batch < 1, seq_len beyond
// the context, every:K with K > layers, a gradient dtype other than f32 or the compute dtype).
// The Llama's ZeRO-3 groups are Llama::gather_groups(config)'s.
MemoryPlan memory_plan(const models::GptConfig& config, const PlanOptions& options);
MemoryPlan memory_plan(const models::LlamaConfig& config, const PlanOptions& options);

// The plan of any model of tutti's layers (a Sequential MLP or CNN: each layer states its
// buffers, Module::buffer_bytes; InvalidArgument names one that does not) trained with
// `options` on samples of shape `sample` (an input without the batch dimension: {784},
// {1, 28, 28}) and a softmax cross-entropy over its output: DDP's part, the batch (f32 inputs,
// i64 labels, and the inputs cast to a half compute dtype, or in f32 the last step's, which the
// first layer holds until the next forward), the layers' buffers, the loss's gradient. Not
// counted: a GPU's stream-ordered kernel scratch (PlanOptions::gpu is not used here). micro_batch is in samples;
// seq_len, recompute, tensor_parallel, evaluation, state_dict and checkpoint are the decoders' only (InvalidArgument
// when set). ZeRO-3's gather groups are ShardParameters' default.
MemoryPlan memory_plan(nn::Module& model, const Shape& sample, const PlanOptions& options);

// The largest micro_batch (per rank) whose plan fits in `device_bytes`, searched up to `limit`
// sequences; 0 when not even one fits.
std::int64_t largest_micro_batch(const models::GptConfig& config, PlanOptions options, std::int64_t device_bytes,
                                 std::int64_t limit = 1 << 16);
std::int64_t largest_micro_batch(const models::LlamaConfig& config, PlanOptions options, std::int64_t device_bytes,
                                 std::int64_t limit = 1 << 16);

// What to change when `options` does not fit `device_bytes`: each of a smaller micro-batch,
// recomputation (blocks), the next ZeRO stage and twice the ranks, then all of them at once at
// this many ranks, with the total each would give and whether that fits; "" when the plan fits.
// One sentence per line, for a person.
std::string fit_advice(const models::GptConfig& config, const PlanOptions& options, std::int64_t device_bytes);
std::string fit_advice(const models::LlamaConfig& config, const PlanOptions& options, std::int64_t device_bytes);

// "141GB", "80 GiB", "512MiB", "1.5TB" or plain bytes -> bytes (GB and TB are powers of 10,
// GiB and TiB of 2). InvalidArgument otherwise.
std::int64_t parse_bytes(const std::string& text);

}  // namespace tutti::train
