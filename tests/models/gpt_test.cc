// models/gpt (src/models/gpt.cc, train_gpt's model): the whole GPT's gradients against finite
// differences, the tied weight's gradient reported once and complete, GPT-2 124M's parameter
// count (llm.c's), the weight-decay groups of the library's rule, GPT-2's initialization,
// sampling; and the model on the GPU against the CPU (emulated in CI).
#include "tutti/models/gpt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "kernels/kernel_test_util.h"
#include "models/model_test_util.h"
#include "tutti/kernels.h"
#include "tutti/nn/loss.h"
#include "tutti/optim/optimizer.h"

namespace tutti::models {
namespace {

using tutti::Device;
using tutti::DType;
using tutti::Tensor;

GptConfig tiny() {
  GptConfig c;
  c.vocab = c.padded_vocab = 11;
  c.context = 6;
  c.layers = 2;
  c.heads = 2;
  c.width = 8;
  return c;
}

using testing::random_tokens;

// Values far from GPT-2's small initialization, so that every path carries a gradient
// well above rounding: weights U(-0.5, 0.5), LayerNorm gains 1 + U(-0.3, 0.3).
void randomize(Gpt& model, std::uint32_t seed) {
  tutti::StateDict s = model.state_dict();
  std::uint32_t k = seed;
  for (auto& [name, t] : s) {
    const bool gain = name.size() > 6 && name.compare(name.size() - 6, 6, ".gamma") == 0;
    Tensor r = tutti::testing::random_tensor(t.shape(), DType::f32, k++, gain ? 0.7f : -0.5f, gain ? 1.3f : 0.5f);
    t = r;
  }
  model.load_state_dict(s);
}

// Mean cross-entropy of the model on (x, y), and its gradients in the parameters' grads.
double loss_and_grads(Gpt& model, const Tensor& x, const Tensor& y, bool backward) {
  const Tensor logits = model.forward(x.to(model.device(), model.stream()));
  tutti::nn::CrossEntropyLoss loss;
  // [B, T, V] logits and [B, T] targets. On the model's stream: backward reads the loss's
  // gradient there.
  loss.forward(logits, y.to(model.device(), model.stream()), 1.0f, model.stream());
  if (backward) {
    model.zero_grad();
    model.backward(loss.grad());
  }
  return tutti::nn::item(loss.loss(), model.stream());
}

TEST(GptModel, WholeModelGradientsMatchFiniteDifferences) {
  Gpt model(tiny());
  model.init(1);
  randomize(model, 10);
  const Tensor x = random_tokens(2, 5, 11, 3), y = random_tokens(2, 5, 11, 4);
  loss_and_grads(model, x, y, true);
  std::map<std::string, std::vector<float>> grads;
  for (auto* p : model.parameters()) grads[p->name] = p->grad.to_floats();
  // Every parameter tensor, at most 6 elements each, spread over it: 70-odd checks.
  std::mt19937 rng(5);
  int checked = 0;
  for (auto* p : model.parameters()) {
    float* v = p->value.data_as<float>();
    for (int k = 0; k < 6 && k < p->numel(); ++k) {
      const std::int64_t i = static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(p->numel()));
      const float saved = v[i];
      const double h = 1e-2;
      v[i] = static_cast<float>(saved + h);
      const double plus = loss_and_grads(model, x, y, false);
      v[i] = static_cast<float>(saved - h);
      const double minus = loss_and_grads(model, x, y, false);
      v[i] = saved;
      const double numeric = (plus - minus) / (2 * h), analytic = grads[p->name][static_cast<std::size_t>(i)];
      EXPECT_NEAR(analytic, numeric, 2e-4 + 0.03 * std::fabs(numeric)) << p->name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 60);
  // The token embedding is used twice (input and tied head): its gradient is not small.
  double wte = 0;
  for (float g : grads["embed.wte"]) wte = std::max(wte, double(std::fabs(g)));
  EXPECT_GT(wte, 1e-2);
}

TEST(GptModel, TiedWeightIsOneParameterReportedOnceWithBothShares) {
  Gpt model(tiny());
  model.init(2);
  randomize(model, 20);
  int wte_parameters = 0;
  for (auto* p : model.parameters()) wte_parameters += p->name == "embed.wte";
  EXPECT_EQ(wte_parameters, 1);
  std::map<std::string, int> calls;
  std::vector<float> at_hook;
  model.storage().set_grad_ready_hook([&](tutti::nn::Parameter& p) {
    ++calls[p.name];
    if (p.name == "embed.wte") at_hook = p.grad.to_floats();
  });
  const Tensor x = random_tokens(2, 5, 11, 6), y = random_tokens(2, 5, 11, 7);
  loss_and_grads(model, x, y, true);
  for (auto* p : model.parameters()) EXPECT_EQ(calls[p->name], 1) << p->name;
  // When the hook fired, the gradient was already complete (the head's share was in).
  tutti::testing::expect_close(at_hook, model.embed_weight().grad.to_floats(), 0, 0, "wte at its hook");
  // The head's share alone: dlogits^T · final activations. Freeze the embedding's own use by
  // comparing with a run where the head's share is removed: the difference must be it.
  tutti::nn::Parameter& wte = model.embed_weight();
  const std::vector<float> total = wte.grad.to_floats();
  Tensor head_only = Tensor::zeros(wte.shape(), DType::f32);
  const Tensor logits = model.forward(x);
  tutti::nn::CrossEntropyLoss loss;
  loss.forward(logits, y);
  tutti::kernels::matmul(loss.grad().reshape({10, 11}), true, model.last_hidden().reshape({10, 8}), false, head_only);
  model.backward(loss.grad());  // the forward above must be consumed
  double head_norm = 0, diff = 0;
  const std::vector<float> h = head_only.to_floats();
  for (std::size_t i = 0; i < h.size(); ++i) head_norm += h[i] * h[i];
  EXPECT_GT(head_norm, 1e-6);
  // total - head = the embedding's scatter-add share: zero in the rows of tokens not in x.
  std::vector<bool> present(11, false);
  for (auto t : x.to_ints()) present[static_cast<std::size_t>(t)] = true;
  for (std::int64_t v = 0; v < 11; ++v) {
    for (std::int64_t c = 0; c < 8; ++c) {
      const std::size_t i = static_cast<std::size_t>(v * 8 + c);
      if (!present[static_cast<std::size_t>(v)]) diff = std::max(diff, double(std::fabs(total[i] - h[i])));
    }
  }
  EXPECT_LT(diff, 1e-6) << "rows of absent tokens hold only the head's share";
}

TEST(GptModel, Gpt2SmallHasLlmcsParameterCount) {
  Gpt model(GptConfig::preset("gpt2-124m"));
  std::int64_t n = 0;
  for (auto* p : model.parameters()) n += p->numel();
  EXPECT_EQ(n, 124475904);  // llm.c's num_parameters for GPT-2 124M with the vocabulary padded to 50304
  EXPECT_EQ(model.flop_parameters(), 124475904 - 1024 * 768);
  // FLOPs per token as the layers count them: 6 x the weight matrices (12·L·C² + V·C) + 12·L·C·T,
  // within 0.1% of 6·N + 12·L·C·T with N every parameter but wpe (biases and LayerNorms).
  const double T = 1024, L = 12, C = 768, V = 50304;
  EXPECT_EQ(model.flops_per_token(1024), 6 * (12 * L * C * C + V * C) + 12 * L * C * T);
  EXPECT_NEAR(model.flops_per_token(1024) / (6.0 * model.flop_parameters() + 12 * L * C * T), 1.0, 1e-3);
  EXPECT_EQ(model.config().fingerprint(), "L12 H12 C768 T1024 V50257/50304");
  EXPECT_THROW(GptConfig::preset("gpt-huge"), tutti::InvalidArgument);
}

TEST(GptModel, LibraryDecayRuleDecaysExactlyTheBlocksMatrices) {
  GptConfig c = tiny();
  c.layers = 3;
  Gpt model(c);
  const auto groups = tutti::optim::weight_decay_groups(model.parameters(), 0.1f);
  ASSERT_EQ(groups.size(), 2u);
  std::int64_t decayed = 0;
  for (const auto* p : groups[0].parameters) {
    decayed += p->numel();
    EXPECT_EQ(p->ndim(), 2) << p->name;
    EXPECT_EQ(p->name.rfind("blocks.", 0), 0u) << p->name << " decays";
  }
  EXPECT_EQ(decayed, 12 * c.width * c.width * c.layers);
  std::int64_t all = 0;
  for (const auto* p : model.parameters()) all += p->numel();
  std::int64_t kept = 0;
  for (const auto* p : groups[1].parameters) kept += p->numel();
  EXPECT_EQ(kept, all - decayed);
  EXPECT_TRUE(model.embed_weight().no_weight_decay);
  EXPECT_TRUE(model.position_embedding()->no_weight_decay);
}

TEST(GptModel, Gpt2Initialization) {
  GptConfig c = tiny();
  c.width = 64;
  c.vocab = c.padded_vocab = 256;
  c.context = 64;
  c.layers = 8;
  Gpt model(c);
  model.init(5);
  // Standard deviation of each weight matrix: 0.02, or 0.02 / sqrt(2 · layers) = 0.005 for the
  // residual projections (body.3); biases 0, LayerNorm gains 1.
  for (const auto* p : model.parameters()) {
    const std::vector<float> v = p->value.to_floats();
    double sq = 0, sum = 0;
    for (float x : v) sum += x, sq += double(x) * x;
    const double n = static_cast<double>(v.size());
    if (p->ndim() == 2) {
      const bool proj = p->name.find("body.3.") != std::string::npos;
      const double expect = proj ? 0.005 : 0.02;
      EXPECT_NEAR(std::sqrt(sq / n), expect, 0.08 * expect) << p->name;
      EXPECT_NEAR(sum / n, 0.0, 0.1 * expect) << p->name;
    } else {
      const bool gain = p->name.size() > 6 && p->name.compare(p->name.size() - 6, 6, ".gamma") == 0;
      for (float x : v) ASSERT_EQ(x, gain ? 1.0f : 0.0f) << p->name;
    }
  }
}

TEST(GptModel, GenerateIsDeterministicAndStaysInTheVocabulary) {
  GptConfig c = tiny();
  c.padded_vocab = 16;  // padding never sampled
  Gpt model(c);
  model.init(3);
  SampleOptions o;
  o.tokens = 20;
  o.top_k = 5;
  const auto a = generate(model, {1, 2}, o), b = generate(model, {1, 2}, o);
  ASSERT_EQ(a.size(), 22u);
  EXPECT_EQ(a, b);
  for (auto t : a) EXPECT_TRUE(t >= 0 && t < 11) << t;
  EXPECT_TRUE(model.is_training());
}

TEST(Gpu, GptForwardAndBackwardMatchCpu) {
  TUTTI_REQUIRE_GPU();
  for (DType d : {DType::f32, DType::bf16}) {
    Gpt cpu(tiny()), gpu(tiny());
    cpu.init(4);
    randomize(cpu, 40);
    gpu.set_precision(d);
    gpu.to(Device::cuda(0), tutti::Stream::create(Device::cuda(0)));
    gpu.load_state_dict(cpu.state_dict());
    const Tensor x = random_tokens(3, 6, 11, 8), y = random_tokens(3, 6, 11, 9);
    const double lc = loss_and_grads(cpu, x, y, true), lg = loss_and_grads(gpu, x, y, true);
    const double tol = d == DType::f32 ? 1e-5 : 2e-2;
    EXPECT_NEAR(lg, lc, tol * std::fabs(lc)) << tutti::name_of(d);
    const auto pc = cpu.parameters(), pg = gpu.parameters();
    for (std::size_t i = 0; i < pc.size(); ++i) {
      const std::vector<float> gc = pc[i]->grad.to_floats();
      double scale = 0;
      for (float g : gc) scale = std::max(scale, double(std::fabs(g)));
      tutti::testing::expect_close(pg[i]->grad.to_floats(), gc, d == DType::f32 ? 1e-3 : 0.1,
                                   (d == DType::f32 ? 1e-4 : 5e-2) * scale,
                                   std::string(tutti::name_of(d)) + " grad of " + pc[i]->name);
    }
  }
}

}  // namespace
}  // namespace tutti::models
