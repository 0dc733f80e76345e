// The Reducer's PowerSGD (tutti/ddp/powersgd.h says what it computes and promises): per bucket,
// a first half when the bucket is ready (error feedback, P = M·Q, the allreduces of P and of the
// uncompressed gradients) and a second half in the Reducer's finish() (orthonormalize P,
// Q = M^T·P, the allreduce of Q, M = P·Q^T, the new error). Internal to PowerSgdHook.
#pragma once

#include <cstdint>
#include <vector>

#include "tutti/comm/communicator.h"
#include "tutti/core/state_dict.h"
#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"
#include "tutti/ddp/powersgd.h"
#include "tutti/nn/flat_plan.h"

namespace tutti::ddp {

class PowerSgd {
 public:
  // Lays out P, Q and the error of every bucket of `plan`, over the gradients in `buffer`
  // (f32 [plan.total] on `device`). Not collective.
  PowerSgd(Communicator& comm, const nn::FlatPlan& plan, Tensor buffer, PowerSgdOptions options);
  ~PowerSgd();
  PowerSgd(const PowerSgd&) = delete;
  PowerSgd& operator=(const PowerSgd&) = delete;

  // Whether the current step compresses (the warm-up of start_step steps is over).
  bool active() const { return step_ >= options_.start_step; }
  // Bucket b's gradients are complete: its first half, issued on `stream`. Returns the bytes
  // it put on the wire.
  std::int64_t launch(int b, const Stream& stream);
  // Every bucket was launched: the second halves, in bucket order; when it returns (GPU: for
  // work ordered on `stream` after it) the buffer holds, per bucket, the SUM over ranks of the
  // approximations and of the uncompressed gradients (the Reducer divides by N as it does for
  // an allreduce). Returns the bytes it put on the wire; adds the collectives' run times to
  // *run_ms.
  std::int64_t finish(const Stream& stream, double* run_ms);
  // The step is over (counts the warm-up).
  void end_step() { ++step_; }
  // Bytes of P, Q, the error and the staging of the uncompressed gradients.
  std::int64_t bytes() const;
  // How many gradients are compressed, and how many elements of the buffer they hold.
  std::int64_t compressed_count() const;
  std::int64_t compressed_numel() const;

  // Checkpoints (powersgd_state.cc; tutti/ddp/powersgd.h says what is kept and when). `plan`
  // is the one given to the constructor (for the parameters' names). COLLECTIVE: every rank's
  // error is all-gathered, bucket by bucket; rank 0's result holds every rank's, the others'
  // their own. Between steps only (no collective of a step in flight).
  StateDict state_dict(const nn::FlatPlan& plan, const Stream& stream);
  // Not collective. Checks every entry before anything changes (InvalidArgument naming it);
  // returns "" when PowerSGD continues exactly, else what it did instead (for a start-up line).
  std::string load_state_dict(const nn::FlatPlan& plan, const StateDict& state, const Stream& stream);

 private:
  struct Matrix {
    std::size_t entry = 0;
    std::int64_t n = 0, m = 0, r = 0;
    std::int64_t offset = 0;    // in the buffer
    std::int64_t p_offset = 0;  // in the bucket's p
    std::int64_t q_offset = 0;  // in the bucket's q
    std::int64_t e_offset = 0;  // in the bucket's error
  };
  struct Plain {
    std::int64_t offset = 0, numel = 0, staged = 0;  // in the buffer, in the bucket's plain
  };
  struct Bucket {
    std::vector<Matrix> matrices;
    std::vector<Plain> plain;
    Tensor p, q, error, plain_buf;  // f32, flat
    Work p_work, q_work, plain_work;
    bool q_drawn = false;  // a warm start has a Q to start from
  };
  Tensor matrix_of(const Matrix& x) const { return buffer_.view(x.offset, {x.n, x.m}); }
  void draw_q(Bucket& bucket, const Stream& stream);
  void orthonormalize(Bucket& bucket, const Stream& stream);
  void restart(const Stream& stream);  // step 0, zero error, no Q drawn (a fresh PowerSgd)

  Communicator& comm_;
  PowerSgdOptions options_;
  Tensor buffer_;
  std::vector<Bucket> buckets_;
  int step_ = 0;
  std::vector<double> work_;  // the orthonormalization's host copy
};

}  // namespace tutti::ddp
