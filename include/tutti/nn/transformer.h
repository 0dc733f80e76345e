// The layers a decoder-only transformer needs beyond layers.h: token embeddings (with a position
// table, GPT-2's; or without, Llama's), rotary position embeddings, causal self-attention (multi-head
// or grouped-query), and an output projection tied to the embedding's weight. Shapes are
// [B, T, ...]: B sequences of T positions. A GPT-2 block and a Llama block are built from these and
// layers.h's (tutti/models/gpt.h and llama.h):
//
//   GPT-2: Residual( LayerNorm(C), Linear(C, 3C), CausalSelfAttention(heads), Linear(C, C) )
//          Residual( LayerNorm(C), Linear(C, 4C), GELU, Linear(4C, C) )
//   Llama: Residual( RMSNorm(C), Linear(C, (H + 2G)·hs), RotaryEmbedding, CausalSelfAttention(H, G),
//                    Linear(H·hs, C) )
//          Residual( RMSNorm(C), Linear(C, 2F), SwiGLU, Linear(F, C) )
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tutti/kernels/embedding.h"
#include "tutti/nn/module.h"

namespace tutti::nn {

// tokens [B, T] (i32, each in [0, vocab)) -> weight[tokens] as [B, T, width]: a model whose
// positions enter elsewhere (RotaryEmbedding). The table is initialized N(0, 0.02²) (Llama's
// initializer_range) and marked no_weight_decay. The input is data: backward returns an undefined
// tensor.
class TokenEmbedding : public Module {
 public:
  TokenEmbedding(std::int64_t vocab, std::int64_t width);
  Parameter weight;  // [vocab, width]
  std::string describe() const override;
  // A gather: no FLOPs (an output head counts its multiply). [T] -> [T, width].
  Flops flops(const Shape& sample, Shape& out) const override;
  // y [B, T, width] (slot 0) for tokens [B, T].
  std::vector<BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& tokens) override;
  Tensor backward_impl(const Tensor& dy) override;
  // Which rows of the whole table `weight` holds: all of them, or a vocabulary-parallel
  // subclass's slice (parallel::VocabParallelEmbedding sets it).
  kernels::EmbeddingRows rows_;
  // InvalidArgument unless tokens are [B, T] i32.
  void check_tokens(const Tensor& tokens) const;
  // Forward's lookup into y ([B, T, width], the compute dtype), the tokens kept for backward: a
  // sequence-parallel subclass looks up into a shared buffer before it splits the rows.
  void embed_into(const Tensor& tokens, const Tensor& y);

 private:
  std::int64_t vocab_, width_;
  Tensor tokens_;
};

// Llama 3's rescaling of the rotary frequencies for long contexts (Hugging Face's rope_type
// "llama3"): wavelengths above original_context / low_freq_factor are stretched by `factor`, those
// below original_context / high_freq_factor kept, those between interpolated. factor 0: off.
struct RopeScaling {
  double factor = 0;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  std::int64_t original_context = 8192;
  friend bool operator==(const RopeScaling&, const RopeScaling&) = default;
};

struct RopeOptions {
  double theta = 10000.0;  // rope_theta: the base of the frequencies
  RopeScaling scaling;     // llama3 scaling, off by default
  friend bool operator==(const RopeOptions&, const RopeOptions&) = default;
};

// The rotary frequencies inv_freq[i] = theta^(-2i / head_size), i < head_size / 2, with `scaling`,
// computed in f32 as Hugging Face computes them (so that long positions turn by the same angles).
std::vector<float> rope_inv_freq(std::int64_t head_size, const RopeOptions& options);

// The (cos, sin) table of the rotary embedding (kernels::rope_table) on a device, shared by every
// layer of a model: built on the host for the longest sequence asked so far and copied to the
// device, again only when a longer one comes or the device changes. Not thread-safe (a model is
// used by one thread at a time).
class RopeTable {
 public:
  RopeTable(std::int64_t head_size, const RopeOptions& options);
  // The table of at least T positions on `device`, [T', head_size / 2, 2] f32 with T' >= T.
  const Tensor& get(std::int64_t T, Device device, const Stream& stream);
  std::int64_t head_size() const { return head_size_; }
  const RopeOptions& options() const { return options_; }
  // Bytes the table holds now (0 before the first get).
  std::int64_t bytes() const { return table_.defined() ? static_cast<std::int64_t>(table_.nbytes()) : 0; }
  // Bytes the table holds once get(T) was its longest request: T positions' (cos, sin) in f32.
  std::int64_t bytes_for(std::int64_t T) const { return T * head_size_ * 4; }

 private:
  std::int64_t head_size_;
  RopeOptions options_;
  std::vector<float> inv_freq_;
  Tensor table_;
};

// Rotates the query and key heads of a packed qkv [B, T, (heads + 2 kv_heads)·hs] in place by
// their positions 0..T-1 (kernels::rope_forward; Hugging Face's "rotate half" pairing), and its
// gradient back in backward. Returns its input, rotated: it sits between the qkv projection (whose
// output it rotates; that Linear's backward reads its own input, not this) and the attention.
// No parameters.
class RotaryEmbedding : public Module {
 public:
  RotaryEmbedding(std::int64_t heads, std::int64_t kv_heads, std::shared_ptr<RopeTable> table);
  std::string describe() const override;
  const RopeTable& table() const { return *table_; }
  // None: it rotates its input in place (the table is the model's, shared by its layers).
  std::vector<BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& qkv) override;
  Tensor backward_impl(const Tensor& dqkv) override;

 private:
  std::int64_t heads_, kv_heads_;
  std::shared_ptr<RopeTable> table_;
};

// Which kernel computes attention: the tiled one (kernels/flash_attention.h: keeps the output and a
// log-sum-exp per query, memory linear in T, grouped-query heads) or the reference that keeps the
// softmax probabilities [B, heads, T, T] (kernels/attention.h; multi-head only).
enum class AttentionKernel : std::uint8_t { flash, materialized };
// "flash" or "materialized"; InvalidArgument naming the choices otherwise.
AttentionKernel parse_attention_kernel(const std::string& name);
const char* name_of(AttentionKernel kernel);

struct AttentionOptions {
  std::int64_t kv_heads = 0;  // key/value heads (grouped-query attention; must divide heads); 0: heads
  AttentionKernel kernel = AttentionKernel::flash;
  std::int64_t query_tile = 0, key_tile = 0;  // the flash kernel's tiles (0: its choice)
};

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
  // y [B, T, width] (slot 0) for tokens [B, T].
  std::vector<BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;

 protected:
  Tensor forward_impl(const Tensor& tokens) override;
  Tensor backward_impl(const Tensor& dy) override;
  // Which rows of the whole table wte holds, and whether forward adds the positions: all rows and
  // yes, or a vocabulary-parallel subclass's slice, the positions added on one rank of its group
  // before the sum over it (parallel::VocabParallelTokenPositionEmbedding sets them).
  kernels::EmbeddingRows rows_;
  bool adds_positions_ = true;
  // As TokenEmbedding's: T must not exceed the context.
  void check_tokens(const Tensor& tokens) const;
  void embed_into(const Tensor& tokens, const Tensor& y);

 private:
  std::int64_t vocab_, context_, width_;
  Tensor tokens_;
};

// Causal self-attention without projections: [B, T, (H + 2G)·hs] (the H query heads, then the G
// key heads, then the G value heads side by side: the output of one Linear; GPT-2's [q | k | v]
// with G = H) -> [B, T, H·hs]. Query head h reads key/value head h / (H / G). With the flash kernel
// (the default) it keeps its output and a log-sum-exp per query and head ([B, H, T] f32) for
// backward; with the materialized one the probabilities [B, H, T, T]. No parameters.
class CausalSelfAttention : public Module {
 public:
  explicit CausalSelfAttention(std::int64_t heads, AttentionOptions options = {});
  std::int64_t heads() const { return heads_; }
  std::int64_t kv_heads() const { return kv_heads_; }
  const AttentionOptions& options() const { return options_; }
  std::string describe() const override;
  // [T, (H + 2G)·hs] -> [T, H·hs]: 4·T²·H·hs forward (the scores and their use, the full T x T as
  // PaLM counts; the flash kernel's recomputation in backward is not counted, as FlashAttention's
  // MFU does not count it).
  Flops flops(const Shape& sample, Shape& out) const override;
  // For qkv [B, T, (H + 2G)·hs]: its output [B, T, H·hs] (slot 0) and the saved tensor (1), both
  // kept for backward, and dqkv (2) where the input needs a gradient.
  std::vector<BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;
  // The largest stream-ordered scratch its GPU kernels take, forward or backward, for such an
  // input (not Module::buffer's, and not in Storage's count on a GPU).
  std::int64_t gpu_scratch_bytes(const Shape& input, DType dtype) const;

 protected:
  Tensor forward_impl(const Tensor& qkv) override;
  Tensor backward_impl(const Tensor& dy) override;

 private:
  std::int64_t heads_, kv_heads_;
  AttentionOptions options_;
  Tensor qkv_, saved_, out_;  // saved_: the probabilities (materialized) or the log-sum-exp (flash)
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
  // As Linear's: y (slot 0), dx (1) where the input needs a gradient, a frozen weight's scratch (2).
  std::vector<BufferStatement> buffer_statements(const Shape& input, DType dtype, Shape& out) const override;
  Parameter& weight() const { return weight_; }

 protected:
  Tensor forward_impl(const Tensor& x) override;
  Tensor backward_impl(const Tensor& dy) override;
  // Forward's multiply, y = x · weight^T, and backward's (the weight's gradient added, not
  // reported ready; dx = dy · weight where dx is defined), on given tensors: as nn::Linear's, for
  // parallel::ColumnParallelTiedLinear to gather and scatter around.
  void multiply(const Tensor& x, const Tensor& y);
  void multiply_backward(const Tensor& x, const Tensor& dy, const Tensor& dx);
  Tensor x_;  // forward input, for backward

 private:
  Parameter& weight_;
};

}  // namespace tutti::nn
