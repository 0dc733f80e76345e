// DistributedDataParallel: N ranks train like one rank with N times the batch, and with a
// sharded state (DdpOptions::sharding, ddp/sharding.h: ZeRO-1, 2 or 3) without N copies of the
// optimizer's (and with ShardParameters, the parameters') memory.
//
// It wraps a model and a communicator. At construction (COLLECTIVE) it checks that every rank
// has the same model (names, shapes, dtypes, in order; a difference fails on every rank with a
// message naming it), computes THE flat plan of the model (nn::make_flat_plan: order, offsets,
// buckets and, under ZeRO, each rank's shard), lays the model's values and gradients out by
// it and gives it to its Reducer, and broadcasts the parameters and the layers' state
// (Dropout's random-number position) from rank 0; a parameter that rank 0 never initialized is
// an error on every rank. It also tells the model that this rank holds slice `rank` of `world
// size` of each global batch (Module::set_batch_slice), so that Dropout masks each sample as
// one rank with the whole batch would.
//
// A training step with k micro-batches per step and a loss scaler:
//
// doc-test: fragment a step; the model, the optimizer, the loss and the batches are elided
//   ddp.attach(optimizer);                                 // once: the optimizer takes the plan
//   for (int micro = 0; micro < k; ++micro) {
//     const Tensor& logits = ddp.forward(x[micro]);
//     loss.forward(logits, y[micro], scaler.scale());
//     if (ddp.backward(loss.grad(), scaler.scale())) {    // true on the k-th micro-batch
//       if (scaler.update(ddp.found_nonfinite())) optimizer.step();  // the step's one host sync
//       ddp.zero_grad();
//     }
//   }
//
// Gradient scaling: who divides by what. (The one place this is said; nn/loss.h and
// amp/loss_scaler.h point here.) A loss (nn::CrossEntropyLoss) gives grad_scale times the
// gradient of the MEAN over its micro-batch's rows. Pass grad_scale = the loss scale
// (LossScaler::scale(); 1 without one) and nothing else, and the same loss scale to backward:
// on the last micro-batch of a step backward divides the summed gradients by
// world size · accumulation_steps · loss_scale, so the optimizer gets the mean over the global
// batch (world size · k micro-batches of equal size), as one rank with the whole batch would
// (tests/ddp/ddp_test.cc, DocumentedScalingWithAccumulationMatchesOneRank). Folding 1/k or
// 1/world into grad_scale divides twice. Without DDP (Module::backward on k micro-batches)
// nothing divides for you: unscale with LossScaler::unscale_and_check(grads, k), or pass
// grad_scale = scale / k.
//
// Sharding (ddp/sharding.h has the values and their options; a strategy object inside carries
// each out, src/ddp/strategy.h):
//   Replicate (ZeRO-0)  every rank keeps everything; gradients are allreduced.
//   ShardOptimizer (1)  gradients are reduce-scattered (each rank gets the averaged gradients of
//      its shard of every bucket), each rank keeps the fp32 master weights and the optimizer
//      state of its shard only and updates only those, and the updated parameters (in the
//      compute dtype) are all-gathered, bucket by bucket, by the next forward as it reaches them.
//   ShardGradients (2)  as 1, and no full-size gradient buffer is kept: backward writes each
//      bucket into a small pool, each rank keeps its shard of the gradients. Every micro-step
//      communicates.
//   ShardParameters (3)  as 2, and each rank keeps only its shard of the parameters too (compute
//      dtype, beside the fp32 master shard under mixed precision): bytes per parameter 18/N with
//      bf16 AdamW, plus two gather buffers and the resident group. Parameters are grouped
//      (ShardParameters::gather_group: by default one group per numbered module, "blocks.3", "0";
//      the plan cuts a bucket per group); a group is all-gathered into one of two gather buffers
//      when a layer first reads it (the param-use hook), the next group in forward order
//      (reverse order in backward) is prefetched into the other buffer, and the group before is
//      released, so at most two groups are whole at a time. Backward gathers again and
//      reduce-scatters each group's gradients as ZeRO-2 does. Parameters outside every group
//      (gather_group ""; by default the names without a number: GPT's embeddings, its tied head
//      and final LayerNorm) form the resident group, whole for the whole step (gathered after
//      each optimizer step). Outside forward and backward the parameters are not whole: read
//      them through state().model_state_dict().
// Under ZeRO the optimizer must be attached (backward refuses to complete a step otherwise),
// gradient-norm clipping goes through grad_norm() and checkpoints through
// state().model_state_dict() and state().optimizer_state_dict() (ddp/ddp_state.h), which write
// whole tensors whatever the stage and world size.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>

#include "tutti/comm/communicator.h"
#include "tutti/core/state_dict.h"
#include "tutti/ddp/comm_hook.h"
#include "tutti/ddp/ddp_state.h"
#include "tutti/ddp/reducer.h"
#include "tutti/ddp/sharding.h"
#include "tutti/nn/module.h"
#include "tutti/optim/clip.h"
#include "tutti/optim/optimizer.h"

namespace tutti::ddp {

// The deterministic mode (DdpOptions::deterministic): how each slice's gradients are held.
struct DeterministicOptions {
  // Each slice's gradient is rounded to a multiple of 2^-F and an element may reach at most
  // 2^(62-F) / slices (else backward throws, naming this field). In [0, 60].
  int fixed_point_fraction_bits = 40;
};

struct DdpOptions {
  // The plan's buckets (nn::FlatPlanOptions), in MiB of gradients: bigger ones run each
  // collective nearer full bandwidth, smaller ones start communication earlier. The first
  // (the last layers) is small so that communication starts early.
  double bucket_cap_mb = 25.0;
  double first_bucket_cap_mb = 1.0;
  int accumulation_steps = 1;  // micro-batches per optimizer step
  // What each rank keeps of the parameters, gradients and optimizer state (ddp/sharding.h):
  // Replicate, ShardOptimizer, ShardGradients or ShardParameters (ZeRO-0 to 3).
  Sharding sharding = Replicate{};
  // How gradients are reduced. grad_comm_dtype unset: the model's grad_comm_dtype(), which
  // amp::apply sets from the policy (bf16 for Policy::bf16()) and is f32 otherwise. Its sharding
  // is `sharding`'s to set (leave it). After construction, options().reducer holds what is used.
  ReducerOptions reducer{};
  // Set: the deterministic mode. The trained model does not depend on the world size, bit for bit
  // (Replicate or ShardOptimizer; with ShardOptimizer every rank sums and converts the whole gradient, an allreduce
  // rather than a reduce-scatter, and its optimizer updates its shard). Each micro-batch must be one slice of the
  // global batch, of the same size at every world size (so world size x accumulation steps is constant); each slice's
  // gradients are added exactly into int64 fixed point (DeterministicOptions), summed across ranks
  // by an int64 allreduce after the last micro-batch (not overlapped with backward) and
  // converted once. reducer.grad_comm_dtype is not used. The kernels must give the same bits
  // at every world size: on the CPU keep the GEMM threads (JobOptions::cpu_threads) the same,
  // since OpenBLAS's results depend on them. docs/user-guide.md says what it costs.
  std::optional<DeterministicOptions> deterministic;
  bool broadcast_parameters = true;  // rank 0's values everywhere at construction
  bool verify_model = true;          // the start-up check that every rank has the same model
};

// Bytes this rank holds, by component (what the tensors' storages hold, not a formula).
struct DdpMemory {
  std::int64_t parameters = 0;       // what forward reads: compute copies (half), or the fp32 values
  std::int64_t master_weights = 0;   // fp32 masters kept beside half parameters (ZeRO: the shard)
  std::int64_t gradients = 0;        // the flat gradient buffer (ZeRO-2: the shard)
  std::int64_t optimizer_state = 0;  // the attached optimizer's state (ZeRO: the shard)
  std::int64_t communication = 0;    // staging in the wire dtype, ZeRO-2's pool
  std::int64_t gathered = 0;         // ZeRO-3: the two gather buffers and the resident group (whole)
  std::int64_t total() const {
    return parameters + master_weights + gradients + optimizer_state + communication + gathered;
  }
};

class ExactGradientSum;  // the deterministic mode's sum (src/ddp/exact_sum.h)
class ShardingStrategy;  // carries out DdpOptions::sharding (src/ddp/strategy.h)

class DistributedDataParallel {
 public:
  // COLLECTIVE. The model must be on its device with its precision set (to(),
  // set_precision()) and initialized on rank 0 at least (else InvalidArgument on every rank,
  // naming the parameter); the communicator must serve that device. Keeps references to
  // both: they must outlive this object, which leaves the model's batch slice at (0, 1)
  // when it goes. Under ZeRO with a half compute dtype the model's fp32 masters are released
  // (FlatStorage::release_masters): the model then lives on with this object's shard only; at
  // ShardParameters its parameters are released too (FlatStorage::release_parameters).
  // A model with deferred parameters (nn::DeferredParameters; init() or hf::load_weights gave
  // them sources): with ShardParameters its shards are filled one gather group at a time (rank 0
  // reads the sources and broadcasts each group, or every rank reads them without
  // broadcast_parameters), so no rank holds the whole model at once; at stages 0-2 it is
  // materialized whole first (Module::materialize).
  DistributedDataParallel(Communicator& comm, nn::Module& model, DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Binds `optimizer` (every parameter of it must be the model's) to this object's buffers:
  // at stage 0 the whole plan (one fused call per run of a weight decay), under ZeRO this
  // rank's shard, and its step() then also launches the all-gather of the updated
  // parameters. Not collective. The state so far is carried over. The optimizer may outlive
  // this object, but must not step after it is gone (it throws).
  void attach(optim::Optimizer& optimizer);

  // The model's forward (not collective; under ZeRO it waits, bucket by bucket, for the
  // all-gathers of the last step). With ShardParameters COLLECTIVE: it gathers each group, so every
  // rank must run as many forwards, the model's own too (evaluation, sampling: on every rank). The first forward of a
  // step starts the step's clock (StepStats::compute_before_comm_ms).
  Tensor forward(const Tensor& x);
  // Backward of one micro-batch. On the last micro-batch of a step it is COLLECTIVE: it
  // reduces the gradients across ranks (overlapped with backward), waits for them and
  // divides by (world size · accumulation steps · loss_scale) ("Gradient scaling" at the top
  // of this file), and returns true: the
  // gradients are ready for the optimizer. Otherwise it accumulates locally and returns false
  // (ZeRO-2: reduces too, so it is collective). loss_scale: the factor the loss gradient was
  // multiplied by (LossScaler::scale()). Throws InvalidArgument, before any communication,
  // when the model ran no forward since its last backward (Module::backward), and under ZeRO
  // when no optimizer is attached.
  bool backward(const Tensor& dy, double loss_scale = 1.0);
  // Whether the next backward completes a step. The count of micro-steps restarts at
  // zero_grad().
  bool next_backward_syncs() const { return micro_step_ + 1 == options_.accumulation_steps; }
  // After a backward that returned true: whether any reduced gradient holds inf or nan (the
  // same answer on every rank). Reads a flag from the device: the step's one host sync.
  bool found_nonfinite();
  // Zeroes all gradients and starts a new step (the micro-step count restarts).
  void zero_grad();
  // After a backward that returned true, COLLECTIVE under ZeRO (one small allreduce): the
  // global L2 norm of the reduced gradients of every rank, and the clipping coefficient for
  // max_norm to pass to Optimizer::step (as optim::compute_grad_norm). One host sync.
  optim::GradNorm grad_norm(double max_norm);
  // The model's and the optimizer's state as this object holds it, whatever the sharding: whole
  // tensors for checkpoints, live views, this rank's parts, the flat parameter vector, and their
  // loads (ddp/ddp_state.h).
  DdpState& state() { return state_; }

  // Replaces the reducer's allreduce of each bucket by `hook` (ddp/comm_hook.h; PowerSGD:
  // ddp/powersgd.h): Reducer::register_comm_hook, after checking that this DDP can use one
  // (Replicate, not deterministic: else InvalidArgument naming the hook). Not collective;
  // every rank registers the same kind. Register it before building a train::State, which
  // saves the hook's state as the entry "<name>.", and before a DiLoCo over this DDP (which
  // refuses one).
  void register_comm_hook(std::shared_ptr<CommHook> hook);

  nn::Module& module() { return model_; }
  // The reducer: its plan() (THE flat plan) and last_stats() (statistics of the last step).
  Reducer& reducer() { return *reducer_; }
  const DdpOptions& options() const { return options_; }
  // Whether each rank holds a shard of the state (ShardOptimizer and beyond): the *_state_dict
  // functions are then collective, and no *_views exist.
  bool sharded() const;
  // Bytes this rank holds now, by component.
  DdpMemory memory() const;

 private:
  void verify_same_model();
  // Rank 0's layer state, and its flat parameter values when `values`.
  void broadcast_parameters(bool values);
  bool exact_backward(const Tensor& dy, double loss_scale);  // deterministic mode (exact_sum.cc)
  // The found-nonfinite flag (i32 [1] on the device): the exact sum's or the reducer's.
  const Tensor& found_nonfinite_flag() const;
  friend class DdpState;

  Communicator& comm_;
  nn::Module& model_;
  DdpOptions options_;
  std::unique_ptr<Reducer> reducer_;
  std::vector<nn::Parameter*> params_;
  std::unordered_map<const nn::Parameter*, std::size_t> index_;
  int micro_step_ = 0;
  bool step_clock_running_ = false;
  std::chrono::steady_clock::time_point t_step_start_;
  std::unique_ptr<ExactGradientSum> exact_;  // deterministic mode
  bool exact_reduced_ = false;
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);  // the optimizer's after_step checks it
  DdpState state_{*this};
  // Declared last: it goes first, before the reducer it uses.
  std::unique_ptr<ShardingStrategy> strategy_;
};

}  // namespace tutti::ddp
