// A Llama-family decoder (Llama 2/3 and the models shaped like them) built from tutti's nn layers:
// a token embedding, `layers` pre-norm blocks (RMSNorm, then grouped-query causal self-attention
// with rotary position embeddings; RMSNorm, then a SwiGLU MLP; each a residual branch), a final
// RMSNorm and an output head, untied or tied to the embedding. The math is Hugging Face
// transformers' LlamaForCausalLM's (tests/models/hf checks it against transformers), so a model
// saved there loads here (models/hf.h) and back. A program builds it in one line:
//
// doc-test: wrap-main
// setup: const tutti::Device device = tutti::Device::cpu();
// setup: const std::uint64_t seed = 1;
//   tutti::models::Llama model(tutti::models::LlamaConfig::preset("llama-tiny"));
//   model.to(device).init(seed);   // tokens [B, T] i32 -> logits [B, T, vocab]
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tutti/comm/communicator.h"
#include "tutti/models/causal_lm.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/transformer.h"

namespace tutti::models {

struct LlamaConfig {
  std::int64_t vocab = 256;    // vocab_size: rows of the embedding and columns of the logits
  std::int64_t context = 256;  // max_position_embeddings: the longest sequence
  std::int64_t layers = 4;     // num_hidden_layers
  std::int64_t heads = 4;      // num_attention_heads (H)
  std::int64_t kv_heads = 2;   // num_key_value_heads (G, dividing H; H for multi-head attention)
  std::int64_t width = 128;    // hidden_size (C)
  std::int64_t head_size = 0;  // head_dim; 0: width / heads
  std::int64_t ffn = 384;      // intermediate_size (F) of the SwiGLU MLP
  float norm_eps = 1e-5f;      // rms_norm_eps
  nn::RopeOptions rope;        // rope_theta and the llama3 rope_scaling
  bool tied_head = false;      // tie_word_embeddings: the head is the embedding's transpose
  // Which kernel computes attention (not part of the fingerprint: the parameters are the same). The
  // materialized one has no grouped-query attention, so it needs kv_heads == heads.
  nn::AttentionKernel attention = nn::AttentionKernel::flash;

  // "llama-tiny" (4 layers, 4 heads sharing 2 key/value heads, 128 wide, MLP 384, context 256,
  // byte vocabulary: for tests and a 2-core CPU), or the shapes of Meta's releases as their
  // config.json gives them (vocabulary 128,256, rope_theta 500,000 with llama3 scaling, context
  // 131,072): "llama3.2-1b" (16 layers, 32 heads, 8 kv heads, 2048 wide, MLP 8192, head size 64,
  // tied head) and "llama3.1-8b" (32 layers, 32 heads, 8 kv heads, 4096 wide, MLP 14336, untied).
  // Throws InvalidArgument for another name.
  static LlamaConfig preset(const std::string& name);
  // The names preset() knows, smallest first.
  static std::vector<std::string> preset_names();
  // head_size, or width / heads when 0.
  std::int64_t head_dim() const { return head_size > 0 ? head_size : width / heads; }
  // Parameters of a Llama of this configuration (without building it): vocab·C (embedding)
  // + layers·(2·C + C·(H + 2G)·hs + H·hs·C + 3·C·F) + C, + vocab·C for an untied head.
  std::int64_t parameter_count() const;
  // "Llama L4 H4/2 C128 F384 T256 V256" (and " hs64" when set, " tied", " theta500000",
  // " llama3x32"): what a checkpoint must match.
  std::string fingerprint() const;
  // InvalidArgument naming what is wrong: sizes not positive, kv_heads not dividing heads, an odd
  // head size (rotary pairs), the materialized kernel with grouped heads.
  void validate() const;
};

// Parameters (registration order): "embed.weight" [vocab, C]; per layer l the attention block
// "blocks.<2l>.body.{0,1,4}" (RMSNorm "weight" [C], the q/k/v projection Linear(C, (H + 2G)·hs)
// whose rows are the H query heads, then the G key heads, then the G value heads, and the output
// projection Linear(H·hs, C)) and the MLP block "blocks.<2l+1>.body.{0,1,3}" (RMSNorm, the
// gate/up projection Linear(C, 2F) whose rows are [gate | up], and the down projection
// Linear(F, C)); "norm.weight"; and "head.weight" [vocab, C] unless the head is tied. No biases.
// Initialization (Hugging Face's): N(0, 0.02²) for the embedding and every weight matrix, the norms'
// weights 1. The embedding and the norms are marked no_weight_decay.
class Llama : public CausalLm {
 public:
  // Throws InvalidArgument for an invalid configuration (LlamaConfig::validate).
  explicit Llama(const LlamaConfig& config);
  // Tensor parallelism over `tensor_parallel` (parallel/tensor_parallel.h, as models::Gpt's): each
  // layer's query and key/value heads (the q/k/v projection column-parallel by blocks {H·hs, G·hs,
  // G·hs}, the output projection row-parallel) and its MLP features (the gate/up projection by
  // blocks {F, F}, the down projection row-parallel) split across the group, and the vocabulary
  // (parallel/vocab_parallel.h: the embedding's rows and the head's, tied or not, so the logits'
  // columns, [B, T, vocab / tp] per rank; train it with make_loss()); the norms whole on every
  // rank, or with options.sequence_parallel holding 1/tp of the rows (parallel/sequence_parallel.h).
  // COLLECTIVE forward and backward over the group; heads, kv_heads, ffn and vocab must divide by
  // its size (InvalidArgument). Module::init gives each rank its slices of the unsplit Llama's
  // values for the seed. Keeps a reference to the group.
  Llama(const LlamaConfig& config, Communicator& tensor_parallel, const TensorParallelOptions& options = {});
  const LlamaConfig& config() const { return config_; }
  std::string describe() const override;
  std::int64_t vocab() const override { return config_.vocab; }
  std::int64_t padded_vocab() const override { return config_.vocab; }
  std::int64_t context() const override { return config_.context; }
  std::string fingerprint() const override { return config_.fingerprint(); }
  // Every parameter: Llama has no position table. With a tied head its weight (the embedding)
  // counts once, though it multiplies twice: the head's product is counted by its layer's FLOPs.
  std::int64_t flop_parameters() override;
  // The rotary table of T positions.
  std::int64_t shared_buffer_bytes(std::int64_t T) const override { return rope_->bytes_for(T); }
  nn::Parameter& embed_weight() { return embed_->weight; }
  // The untied head's weight; null when the head is tied to the embedding.
  nn::Parameter* head_weight() { return untied_head_ ? &untied_head_->weight : nullptr; }
  // The rotary table every layer shares (its bytes: RopeTable::bytes).
  const nn::RopeTable& rope_table() const { return *rope_; }
  // ZeRO-3's gather groups: a layer per group (CausalLm::gather_group); the final norm resident;
  // the embedding resident when the head is tied to it (the head reads it again at the end), else
  // the embedding and the untied head each a group of their own ("embedding", "head"), gathered for
  // their one use, so that no rank holds both whole between them.
  std::string group_of(const std::string& name) const;
  // group_of for a configuration, as a function (ddp::ShardParameters::gather_group).
  static std::function<std::string(const std::string&)> gather_groups(const LlamaConfig& config);

 protected:
  // tokens [B, T] i32 -> logits [B, T, vocab] (/ tp: this rank's columns).
  Tensor forward_impl(const Tensor& tokens) override;
  Tensor backward_impl(const Tensor& dlogits) override;

 private:
  Llama(const LlamaConfig& config, Communicator* tp, const TensorParallelOptions& options);

  LlamaConfig config_;
  Communicator* tp_ = nullptr;  // the tensor-parallel group, or none
  std::shared_ptr<nn::RopeTable> rope_;
  std::unique_ptr<nn::TokenEmbedding> embed_;  // whole, or parallel::VocabParallelEmbedding
  std::unique_ptr<nn::RMSNorm> norm_;          // or parallel::SequenceParallelRMSNorm
  std::unique_ptr<nn::Linear> untied_head_;
  std::unique_ptr<nn::TiedLinear> tied_head_;
};

}  // namespace tutti::models
