// Sequence parallelism (Korthikanti et al. 2022, Megatron-LM's): the parts of a tensor-parallel
// model that tensor parallelism leaves whole (the norms and the residual stream between the
// split layers) each hold only 1/tp of the batch's rows, so their activations and gradients
// fall by the group's size as the split layers' do.
//
// Without it every rank of the group holds the whole [B, T, C] residual stream: a row-parallel
// layer sums its output over the group (allreduce), and a column-parallel layer's input is that
// whole sum. With it the row-parallel layer reduce-scatters instead, each rank keeping its rows
// [r·N/tp, (r+1)·N/tp) of the N = B·T rows of the batch flattened, as [N/tp, C]; the norm and
// the residual add work on those rows alone; the next column-parallel layer allgathers the rows
// back into [B, T, C] before its multiply. Backward mirrors it (allgather of the output gradient
// where forward reduce-scattered, reduce-scatter of the input gradient where it gathered).
// Forward moves the bytes of the allreduce it replaces (an allreduce is a reduce-scatter and an
// allgather); backward one allgather more per column-parallel layer, of its input again, started
// before the layer's input-gradient multiply so that the two overlap where the backend's
// collectives run beside the compute (nccl's stream, mpi's thread). The
// norms' parameters see only their rows' share of the gradient: theirs is summed over the group
// in backward (SequenceParallelLayerNorm, one small allreduce of 2·C values).
//
// Memory: the split layers keep their inputs as this rank's rows and gather them again in
// backward; the whole [B, T, C] tensors of the gathers and of the partial sums live in two
// buffers that every layer of the region shares (workspace_bytes()), not one per layer.
//
// The rows split only where N divides by the group's size; otherwise (generate's growing
// prompt, an odd batch) the forward runs as tensor parallelism without it, its backward too
// (active()). models::Gpt and models::Llama build theirs with
// TensorParallelOptions::sequence_parallel (train_gpt --sequence-parallel). The rows are the
// flattened batch's, not the positions of each sequence: the layers in the region are per row.
#pragma once

#include <cstdint>
#include <string>

#include "tutti/comm/communicator.h"
#include "tutti/core/tensor.h"
#include "tutti/nn/layers.h"

namespace tutti::parallel {

// The split of one model's rows over its tensor-parallel group, and the two whole-batch buffers
// its layers share. One per model; the split layers keep a pointer to it (it must outlive them).
// Not thread-safe (a model is not).
class SequenceParallel {
 public:
  explicit SequenceParallel(Communicator& group);
  Communicator& group() const { return group_; }

  // Called by the region's first layer (the embeddings) at each forward, with the batch's leading
  // shape [B, T]: whether this forward (and its backward) splits the rows, i.e. B·T divides by
  // the group's size.
  bool begin(std::int64_t batch, std::int64_t sequence);
  bool active() const { return active_; }
  // [N/tp, width]: the shape of this rank's rows while active(). It, gather and scatter_sum throw
  // (tutti::Error) when the rows are not split.
  Shape local_shape(std::int64_t width) const;
  // [B, T, width] of the last begin: the whole batch's shape.
  Shape whole_shape(std::int64_t width) const { return {batch_, sequence_, width}; }

  // COLLECTIVE over the group, ordered on `stream`: every rank's rows [N/tp, width] put together
  // as the whole [B, T, width] in shared buffer `slot` (0 or 1), valid until that slot's next use.
  Tensor gather(const Tensor& rows, int slot, const Stream& stream, const std::string& label);
  // gather, started: `whole` may be read once `work` is waited for (Work::wait(stream)), and
  // other work may run in between (a layer's input-gradient multiply, which needs only its own
  // rows' gradient, while its whole input is gathered again for the weight's).
  struct Gathering {
    Tensor whole;
    Work work;
  };
  Gathering start_gather(const Tensor& rows, int slot, const Stream& stream, const std::string& label);
  // COLLECTIVE: `rows` ([N/tp, width]) = this rank's rows of the sum over the group of `whole`.
  void scatter_sum(const Tensor& whole, const Tensor& rows, const Stream& stream, const std::string& label);
  // Shared buffer `slot` (0 or 1) as [B, T, width] of `dtype` on `device`: grown when too small
  // (never shrunk), its contents uninitialized.
  Tensor whole_buffer(int slot, std::int64_t width, DType dtype, Device device);
  // Bytes both shared buffers hold now.
  std::int64_t workspace_bytes() const;
  // Bytes both hold once layers gathering at most `width` features of `dtype` have run a step on
  // the last begin's batch (what a decoder holds: its split layers gather the residual stream's
  // width); 0 where the rows are not split.
  std::int64_t planned_workspace_bytes(std::int64_t width, DType dtype) const;

 private:
  void require_active(const char* what) const;

  Communicator& group_;
  bool active_ = false;
  std::int64_t batch_ = 0, sequence_ = 0;
  Tensor buffers_[2];
};

// A norm (nn::LayerNorm, nn::RMSNorm) in the sequence-parallel region: while `sequence` splits
// the rows, its parameters' gradients are summed over the group in backward (COLLECTIVE: one
// small allreduce), so that every rank adds the whole batch's, as the unsplit layer would.
template <typename Norm>
class SequenceParallelNorm : public Norm {
 public:
  SequenceParallelNorm(SequenceParallel& sequence, std::int64_t dim, float eps = 1e-5f)
      : Norm(dim, eps), sequence_(sequence) {}
  std::string describe() const override {
    return Norm::describe() + " (sequence-parallel, tp " + std::to_string(sequence_.group().size()) + ")";
  }

 protected:
  bool partial_rows() const override { return sequence_.active(); }
  void sum_partial_grads(const Tensor& grads) override;

 private:
  SequenceParallel& sequence_;
};

// Instantiated in src/parallel/sequence_parallel.cc for these two.
extern template class SequenceParallelNorm<nn::LayerNorm>;
extern template class SequenceParallelNorm<nn::RMSNorm>;
using SequenceParallelLayerNorm = SequenceParallelNorm<nn::LayerNorm>;  // GPT's
using SequenceParallelRMSNorm = SequenceParallelNorm<nn::RMSNorm>;      // Llama's

}  // namespace tutti::parallel
