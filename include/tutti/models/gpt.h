// A GPT-2 decoder built from tutti's nn layers: token + position embedding, `layers`
// pre-LayerNorm blocks (causal self-attention, then an MLP 4x as wide with GELU, each a
// residual branch), a final LayerNorm, and an output head tied to the token embedding;
// GPT-2's initialization. examples/train_gpt trains it (docs/gpt.md); a program of its own
// builds it in one line:
//
// doc-test: wrap-main
// setup: const tutti::Device device = tutti::Device::cpu();
// setup: const std::uint64_t seed = 1;
//   tutti::models::Gpt model(tutti::models::GptConfig::preset("gpt-tiny"));
//   model.to(device).init(seed);   // tokens [B, T] i32 -> logits [B, T, padded_vocab]
//
// models/ is the layer above nn/: whole models made of nn's layers (docs/architecture.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tutti/comm/communicator.h"
#include "tutti/models/causal_lm.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/module.h"
#include "tutti/nn/sequential.h"
#include "tutti/nn/transformer.h"

namespace tutti::models {

struct GptConfig {
  std::int64_t vocab = 256;         // tokens the data can hold
  std::int64_t padded_vocab = 256;  // rows of the embedding and columns of the logits (>= vocab;
                                    // GPT-2's 50257 is padded to 50304, a multiple of 128, as
                                    // llm.c and nanoGPT do: the GEMMs run faster)
  std::int64_t context = 128;       // the longest sequence (rows of the position embedding)
  std::int64_t layers = 4;
  std::int64_t heads = 4;
  std::int64_t width = 128;  // C; heads must divide it
  // Which kernel computes attention: tiled (memory linear in T, the default) or the one that keeps
  // the T x T probabilities. Not part of the fingerprint: the parameters are the same.
  nn::AttentionKernel attention = nn::AttentionKernel::flash;

  // "gpt-tiny" (4 layers, 4 heads, 128 wide, context 128, byte vocabulary: for a 2-core CPU)
  // or GPT-2 in llm.c's configurations, context 1024 and vocabulary 50257 padded to 50304:
  // "gpt2-124m" (12 layers, 12 heads, 768 wide), "gpt2-350m" (24, 16, 1024), "gpt2-774m"
  // (36, 20, 1280) or "gpt2-1558m" (48, 25, 1600). Throws InvalidArgument for another name.
  static GptConfig preset(const std::string& name);
  // The names preset() knows, smallest first.
  static std::vector<std::string> preset_names();
  // Parameters of a Gpt of this configuration (without building it): padded_vocab·C +
  // context·C + layers·(12·C² + 13·C) + 2·C.
  std::int64_t parameter_count() const;
  // "L4 H4 C128 T128 V256" (and "/50304" when padded): what a checkpoint must match.
  std::string fingerprint() const;
};

// Rounds v up to a multiple of 128 (llm.c's padding of GPT-2's vocabulary).
std::int64_t pad_vocab(std::int64_t v);

// Parameters (registration order, so Module::parameters() and state_dict() list them so):
// "embed.wte" [padded_vocab, C] (also the output head's weight), "embed.wpe" [context, C], then
// per layer l the blocks "blocks.<2l>.body.{0,1,3}" (attention: LayerNorm, Linear(C, 3C),
// Linear(C, C)) and "blocks.<2l+1>.body.{0,1,3}" (MLP: LayerNorm, Linear(C, 4C), Linear(4C, C)),
// and "ln_f". Initialization (GPT-2's): N(0, 0.02²) for the embeddings and weight matrices,
// N(0, (0.02 / sqrt(2·layers))²) for the residual branches' output projections, zero biases,
// LayerNorm gains 1. The embeddings, biases and LayerNorms are marked no_weight_decay by their
// layers, so optim::weight_decay_groups(model.parameters(), wd) decays exactly the blocks'
// weight matrices (12·C² per layer).
//
// What every model of tutti's layers shares (recompute, gather groups, FLOPs, generate()) is
// CausalLm's (causal_lm.h).
class Gpt : public CausalLm {
 public:
  // Throws InvalidArgument when heads do not divide the width, layers < 1 or padded_vocab < vocab.
  explicit Gpt(const GptConfig& config);
  // Tensor parallelism over `tensor_parallel` (parallel/tensor_parallel.h, Megatron's): each
  // layer's attention heads and MLP features split across the group's ranks (the [q | k | v]
  // and first MLP projections column-parallel, the output projections row-parallel) and the
  // vocabulary (parallel/vocab_parallel.h: wte's rows, so the tied head's and the logits'
  // columns, [B, T, padded_vocab / tp] per rank; train it with make_loss()); the position table
  // and the LayerNorms whole on every rank. Forward and backward are COLLECTIVE over the group
  // (two allreduces a layer each way, one for the embedding, two small ones for the loss); the
  // heads and padded_vocab must divide by its size (InvalidArgument). Module::init gives each
  // rank its slices of the values the unsplit Gpt gets for the seed;
  // parallel::whole_state_dict / split_state_dict convert its state to and from the unsplit
  // model's. options.sequence_parallel splits the LayerNorms' and the residual stream's rows too
  // (parallel/sequence_parallel.h). Keeps a reference to the group: it must outlive the model.
  Gpt(const GptConfig& config, Communicator& tensor_parallel, const TensorParallelOptions& options = {});
  const GptConfig& config() const { return config_; }
  std::string describe() const override;
  std::int64_t vocab() const override { return config_.vocab; }
  std::int64_t padded_vocab() const override { return config_.padded_vocab; }
  std::int64_t context() const override { return config_.context; }
  std::string fingerprint() const override { return config_.fingerprint(); }
  // Every parameter but the position embedding. flops_per_token(T) is, as the layers count it,
  // 6·(12·L·C² + V·C) + 12·L·C·T: PaLM's 6·N + 12·L·C·T (appendix B: the attention scores and their
  // use, the full T x T without halving for the causal mask) with N the weight matrices'
  // parameters (biases and LayerNorms, 0.1% of GPT-2's, do no matrix product).
  std::int64_t flop_parameters() override;
  // The token embedding, which the output head shares.
  nn::Parameter& embed_weight() { return embed_->wte; }
  // The position embedding.
  const nn::Parameter* position_embedding() const { return &embed_->wpe; }
  // ZeRO-3's gather groups are CausalLm::gather_group's: a layer per group; the embeddings (which
  // the tied head reads again at the end) and ln_f resident.

 protected:
  // tokens [B, T] i32 -> logits [B, T, padded_vocab] (/ tp: this rank's columns).
  Tensor forward_impl(const Tensor& tokens) override;
  Tensor backward_impl(const Tensor& dlogits) override;

 private:
  Gpt(const GptConfig& config, Communicator* tp, const TensorParallelOptions& options);

  GptConfig config_;
  // Whole, or with tensor parallelism their vocabulary-parallel kinds (parallel/vocab_parallel.h).
  std::unique_ptr<nn::TokenPositionEmbedding> embed_;
  std::unique_ptr<nn::LayerNorm> ln_f_;  // or parallel::SequenceParallelLayerNorm
  std::unique_ptr<nn::TiedLinear> head_;
  Communicator* tp_ = nullptr;  // the tensor-parallel group, or none
};

}  // namespace tutti::models
