// Reducer: sums gradients across ranks in buckets while backward is still running.
//
// It takes a FlatPlan (nn/flat_plan.h): the plan says where gradient i lives in the flat
// buffer, which bucket holds it and, sharded, which chunk of every bucket each rank owns.
// When every gradient of a bucket has been marked ready, its collective starts at once (GPU:
// on the communicator's stream, ordered after the work issued to the compute stream so far;
// CPU: on the communication thread), while backward goes on.
//
// Invariant, on which correctness depends (as in PyTorch's reducer): buckets are reduced in
// the same order on every rank — bucket b is launched only after buckets 0..b-1, whatever
// order the gradients become ready in.
//
// Sharding (ReducerOptions::sharding; DistributedDataParallel's sharding strategy sets it):
//   none        allreduce: every rank gets every averaged gradient (plain data parallelism).
//   scatter     reduce-scatter in place (ZeRO-1): rank r gets the averaged gradients of its
//               chunk of each bucket (shard_grad(b)); the rest of the buffer keeps this rank's
//               local sums, which nobody should read.
//   shard_only  no full-size buffer at all (ZeRO-2): backward writes each bucket into a buffer
//               of a small pool (grad(i) places it: call it right before writing gradient i),
//               the bucket is reduce-scattered and its chunk added to this rank's shard (shard()),
//               and the pool buffer serves a later bucket. The pool grows only while more buckets
//               are being written at once than it has buffers (two for a model whose backward
//               goes layer by layer). Every pass communicates, the accumulating ones too (as
//               DeepSpeed's stage 2): a non-final pass adds its reduced chunks to the shard.
//
// The phases of a reducer, every transition checked (misuse is an error at once, never a
// wrong sum):
//   idle --prepare(false)--> accumulating --prepare(...)--> (the pass is closed first)
//   idle --prepare(true)---> reducing --finish()--> reduced --zero()--> idle
//   any failure inside a collective --> failed (every later call throws, naming it)
// prepare(true) then prepare again without finish() is refused (the sums were never
// averaged); prepare() in `reduced` is refused (zero() first: the optimizer's gradients are
// still in the buffer and would be added to).
//
// This is also the low-level API for programs with their own kernels (docs/user-guide.md has
// the recipe; tests/ddp/reducer_test.cc runs it).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tutti/comm/communicator.h"
#include "tutti/core/state_dict.h"
#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"
#include "tutti/ddp/comm_hook.h"
#include "tutti/nn/flat_plan.h"

namespace tutti::ddp {

enum class GradientSharding : std::uint8_t { none, scatter, shard_only };

struct ReducerOptions {
  // Dtype on the wire: f32, bf16 or f16; unset: the gradients' dtype. When it differs from the
  // gradients' dtype, each bucket is cast into a staging buffer before its collective and back
  // after it. A half reduction that averages divides by the world size BEFORE it sums, so the
  // sum of N gradients cannot overflow; the mpi backend accumulates halves in fp32.
  std::optional<DType> grad_comm_dtype;
  // true: gradients are averaged over ranks; false: summed.
  bool average = true;
  // true: a bucket's collective starts as soon as it is ready (overlapped with backward);
  // false: every collective starts in finish() (or, shard_only, when the pass closes).
  bool overlap = true;
  // A gradient never marked ready when its bucket must be reduced: false (default) throws an
  // error naming it; true treats it as zero (its slot keeps whatever it holds).
  bool allow_unused = false;
  GradientSharding sharding = GradientSharding::none;
};

// One step of a backward pass as the reducer sees it: gradient `param` (its index in the plan's
// entries) is placed (grad(i): shard_only's pool) or reported ready (mark_ready(i)).
struct GradientEvent {
  bool ready = false;
  std::size_t param = 0;
};

// Timings of the last synchronized step, in milliseconds of wall time on the host (GPU:
// the time the host spent, not device time), and its traffic.
struct StepStats {
  double backward_ms = 0;      // from prepare() to the start of finish()
  double comm_ms = 0;          // from the first launch until finish() saw the last bucket
                               // complete: the span communication was in flight (an upper
                               // bound of the time spent communicating)
  double comm_run_ms = 0;      // the buckets' collectives' own run times added up, where the
                               // backend measures them (mpi; 0 on nccl): time spent communicating
  double exposed_comm_ms = 0;  // time finish() waited for communication: NOT hidden by backward
  double finish_ms = 0;        // all of finish(): waits, casts, unscale and check
  // Host time from the start of the step (DistributedDataParallel: its first forward; a bare
  // Reducer: the first prepare()) to the launch of its first collective: the compute that no
  // collective waits for yet, so a slow rank shows here (the collectives make every rank's
  // backward look alike). On a GPU: the host's issue time, not the device's.
  double compute_before_comm_ms = 0;
  std::int64_t bytes_reduced = 0;  // per rank, on the wire (each bucket's input)
  double busbw_gbs = 0;            // bytes_reduced · f / comm_run_ms (comm_ms where not measured),
                                   // f = 2(n-1)/n for allreduce, (n-1)/n for reduce-scatter
  int buckets = 0;
  // ZeRO (filled by DistributedDataParallel): the all-gathers of the updated parameters that
  // followed the previous step.
  double gather_ms = 0;          // from their launch until the last one was seen complete
  double exposed_gather_ms = 0;  // time forward (or the step, gathering right away) waited for them;
                                 // ZeRO-3: the step's waits for its groups' gathers (forward and backward)
};

class Reducer {
 public:
  enum class Phase : std::uint8_t { idle, accumulating, reducing, reduced, failed };

  // Lays out the buffer (grad_dtype: f32, f16 or bf16, on device) by `plan`. Not collective;
  // every rank must construct it with the same plan and options. Sharded, the plan must be
  // made for comm.size() ranks.
  Reducer(Communicator& comm, nn::FlatPlan plan, DType grad_dtype, Device device, ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  const nn::FlatPlan& plan() const { return *plan_; }
  // The communicator it reduces over (DistributedDataParallel's: the data-parallel group).
  Communicator& communicator() const { return comm_; }
  const std::shared_ptr<const nn::FlatPlan>& shared_plan() const { return plan_; }
  // none and scatter: the flat buffer (zeroed at start); shard_only: undefined.
  const Tensor& buffer() const { return buffer_; }
  // Gradient i, where backward must write it: a view into the buffer; shard_only, a view into
  // its bucket's pool buffer, placing the bucket there (call it right before writing, within a
  // pass; writing a gradient after its bucket was launched is an error).
  Tensor grad(std::size_t i);
  // Sharded: this rank's chunk of bucket b's reduced gradients (valid after finish()).
  Tensor shard_grad(int bucket) const;
  // shard_only: this rank's gradient shard [plan.shard_numel] (chunks in bucket order).
  const Tensor& shard() const { return shard_; }
  std::size_t size() const { return plan_->entries.size(); }
  int bucket_count() const { return static_cast<int>(plan_->buckets.size()); }
  int bucket_of(std::size_t i) const { return plan_->entries.at(i).bucket; }
  std::int64_t offset(std::size_t i) const { return plan_->entries.at(i).offset; }
  // The options in use (grad_comm_dtype resolved).
  const ReducerOptions& options() const { return options_; }
  Phase phase() const { return phase_; }

  // Opens a backward pass; every pass needs one, the accumulating ones too. sync: this pass
  // completes the step (the last micro-step of an accumulation) and must end with finish();
  // otherwise mark_ready() only records (shard_only: reduces too). Work is issued on `stream`
  // (the model's compute stream). An accumulating pass still open is closed first. Throws in
  // `reducing` (never finished), `reduced` (zero() first) and `failed`.
  void prepare(bool sync, const Stream& stream = Stream());
  // Gradient i is written for this pass (for a GPU: its last kernel is issued on the stream
  // given to prepare). Launches every bucket that became ready, in bucket order. Throws if i
  // was already marked in this pass, or outside a pass.
  void mark_ready(std::size_t i);
  // Ends a synchronized pass: launches what is left (overlap off, or unused gradients when
  // allowed), waits for every bucket (GPU: the stream waits, the host does not), then one
  // fused pass multiplies by 1 / (world size (if averaging) · divisor) and checks for inf/nan
  // (sharded: over this rank's chunks, then one small max-allreduce of the flag). divisor is
  // typically accumulation steps · loss scale. Returns the found-nonfinite flag (i32 [1] on
  // the device, 0 or 1), identical on every rank. No host sync on a GPU.
  const Tensor& finish(double divisor = 1.0);
  // Zeroes the gradients (the buffer, or the shard) on the stream of the last prepare(), and
  // returns to idle. Needed after every step: gradients are added into the buffer. Throws in
  // `reducing` and `failed`.
  void zero();
  // The found-nonfinite flag of the last finish() (i32 [1] on the device; 0 before any).
  const Tensor& found_nonfinite_flag() const { return found_; }
  // Statistics of the last finish().
  const StepStats& last_stats() const { return stats_; }
  StepStats& mutable_stats() { return stats_; }
  // When the first collective of the current (or last) step was launched (empty before any).
  std::optional<std::chrono::steady_clock::time_point> first_launch() const {
    return launched_any_ ? std::optional(t_first_launch_) : std::nullopt;
  }
  // Memory: bytes of gradients held (the buffer, or the shard) and of communication buffers
  // (staging in the wire dtype, shard_only's pool).
  std::int64_t gradient_bytes() const;
  std::int64_t communication_bytes() const;
  // Replaces the allreduce of each bucket by `hook` (ddp/comm_hook.h: what it must do;
  // ddp/powersgd.h: PowerSGD). Binds it (CommHook::bind, which refuses what it cannot serve).
  // Not collective, but every rank must register the same kind of hook. Only between steps
  // (idle), and once: a second hook throws. The reducer shares ownership of it.
  void register_comm_hook(std::shared_ptr<CommHook> hook);
  // The registered hook, or nullptr.
  CommHook* comm_hook() const { return hook_.get(); }
  // shard_only: buffers in the pool now.
  int pool_size() const { return static_cast<int>(slots_.size()); }
  // shard_only: the pool buffers (each of the largest bucket's size) that one backward pass in
  // `order` leaves, replaying the choices the pool makes (a free buffer, else the earliest
  // launched bucket's, else one more): pool_size() after that pass. For ddp/memory.h's
  // predictions, beside the code it predicts.
  static int pool_buffers(const nn::FlatPlan& plan, const std::vector<GradientEvent>& order);
  // What a reducer of `plan` allocates, as gradient_bytes() and communication_bytes() will say
  // (without a hook): the buffer or the shard, and the wire-dtype staging or `pool` buffers.
  struct Bytes {
    std::int64_t gradients = 0, communication = 0;
  };
  static Bytes predicted_bytes(const nn::FlatPlan& plan, DType grad_dtype, DType wire_dtype, GradientSharding sharding,
                               int pool);

 private:
  struct Bucket {
    int pending = 0;  // gradients not yet marked in this pass
    Tensor staging;   // wire-dtype copy (none/scatter: one per bucket)
    Work work;
    bool launched = false;
    int slot = -1;  // shard_only: the pool buffer holding it in this pass
  };
  struct Slot {      // shard_only: one pool buffer
    Tensor grads;    // grad dtype, the largest bucket's length
    Tensor staging;  // wire dtype when it differs
    int bucket = -1;
  };
  bool communicates() const { return phase_ == Phase::reducing || options_.sharding == GradientSharding::shard_only; }
  void require_usable(const char* what) const;
  void begin_pass(bool sync, const Stream& stream);
  void close_accumulating_pass();
  void launch(int b);
  void launch_ready_buckets();
  void launch_rest();
  int acquire_slot(int bucket);
  void retire(int b);
  Tensor wire_of(int b);
  [[noreturn]] void throw_unready() const;
  template <typename F>
  auto guarded(const char* what, F&& f) -> decltype(f());

  bool compressing() const;

  Communicator& comm_;
  std::shared_ptr<const nn::FlatPlan> plan_;
  ReducerOptions options_;
  DType grad_dtype_;
  Device device_;
  Tensor buffer_, shard_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;
  std::vector<bool> marked_;
  int next_to_launch_ = 0;
  Phase phase_ = Phase::idle;
  std::string failure_;
  Stream stream_;
  Tensor found_;                    // i32 [1]
  std::shared_ptr<CommHook> hook_;  // register_comm_hook
  StepStats stats_;
  std::chrono::steady_clock::time_point t_prepare_, t_first_launch_;
  bool launched_any_ = false;
  bool step_started_ = false;  // shard_only: a pass of this step has launched something
};

}  // namespace tutti::ddp
