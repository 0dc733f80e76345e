// What DistributedDataParallel will hold on each rank, predicted before it is made, from the
// model's parameter list alone (no storage): the memory planner (train/memory_plan.h) adds the
// model's own rows (activations, logits, workspaces) to these.
//
// Each part states the bytes it allocates beside the code that allocates them: the sharding
// strategies their parameters, masters, gathered groups and optimizer spans
// (src/ddp/replicate.cc, zero.cc, zero3_strategy.cc), the reducer its gradient buffer, staging
// and ZeRO-2's pool (Reducer::pool_buffers), the deterministic mode its exact sum. The plan is
// made by the function DistributedDataParallel's constructor uses. Once the DDP exists,
// DistributedDataParallel::memory() measures the same components (tests/ddp/memory_test.cc holds
// the two equal, byte for byte). Not predicted: a communication hook's own buffers (PowerSGD's
// factors), registered later.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tutti/core/dtype.h"
#include "tutti/ddp/ddp.h"
#include "tutti/nn/flat_plan.h"

namespace tutti::ddp {

struct MemoryInputs {
  std::vector<nn::PlanParam> params;  // the model's, in registration order (what its plan cuts)
  int world_size = 1;                 // the data-parallel ranks
  DType compute = DType::f32;         // the parameters' compute dtype: half keeps f32 masters beside
  DType grad = DType::f32;            // the gradients' dtype (Module::grad_dtype)
  DType grad_comm = DType::f32;       // on the wire (ReducerOptions::grad_comm_dtype, resolved)
  int optimizer_states = 2;           // f32 values per element the attached optimizer keeps (AdamW: 2)
  // ShardGradients and ShardParameters: one backward pass's gradient placements and reports, in
  // order (the pool's size follows from it: Reducer::pool_buffers); empty: none yet (0 buffers).
  std::vector<GradientEvent> backward_order;
  // ShardParameters: what the resident group holds, in words, for its line ("the embeddings").
  std::string resident;
};

// One component: its bytes on each rank and how they come about ("2 x f32 (shard 421,120 of
// 842,496)").
struct MemoryLine {
  std::string name;
  std::int64_t bytes = 0;
  std::string detail;
};

struct MemoryPrediction {
  nn::FlatPlan plan;  // the plan DistributedDataParallel will make
  DdpMemory bytes;    // by component, as memory() measures them once the optimizer is attached
  // The same bytes as lines, in this order: parameters, master weights, gathered parameters,
  // gradients, optimizer state, communication buffers.
  std::vector<MemoryLine> lines;
  // Whether DdpState::model_state_dict gathers the f32 values whole on the device (sharded fp32
  // masters: half compute under ZeRO, and ZeRO-3), and optimizer_state_dict the optimizer's
  // state (sharded, on more than one rank).
  bool gathers_values = false;
  bool gathers_optimizer_state = false;
  bool sharded = false;  // DistributedDataParallel::sharded(): each rank keeps a shard of the state
};

// The prediction for a model of `inputs.params` under `options` (its sharding, bucket caps and
// deterministic mode; options.reducer.grad_comm_dtype, when set, overrides inputs.grad_comm).
// InvalidArgument for what the constructor would refuse in the plan (ShardParameters with a
// frozen parameter).
MemoryPrediction predict_memory(const DdpOptions& options, const MemoryInputs& inputs);

}  // namespace tutti::ddp
