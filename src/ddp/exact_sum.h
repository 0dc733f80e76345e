// ExactGradientSum: how DistributedDataParallel sums gradients in its deterministic mode
// (DdpOptions::deterministic; docs/architecture.md, "Deterministic gradient sums").
//
// Every micro-batch is one slice of the global batch, of the same size at every world size.
// Its gradients (the gradient of its mean loss, times the loss scale) are divided by the loss
// scale and added, each rounded once to a multiple of 2^-F (F = fraction_bits), into an int64
// accumulator: integer additions are exact, so the sum does not depend on their order. At the
// end of a step the ranks' accumulators are summed by one int64 allreduce (exact too) and
// converted once: gradient = sum · 2^-F / slices. The result is the same bits whatever the
// number of ranks, and whichever rank computed which slice.
//
// Range: one slice may add at most 2^62 / slices units (|g| <= 2^(62-F) / slices), so that
// no partial sum can overflow in any order. A larger element is not added: it sets a flag
// that the allreduce carries, and finish() throws on every rank alike (never a silent wrap).
// An inf or nan in a slice (a loss scale too high) makes every gradient of the step nan, so
// that the found-nonfinite flag is set on every rank and a loss scaler skips the step.
#pragma once

#include <cstdint>

#include "tutti/comm/communicator.h"
#include "tutti/core/stream.h"
#include "tutti/core/tensor.h"

namespace tutti::ddp {

class ExactGradientSum {
 public:
  // numel: the gradients' flat length; slices: slices per step (world size x accumulation steps).
  ExactGradientSum(Communicator& comm, std::int64_t numel, Device device, int fraction_bits, int slices);

  // Adds one slice's gradients (`grads`, flat, f32/f16/bf16, times loss_scale) and zeroes
  // them. Not collective.
  void add(const Tensor& grads, double loss_scale, const Stream& stream);
  // COLLECTIVE: sums the ranks' accumulators (one int64 allreduce), writes the mean over the
  // step's slices into `grads` (nan everywhere when a slice held inf or nan) and sets found().
  // Throws Error on every rank when an element exceeded the range. One host sync.
  void finish(const Tensor& grads, const Stream& stream);
  // Zeroes the accumulator for the next step.
  void zero(const Stream& stream);
  // i32 [1] on the device: 1 when the last finish() found inf or nan in some slice.
  const Tensor& found() const { return found_; }
  std::int64_t bytes() const { return static_cast<std::int64_t>(acc_.nbytes() + found_.nbytes()); }
  // What bytes() will be for `numel` gradient elements (the constructor's allocations).
  static std::int64_t predicted_bytes(std::int64_t numel) { return (numel + 2) * 8 + 4; }

 private:
  Communicator& comm_;
  std::int64_t numel_;
  int fraction_bits_;
  int slices_;
  Tensor acc_;    // i64 [numel + 2]: the sums, then the status (inf/nan seen, out of range seen)
  Tensor found_;  // i32 [1]
};

}  // namespace tutti::ddp
