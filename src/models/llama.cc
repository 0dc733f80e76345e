#include "tutti/models/llama.h"

#include <sstream>

#include "tutti/core/error.h"
#include "tutti/parallel/tensor_parallel.h"
#include "tutti/parallel/vocab_parallel.h"

namespace tutti::models {

using nn::Linear;
using nn::LinearOptions;
using nn::Residual;
using nn::RMSNorm;
using nn::WeightInit;

namespace {

// Meta's releases as their config.json gives them.
LlamaConfig llama3(std::int64_t layers, std::int64_t width, std::int64_t ffn, double rope_factor, bool tied) {
  LlamaConfig c;
  c.vocab = 128256;
  c.context = 131072;
  c.layers = layers;
  c.heads = 32;
  c.kv_heads = 8;
  c.width = width;
  c.head_size = width / 32;
  c.ffn = ffn;
  c.norm_eps = 1e-5f;
  c.rope.theta = 500000.0;
  c.rope.scaling = {rope_factor, 1.0, 4.0, 8192};
  c.tied_head = tied;
  return c;
}

}  // namespace

std::vector<std::string> LlamaConfig::preset_names() { return {"llama-tiny", "llama3.2-1b", "llama3.1-8b"}; }

LlamaConfig LlamaConfig::preset(const std::string& name) {
  if (name == "llama-tiny") return LlamaConfig{};
  if (name == "llama3.2-1b") return llama3(16, 2048, 8192, 32.0, true);
  if (name == "llama3.1-8b") return llama3(32, 4096, 14336, 8.0, false);
  std::string known;
  for (const std::string& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  TUTTI_THROW(InvalidArgument, "unknown model '", name, "' (", known, ")");
}

std::int64_t LlamaConfig::parameter_count() const {
  const std::int64_t C = width, hs = head_dim();
  const std::int64_t layer = 2 * C + C * (heads + 2 * kv_heads) * hs + heads * hs * C + 3 * C * ffn;
  return vocab * C * (tied_head ? 1 : 2) + layers * layer + C;
}

std::string LlamaConfig::fingerprint() const {
  std::ostringstream s;
  s << "Llama L" << layers << " H" << heads << "/" << kv_heads << " C" << width << " F" << ffn << " T" << context
    << " V" << vocab;
  if (head_size > 0) s << " hs" << head_size;
  if (tied_head) s << " tied";
  if (rope.theta != 10000.0) s << " theta" << rope.theta;
  if (rope.scaling.factor > 0) s << " llama3x" << rope.scaling.factor;
  return s.str();
}

void LlamaConfig::validate() const {
  TUTTI_CHECK_ARG(vocab >= 1 && context >= 1 && layers >= 1 && heads >= 1 && kv_heads >= 1 && width >= 1 && ffn >= 1 &&
                      head_size >= 0 && norm_eps >= 0,
                  "Llama: every size must be positive (", fingerprint(), ")");
  TUTTI_CHECK_ARG(heads % kv_heads == 0, "Llama: ", kv_heads, " kv_heads must divide ", heads, " heads (",
                  fingerprint(), ")");
  TUTTI_CHECK_ARG(head_size > 0 || width % heads == 0, "Llama: ", heads, " heads must divide the width ", width,
                  " when head_size is not given (", fingerprint(), ")");
  TUTTI_CHECK_ARG(head_dim() % 2 == 0, "Llama: the head size ", head_dim(),
                  " must be even (the rotary embedding turns pairs of columns)");
  TUTTI_CHECK_ARG(attention == nn::AttentionKernel::flash || kv_heads == heads,
                  "Llama: the materialized attention kernel has no grouped-query attention (", kv_heads,
                  " kv_heads for ", heads, " heads); use flash");
}

Llama::Llama(const LlamaConfig& config) : Llama(config, nullptr, {}) {}

Llama::Llama(const LlamaConfig& config, Communicator& tensor_parallel, const TensorParallelOptions& options)
    : Llama(config, &tensor_parallel, options) {}

Llama::Llama(const LlamaConfig& config, Communicator* tp, const TensorParallelOptions& options)
    : config_((config.validate(), config)),
      tp_(tp),
      rope_(std::make_shared<nn::RopeTable>(config.head_dim(), config.rope)) {
  const std::int64_t C = config.width, hs = config.head_dim(), H = config.heads, G = config.kv_heads;
  const LinearOptions weight{.bias = false, .init = WeightInit::normal(0.02)};
  const nn::AttentionOptions attention{.kv_heads = G, .kernel = config.attention};
  if (tp_ != nullptr) {
    // Megatron's split (as Gpt's): each rank H/tp query heads and G/tp key/value heads, F/tp of the
    // MLP's features; the output and down projections sum over the group.
    const std::int64_t n = tp_->size(), F = config.ffn;
    TUTTI_CHECK_ARG(H % n == 0 && G % n == 0 && F % n == 0 && config.vocab % n == 0, "Llama: ", H, " heads, ", G,
                    " key/value heads, ffn ", F, " and the vocabulary ", config.vocab,
                    " must divide by the tensor-parallel group's ", n, " rank(s)");
    // With sequence parallelism the RMSNorms and the residual stream hold 1/tp of the rows.
    if (options.sequence_parallel) sequence_ = std::make_unique<parallel::SequenceParallel>(*tp_);
    parallel::SequenceParallel* const sp = sequence_.get();
    auto rms_norm = [&](nn::Sequential& body) -> nn::Sequential& {
      return sp ? body.add<parallel::SequenceParallelRMSNorm>(*sp, C, config.norm_eps)
                : body.add<RMSNorm>(C, config.norm_eps);
    };
    embed_ = std::make_unique<parallel::VocabParallelEmbedding>(*tp_, config.vocab, C, sp);
    norm_ = sp ? std::unique_ptr<RMSNorm>(std::make_unique<parallel::SequenceParallelRMSNorm>(*sp, C, config.norm_eps))
               : std::make_unique<RMSNorm>(C, config.norm_eps);
    vocab_group_ = tp_;
    const nn::AttentionOptions local{.kv_heads = G / n, .kernel = config.attention};
    for (std::int64_t l = 0; l < config.layers; ++l) {
      rms_norm(blocks_.emplace<Residual>().body())
          .add<parallel::ColumnParallelLinear>(*tp_, C, (H + 2 * G) * hs, weight,
                                               std::vector<std::int64_t>{H * hs, G * hs, G * hs}, sp)
          .add<nn::RotaryEmbedding>(H / n, G / n, rope_)
          .add<nn::CausalSelfAttention>(H / n, local)
          .add<parallel::RowParallelLinear>(*tp_, H * hs, C, weight, sp);
      rms_norm(blocks_.emplace<Residual>().body())
          .add<parallel::ColumnParallelLinear>(*tp_, C, 2 * F, weight, std::vector<std::int64_t>{F, F}, sp)
          .add<nn::SwiGLU>()
          .add<parallel::RowParallelLinear>(*tp_, F, C, weight, sp);
    }
  } else {
    embed_ = std::make_unique<nn::TokenEmbedding>(config.vocab, C);
    norm_ = std::make_unique<RMSNorm>(C, config.norm_eps);
    for (std::int64_t l = 0; l < config.layers; ++l) {
      blocks_.emplace<Residual>()
          .body()
          .add<RMSNorm>(C, config.norm_eps)
          .add<Linear>(C, (H + 2 * G) * hs, weight)
          .add<nn::RotaryEmbedding>(H, G, rope_)
          .add<nn::CausalSelfAttention>(H, attention)
          .add<Linear>(H * hs, C, weight);
      blocks_.emplace<Residual>()
          .body()
          .add<RMSNorm>(C, config.norm_eps)
          .add<Linear>(C, 2 * config.ffn, weight)
          .add<nn::SwiGLU>()
          .add<Linear>(config.ffn, C, weight);
    }
  }
  register_module("embed", *embed_);
  register_module("blocks", blocks_);
  register_module("norm", *norm_);
  // The head: with tp, its rows of the vocabulary (the tied table's, or an untied weight's).
  if (config.tied_head) {
    tied_head_ = tp_ ? std::make_unique<parallel::ColumnParallelTiedLinear>(*tp_, embed_->weight, sequence_.get())
                     : std::make_unique<nn::TiedLinear>(embed_->weight);
    register_module("head", *tied_head_);
  } else {
    untied_head_ = tp_ ? std::make_unique<parallel::ColumnParallelLinear>(*tp_, C, config.vocab, weight,
                                                                          std::vector<std::int64_t>{}, sequence_.get())
                       : std::make_unique<Linear>(C, config.vocab, weight);
    register_module("head", *untied_head_);
  }
}

std::string Llama::describe() const {
  return "Llama(" + config_.fingerprint() + (tp_ ? ", tp " + std::to_string(tp_->size()) : "") +
         (sequence_ ? ", sequence-parallel" : "") + ")";
}

std::int64_t Llama::flop_parameters() {
  std::int64_t n = 0;
  for (auto* p : parameters()) n += p->numel();
  return n;
}

std::string Llama::group_of(const std::string& name) const { return gather_groups(config_)(name); }

std::function<std::string(const std::string&)> Llama::gather_groups(const LlamaConfig& config) {
  return [tied = config.tied_head](const std::string& name) -> std::string {
    if (name.rfind("blocks.", 0) == 0) return CausalLm::gather_group(name);
    if (tied) return "";
    if (name.rfind("embed.", 0) == 0) return "embedding";
    if (name.rfind("head.", 0) == 0) return "head";
    return "";
  };
}

Tensor Llama::forward_impl(const Tensor& tokens) {
  TUTTI_CHECK_ARG(tokens.ndim() == 2 && tokens.dim(1) <= config_.context, describe(),
                  ": tokens must be [B, T <= ", config_.context, "], got ", tokens.str());
  hidden_ = norm_->forward(blocks_.forward(embed_->forward(tokens)));
  return untied_head_ ? untied_head_->forward(hidden_) : tied_head_->forward(hidden_);
}

Tensor Llama::backward_impl(const Tensor& dlogits) {
  const Tensor dh = untied_head_ ? untied_head_->backward(dlogits) : tied_head_->backward(dlogits);
  embed_->backward(blocks_.backward(norm_->backward(dh)));
  return Tensor();  // token ids have no gradient
}

}  // namespace tutti::models
