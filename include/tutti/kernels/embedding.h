// Token + position embedding, GPT-2's input layer. See linear.h for the conventions.
#pragma once

#include "tutti/core/tensor.h"

namespace tutti::kernels {

// tokens [B, T] i32 (each in [0, V)), wte [V, C], wpe [T_max, C] with T <= T_max:
//   out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :]
// or, with wpe undefined (a model without a position table, such as Llama), wte's rows alone.
// A token out of range is an InvalidArgument on the CPU; on the GPU, where the host cannot
// read the tokens without a sync, its row of out is nan.
void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe, const Tensor& out,
                       const Stream& stream = Stream());

// Given dout [B, T, C]: dwte [V, C] (+)= the sum of dout's rows over the positions of each
// token (a scatter-add), dwpe [T_max, C] (+)= the sum over the batch of dout[:, t, :] in its
// first T rows (rows T.. are zeroed, or left alone with accumulate_params). Either may be
// undefined (not wanted); each may be f32 while dout is f16/bf16. Deterministic on every
// device: each gradient element is the sum of its terms in position order (no float
// atomics), so the same inputs give the same bits run after run.
void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dwte, const Tensor& dwpe,
                        bool accumulate_params, const Stream& stream = Stream());

}  // namespace tutti::kernels
