#include "tutti/parallel/sequence_parallel.h"

#include "parallel/reduce_over.h"
#include "tutti/core/error.h"

namespace tutti::parallel {

SequenceParallel::SequenceParallel(Communicator& group) : group_(group) {}

bool SequenceParallel::begin(std::int64_t batch, std::int64_t sequence) {
  TUTTI_CHECK_ARG(batch > 0 && sequence > 0, "SequenceParallel: a batch of [", batch, ", ", sequence, "] rows");
  batch_ = batch;
  sequence_ = sequence;
  active_ = group_.size() > 1 && (batch * sequence) % group_.size() == 0;
  return active_;
}

void SequenceParallel::require_active(const char* what) const {
  TUTTI_CHECK(active_, "SequenceParallel::", what, ": this forward does not split the rows (", batch_, " x ", sequence_,
              " over ", group_.size(), " rank(s))");
}

Shape SequenceParallel::local_shape(std::int64_t width) const {
  require_active("local_shape");
  return {batch_ * sequence_ / group_.size(), width};
}

Tensor SequenceParallel::whole_buffer(int slot, std::int64_t width, DType dtype, Device device) {
  TUTTI_CHECK_ARG(slot == 0 || slot == 1, "SequenceParallel::whole_buffer: slot ", slot, " (0 or 1)");
  Tensor& b = buffers_[slot];
  const std::int64_t numel = batch_ * sequence_ * width;
  if (!b.defined() || b.numel() < numel || b.dtype() != dtype || b.device() != device) {
    const std::int64_t grown = b.defined() && b.dtype() == dtype && b.device() == device ? b.numel() : 0;
    b = Tensor();  // the old one released before the new one is made
    b = Tensor::empty({std::max(numel, grown)}, dtype, device);
  }
  return b.view(0, {batch_, sequence_, width});
}

Tensor SequenceParallel::gather(const Tensor& rows, int slot, const Stream& stream, const std::string& label) {
  const Gathering g = start_gather(rows, slot, stream, label);
  g.work.wait(stream);
  return g.whole;
}

SequenceParallel::Gathering SequenceParallel::start_gather(const Tensor& rows, int slot, const Stream& stream,
                                                           const std::string& label) {
  require_active("gather");
  const std::int64_t width = rows.dim(-1);
  TUTTI_CHECK_ARG(rows.shape() == local_shape(width), label, ": this rank's rows ", rows.str(), " are not [",
                  batch_ * sequence_ / group_.size(), ", ", width, "]");
  Gathering g;
  g.whole = whole_buffer(slot, width, rows.dtype(), rows.device());
  g.work = group_.allgather(rows.reshape({rows.numel()}), g.whole.reshape({g.whole.numel()}),
                            {.label = label, .stream = stream});
  return g;
}

void SequenceParallel::scatter_sum(const Tensor& whole, const Tensor& rows, const Stream& stream,
                                   const std::string& label) {
  require_active("scatter_sum");
  TUTTI_CHECK_ARG(whole.numel() == rows.numel() * group_.size(), label, ": ", whole.str(), " is not ", group_.size(),
                  " x ", rows.str());
  group_
      .reduce_scatter(whole.reshape({whole.numel()}), rows.reshape({rows.numel()}), ReduceOp::sum,
                      {.label = label, .stream = stream})
      .wait(stream);
}

std::int64_t SequenceParallel::workspace_bytes() const {
  std::int64_t bytes = 0;
  for (const Tensor& b : buffers_) bytes += b.defined() ? b.nbytes() : 0;
  return bytes;
}

std::int64_t SequenceParallel::planned_workspace_bytes(std::int64_t width, DType dtype) const {
  return active_ ? 2 * batch_ * sequence_ * width * static_cast<std::int64_t>(size_of(dtype)) : 0;
}

// ---- the norms ----------------------------------------------------------------------------

template <typename Norm>
void SequenceParallelNorm<Norm>::sum_partial_grads(const Tensor& grads) {
  reduce_over(sequence_.group(), grads, this->stream(), describe() + " parameter gradients");
}

template class SequenceParallelNorm<nn::LayerNorm>;
template class SequenceParallelNorm<nn::RMSNorm>;

}  // namespace tutti::parallel
