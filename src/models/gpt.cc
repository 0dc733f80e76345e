#include "tutti/models/gpt.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <random>
#include <sstream>

#include "tutti/core/error.h"
#include "tutti/core/stream.h"

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

Gpt::Gpt(const GptConfig& config)
    : config_(config),
      embed_(config.padded_vocab, config.context, config.width),
      ln_f_(config.width),
      head_(embed_.wte) {
  const std::int64_t C = config.width;
  TUTTI_CHECK_ARG(config.layers >= 1 && config.heads >= 1 && C % config.heads == 0 && config.vocab >= 1 &&
                      config.padded_vocab >= config.vocab,
                  "GPT: ", config.heads, " heads must divide the width ", C, ", with at least one layer and ",
                  "padded vocabulary >= vocabulary (", config.fingerprint(), ")");
  // GPT-2's initialization: N(0, 0.02²) weights, the residual branches' output projections
  // scaled by 1/sqrt(2 · layers), zero biases, LayerNorm gains 1.
  const LinearOptions weight{.init = WeightInit::normal(0.02)};
  const LinearOptions proj{.init = WeightInit::normal(0.02 / std::sqrt(2.0 * static_cast<double>(config.layers)))};
  for (std::int64_t l = 0; l < config.layers; ++l) {
    blocks_.emplace<Residual>()
        .body()
        .add<LayerNorm>(C)
        .add<Linear>(C, 3 * C, weight)
        .add<nn::CausalSelfAttention>(config.heads)
        .add<Linear>(C, C, proj);
    blocks_.emplace<Residual>()
        .body()
        .add<LayerNorm>(C)
        .add<Linear>(C, 4 * C, weight)
        .add<GELU>()
        .add<Linear>(4 * C, C, proj);
  }
  register_module("embed", embed_);
  register_module("blocks", blocks_);
  register_module("ln_f", ln_f_);
  register_module("head", head_);
}

Recompute Recompute::parse(std::string_view text) {
  Recompute r;
  if (text == "none") return r;
  if (text == "blocks") {
    r.mode = Mode::blocks;
    return r;
  }
  if (text == "attn") {
    r.mode = Mode::attn;
    return r;
  }
  if (text == "mlp") {
    r.mode = Mode::mlp;
    return r;
  }
  constexpr std::string_view every = "every:";
  if (text.substr(0, every.size()) == every) {
    const std::string_view k = text.substr(every.size());
    std::int64_t value = 0;
    const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), value);
    if (ec == std::errc() && end == k.data() + k.size() && !k.empty() && value >= 1) {
      r.mode = Mode::every;
      r.every = value;
      return r;
    }
  }
  TUTTI_THROW(InvalidArgument, "recompute policy '", text,
              "': expected none, blocks, every:K (K >= 1: layers 0, K, 2K, ...), attn or mlp");
}

std::string Recompute::str() const {
  switch (mode) {
    case Mode::none: return "none";
    case Mode::blocks: return "blocks";
    case Mode::every: return "every:" + std::to_string(every);
    case Mode::attn: return "attn";
    case Mode::mlp: return "mlp";
  }
  return "none";
}

bool Recompute::checkpoints(std::int64_t layer, bool mlp) const {
  switch (mode) {
    case Mode::none: return false;
    case Mode::blocks: return true;
    case Mode::every: return every >= 1 && layer % every == 0;
    case Mode::attn: return !mlp;
    case Mode::mlp: return mlp;
  }
  return false;
}

Gpt& Gpt::set_recompute(const Recompute& policy) {
  TUTTI_CHECK_ARG(policy.mode != Recompute::Mode::every || (policy.every >= 1 && policy.every <= config_.layers),
                  "Gpt::set_recompute: ", policy.str(), " names every ", policy.every, "-th layer but ",
                  config_.fingerprint(), " has ", config_.layers, " layers (use 1 to ", config_.layers, ")");
  TUTTI_CHECK_ARG(!awaiting_backward(), "Gpt::set_recompute: between a forward and its backward (", policy.str(),
                  "); change it before a forward");
  recompute_ = policy;
  // One workspace for every checkpointed residual: the attention and MLP bodies number their
  // layers alike (LayerNorm, Linear, attention or GELU, Linear), so it holds the larger of each.
  workspace_ = policy.mode == Recompute::Mode::none ? nullptr : std::make_shared<nn::RecomputeWorkspace>();
  for (std::int64_t l = 0; l < config_.layers; ++l) {
    for (const bool mlp : {false, true}) {
      auto& block = static_cast<Residual&>(blocks_[static_cast<std::size_t>(2 * l + (mlp ? 1 : 0))]);
      block.set_recompute(policy.checkpoints(l, mlp) ? workspace_ : nullptr);
    }
  }
  return *this;
}

std::int64_t Gpt::recompute_workspace_bytes() const { return workspace_ ? workspace_->bytes() : 0; }

std::string Gpt::describe() const { return "GPT(" + config_.fingerprint() + ")"; }

std::int64_t Gpt::flop_parameters() {
  std::int64_t n = 0;
  for (auto* p : parameters()) n += p->numel();
  return n - embed_.wpe.numel();
}

nn::Flops Gpt::flops(const Shape& sample, Shape& out) const {
  nn::Flops sum;
  Shape shape = sample;
  for (const nn::Module* m : {static_cast<const nn::Module*>(&embed_), static_cast<const nn::Module*>(&blocks_),
                              static_cast<const nn::Module*>(&ln_f_), static_cast<const nn::Module*>(&head_)}) {
    Shape next;
    const nn::Flops f = m->flops(shape, next);
    sum.forward += f.forward;
    sum.backward += f.backward;
    shape = std::move(next);
  }
  out = shape;
  return sum;
}

double Gpt::flops_per_token(std::int64_t T) const { return training_flops_per_sample({T}) / static_cast<double>(T); }

std::string Gpt::gather_group(const std::string& name) {
  const std::string prefix = "blocks.";
  if (name.rfind(prefix, 0) != 0) return "";
  const std::size_t end = name.find('.', prefix.size());
  const std::string index = name.substr(prefix.size(), end - prefix.size());
  if (index.empty() || index.find_first_not_of("0123456789") != std::string::npos) return "";
  return "layer " + std::to_string(std::stoll(index) / 2);
}

Tensor Gpt::forward_impl(const Tensor& tokens) {
  hidden_ = ln_f_.forward(blocks_.forward(embed_.forward(tokens)));
  return head_.forward(hidden_);
}

Tensor Gpt::backward_impl(const Tensor& dlogits) {
  embed_.backward(blocks_.backward(ln_f_.backward(head_.backward(dlogits))));
  return Tensor();  // token ids have no gradient
}

std::vector<std::int32_t> generate(Gpt& model, std::vector<std::int32_t> prompt, const SampleOptions& options) {
  TUTTI_CHECK_ARG(!prompt.empty() && options.temperature > 0, "generate: needs a prompt and a positive temperature");
  const GptConfig& c = model.config();
  std::mt19937_64 rng(options.seed);
  const Stream& stream = model.stream();
  model.eval();
  std::vector<std::int32_t> out = prompt;
  std::vector<float> p(static_cast<std::size_t>(c.vocab));
  for (std::int64_t n = 0; n < options.tokens; ++n) {
    const std::int64_t T = std::min<std::int64_t>(c.context, static_cast<std::int64_t>(out.size()));
    const std::vector<std::int64_t> window(out.end() - T, out.end());
    const Tensor x = Tensor::from_ints(window, {1, T}, DType::i32).to(model.device(), stream);
    const Tensor logits = model.forward(x);
    const Tensor last = logits.view((T - 1) * c.padded_vocab, {c.padded_vocab}).to(Device::cpu(), stream);
    stream.synchronize();
    const std::vector<float> l = last.to_floats();
    // Softmax over the real vocabulary (the padding never occurs) at the temperature, among
    // the top k.
    std::vector<float> sorted(l.begin(), l.begin() + c.vocab);
    float cut = -INFINITY;
    if (options.top_k > 0 && options.top_k < c.vocab) {
      std::nth_element(sorted.begin(), sorted.begin() + (options.top_k - 1), sorted.end(), std::greater<float>());
      cut = sorted[static_cast<std::size_t>(options.top_k - 1)];
    }
    const float mx = *std::max_element(l.begin(), l.begin() + c.vocab);
    double sum = 0;
    for (std::int64_t v = 0; v < c.vocab; ++v) {
      const float x_v = l[static_cast<std::size_t>(v)];
      p[static_cast<std::size_t>(v)] = x_v >= cut ? std::exp((x_v - mx) / options.temperature) : 0.0f;
      sum += p[static_cast<std::size_t>(v)];
    }
    double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * sum;
    std::int32_t pick = 0;
    for (std::int64_t v = 0; v < c.vocab; ++v) {
      u -= p[static_cast<std::size_t>(v)];
      pick = static_cast<std::int32_t>(v);
      if (u < 0) break;
    }
    out.push_back(pick);
  }
  model.train();
  return out;
}

}  // namespace tutti::models
