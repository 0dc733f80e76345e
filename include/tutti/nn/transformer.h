// The layers a GPT needs beyond layers.h: the token + position embedding, causal multi-head
// self-attention, and an output projection tied to the embedding's weight. Shapes are
// [B, T, ...]: B sequences of T positions. A GPT-2 block is built from these and layers.h's
// (tutti/models/gpt.h builds GPT-2 of them):
//
//   Residual( LayerNorm(C), Linear(C, 3C), CausalSelfAttention(heads), Linear(C, C) )
//   Residual( LayerNorm(C), Linear(C, 4C), GELU, Linear(4C, C) )
#pragma once

#include <cstdint>

#include "tutti/nn/module.h"

namespace tutti::nn {

// tokens [B, T] (i32, each in [0, vocab)) -> wte[tokens] + wpe[0..T) as [B, T, width], T <= context.
// Both tables are initialized N(0, 0.02^2), GPT-2's. The input is data: backward returns an
// undefined tensor.
class TokenPositionEmbedding : public Module {
 public:
  TokenPositionEmbedding(std::int64_t vocab, std::int64_t context, std::int64_t width);
  Parameter wte;  // [vocab, width]
  Parameter wpe;  // [context, width]
  std::string describe() const override;
  // A gather: no FLOPs (the tied head counts the table's multiply). [T] -> [T, width].
  Flops flops(const Shape& sample, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& tokens) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  std::int64_t vocab_, context_, width_;
  Tensor tokens_;
};

// Causal multi-head self-attention without projections (kernels/attention.h): [B, T, 3C]
// (q, k, v side by side, the output of Linear(C, 3C)) -> [B, T, C]. Keeps the softmax
// probabilities [B, heads, T, T] for backward. No parameters.
class CausalSelfAttention : public Module {
 public:
  explicit CausalSelfAttention(std::int64_t heads);
  std::int64_t heads() const { return heads_; }
  std::string describe() const override;
  // [T, 3C] -> [T, C]: 4·T²·C forward (the scores and their use, the full T x T as PaLM counts).
  Flops flops(const Shape& sample, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& qkv) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  std::int64_t heads_;
  Tensor qkv_, probs_;
};

// y[..., out] = x[..., in] · weight^T, with the weight [out, in] of another module: weight
// tying (GPT-2's output head shares the token embedding wte). The parameter stays its
// owner's (registered there, once: so it is one parameter to the optimizer, the flat layout
// and the data-parallel runtime). Backward ADDS this use's gradient into weight.grad and
// does not report it ready: its owner does, after adding its own share, so that a
// parameter used twice gets the sum of both gradients before anyone reads it. That needs the
// owner's backward to run after this one's, i.e. the owner to come earlier in the forward
// pass (the embedding is the first layer, the head the last).
class TiedLinear : public Module {
 public:
  explicit TiedLinear(Parameter& weight);
  std::string describe() const override;
  // 2·in·out per row forward, as Linear.
  Flops flops(const Shape& sample, Shape& out) const override;
  Parameter& weight() const { return weight_; }

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  Parameter& weight_;
  Tensor x_;
};

}  // namespace tutti::nn
