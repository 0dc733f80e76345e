#include "tutti/models/gpt.h"

#include <algorithm>
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

GptConfig GptConfig::preset(const std::string& name) {
  GptConfig c;
  if (name == "gpt-tiny") return c;
  if (name == "gpt2-124m") {
    c.vocab = 50257;
    c.padded_vocab = pad_vocab(c.vocab);
    c.context = 1024;
    c.layers = 12;
    c.heads = 12;
    c.width = 768;
    return c;
  }
  TUTTI_THROW(InvalidArgument, "unknown model '", name, "' (gpt-tiny or gpt2-124m)");
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
