// How the data-parallel ranks divide the training state among them (DdpOptions::sharding): a
// value, chosen like any other option. ZeRO's stages, as DeepSpeed numbers them; bytes per
// parameter with AdamW, N ranks, half compute and half gradients:
//
//   Replicate        stage 0   16       every rank keeps everything; gradients are allreduced
//   ShardOptimizer   stage 1   4 + 12/N the optimizer's state and fp32 masters by shard
//   ShardGradients   stage 2   2 + 14/N also the gradients
//   ShardParameters  stage 3   18/N     also the parameters, gathered group by group (plus two
//                                       gather buffers and the resident group)
//
// doc-test: fragment choosing a sharding; the model and the communicator are elided
//   tutti::ddp::DdpOptions options;
//   options.sharding = tutti::ddp::ShardParameters{.gather_group = tutti::models::Gpt::gather_group};
//
// Each value is carried out by one strategy object inside DistributedDataParallel
// (src/ddp/strategy.h), which owns its buffers, its part of the checkpoints and its memory
// figure. ddp.h says what each stage does step by step.
#pragma once

#include <functional>
#include <string>
#include <variant>

namespace tutti::ddp {

// Stage 0: every rank keeps the whole model, gradients and optimizer state.
struct Replicate {};

// Stage 1: gradients are reduce-scattered (each rank gets the averaged gradients of its chunk of
// every bucket); each rank keeps the fp32 masters and the optimizer state of its shard only and
// updates only those; the updated parameters (compute dtype) are all-gathered, bucket by bucket.
struct ShardOptimizer {
  // true: each bucket's all-gather is waited for by the first forward that reads one of its
  // parameters (overlapped with the forward of the layers before it); false: right after the
  // optimizer's step.
  bool gather_during_forward = true;
};

// Stage 2: as ShardOptimizer, and no full-size gradient buffer is kept: backward writes each
// bucket into a small pool, each rank keeps its shard of the gradients. Every micro-step
// communicates, the accumulating ones too.
struct ShardGradients {
  bool gather_during_forward = true;  // as ShardOptimizer's
};

// Stage 3: as ShardGradients, and each rank keeps only its shard of the parameters too. A gather
// group is all-gathered into one of two gather buffers when a layer first reads it and released
// when the group after it is gathered, so at most two groups are whole at a time. Not with
// frozen parameters nor in the deterministic mode (refused at construction).
struct ShardParameters {
  // The gather group of a parameter, by name ("" puts it in the resident group, whole for the
  // whole step). Unset: the name up to its first numeric component ("blocks.3.body.1.w" ->
  // "blocks.3", "0.weight" -> "0"; "embed.wte" -> ""). models::Gpt::gather_group puts a
  // transformer layer's two residual blocks in one group. Consecutive parameters (in
  // registration order) of one group form one bucket of the plan; bucket caps do not apply.
  // A layer that reads another module's parameter (nn::TiedLinear) must read a resident one.
  std::function<std::string(const std::string& name)> gather_group;
  // Each of the two gather buffers' size in MiB of the compute dtype; 0: the largest group's. A
  // group larger than a given size is refused at construction, naming it.
  double gather_buffer_mb = 0;
  // true: when a group is used, the next one (in forward order, reverse order in backward) is
  // gathered into the other buffer while the layer computes; false: each group is gathered when
  // it is first read, and the host waits (less traffic in flight, no overlap).
  bool prefetch = true;
};

using Sharding = std::variant<Replicate, ShardOptimizer, ShardGradients, ShardParameters>;

// The ZeRO stage of a sharding, 0 to 3 (for figures, summaries and the memory planner).
int zero_stage(const Sharding& sharding);
// Stage `stage`'s sharding with its default options, and at stage 3 the gather groups
// `gather_group` (unset: the default; not used at other stages), for command-line flags such as
// --zero N. InvalidArgument, naming the stage, outside 0-3.
Sharding sharding_of_stage(int stage, std::function<std::string(const std::string& name)> gather_group = {});

}  // namespace tutti::ddp
