// Reducer: sums gradients across ranks in buckets while backward is still running.
//
// The reducer owns one flat gradient buffer. Gradient i (in the order given, which is the
// parameters' registration order) is a view into it, and the views are laid out in REVERSE
// order, because backward produces the last layers' gradients first. The buffer is cut into
// buckets at gradient boundaries: the first bucket holds about first_bucket_cap_mb, the
// others about bucket_cap_mb. When every gradient of a bucket has been marked ready, its
// allreduce starts at once (GPU: on the communicator's stream, ordered after the work issued
// to the compute stream so far; CPU: on the communication thread), while backward goes on.
//
// Invariant, on which correctness depends (as in PyTorch's reducer): buckets are reduced in
// the same order on every rank — bucket b is launched only after buckets 0..b-1, whatever
// order the gradients become ready in.
//
// This is also the low-level API for programs with their own kernels (docs/user-guide.md has
// the recipe; tests/ddp/reducer_test.cc runs it): per backward pass prepare(sync), add each
// gradient into grad(i) and mark_ready(i) as it is done; finish() after the communicating
// pass; zero() before the next step.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "tutti/comm/communicator.h"
#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"

namespace tutti::ddp {

struct ReducerOptions {
  // Bucket sizes in MiB of gradient data. The first bucket (the last layers) is small so
  // that communication starts early; the others are large so each allreduce runs near full
  // bandwidth.
  double bucket_cap_mb = 25.0;
  double first_bucket_cap_mb = 1.0;
  // Dtype on the wire: f32, bf16 or f16. When it differs from the gradients' dtype, each
  // bucket is cast into a staging buffer before its allreduce and back after it. A half
  // reduction that averages divides by the world size BEFORE it sums, so the sum of N
  // gradients cannot overflow; the mpi backend accumulates halves in fp32.
  DType grad_comm_dtype = DType::f32;
  // true: gradients are averaged over ranks (DDP's default); false: summed.
  bool average = true;
  // true: a bucket's allreduce starts as soon as it is ready (overlapped with backward);
  // false: every allreduce starts in finish(), after backward (for comparison).
  bool overlap = true;
  // A gradient never marked ready by finish(): false (default) throws an error naming it;
  // true treats it as zero (its slot keeps whatever it holds, zero after zero()).
  bool allow_unused = false;
};

// One gradient the reducer holds.
struct GradientSpec {
  std::string name;  // for error messages: "2.weight"
  Shape shape;
  bool requires_grad = true;  // false: never communicated and never waited for (a frozen weight)
};

// Timings of the last synchronized step, in milliseconds of wall time on the host (GPU:
// the time the host spent, not device time), and its traffic.
struct StepStats {
  double backward_ms = 0;       // from prepare() to the start of finish()
  double comm_ms = 0;           // from the first launch until finish() saw the last bucket
                                // complete: the span communication was in flight (an upper
                                // bound of the time spent communicating)
  double comm_run_ms = 0;       // the buckets' allreduces' own run times added up, where the
                                // backend measures them (mpi; 0 on nccl): time spent communicating
  double exposed_comm_ms = 0;   // time finish() waited for communication: NOT hidden by backward
  double finish_ms = 0;         // all of finish(): waits, casts, unscale and check
  std::int64_t bytes_reduced = 0;  // per rank, on the wire
  double busbw_gbs = 0;         // bytes_reduced · 2(n-1)/n / comm_run_ms (comm_ms where not measured)
  int buckets = 0;
};

class Reducer {
 public:
  // Lays out the buffer (grad_dtype: f32, f16 or bf16, on device) and the buckets. Not
  // collective; every rank must construct it with the same specs and options.
  Reducer(Communicator& comm, std::vector<GradientSpec> specs, DType grad_dtype, Device device,
          ReducerOptions options = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // The flat buffer and gradient i's view into it; offsets(i) in elements. Zeroed at start.
  const Tensor& buffer() const { return buffer_; }
  Tensor grad(std::size_t i) const;
  std::int64_t offset(std::size_t i) const { return offsets_.at(i); }
  // The offsets of every gradient, in order, and the buffer length (elements).
  const std::vector<std::int64_t>& offsets() const { return offsets_; }
  std::size_t size() const { return specs_.size(); }
  int bucket_count() const { return static_cast<int>(buckets_.size()); }
  // Which bucket gradient i is in (0 = reduced first).
  int bucket_of(std::size_t i) const { return bucket_of_.at(i); }
  const ReducerOptions& options() const { return options_; }

  // Starts a backward pass; every pass needs one, the accumulating ones too. sync: this pass
  // communicates (the last micro-step of an accumulation) and must end with finish();
  // otherwise mark_ready() only records and nothing is launched. Work is issued on `stream`
  // (the model's compute stream). Throws if the previous pass was prepared with sync = true,
  // got under way and was never finished.
  void prepare(bool sync, const Stream& stream = Stream());
  // Gradient i is written for this backward (for a GPU: its last kernel is issued on the
  // stream given to prepare). Launches every bucket that became ready, in bucket order.
  // Throws if i was already marked in this pass.
  void mark_ready(std::size_t i);
  // Ends a synchronized backward: launches what is left (overlap off, or unused gradients
  // when allowed), waits for every bucket (GPU: the stream waits, the host does not), then
  // one fused pass per bucket multiplies by 1 / (world size (if averaging) · divisor) and
  // checks for inf/nan. divisor is typically accumulation steps · loss scale. Returns the
  // found-nonfinite flag (i32 [1] on the device, 0 or 1), identical on every rank because
  // the check runs after the reduction. No host sync on a GPU.
  const Tensor& finish(double divisor = 1.0);
  // Zeroes the whole buffer (one memset on the stream of the last prepare()). The buffer is
  // zero only at construction and gradients are added into it: a reducer used for several
  // steps needs zero() after each step's gradients have been used.
  void zero();
  // The found-nonfinite flag of the last finish() (i32 [1] on the device; 0 before any).
  const Tensor& found_nonfinite_flag() const { return found_; }
  // Statistics of the last finish().
  const StepStats& last_stats() const { return stats_; }

 private:
  struct Bucket {
    std::int64_t offset = 0;  // elements into buffer_
    std::int64_t numel = 0;
    std::vector<std::size_t> grads;
    int pending = 0;          // gradients not yet marked in this pass
    Tensor staging;           // grad_comm_dtype copy when it differs from the buffer's dtype
    Work work;
    bool launched = false;
  };
  void launch(Bucket& b, int index);
  void launch_ready_buckets();
  [[noreturn]] void throw_unready() const;

  Communicator& comm_;
  std::vector<GradientSpec> specs_;
  ReducerOptions options_;
  Device device_;
  Tensor buffer_;
  std::vector<std::int64_t> offsets_;
  std::vector<int> bucket_of_;
  std::vector<Bucket> buckets_;
  std::vector<bool> marked_;
  int next_to_launch_ = 0;
  bool sync_ = false;
  bool in_pass_ = false;
  Stream stream_;
  Tensor found_;  // i32 [1]
  StepStats stats_;
  std::chrono::steady_clock::time_point t_prepare_, t_first_launch_;
  bool launched_any_ = false;
};

}  // namespace tutti::ddp
