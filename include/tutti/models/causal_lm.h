// What tutti's decoder-only language models share (models::Gpt, models::Llama): tokens [B, T] i32
// -> logits [B, T, padded_vocab], a stack of `layers` transformer layers of two residual blocks
// each (attention, then MLP), activation checkpointing by block, ZeRO-3's gather groups by layer,
// the FLOPs of a token, and sampling. A trainer written against CausalLm trains either model
// (examples/train_gpt does).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/comm/communicator.h"
#include "tutti/nn/loss.h"
#include "tutti/nn/module.h"
#include "tutti/nn/sequential.h"
#include "tutti/parallel/sequence_parallel.h"

namespace tutti::models {

// Which residual blocks recompute their activations in backward (activation checkpointing,
// CausalLm::set_recompute; nn::Residual::set_recompute does the work). Every layer has two:
// attention and MLP. A checkpointed one keeps only its input and output between forward and
// backward and runs its body's forward again in backward; gradients stay bit-identical.
// docs/gpt.md measures what each saves and costs.
struct Recompute {
  enum class Mode : std::uint8_t {
    none,    // keep every activation (the default)
    blocks,  // both residuals of every layer: the least memory, about one more forward
    every,   // both residuals of layers 0, k, 2k, ... (k = every)
    attn,    // only the attention residuals
    mlp,     // only the MLP residuals
  };
  Mode mode = Mode::none;
  std::int64_t every = 1;  // k of Mode::every (>= 1)

  // "none", "blocks", "every:K" (K >= 1), "attn" or "mlp"; InvalidArgument naming the choices
  // otherwise.
  static Recompute parse(std::string_view text);
  // The spelling parse() reads.
  std::string str() const;
  // Whether layer `layer`'s MLP residual (mlp true) or attention residual (false) recomputes.
  bool checkpoints(std::int64_t layer, bool mlp) const;
};

// How a model built over a tensor-parallel group (Gpt(config, group, options), Llama's) splits.
struct TensorParallelOptions {
  // Sequence parallelism (parallel/sequence_parallel.h): the norms and the residual stream hold
  // 1/tp of the batch's rows [B·T / tp, width] rather than all of them; the final norm's output
  // (last_hidden()) too. Trains as without it, up to the order of the sums.
  bool sequence_parallel = false;
};

class CausalLm : public nn::Module {
 public:
  // Tokens the data can hold, and the logits' width (>= vocab: rows the embedding may pad).
  virtual std::int64_t vocab() const = 0;
  virtual std::int64_t padded_vocab() const = 0;
  // The longest sequence the model takes.
  virtual std::int64_t context() const = 0;
  // Transformer layers (two residual blocks each).
  std::int64_t layers() const { return static_cast<std::int64_t>(blocks_.size()) / 2; }
  // The shape in a few words ("L4 H4 C128 T128 V256"): what a checkpoint must match.
  virtual std::string fingerprint() const = 0;
  // N of the MFU formula: the parameters that take part in a multiply-add per token (every one but
  // a position table), as nanoGPT and PaLM count.
  virtual std::int64_t flop_parameters() = 0;
  // Model FLOPs per trained token (forward + backward) at sequence length T, as the layers count
  // them (Module::flops).
  double flops_per_token(std::int64_t T) const;
  // A sample is a sequence of T tokens: [T] -> [T, padded vocab]; the children's FLOPs summed in
  // order.
  nn::Flops flops(const Shape& sample, Shape& out) const override;
  // The final norm's output of the last forward, [B, T, width]: what the head multiplies (with
  // sequence parallelism, while it splits the rows, this rank's [B·T / tp, width]).
  const Tensor& last_hidden() const { return hidden_; }
  // The tensor-parallel group the logits' classes are split over (a model built over one: each
  // rank's logits are [B, T, padded_vocab / tp], its columns in rank order), or nullptr where
  // every rank has the whole logits.
  Communicator* vocab_group() const { return vocab_group_; }
  // The model's sequence-parallel split (TensorParallelOptions::sequence_parallel), or nullptr.
  parallel::SequenceParallel* sequence_parallel() const { return sequence_.get(); }
  // Bytes of what the layers share outside their own buffers (Module::buffer_statements) once the
  // model has trained on sequences of T tokens: Llama's rotary table; 0 for GPT.
  virtual std::int64_t shared_buffer_bytes(std::int64_t /*T*/) const { return 0; }
  // The loss these logits take: nn::CrossEntropyLoss, or over vocab_group()
  // parallel::VocabParallelCrossEntropy (COLLECTIVE over it). The group must outlive the loss.
  std::unique_ptr<nn::CrossEntropyLoss> make_loss(std::int64_t ignore_index = -100) const;

  // Activation checkpointing by `policy` (see Recompute), from the next forward on; all
  // checkpointed residuals share one workspace, sized for the largest body. Throws
  // InvalidArgument for every:K with K > layers, or between a forward and its backward.
  CausalLm& set_recompute(const Recompute& policy);
  const Recompute& recompute() const { return recompute_; }
  // Bytes the checkpointed residuals' shared workspace holds now (0 without recomputation).
  std::int64_t recompute_workspace_bytes() const;

  // ZeRO-3's gather group of a parameter (ddp::ShardParameters::gather_group) by the layer it belongs to:
  // "layer <l>" for both residual blocks of layer l ("blocks.<2l>.*", "blocks.<2l+1>.*"), "" (the
  // resident group) otherwise. Llama::gather_group refines it for an untied head.
  static std::string gather_group(const std::string& name);

 protected:
  CausalLm() = default;
  // Made by a model with sequence parallelism, before (so destroyed after) the layers using it.
  std::unique_ptr<parallel::SequenceParallel> sequence_;
  nn::Sequential blocks_;  // the layers' residual blocks, registered by the model as "blocks"
  Tensor hidden_;
  Communicator* vocab_group_ = nullptr;  // set by a model whose head splits the vocabulary

 private:
  Recompute recompute_;
  std::shared_ptr<nn::RecomputeWorkspace> workspace_;
};

struct SampleOptions {
  std::int64_t tokens = 200;  // new tokens to generate
  float temperature = 0.8f;   // logits are divided by it (> 0)
  std::int64_t top_k = 40;    // sample among the k likeliest (0: all)
  std::uint64_t seed = 1;
};

// Continues `prompt` (at least one token) by options.tokens tokens drawn one at a time from
// the model (eval mode; each step runs the last `context` tokens through it, no cache).
// Reads each step's last logits on the host. Not collective: call it on one rank; with tensor
// parallelism every rank of the group calls it alike (the forward, and the gather of the split
// logits' last row, are COLLECTIVE over the group) and draws the same tokens.
std::vector<std::int32_t> generate(CausalLm& model, std::vector<std::int32_t> prompt, const SampleOptions& options);

}  // namespace tutti::models
