#include "tutti/models/gpt.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <random>
#include <sstream>

#include "tutti/core/error.h"
#include "tutti/core/stream.h"
#include "tutti/parallel/sequence_parallel.h"
#include "tutti/parallel/tensor_parallel.h"
#include "tutti/parallel/vocab_parallel.h"

namespace tutti::models {

using nn::GELU;
using nn::LayerNorm;
using nn::Linear;
using nn::LinearOptions;
using nn::Residual;
using nn::WeightInit;

std::int64_t pad_vocab(std::int64_t v) { return (v + 127) / 128 * 128; }

namespace {
// GPT-2's sizes in llm.c's configurations (train_gpt2.cu's d12, d24, d36, d48).
struct Gpt2Size {
  const char* name;
  std::int64_t layers, heads, width;
};
constexpr Gpt2Size kGpt2Sizes[] = {
    {"gpt2-124m", 12, 12, 768},
    {"gpt2-350m", 24, 16, 1024},
    {"gpt2-774m", 36, 20, 1280},
    {"gpt2-1558m", 48, 25, 1600},
};
}  // namespace

std::vector<std::string> GptConfig::preset_names() {
  std::vector<std::string> names{"gpt-tiny"};
  for (const Gpt2Size& s : kGpt2Sizes) names.emplace_back(s.name);
  return names;
}

GptConfig GptConfig::preset(const std::string& name) {
  GptConfig c;
  if (name == "gpt-tiny") return c;
  for (const Gpt2Size& s : kGpt2Sizes) {
    if (name != s.name) continue;
    c.vocab = 50257;
    c.padded_vocab = pad_vocab(c.vocab);
    c.context = 1024;
    c.layers = s.layers;
    c.heads = s.heads;
    c.width = s.width;
    return c;
  }
  std::string known;
  for (const std::string& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  TUTTI_THROW(InvalidArgument, "unknown model '", name, "' (", known, ")");
}

std::int64_t GptConfig::parameter_count() const {
  const std::int64_t C = width;
  return padded_vocab * C + context * C + layers * (12 * C * C + 13 * C) + 2 * C;
}

std::string GptConfig::fingerprint() const {
  std::ostringstream s;
  s << "L" << layers << " H" << heads << " C" << width << " T" << context << " V" << vocab;
  if (padded_vocab != vocab) s << "/" << padded_vocab;
  return s.str();
}

Gpt::Gpt(const GptConfig& config) : Gpt(config, nullptr, {}) {}

Gpt::Gpt(const GptConfig& config, Communicator& tensor_parallel, const TensorParallelOptions& options)
    : Gpt(config, &tensor_parallel, options) {}

Gpt::Gpt(const GptConfig& config, Communicator* tp, const TensorParallelOptions& options) : config_(config), tp_(tp) {
  const std::int64_t C = config.width;
  TUTTI_CHECK_ARG(config.layers >= 1 && config.heads >= 1 && C % config.heads == 0 && config.vocab >= 1 &&
                      config.padded_vocab >= config.vocab,
                  "GPT: ", config.heads, " heads must divide the width ", C, ", with at least one layer and ",
                  "padded vocabulary >= vocabulary (", config.fingerprint(), ")");
  // GPT-2's initialization: N(0, 0.02²) weights, the residual branches' output projections
  // scaled by 1/sqrt(2 · layers), zero biases, LayerNorm gains 1.
  const LinearOptions weight{.init = WeightInit::normal(0.02)};
  const LinearOptions proj{.init = WeightInit::normal(0.02 / std::sqrt(2.0 * static_cast<double>(config.layers)))};
  const nn::AttentionOptions attention{.kernel = config.attention};
  if (tp_ != nullptr) {
    // Megatron's split: each rank its heads (the [q | k | v] projection's rows of them, 3 blocks)
    // and its 1/tp of the MLP's 4·width features; the output projections sum over the group. The
    // vocabulary: wte's rows, which the tied head reads, so the logits' columns.
    TUTTI_CHECK_ARG(config.heads % tp_->size() == 0 && config.padded_vocab % tp_->size() == 0, "GPT: ", config.heads,
                    " heads and the padded vocabulary ", config.padded_vocab,
                    " must divide by the tensor-parallel group's ", tp_->size(), " rank(s)");
    // With sequence parallelism the LayerNorms and the residual stream hold 1/tp of the rows.
    if (options.sequence_parallel) sequence_ = std::make_unique<parallel::SequenceParallel>(*tp_);
    parallel::SequenceParallel* const sp = sequence_.get();
    auto norm = [&](nn::Sequential& body) -> nn::Sequential& {
      return sp ? body.add<parallel::SequenceParallelLayerNorm>(*sp, C) : body.add<LayerNorm>(C);
    };
    embed_ = std::make_unique<parallel::VocabParallelTokenPositionEmbedding>(*tp_, config.padded_vocab, config.context,
                                                                             C, sp);
    head_ = std::make_unique<parallel::ColumnParallelTiedLinear>(*tp_, embed_->wte, sp);
    ln_f_ = sp ? std::unique_ptr<LayerNorm>(std::make_unique<parallel::SequenceParallelLayerNorm>(*sp, C))
               : std::make_unique<LayerNorm>(C);
    vocab_group_ = tp_;
    for (std::int64_t l = 0; l < config.layers; ++l) {
      norm(blocks_.emplace<Residual>().body())
          .add<parallel::ColumnParallelLinear>(*tp_, C, 3 * C, weight, std::vector<std::int64_t>{C, C, C}, sp)
          .add<nn::CausalSelfAttention>(config.heads / tp_->size(), attention)
          .add<parallel::RowParallelLinear>(*tp_, C, C, proj, sp);
      norm(blocks_.emplace<Residual>().body())
          .add<parallel::ColumnParallelLinear>(*tp_, C, 4 * C, weight, std::vector<std::int64_t>{}, sp)
          .add<GELU>()
          .add<parallel::RowParallelLinear>(*tp_, 4 * C, C, proj, sp);
    }
  } else {
    embed_ = std::make_unique<nn::TokenPositionEmbedding>(config.padded_vocab, config.context, C);
    head_ = std::make_unique<nn::TiedLinear>(embed_->wte);
    ln_f_ = std::make_unique<LayerNorm>(C);
    for (std::int64_t l = 0; l < config.layers; ++l) {
      blocks_.emplace<Residual>()
          .body()
          .add<LayerNorm>(C)
          .add<Linear>(C, 3 * C, weight)
          .add<nn::CausalSelfAttention>(config.heads, attention)
          .add<Linear>(C, C, proj);
      blocks_.emplace<Residual>()
          .body()
          .add<LayerNorm>(C)
          .add<Linear>(C, 4 * C, weight)
          .add<GELU>()
          .add<Linear>(4 * C, C, proj);
    }
  }
  register_module("embed", *embed_);
  register_module("blocks", blocks_);
  register_module("ln_f", *ln_f_);
  register_module("head", *head_);
}

std::string Gpt::describe() const {
  return "GPT(" + config_.fingerprint() + (tp_ ? ", tp " + std::to_string(tp_->size()) : "") +
         (sequence_ ? ", sequence-parallel" : "") + ")";
}

std::int64_t Gpt::flop_parameters() {
  std::int64_t n = 0;
  for (auto* p : parameters()) n += p->numel();
  return n - embed_->wpe.numel();
}

Tensor Gpt::forward_impl(const Tensor& tokens) {
  hidden_ = ln_f_->forward(blocks_.forward(embed_->forward(tokens)));
  return head_->forward(hidden_);
}

Tensor Gpt::backward_impl(const Tensor& dlogits) {
  embed_->backward(blocks_.backward(ln_f_->backward(head_->backward(dlogits))));
  return Tensor();  // token ids have no gradient
}

}  // namespace tutti::models
