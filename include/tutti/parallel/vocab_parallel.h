// The vocabulary split across a tensor-parallel group (Megatron-LM's vocabulary-parallel
// embedding and cross-entropy): each rank holds rows [r·V/tp, (r+1)·V/tp) of the token table, and
// of the output head that reads it, so the table, the head's multiply and the logits [B, T, V/tp]
// are 1/tp per rank. models::Gpt(config, group) and models::Llama(config, group) build theirs so;
// a model of them trains, for a seed, like the unsplit one up to the order of the sums
// (tests/parallel/model_tensor_parallel_test.cc).
//
// doc-test: wrap-main
// setup: tutti::Job job(argc, argv);
// setup: tutti::Communicator& tp = job.communicator();
//   tutti::models::GptConfig config = tutti::models::GptConfig::preset("gpt-tiny");
//   tutti::models::Gpt model(config, tp);                 // logits [B, T, padded_vocab / tp]
//   model.init(1);
//   std::unique_ptr<tutti::nn::CrossEntropyLoss> loss = model.make_loss();  // the split loss
//   tutti::Tensor tokens = tutti::Tensor::zeros({2, 8}, tutti::DType::i32);
//   loss->forward(model.forward(tokens), tokens);         // the whole vocabulary's mean loss
//   model.backward(loss->grad());
//
// Communication, each COLLECTIVE over the group, on the model's stream: the embedding sums its
// output [B, T, C] (each rank looks up the tokens of its rows, zeros for the others); the head's
// input gradient [B, T, C] is summed in backward (each rank's rows contributed their part); the
// loss reduces two small [N] and [2, N] f32 tensors (the row maxima, then the sums of exp and the
// labels' logits; kernels/cross_entropy.h's split pieces). Nothing of [N, V] size crosses ranks.
//
// With sequence parallelism (the `sequence` of each, parallel/sequence_parallel.h): the
// embeddings start the split (SequenceParallel::begin) and reduce-scatter their output to this
// rank's rows [N/tp, C] instead of summing it whole; the head gathers its input rows and
// reduce-scatters its input gradient back to them.
//
// Checkpoints: the split tables are split parameters like ColumnParallelLinear's weight
// (Parameter::init_slice, rows): parallel::whole_state_dict and split_state_dict gather and cut
// them, so a checkpoint holds the whole tables and resumes at any tensor-parallel size.
#pragma once

#include <cstdint>
#include <string>

#include "tutti/comm/communicator.h"
#include "tutti/nn/loss.h"
#include "tutti/nn/transformer.h"
#include "tutti/parallel/sequence_parallel.h"

namespace tutti::parallel {

// tokens [B, T] (i32, each in [0, vocab)) -> [B, T, width]: nn::TokenEmbedding(vocab, width)
// (Llama's), its `weight` rows [r·vocab/tp, (r+1)·vocab/tp) of the whole table (initialized as the
// whole table's rows: the unsplit layer's values for the seed). Forward looks up this rank's rows
// (zeros for the others' tokens) and sums the output over the group (COLLECTIVE); backward adds
// each of this rank's tokens' output gradient to its row, no communication. vocab must divide by
// the group's size (InvalidArgument).
class VocabParallelEmbedding : public nn::TokenEmbedding {
 public:
  VocabParallelEmbedding(Communicator& group, std::int64_t vocab, std::int64_t width,
                         SequenceParallel* sequence = nullptr);
  std::string describe() const override;
  // nn::TokenEmbedding's; while `sequence` splits the rows, y is this rank's rows [N/tp, width].
  std::vector<nn::BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& tokens) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  Communicator& group_;
  std::int64_t vocab_;
  SequenceParallel* sequence_;
};

// tokens [B, T] -> wte[tokens] + wpe[0..T) as [B, T, width]: nn::TokenPositionEmbedding (GPT-2's)
// with wte's rows split as VocabParallelEmbedding's and wpe whole on every rank (added by the
// group's first rank before the sum; every rank computes its whole, equal gradient).
class VocabParallelTokenPositionEmbedding : public nn::TokenPositionEmbedding {
 public:
  VocabParallelTokenPositionEmbedding(Communicator& group, std::int64_t vocab, std::int64_t context, std::int64_t width,
                                      SequenceParallel* sequence = nullptr);
  std::string describe() const override;
  // As VocabParallelEmbedding's.
  std::vector<nn::BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& tokens) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  Communicator& group_;
  std::int64_t vocab_;
  SequenceParallel* sequence_;
};

// x [..., in] -> [..., out/tp]: nn::TiedLinear over a weight whose rows are split across the
// group (a vocabulary-parallel embedding's table): this rank's columns of the tied head's output.
// Backward sums the input gradient over the group (COLLECTIVE) and adds this use's gradient to
// the rows this rank holds.
class ColumnParallelTiedLinear : public nn::TiedLinear {
 public:
  ColumnParallelTiedLinear(Communicator& group, nn::Parameter& weight, SequenceParallel* sequence = nullptr);
  std::string describe() const override;
  // As ColumnParallelLinear's: while `sequence` splits the rows, y [B, T, out/tp] from the rows.
  std::vector<nn::BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  Communicator& group_;
  SequenceParallel* sequence_;
};

// nn::CrossEntropyLoss over logits whose classes are split across the group in rank order (rank r
// holds columns [r·C/tp, (r+1)·C/tp) of the whole [..., C]: a vocabulary-parallel head's output).
// forward(logits, labels, grad_scale, stream) takes this rank's logits [..., C/tp] and the whole
// labels (the same on every rank of the group) and gives every rank the whole mean loss and
// grad() for its own columns: the unsplit loss's, up to the order of the sums. COLLECTIVE (two
// allreduces of N and 2·N floats, N the rows). Labels are checked against [0, C) as the unsplit
// loss checks them. (nn::count_correct, an argmax over the columns it is given, would see this
// rank's columns only: gather the logits first.)
class VocabParallelCrossEntropy : public nn::CrossEntropyLoss {
 public:
  explicit VocabParallelCrossEntropy(Communicator& group, std::int64_t ignore_index = -100);
  const Tensor& forward(const Tensor& logits, const Tensor& labels, float grad_scale = 1.0f,
                        const Stream& stream = Stream()) override;
  // grad() and the row statistics [3, N] f32.
  std::int64_t buffer_bytes(const Shape& logits, DType dtype) const override;

 private:
  Communicator& group_;
  Tensor stats_;  // [3, N] f32: the rows' maxima, then their sums of exp and the labels' logits
};

}  // namespace tutti::parallel
