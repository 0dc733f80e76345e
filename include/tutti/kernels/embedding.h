// Token + position embedding, GPT-2's input layer. See linear.h for the conventions.
#pragma once

#include <cstdint>

#include "tutti/core/tensor.h"

namespace tutti::kernels {

// Which rows of the whole token table wte holds. By default all of them. Split across the ranks
// of a tensor-parallel group (parallel::VocabParallelEmbedding, Megatron's vocabulary-parallel
// embedding): rows [first, first + wte's rows) of a table of `total` rows. A token of the whole
// vocabulary outside this rank's rows gives a row of zeros (plus its position) in forward and no
// gradient in backward: the sum over the ranks is the whole table's lookup.
struct EmbeddingRows {
  std::int64_t first = 0;  // the table row that wte's row 0 is
  std::int64_t total = 0;  // rows of the whole table (0: wte's own, first must be 0)
};

// tokens [B, T] i32 (each in [0, V)), wte [V, C], wpe [T_max, C] with T <= T_max:
//   out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :]
// or, with wpe undefined (a model without a position table, such as Llama), wte's rows alone.
// A token out of range (of the whole table, with `rows`) is an InvalidArgument on the CPU; on the
// GPU, where the host cannot read the tokens without a sync, its row of out is nan.
void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& out,
                       const EmbeddingRows& rows = {}, const Stream& stream = Stream());

// Given dout [B, T, C]: dwte [V, C] (+)= the sum of dout's rows over the positions of each
// token (a scatter-add), dwpe [T_max, C] (+)= the sum over the batch of dout[:, t, :] in its
// first T rows (rows T.. are zeroed, or left alone with accumulate_params). Either may be
// undefined (not wanted); each may be f32 while dout is f16/bf16. Deterministic on every
// device: each gradient element is the sum of its terms in position order (no float
// atomics), so the same inputs give the same bits run after run. With `rows`, dwte is this rank's
// rows: tokens outside them add nothing.
void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dwte, const Tensor& dwpe,
                        bool accumulate_params, const EmbeddingRows& rows = {}, const Stream& stream = Stream());

}  // namespace tutti::kernels
