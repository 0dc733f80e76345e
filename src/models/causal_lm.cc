#include "tutti/models/causal_lm.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <memory>
#include <random>

#include "tutti/core/error.h"
#include "tutti/core/stream.h"
#include "tutti/nn/layers.h"
#include "tutti/parallel/vocab_parallel.h"

namespace tutti::models {

using nn::Residual;

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

CausalLm& CausalLm::set_recompute(const Recompute& policy) {
  TUTTI_CHECK_ARG(policy.mode != Recompute::Mode::every || (policy.every >= 1 && policy.every <= layers()),
                  "set_recompute: ", policy.str(), " names every ", policy.every, "-th layer but ", fingerprint(),
                  " has ", layers(), " layers (use 1 to ", layers(), ")");
  TUTTI_CHECK_ARG(!awaiting_backward(), "Gpt::set_recompute: between a forward and its backward (", policy.str(),
                  "); change it before a forward");
  recompute_ = policy;
  // One workspace for every checkpointed residual: the attention and MLP bodies number their
  // layers alike (norm, Linear, ..., Linear), so it holds the larger at each position.
  workspace_ = policy.mode == Recompute::Mode::none ? nullptr : std::make_shared<nn::RecomputeWorkspace>();
  for (std::int64_t l = 0; l < layers(); ++l) {
    for (const bool mlp : {false, true}) {
      auto& block = static_cast<Residual&>(blocks_[static_cast<std::size_t>(2 * l + (mlp ? 1 : 0))]);
      block.set_recompute(policy.checkpoints(l, mlp) ? workspace_ : nullptr);
    }
  }
  return *this;
}

std::int64_t CausalLm::recompute_workspace_bytes() const { return workspace_ ? workspace_->bytes() : 0; }

nn::Flops CausalLm::flops(const Shape& sample, Shape& out) const {
  nn::Flops sum;
  Shape shape = sample;
  for (const auto& [name, child] : children()) {
    Shape next;
    const nn::Flops f = child->flops(shape, next);
    sum.forward += f.forward;
    sum.backward += f.backward;
    shape = std::move(next);
  }
  out = shape;
  return sum;
}

double CausalLm::flops_per_token(std::int64_t T) const {
  return training_flops_per_sample({T}) / static_cast<double>(T);
}

std::string CausalLm::gather_group(const std::string& name) {
  const std::string prefix = "blocks.";
  if (name.rfind(prefix, 0) != 0) return "";
  const std::size_t end = name.find('.', prefix.size());
  const std::string index = name.substr(prefix.size(), end - prefix.size());
  if (index.empty() || index.find_first_not_of("0123456789") != std::string::npos) return "";
  return "layer " + std::to_string(std::stoll(index) / 2);
}

namespace {

// Row t of the logits [1, T, V], whole: with the vocabulary split, each rank's columns gathered in
// rank order (COLLECTIVE over the group).
Tensor last_logits(CausalLm& model, const Tensor& logits, std::int64_t t) {
  const std::int64_t V = logits.dim(-1);
  const Tensor row = logits.view(t * V, {V});
  Communicator* group = model.vocab_group();
  if (group == nullptr || group->size() == 1) return row;
  Tensor whole = Tensor::empty({V * group->size()}, row.dtype(), row.device());
  group->allgather(row, whole, {.label = "generate: the last logits", .stream = model.stream()}).wait(model.stream());
  return whole;
}

}  // namespace

std::unique_ptr<nn::CrossEntropyLoss> CausalLm::make_loss(std::int64_t ignore_index) const {
  if (vocab_group_ != nullptr)
    return std::make_unique<parallel::VocabParallelCrossEntropy>(*vocab_group_, ignore_index);
  return std::make_unique<nn::CrossEntropyLoss>(ignore_index);
}

std::vector<std::int32_t> generate(CausalLm& model, std::vector<std::int32_t> prompt, const SampleOptions& options) {
  TUTTI_CHECK_ARG(!prompt.empty() && options.temperature > 0, "generate: needs a prompt and a positive temperature");
  std::mt19937_64 rng(options.seed);
  const Stream& stream = model.stream();
  model.eval();
  std::vector<std::int32_t> out = prompt;
  std::vector<float> p(static_cast<std::size_t>(model.vocab()));
  for (std::int64_t n = 0; n < options.tokens; ++n) {
    const std::int64_t T = std::min<std::int64_t>(model.context(), static_cast<std::int64_t>(out.size()));
    const std::vector<std::int64_t> window(out.end() - T, out.end());
    const Tensor x = Tensor::from_ints(window, {1, T}, DType::i32).to(model.device(), stream);
    const Tensor logits = model.forward(x);
    const Tensor last = last_logits(model, logits, T - 1).to(Device::cpu(), stream);
    stream.synchronize();
    const std::vector<float> l = last.to_floats();
    // Softmax over the real vocabulary (the padding never occurs) at the temperature, among
    // the top k.
    std::vector<float> sorted(l.begin(), l.begin() + model.vocab());
    float cut = -INFINITY;
    if (options.top_k > 0 && options.top_k < model.vocab()) {
      std::nth_element(sorted.begin(), sorted.begin() + (options.top_k - 1), sorted.end(), std::greater<float>());
      cut = sorted[static_cast<std::size_t>(options.top_k - 1)];
    }
    const float mx = *std::max_element(l.begin(), l.begin() + model.vocab());
    double sum = 0;
    for (std::int64_t v = 0; v < model.vocab(); ++v) {
      const float x_v = l[static_cast<std::size_t>(v)];
      p[static_cast<std::size_t>(v)] = x_v >= cut ? std::exp((x_v - mx) / options.temperature) : 0.0f;
      sum += p[static_cast<std::size_t>(v)];
    }
    double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * sum;
    std::int32_t pick = 0;
    for (std::int64_t v = 0; v < model.vocab(); ++v) {
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
