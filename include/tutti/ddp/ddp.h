// DistributedDataParallel: N ranks train like one rank with N times the batch.
//
// It wraps a model and a communicator. At construction (COLLECTIVE) it checks that every rank
// has the same model (names, shapes, dtypes, in order; a difference fails on every rank with a
// message naming it), lays the gradients out in buckets (see reducer.h), makes every
// parameter's gradient a view into them and its fp32 value a view into a flat buffer of the
// same layout (so the optimizer updates the whole model in one fused call), and broadcasts
// the parameters and the layers' state (Dropout's random-number position) from rank 0; a
// parameter that rank 0 never initialized is an error on every rank. It also tells the model
// that this rank holds slice `rank` of `world size` of each global batch
// (Module::set_batch_slice), so that Dropout masks each sample as one rank with the whole
// batch would.
//
// A training step with k micro-batches per step and a loss scaler:
//
//   for (int micro = 0; micro < k; ++micro) {
//     const Tensor& logits = ddp.forward(x[micro]);
//     loss.forward(logits, y[micro], scaler.scale());
//     if (ddp.backward(loss.grad(), scaler.scale())) {    // true on the k-th micro-batch
//       if (scaler.update(ddp.found_nonfinite())) optimizer.step();  // the step's one host sync
//       ddp.zero_grad();
//     }
//   }
//
// The first k-1 backward passes accumulate gradients locally and communicate nothing; the
// k-th launches each bucket's allreduce as soon as its gradients are written, then waits
// for all and divides by (world size · k · loss scale) in one fused pass that also checks
// for inf/nan — after the reduction, so every rank sees the same flag and skips alike.
#pragma once

#include <memory>
#include <optional>

#include "tutti/comm/communicator.h"
#include "tutti/ddp/reducer.h"
#include "tutti/nn/module.h"

namespace tutti::ddp {

struct DdpOptions {
  double bucket_cap_mb = 25.0;        // see ReducerOptions
  double first_bucket_cap_mb = 1.0;
  int accumulation_steps = 1;         // micro-batches per optimizer step
  // f32, bf16 or f16 on the wire. Unset: the model's grad_comm_dtype(), which amp::apply sets
  // from the policy (bf16 for Policy::bf16()) and is f32 otherwise. After construction,
  // options() holds the dtype in use.
  std::optional<DType> grad_comm_dtype;
  bool average = true;                // average (true) or sum (false) over ranks
  bool overlap = true;                // false: all communication after backward
  bool allow_unused_parameters = false;  // a parameter without gradient: error (false) or zero
  bool broadcast_parameters = true;   // rank 0's values everywhere at construction
  bool verify_model = true;           // the start-up check that every rank has the same model
};

class DistributedDataParallel {
 public:
  // COLLECTIVE. The model must be on its device with its precision set (to(),
  // set_precision()) and initialized on rank 0 at least (else InvalidArgument on every rank,
  // naming the parameter); the communicator must serve that device. Keeps references to
  // both: they must outlive this object, which leaves the model's batch slice at (0, 1)
  // when it goes.
  DistributedDataParallel(Communicator& comm, nn::Module& model, DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // The model's forward (not collective, no communication).
  Tensor forward(const Tensor& x) { return model_.forward(x); }
  // Backward of one micro-batch. On the last micro-batch of a step it is COLLECTIVE: it
  // reduces the gradients across ranks (overlapped with backward), waits for them and
  // divides by (world size · accumulation steps · loss_scale), and returns true: the
  // gradients are ready for the optimizer. Otherwise it accumulates locally and returns false.
  // loss_scale: the factor the loss gradient was multiplied by (LossScaler::scale()).
  // Throws InvalidArgument, before any communication, when the model ran no forward since
  // its last backward (Module::backward).
  bool backward(const Tensor& dy, double loss_scale = 1.0);
  // Whether the next backward completes a step (communicates).
  bool next_backward_syncs() const { return micro_step_ + 1 == options_.accumulation_steps; }
  // After a backward that returned true: whether any reduced gradient holds inf or nan (the
  // same answer on every rank). Reads a flag from the device: the step's one host sync.
  bool found_nonfinite();
  // The flag itself (i32 [1] on the device), for callers that read it later.
  const Tensor& found_nonfinite_flag() const { return reducer_->found_nonfinite_flag(); }
  // Zeroes all gradients (one memset of the bucket buffer).
  void zero_grad();

  nn::Module& module() { return model_; }
  Reducer& reducer() { return *reducer_; }
  const DdpOptions& options() const { return options_; }
  // Statistics of the last synchronized step.
  const StepStats& last_stats() const { return reducer_->last_stats(); }

 private:
  void verify_same_model();
  void broadcast_parameters();

  Communicator& comm_;
  nn::Module& model_;
  DdpOptions options_;
  std::unique_ptr<Reducer> reducer_;
  int micro_step_ = 0;
};

}  // namespace tutti::ddp
