#include "ddp/exact_sum.h"

#include <cmath>
#include <limits>
#include <string>

#include "tutti/core/error.h"
#include "tutti/ddp/ddp.h"
#include "tutti/kernels/elementwise.h"
#include "tutti/kernels/fixed_point.h"

namespace tutti::ddp {

ExactGradientSum::ExactGradientSum(Communicator& comm, std::int64_t numel, Device device, int fraction_bits, int slices)
    : comm_(comm), numel_(numel), fraction_bits_(fraction_bits), slices_(slices) {
  TUTTI_CHECK_ARG(fraction_bits >= 0 && fraction_bits <= 60,
                  "DistributedDataParallel: DeterministicOptions::fixed_point_fraction_bits must be in [0, 60], got ",
                  fraction_bits);
  TUTTI_CHECK_ARG(slices >= 1, "ExactGradientSum: slices must be >= 1, got ", slices);
  acc_ = Tensor::zeros({numel + 2}, DType::i64, device);
  found_ = Tensor::zeros({1}, DType::i32, device);
}

void ExactGradientSum::add(const Tensor& grads, double loss_scale, const Stream& stream) {
  const double limit = std::floor(std::ldexp(1.0, 62) / slices_);
  kernels::fixed_point_accumulate(grads, std::ldexp(1.0, fraction_bits_) / loss_scale, limit, acc_.view(0, {numel_}),
                                  acc_.view(numel_, {2}), /*zero_x=*/true, stream);
}

void ExactGradientSum::finish(const Tensor& grads, const Stream& stream) {
  CallOptions call;
  call.label = "ddp exact gradient sum (int64)";
  call.stream = stream;
  comm_.allreduce(acc_, ReduceOp::sum, call).wait(stream);
  const Tensor host = acc_.view(numel_, {2}).to(Device::cpu(), stream);
  stream.synchronize();
  const std::vector<std::int64_t> status = host.to_ints();
  if (status[1] > 0) {
    TUTTI_THROW(Error, "DistributedDataParallel (deterministic mode), rank ", comm_.rank(), " of ", comm_.size(),
                ": a gradient element of a slice exceeded the fixed-point range |g| <= 2^(62 - ", fraction_bits_,
                ") / ", slices_, " slices = ", std::ldexp(1.0, 62 - fraction_bits_) / slices_, " on ", status[1],
                " rank(s); it would have overflowed the exact int64 sum. The run has likely diverged; otherwise ",
                "lower DeterministicOptions::fixed_point_fraction_bits (more range, coarser resolution: 2^-F)");
  }
  const bool nonfinite = status[0] > 0;
  if (nonfinite) {
    kernels::fill(grads, std::numeric_limits<float>::quiet_NaN(), stream);
  } else {
    kernels::fixed_point_to_float(acc_.view(0, {numel_}), std::ldexp(1.0, -fraction_bits_) / slices_, grads, stream);
  }
  found_.copy_from(Tensor::from_ints({nonfinite ? 1 : 0}, {1}, DType::i32), stream);
}

void ExactGradientSum::zero(const Stream& stream) { acc_.zero(stream); }

// ---- DistributedDataParallel's deterministic backward ----------------------------------------

bool DistributedDataParallel::exact_backward(const Tensor& dy, double loss_scale) {
  const bool sync = next_backward_syncs();
  // The reducer keeps the buffer and the hooks; an accumulating pass never communicates (at
  // ZeRO-1 too: the buffer is whole, each rank's optimizer reads its chunks of it).
  reducer_->prepare(/*sync=*/false, model_.stream());
  model_.backward(dy);
  // The buffer is zeroed in the same pass: the next slice starts from zero, whoever computes it.
  exact_->add(reducer_->buffer(), loss_scale, model_.stream());
  if (!sync) {
    ++micro_step_;
    return false;
  }
  micro_step_ = 0;
  step_clock_running_ = false;
  exact_->finish(reducer_->buffer(), model_.stream());
  exact_reduced_ = true;
  return true;
}

const Tensor& DistributedDataParallel::found_nonfinite_flag() const {
  return exact_ ? exact_->found() : reducer_->found_nonfinite_flag();
}

}  // namespace tutti::ddp
