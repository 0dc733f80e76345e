// Tensor parallelism (Megatron-LM's, Shoeybi et al. 2019): a Linear layer's weight split across
// the ranks of a group, so that each holds 1/tp of it and does 1/tp of its multiply.
//
// doc-test: wrap-main
// setup: tutti::Job job(argc, argv);
// setup: tutti::DeviceMesh mesh = job.mesh({{"dp", tutti::kMeshRest}, {"tp", 1}});
//   tutti::nn::Sequential mlp;                        // an MLP block, split over the tp group
//   mlp.add<tutti::parallel::ColumnParallelLinear>(mesh.group("tp"), 512, 2048);  // 2048/tp out
//   mlp.add<tutti::nn::GELU>();                       // on this rank's 2048/tp features
//   mlp.add<tutti::parallel::RowParallelLinear>(mesh.group("tp"), 2048, 512);     // sums over tp
//   mlp.init(1);                                      // the same values as the unsplit MLP's
//
// The pair needs one allreduce (sum over the group) in forward, after the row-parallel
// layer's multiply, and one in backward, of the column-parallel layer's input gradient: the
// column-parallel layer's output stays split by features (each rank holds out/tp of them), the
// row-parallel layer takes its input so split, and an elementwise layer between them (GELU)
// works on each rank's part alone. Every rank of the group must run forward and backward
// alike: both are COLLECTIVE over it. The input of the column-parallel layer and the output of
// the row-parallel one are whole and the same on every rank of the group.
//
// Weights: ColumnParallelLinear holds rows [r·out/tp, (r+1)·out/tp) of the whole [out, in]
// weight (and that part of the bias), RowParallelLinear columns [r·in/tp, (r+1)·in/tp) of its
// [out, in] weight and the whole bias (replicated: every rank computes the same gradient for
// it). r is the rank in the group. Module::init draws the whole tensors and keeps the rank's
// slice (Parameter::init_slice), so a model of these layers starts, for a seed, from the
// values of the same model of nn::Linear layers, and trains like it up to the order of the sums.
//
// With data parallelism: a DistributedDataParallel over the other mesh dimension's group (the
// ranks with this rank's tp coordinate: the same slices) averages each slice's gradients over
// its data-parallel ranks, at any ZeRO stage, and trains like one rank with the whole batch
// and the unsplit model (tests/parallel/tensor_parallel_test.cc: dp 2 x tp 2, ZeRO 0-3).
//
// Checkpoints: a split model's state_dict (and its optimizer's, "<param>.<state>") holds this
// rank's slices. whole_state_dict gathers them into the whole tensors, the unsplit model's
// state under the same names; split_state_dict cuts the slices a model of any tensor-parallel
// size holds out of such a state: a checkpoint written at tp 4 resumes at tp 2 or 1.
//
// Clipping: DistributedDataParallel::grad_norm sums the squares of this rank's slices only;
// parallel::grad_norm sums the split parameters' over the group and counts the replicated ones
// (the row-parallel bias, and every parameter of the layers that are not split) once.
//
// Attention with the heads split: a ColumnParallelLinear(C, 3C, ..., {C, C, C}) before an
// nn::CausalSelfAttention of heads/tp heads and a RowParallelLinear(C, C) after it
// (models::Gpt(config, group) and models::Llama(config, group) build theirs so).
//
// train::Run writes a split model's checkpoints as whole tensors when its State names the group
// (train::State::tensor_parallel); train_gpt takes --tp N.
//
// The vocabulary splits too (parallel/vocab_parallel.h: the embedding, the output head and the
// loss), so each rank computes 1/tp of the logits; and the rows of the parts that are not split
// (the norms and the residual stream) with sequence parallelism (parallel/sequence_parallel.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tutti/comm/communicator.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/module.h"
#include "tutti/optim/clip.h"
#include "tutti/parallel/sequence_parallel.h"

namespace tutti::ddp {
class DistributedDataParallel;  // ddp/ddp.h (grad_norm reads its reduced gradients)
}

namespace tutti::parallel {

// y[..., out/tp] = x[..., in] · weight[out/tp, in]^T + bias[out/tp]: this rank's features of
// nn::Linear(in, out)'s output. An nn::Linear(in, out/tp) (weight [out/tp, in], bias [out/tp];
// its forward and FLOPs as they are) whose initial values are its rows of the whole layer's and
// whose input gradient is summed over the group in backward (COLLECTIVE). out must divide by
// the group's size (InvalidArgument).
// blocks: the output is blocks of these sizes side by side (summing to out), each split across
// the group: rank r holds part r of each, in block order. A fused [q | k | v] projection,
// {H·hs, G·hs, G·hs}: rank r holds its heads' q, then their k, then their v, which is what
// nn::CausalSelfAttention over H/tp heads (G/tp key/value heads) reads; SwiGLU's [gate | up],
// {F, F}. Empty: one block, the whole output. Each block must divide by the group's size.
// sequence: the model's sequence-parallel split (parallel/sequence_parallel.h) over the same
// group, or none. While it splits the rows, the input is this rank's rows [N/tp, in], gathered
// into the whole [B, T, in] before the multiply (and again in backward: only the rows are kept),
// and the input gradient is reduce-scattered back to the rows instead of summed.
class ColumnParallelLinear : public nn::Linear {
 public:
  ColumnParallelLinear(Communicator& group, std::int64_t in_features, std::int64_t out_features,
                       nn::LinearOptions options = {}, std::vector<std::int64_t> blocks = {},
                       SequenceParallel* sequence = nullptr);
  std::string describe() const override;
  // nn::Linear's; while `sequence` splits the rows (SequenceParallel::begin), the input is this
  // rank's rows and y the whole batch's [B, T, out/tp], dx the rows'.
  std::vector<nn::BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  Communicator& group_;
  std::int64_t in_, out_;
  std::vector<std::int64_t> blocks_;
  SequenceParallel* sequence_;
};

// y[..., out] = sum over the group of x[..., in/tp] · weight[out, in/tp]^T, + bias[out]: nn::Linear
// (in, out) on an input split by features (a ColumnParallelLinear's output, or anything so
// split). An nn::Linear(in/tp, out) (weight [out, in/tp], bias [out] whole on every rank; its
// backward and FLOPs as they are) whose initial weight is its columns of the whole layer's and
// whose forward adds the bias on the group's first rank only, then sums the output over the
// group (COLLECTIVE). Backward: no communication. in must divide by the group's size
// (InvalidArgument).
// sequence: as ColumnParallelLinear's. While it splits the rows, the output is reduce-scattered
// (this rank's rows [N/tp, out] of the sum) instead of summed whole, and backward gathers the
// output gradient's rows into the whole before its multiply.
class RowParallelLinear : public nn::Linear {
 public:
  RowParallelLinear(Communicator& group, std::int64_t in_features, std::int64_t out_features,
                    nn::LinearOptions options = {}, SequenceParallel* sequence = nullptr);
  std::string describe() const override;
  // nn::Linear's; while `sequence` splits the rows, y is this rank's rows [N/tp, out].
  std::vector<nn::BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;
  Tensor forward_bias() const override;

 private:
  Communicator& group_;
  std::int64_t in_, out_;
  SequenceParallel* sequence_;
};

// COLLECTIVE over `group` (the split layers' group): `mine` (model.state_dict(), an
// optimizer's state_dict(), or one of DistributedDataParallel's) with every tensor of a split
// parameter of `model` (Parameter::init_slice; its name, or "<name>.<state>" of its shape)
// replaced by the whole tensor, the group's slices put together in rank order; the other
// entries as they are. Every rank gets the whole state. One allgather per 64 MiB of this rank's
// slices, on the model's device and stream (at most tp x 64 MiB there at once). InvalidArgument
// where a slice is not this rank's part (init_slice.part = the rank in the group).
StateDict whole_state_dict(const StateDict& mine, nn::Module& model, Communicator& group);
// Not collective: `whole` with every tensor of a split parameter of `model` cut to this rank's
// slice (the parameter's init_slice), the other entries as they are: what model.load_state_dict
// (or an optimizer's) takes. InvalidArgument, naming the entry, where a tensor does not have
// the whole parameter's shape.
StateDict split_state_dict(const StateDict& whole, nn::Module& model);

// COLLECTIVE over `group` (one small allreduce; under ZeRO one more over DDP's data-parallel
// ranks, since each holds a shard of the gradients), after a backward of `ddp` that completed a
// step: the global L2 norm of the whole model's reduced gradients, as the unsplit model's would
// be (the split parameters' squares summed over the group, the others' once), and the clipping
// coefficient for max_norm to pass to Optimizer::step. One host sync. Any ZeRO stage, and the
// deterministic mode (where every rank holds every summed gradient, ZeRO-1 too: the norm is then
// the same bits at any number of data-parallel ranks).
optim::GradNorm grad_norm(ddp::DistributedDataParallel& ddp, Communicator& group, double max_norm);

}  // namespace tutti::parallel
