// Causal multi-head self-attention, GPT-2's: the heads' queries, keys and values come packed
// in one tensor (the output of the attention's input projection), and the output is the
// heads' results side by side (the input of its output projection). See linear.h for the
// conventions.
//
// Shapes, with C = heads · head_size:
//   qkv   [B, T, 3C]: q = qkv[..., 0:C], k = qkv[..., C:2C], v = qkv[..., 2C:3C], and head h
//                     owns columns [h·hs, (h+1)·hs) of each
//   out   [B, T, C]:  out[b, t, h·hs + i] = sum_{s <= t} P[b, h, t, s] · v[b, s, h·hs + i]
//   probs [B, heads, T, T]: P = softmax over s <= t of q·k / sqrt(hs), 0 for s > t (the
//                     causal mask); saved by forward for backward, in the dtype of qkv.
// This is what must be kept between forward and backward: one T x T matrix per head
// (GPT-2's recipe, as llm.c's). Backward needs no other saved tensor.
#pragma once

#include <cstdint>

#include "tutti/core/tensor.h"

namespace tutti::kernels {

// Writes out and probs. heads must divide C; T >= 1.
void attention_forward(const Tensor& qkv, std::int64_t heads, const Tensor& out, const Tensor& probs,
                       const Stream& stream = Stream());

// Given dout [B, T, C]: dqkv [B, T, 3C] (written, never accumulated). qkv and probs are the
// forward's.
void attention_backward(const Tensor& qkv, const Tensor& probs, const Tensor& dout, std::int64_t heads,
                        const Tensor& dqkv, const Stream& stream = Stream());

}  // namespace tutti::kernels
