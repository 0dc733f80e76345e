// The state of a DistributedDataParallel's model and optimizer, whatever its sharding
// (DdpOptions::sharding): ddp.state().
//
// Checkpoints take whole tensors (model_state_dict, optimizer_state_dict: the same names and
// shapes at every sharding and world size, so a checkpoint resumes at any of them); train::Run's
// stage-0 checkpoints take live views instead, and its memory snapshots this rank's parts;
// DiLoCo works on the flat parameter vector. The sharding strategy inside DDP (src/ddp/strategy.h)
// answers each; this object only routes to it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "tutti/core/state_dict.h"
#include "tutti/core/tensor.h"
#include "tutti/optim/optimizer.h"

namespace tutti::ddp {

// A part of a whole state tensor, as one rank holds it: elements [begin, begin + part.numel())
// of the tensor of shape `shape`, flattened in row-major order (train::Run's memory snapshots,
// which every rank writes alone).
struct StatePart {
  Tensor part;  // 1-D, contiguous: a view of a live buffer on its device, or a small CPU tensor
  std::int64_t begin = 0;
  Shape shape;  // the whole tensor's
};
using StateParts = std::map<std::string, StatePart>;

class DistributedDataParallel;

// Handed out by reference (ddp.state()) and owned by its DistributedDataParallel: it lives and
// dies with it.
class DdpState {
 public:
  DdpState(const DdpState&) = delete;
  DdpState& operator=(const DdpState&) = delete;

  // ZeRO: waits until every updated parameter has been gathered (forward does it bucket by
  // bucket by itself; call it before reading parameters outside forward). ZeRO-3: the gathers
  // in flight (the parameters outside the resident group are whole only inside forward and
  // backward).
  void synchronize_parameters();

  // Checkpoints whose layout depends neither on the number of ranks nor on the stage: whole
  // tensors by name, exactly what model.state_dict() and optimizer.state_dict() give at
  // stage 0 on one rank. COLLECTIVE (call on every rank; under ZeRO they gather the shards).
  StateDict model_state_dict();
  StateDict optimizer_state_dict(optim::Optimizer& optimizer);
  // Not collective, no copy: the live tensors behind model_state_dict() and
  // optimizer_state_dict(optimizer), under the same names and shapes: views of the model's
  // fp32 values and of the optimizer's state on the model's device (the layers' extra state and
  // "step" are small CPU tensors). They change with the next step: for a checkpoint, hand them
  // to io::CheckpointWriter::save (with ddp.module().stream()), which copies them into its host
  // buffers, one copy where the *_state_dict functions make one more. Only where this rank
  // holds every whole tensor: Replicate, and for the optimizer, attached; otherwise
  // InvalidArgument (under ZeRO the *_state_dict functions gather the shards).
  StateDict model_state_views();
  StateDict optimizer_state_views(optim::Optimizer& optimizer);
  // Not collective, no copy: this rank's parts of model_state_dict() and of
  // optimizer_state_dict(optimizer), under the same names. Under ZeRO, the elements of its
  // shard (views of the live fp32 values or masters and of the attached optimizer's state; a
  // tensor with no element in the shard is left out) and, whole, the small entries every rank
  // holds (the layers' extra state, "step"): the parts of all ranks of one step hold every
  // element of every tensor once. At stage 0, every tensor whole (begin 0), as the *_views
  // (an optimizer not attached: a copy of its state). They change with the next step: copy
  // them before (on ddp.module().stream()).
  StateParts model_state_parts();
  StateParts optimizer_state_parts(optim::Optimizer& optimizer);
  // Not collective: every rank takes its part of the whole tensors (any stage, any world
  // size wrote them).
  void load_model_state_dict(const StateDict& state);
  void load_optimizer_state_dict(optim::Optimizer& optimizer, const StateDict& state);
  // The model's fp32 parameters, whole, in the plan's flat layout: a new f32
  // [ddp.reducer().plan().total] on the model's device (padding between entries is 0), ordered
  // on the model's stream. COLLECTIVE under ZeRO with a half compute dtype (gathers the masters'
  // shards), else not (a copy of the values). For runtimes above DDP that work on the whole
  // vector (ddp/diloco.h).
  Tensor parameters_flat();
  // Not collective: sets every parameter from `flat` (f32 [ddp.reducer().plan().total], any
  // device), in the plan's layout: the fp32 values (ZeRO with half compute, and ZeRO-3: this
  // rank's master shard) and the compute copies (ZeRO-3: its compute shard and the resident
  // group; the gathered groups are dropped), on the model's stream. The optimizer's state is
  // left as it is.
  void load_parameters_flat(const Tensor& flat);

 private:
  friend class DistributedDataParallel;
  explicit DdpState(DistributedDataParallel& ddp) : ddp_(ddp) {}
  DistributedDataParallel& ddp_;
};

}  // namespace tutti::ddp
