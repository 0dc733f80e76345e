#include "tutti/parallel/vocab_parallel.h"

#include "nn/reuse_or_make.h"
#include "parallel/reduce_over.h"
#include "parallel/same_group.h"
#include "tutti/core/error.h"
#include "tutti/kernels/cross_entropy.h"
#include "tutti/kernels/linear.h"

namespace tutti::parallel {

namespace {

// This rank's rows of a table of `vocab` rows; InvalidArgument unless the group's size divides it.
std::int64_t rows_of(const Communicator& group, std::int64_t vocab, const char* layer) {
  TUTTI_CHECK_ARG(vocab > 0 && vocab % group.size() == 0, layer, ": the vocabulary ", vocab,
                  " must divide by the tensor-parallel group's ", group.size(), " rank(s)");
  return vocab / group.size();
}

// `table` as rows [r·part, (r+1)·part) of the whole [vocab, width] table, drawn as the whole
// table; returns those rows, for the embedding kernels.
kernels::EmbeddingRows split_rows(nn::Parameter& table, const Communicator& group, std::int64_t vocab,
                                  std::int64_t width) {
  table.init_slice = {{vocab, width}, 0, group.rank(), group.size(), {}};
  return {group.rank() * (vocab / group.size()), vocab};
}

// Whether `sequence` (when given) splits the rows of this forward of `tokens` (its begin).
bool splits(SequenceParallel* sequence, const Tensor& tokens) {
  return sequence != nullptr && tokens.ndim() == 2 && sequence->begin(tokens.dim(0), tokens.dim(1));
}

}  // namespace

// ---- the embeddings -----------------------------------------------------------------------

VocabParallelEmbedding::VocabParallelEmbedding(Communicator& group, std::int64_t vocab, std::int64_t width,
                                               SequenceParallel* sequence)
    : nn::TokenEmbedding(rows_of(group, vocab, "VocabParallelEmbedding"), width),
      group_(group),
      vocab_(vocab),
      sequence_(same_group(sequence, group, "VocabParallelEmbedding")) {
  rows_ = split_rows(weight, group, vocab, width);
}

std::string VocabParallelEmbedding::describe() const {
  return detail::str("VocabParallelEmbedding(vocab ", vocab_, ", width ", weight.shape()[1], ", tp ", group_.size(),
                     sequence_ ? ", sequence-parallel" : "", ")");
}

Tensor VocabParallelEmbedding::forward_impl(const Tensor& tokens) {
  if (splits(sequence_, tokens)) {
    // This rank's part of every row in the shared buffer; its rows of the sum kept.
    const std::int64_t width = weight.shape()[1];
    const Tensor partial = sequence_->whole_buffer(0, width, compute_dtype(), device());
    embed_into(tokens, partial);
    Tensor y = buffer(0, sequence_->local_shape(width), compute_dtype());
    sequence_->scatter_sum(partial, y, stream(), describe() + " output");
    return y;
  }
  Tensor y = nn::TokenEmbedding::forward_impl(tokens);
  reduce_over(group_, y, stream(), describe() + " output");
  return y;
}

Tensor VocabParallelEmbedding::backward_impl(const Tensor& dy) {
  if (sequence_ == nullptr || !sequence_->active()) return nn::TokenEmbedding::backward_impl(dy);
  return nn::TokenEmbedding::backward_impl(sequence_->gather(dy, 0, stream(), describe() + " output gradient"));
}

VocabParallelTokenPositionEmbedding::VocabParallelTokenPositionEmbedding(Communicator& group, std::int64_t vocab,
                                                                         std::int64_t context, std::int64_t width,
                                                                         SequenceParallel* sequence)
    : nn::TokenPositionEmbedding(rows_of(group, vocab, "VocabParallelTokenPositionEmbedding"), context, width),
      group_(group),
      vocab_(vocab),
      sequence_(same_group(sequence, group, "VocabParallelTokenPositionEmbedding")) {
  rows_ = split_rows(wte, group, vocab, width);
  adds_positions_ = group.rank() == 0;  // once, before the sum
}

std::string VocabParallelTokenPositionEmbedding::describe() const {
  return detail::str("VocabParallelTokenPositionEmbedding(vocab ", vocab_, ", context ", wpe.shape()[0], ", width ",
                     wpe.shape()[1], ", tp ", group_.size(), sequence_ ? ", sequence-parallel" : "", ")");
}

Tensor VocabParallelTokenPositionEmbedding::forward_impl(const Tensor& tokens) {
  if (splits(sequence_, tokens)) {
    check_tokens(tokens);
    const std::int64_t width = wpe.shape()[1];
    const Tensor partial = sequence_->whole_buffer(0, width, compute_dtype(), device());
    embed_into(tokens, partial);
    Tensor y = buffer(0, sequence_->local_shape(width), compute_dtype());
    sequence_->scatter_sum(partial, y, stream(), describe() + " output");
    return y;
  }
  Tensor y = nn::TokenPositionEmbedding::forward_impl(tokens);
  reduce_over(group_, y, stream(), describe() + " output");
  return y;
}

Tensor VocabParallelTokenPositionEmbedding::backward_impl(const Tensor& dy) {
  if (sequence_ == nullptr || !sequence_->active()) return nn::TokenPositionEmbedding::backward_impl(dy);
  return nn::TokenPositionEmbedding::backward_impl(sequence_->gather(dy, 0, stream(), describe() + " output gradient"));
}

namespace {
// An embedding's y while `sequence` splits the rows: this rank's rows [N/tp, width] (the lookup's
// partial sums are SequenceParallel's shared buffer).
void keep_rows(const SequenceParallel* sequence, std::vector<nn::BufferStatement>& b, DType dtype, Shape& out) {
  if (sequence == nullptr || !sequence->active()) return;
  out = sequence->local_shape(out.back());
  for (nn::BufferStatement& s : b)
    if (s.slot == 0) s.bytes = numel_of(out) * static_cast<std::int64_t>(size_of(dtype));
}
}  // namespace

std::vector<nn::BufferStatement> VocabParallelEmbedding::buffer_statements(const Shape& input, DType dtype,
                                                                           Shape& out) const {
  std::vector<nn::BufferStatement> b = nn::TokenEmbedding::buffer_statements(input, dtype, out);
  keep_rows(sequence_, b, dtype, out);
  return b;
}

std::vector<nn::BufferStatement> VocabParallelTokenPositionEmbedding::buffer_statements(const Shape& input, DType dtype,
                                                                                        Shape& out) const {
  std::vector<nn::BufferStatement> b = nn::TokenPositionEmbedding::buffer_statements(input, dtype, out);
  keep_rows(sequence_, b, dtype, out);
  return b;
}

// Backward of both is their base's, on the whole output gradient (the output was summed, or its
// rows are gathered again): each rank adds its tokens' rows to its own table rows, and the
// position table's whole gradient, the same on every rank.

// ---- the tied head ------------------------------------------------------------------------

ColumnParallelTiedLinear::ColumnParallelTiedLinear(Communicator& group, nn::Parameter& weight,
                                                   SequenceParallel* sequence)
    : nn::TiedLinear(weight), group_(group), sequence_(same_group(sequence, group, "ColumnParallelTiedLinear")) {}

std::string ColumnParallelTiedLinear::describe() const {
  return detail::str("ColumnParallelTiedLinear(", weight().shape()[1], ", ", weight().shape()[0] * group_.size(),
                     ", weight ", weight().name.empty() ? "shared" : weight().name, ", tp ", group_.size(),
                     sequence_ ? ", sequence-parallel" : "", ")");
}

Tensor ColumnParallelTiedLinear::forward_impl(const Tensor& x) {
  if (sequence_ == nullptr || !sequence_->active()) return nn::TiedLinear::forward_impl(x);
  // The rows kept; the whole batch's multiplied, gathered into the shared buffer.
  x_ = x;
  const Tensor whole = sequence_->gather(x, 0, stream(), describe() + " input");
  Tensor y = buffer(0, {whole.dim(0), whole.dim(1), weight().shape()[0]}, x.dtype());
  multiply(whole, y);
  return y;
}

Tensor ColumnParallelTiedLinear::backward_impl(const Tensor& dy) {
  if (sequence_ == nullptr || !sequence_->active()) {
    Tensor dx = nn::TiedLinear::backward_impl(dy);
    // Each rank's columns of the logits contributed their part of the input gradient.
    if (dx.defined()) reduce_over(group_, dx, stream(), describe() + " input gradient");
    return dx;
  }
  TUTTI_CHECK_ARG(x_.defined(), describe(), ": backward before forward");
  // As ColumnParallelLinear's: the whole input gathered again for the table's gradient while the
  // input gradient's multiply runs; that (this rank's columns' part of it), in the other shared
  // buffer, then summed over the group into this rank's rows.
  const SequenceParallel::Gathering input =
      sequence_->start_gather(x_, 0, stream(), describe() + " input, again for backward");
  const std::int64_t in = weight().shape()[1], out = weight().shape()[0];
  Tensor dx_whole;
  if (input_grad_needed()) {
    dx_whole = sequence_->whole_buffer(1, in, x_.dtype(), x_.device());
    kernels::matmul(dy.reshape({dy.numel() / out, out}), false, weight().compute_value(), false,
                    dx_whole.reshape({dx_whole.numel() / in, in}), 1.0f, 0.0f, stream());
  }
  input.work.wait(stream());
  multiply_backward(input.whole, dy, Tensor());
  if (!dx_whole.defined()) return Tensor();
  Tensor dx = buffer(1, x_.shape(), x_.dtype());
  sequence_->scatter_sum(dx_whole, dx, stream(), describe() + " input gradient");
  return dx;
}

std::vector<nn::BufferStatement> ColumnParallelTiedLinear::buffer_statements(const Shape& input, DType dtype,
                                                                             Shape& out) const {
  if (sequence_ == nullptr || !sequence_->active()) return nn::TiedLinear::buffer_statements(input, dtype, out);
  // As ColumnParallelLinear's: y of the whole batch (slot 0), dx of this rank's rows (1).
  std::vector<nn::BufferStatement> b =
      nn::TiedLinear::buffer_statements(sequence_->whole_shape(weight().shape()[1]), dtype, out);
  for (nn::BufferStatement& s : b)
    if (s.slot == 1) s.bytes = numel_of(input) * static_cast<std::int64_t>(size_of(dtype));
  return b;
}

// ---- the loss -----------------------------------------------------------------------------

VocabParallelCrossEntropy::VocabParallelCrossEntropy(Communicator& group, std::int64_t ignore_index)
    : nn::CrossEntropyLoss(ignore_index), group_(group) {}

std::int64_t VocabParallelCrossEntropy::buffer_bytes(const Shape& logits, DType dtype) const {
  TUTTI_CHECK_ARG(!logits.empty(), "VocabParallelCrossEntropy::buffer_bytes: logits are [..., C]");
  return nn::CrossEntropyLoss::buffer_bytes(logits, dtype) + 3 * (numel_of(logits) / logits.back()) * 4;
}

const Tensor& VocabParallelCrossEntropy::forward(const Tensor& logits, const Tensor& labels, float grad_scale,
                                                 const Stream& stream) {
  prepare(logits, labels);
  const std::int64_t C = logits.dim(-1), N = labels.numel();
  const kernels::ClassColumns columns{group_.rank() * C, group_.size() * C};
  nn::reuse_or_make(stats_, {3, N}, DType::f32, logits.device());
  const Tensor rows = logits.reshape({N, C}), y = labels.reshape({N});
  const Tensor row_max = stats_.view(0, {N}), sums = stats_.view(N, {2, N});
  kernels::cross_entropy_local_max(rows, row_max, stream);
  reduce_over(group_, row_max, stream, "VocabParallelCrossEntropy row maxima", ReduceOp::max);
  kernels::cross_entropy_local_sums(rows, y, row_max, sums, columns, ignore_index_, stream);
  reduce_over(group_, sums, stream, "VocabParallelCrossEntropy sums");
  kernels::cross_entropy_from_sums(rows, y, row_max, sums, loss_, dlogits_.reshape({N, C}), columns,
                                   {.ignore_index = ignore_index_, .grad_scale = grad_scale}, stream);
  return loss_;
}

}  // namespace tutti::parallel
