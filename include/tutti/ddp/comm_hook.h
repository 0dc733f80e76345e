// CommHook: a Reducer's bucket reduction, replaced (as c10d's register_comm_hook replaces
// PyTorch DDP's allreduce). ddp::PowerSgdHook (ddp/powersgd.h) is one; a program may write its
// own (tests/ddp/comm_hook_test.cc has a small one).
//
// Where it sits: Reducer::register_comm_hook (or DistributedDataParallel::register_comm_hook,
// which also refuses ZeRO and the deterministic mode) binds the hook to the reducer's plan and
// gradient buffer once. From then on, while active() is true, the reducer hands each bucket to
// launch() when its gradients are ready (in bucket order, overlapped with backward, as it would
// allreduce it), calls finish() once after the last bucket, and then divides and checks the
// buffer as it does after an allreduce: the hook must leave the SUM over ranks in the bucket's
// range of the buffer. While active() is false, the reducer allreduces each bucket itself.
// end_step() follows every synchronized step, active or not.
//
// State: a hook with state (PowerSGD's error feedback) returns it from state_dict(), and
// train::State saves it as the entry "<name()>." of every checkpoint (registered by the
// State's constructor: register the hook before building the State).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tutti/comm/communicator.h"
#include "tutti/core/state_dict.h"
#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"
#include "tutti/nn/flat_plan.h"

namespace tutti::ddp {

struct ReducerOptions;

// What a hook is bound to (Reducer::register_comm_hook gives it).
struct CommHookContext {
  Communicator& comm;                        // the reducer's: its ranks are the ones summed over
  std::shared_ptr<const nn::FlatPlan> plan;  // where each gradient lives, bucket by bucket
  Tensor buffer;                             // the flat gradients (grad dtype, plan.total), on their device
  DType wire;                                // the reducer's wire dtype (grad_comm_dtype, resolved)
  const ReducerOptions& options;             // sharding, average, ...
};

class CommHook {
 public:
  virtual ~CommHook() = default;

  // A short name: the checkpoint prefix of its state ("powersgd") and what errors call it.
  virtual std::string name() const = 0;
  // Called once, by Reducer::register_comm_hook. Checks that the hook can serve this reducer
  // (InvalidArgument naming what it needs otherwise) and lays out its buffers. Not collective.
  virtual void bind(const CommHookContext& context) = 0;
  // Whether the current step goes through the hook (false: the reducer allreduces every bucket).
  virtual bool active() const = 0;
  // Bucket b's gradients are complete in the buffer: start reducing them, issued on `stream`
  // (the model's compute stream). Returns the bytes it put on the wire.
  virtual std::int64_t launch(int bucket, const Stream& stream) = 0;
  // Every bucket was launched: complete them. When it returns (GPU: for work ordered on
  // `stream` after it) every bucket's range of the buffer holds the SUM over ranks. Returns the
  // bytes it put on the wire; adds the collectives' measured run times to *run_ms.
  virtual std::int64_t finish(const Stream& stream, double* run_ms) = 0;
  // A synchronized step is over (after finish(), or after the reducer's own allreduces).
  virtual void end_step() = 0;
  // Bytes of device memory it holds (counted as the reducer's communication bytes).
  virtual std::int64_t bytes() const { return 0; }

  // Checkpoints. Its state (empty: none); COLLECTIVE where collective_state() says so (every
  // rank calls it, rank 0's result is saved). Between steps only.
  virtual StateDict state_dict(const Stream& /*stream*/) { return {}; }
  // Restores it from a state_dict() of rank 0 (empty: the checkpoint has none). Not collective.
  // Returns "" when it continues exactly, else what it did instead (for Run::note()).
  virtual std::string load_state_dict(const StateDict& /*state*/, const Stream& /*stream*/) { return ""; }
  virtual bool collective_state() const { return false; }
  // Non-empty: memory snapshots leave its state out, and a resume from one adds this text to
  // Run::note() (train::State::Entry::not_in_snapshots).
  virtual std::string not_in_snapshots() const { return ""; }
};

}  // namespace tutti::ddp
