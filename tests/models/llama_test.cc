// models/llama (src/models/llama.cc): the whole model's gradients against finite differences
// (grouped heads, rotary embeddings with and without Llama 3's scaling, tied and untied heads),
// the parameter names and counts of the presets (Meta's published sizes), the weight-decay groups
// and ZeRO-3's gather groups, activation checkpointing bit-identical to none, the rotary table
// shared by the layers, bad configurations refused; the model on the GPU against the CPU (emulated
// in CI). The math against Hugging Face's own implementation: tests/models/hf.
#include "tutti/models/llama.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "kernels/kernel_test_util.h"
#include "models/model_test_util.h"
#include "tutti/kernels.h"
#include "tutti/nn/loss.h"
#include "tutti/optim/adamw.h"
#include "tutti/optim/optimizer.h"

namespace tutti::models {
namespace {

LlamaConfig tiny(bool tied = false) {
  LlamaConfig c;
  c.vocab = 11;
  c.context = 7;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.width = 8;  // head size 2
  c.ffn = 12;
  c.tied_head = tied;
  return c;
}

using testing::random_tokens;

// Values far from the small initialization, so that every path carries a gradient well above
// rounding: weights U(-0.5, 0.5), norm weights 1 + U(-0.3, 0.3).
void randomize(Llama& model, std::uint32_t seed) {
  StateDict s = model.state_dict();
  std::uint32_t k = seed;
  for (auto& [name, t] : s) {
    const bool norm = t.ndim() == 1;
    t = testing::random_tensor(t.shape(), DType::f32, k++, norm ? 0.7f : -0.5f, norm ? 1.3f : 0.5f);
  }
  model.load_state_dict(s);
}

double loss_and_grads(Llama& model, const Tensor& x, const Tensor& y, bool backward) {
  const Tensor logits = model.forward(x.to(model.device(), model.stream()));
  nn::CrossEntropyLoss loss;
  loss.forward(logits, y.to(model.device(), model.stream()), 1.0f, model.stream());
  if (backward) {
    model.zero_grad();
    model.backward(loss.grad());
  }
  return nn::item(loss.loss(), model.stream());
}

void check_finite_differences(const LlamaConfig& c, std::uint32_t seed) {
  Llama model(c);
  model.init(seed);
  randomize(model, seed * 10);
  const Tensor x = random_tokens(2, 7, c.vocab, seed + 1), y = random_tokens(2, 7, c.vocab, seed + 2);
  loss_and_grads(model, x, y, true);
  std::map<std::string, std::vector<float>> grads;
  for (auto* p : model.parameters()) grads[p->name] = p->grad.to_floats();
  std::mt19937 rng(seed);
  int checked = 0;
  for (auto* p : model.parameters()) {
    float* v = p->value.data_as<float>();
    for (int k = 0; k < 6 && k < p->numel(); ++k) {
      const std::int64_t i = static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(p->numel()));
      const float saved = v[i];
      const double h = 1e-2;
      v[i] = static_cast<float>(saved + h);
      model.refresh_compute_copies();
      const double plus = loss_and_grads(model, x, y, false);
      v[i] = static_cast<float>(saved - h);
      model.refresh_compute_copies();
      const double minus = loss_and_grads(model, x, y, false);
      v[i] = saved;
      model.refresh_compute_copies();
      const double numeric = (plus - minus) / (2 * h), analytic = grads[p->name][static_cast<std::size_t>(i)];
      EXPECT_NEAR(analytic, numeric, 2e-4 + 0.03 * std::fabs(numeric))
          << c.fingerprint() << " " << p->name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 40);
}

TEST(LlamaModel, WholeModelGradientsMatchFiniteDifferences) {
  check_finite_differences(tiny(), 1);
  LlamaConfig tied = tiny(true);
  tied.rope.theta = 50.0;  // angles that turn a lot over 7 positions
  check_finite_differences(tied, 2);
  LlamaConfig scaled = tiny();
  scaled.kv_heads = 1;  // every query head shares one key/value head
  scaled.width = 16;    // head size 4: two rotary frequencies, one of them rescaled
  scaled.rope = {100.0, {4.0, 1.0, 2.0, 6}};
  check_finite_differences(scaled, 3);
}

TEST(LlamaModel, ParametersAreNamedAndCountedAsDocumented) {
  for (bool tied : {false, true}) {
    const LlamaConfig c = tiny(tied);
    Llama model(c);
    std::vector<std::string> names;
    std::int64_t n = 0;
    for (auto* p : model.parameters()) {
      names.push_back(p->name);
      n += p->numel();
    }
    EXPECT_EQ(n, c.parameter_count());
    EXPECT_EQ(model.flop_parameters(), n);
    std::vector<std::string> want = {"embed.weight"};
    for (int b : {0, 2}) {
      const std::string a = "blocks." + std::to_string(b) + ".body.", m = "blocks." + std::to_string(b + 1) + ".body.";
      for (const std::string& s :
           {a + "0.weight", a + "1.weight", a + "4.weight", m + "0.weight", m + "1.weight", m + "3.weight"})
        want.push_back(s);
    }
    want.push_back("norm.weight");
    if (!tied) want.push_back("head.weight");
    EXPECT_EQ(names, want);
    EXPECT_EQ(model.head_weight() == nullptr, tied);
  }
}

TEST(LlamaModel, PresetsHaveMetasSizes) {
  // Llama 3.2 1B and Llama 3.1 8B as published: 1,235,814,400 and 8,030,261,248 parameters.
  EXPECT_EQ(LlamaConfig::preset("llama3.2-1b").parameter_count(), 1235814400);
  EXPECT_EQ(LlamaConfig::preset("llama3.1-8b").parameter_count(), 8030261248);
  const LlamaConfig one = LlamaConfig::preset("llama3.2-1b");
  EXPECT_TRUE(one.tied_head);
  EXPECT_EQ(one.head_dim(), 64);
  EXPECT_EQ(one.rope.scaling.factor, 32.0);
  EXPECT_EQ(LlamaConfig::preset("llama-tiny").fingerprint(), "Llama L4 H4/2 C128 F384 T256 V256");
  for (const std::string& name : LlamaConfig::preset_names()) EXPECT_NO_THROW(LlamaConfig::preset(name).validate());
  testing::expect_invalid_argument([] { LlamaConfig::preset("llama-huge"); }, "llama-tiny");
}

TEST(LlamaModel, BadConfigurationsAreRefused) {
  LlamaConfig c = tiny();
  c.kv_heads = 3;
  testing::expect_invalid_argument([&] { Llama m(c); }, "kv_heads must divide");
  c = tiny();
  c.width = 12;  // head size 3: the rotary pairs need an even one
  testing::expect_invalid_argument([&] { Llama m(c); }, "even");
  c = tiny();
  c.attention = nn::AttentionKernel::materialized;
  testing::expect_invalid_argument([&] { Llama m(c); }, "grouped-query");
  c.kv_heads = c.heads;
  EXPECT_NO_THROW(Llama m(c));
  c = tiny();
  Llama model(c);
  model.init(1);
  testing::expect_invalid_argument([&] { model.forward(random_tokens(1, 8, 11, 1)); }, "T <= 7");
}

TEST(LlamaModel, DecayGroupsAndGatherGroups) {
  const LlamaConfig c = tiny();
  Llama model(c);
  const auto groups = optim::weight_decay_groups(model.parameters(), 0.1f);
  ASSERT_EQ(groups.size(), 2u);
  for (const auto* p : groups[0].parameters) EXPECT_EQ(p->ndim(), 2) << p->name << " decays";
  for (const auto* p : groups[1].parameters) EXPECT_TRUE(p->ndim() == 1 || p->name == "embed.weight") << p->name;
  const auto g = Llama::gather_groups(c);
  EXPECT_EQ(g("blocks.0.body.1.weight"), "layer 0");
  EXPECT_EQ(g("blocks.3.body.3.weight"), "layer 1");
  EXPECT_EQ(g("embed.weight"), "embedding");
  EXPECT_EQ(g("head.weight"), "head");
  EXPECT_EQ(g("norm.weight"), "");
  EXPECT_EQ(Llama::gather_groups(tiny(true))("embed.weight"), "");  // the tied head reads it again
  EXPECT_EQ(model.group_of("head.weight"), "head");
}

// The loss and every gradient over two AdamW steps, for a recompute policy.
std::vector<std::vector<float>> train(const std::string& policy, Device device, DType dtype) {
  LlamaConfig c = tiny();
  c.layers = 3;
  Llama model(c);
  model.init(7);
  model.set_recompute(Recompute::parse(policy));
  const Stream stream = device.is_cpu() ? Stream() : Stream::create(device);
  model.set_precision(dtype);
  model.to(device, stream);
  optim::AdamW opt(model.parameters(), {.lr = 3e-2f});
  std::vector<std::vector<float>> out;
  for (int s = 0; s < 2; ++s) {
    const Tensor x = random_tokens(2, 7, 11, 10 + s).to(device, stream),
                 y = random_tokens(2, 7, 11, 20 + s).to(device, stream);
    nn::CrossEntropyLoss loss;
    loss.forward(model.forward(x), y, 1.0f, stream);
    model.zero_grad();
    model.backward(loss.grad());
    out.push_back(loss.loss().to_floats());
    for (auto* p : model.parameters()) out.push_back(p->grad.to_floats());
    opt.step();
  }
  return out;
}

TEST(LlamaModel, RecomputeIsBitIdentical) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    const auto none = train("none", Device::cpu(), dtype);
    for (const char* policy : {"blocks", "every:2", "attn", "mlp"})
      EXPECT_EQ(train(policy, Device::cpu(), dtype), none) << policy << " " << name_of(dtype);
  }
}

TEST(LlamaModel, LayersShareOneRotaryTable) {
  Llama model(tiny());
  model.init(1);
  EXPECT_EQ(model.rope_table().bytes(), 0);
  const Tensor x = random_tokens(2, 5, 11, 1), y = random_tokens(2, 5, 11, 2);
  loss_and_grads(model, x, y, true);
  // One table of 5 positions x 1 frequency (head size 2) x (cos, sin), whatever the layers.
  EXPECT_EQ(model.rope_table().bytes(), 5 * 1 * 2 * 4);
}

TEST(LlamaModel, GenerateStaysInTheVocabulary) {
  Llama model(tiny(true));
  model.init(3);
  SampleOptions o;
  o.tokens = 12;
  o.seed = 5;
  const std::vector<std::int32_t> a = generate(model, {1, 2}, o), b = generate(model, {1, 2}, o);
  ASSERT_EQ(a.size(), 14u);
  EXPECT_EQ(a, b);
  for (auto t : a) EXPECT_TRUE(t >= 0 && t < 11) << t;
}

TEST(Gpu, LlamaForwardAndBackwardMatchCpu) {
  TUTTI_REQUIRE_GPU();
  for (DType d : {DType::f32, DType::bf16}) {
    Llama cpu(tiny()), gpu(tiny());
    cpu.init(4);
    randomize(cpu, 40);
    gpu.set_precision(d);
    gpu.to(Device::cuda(0), Stream::create(Device::cuda(0)));
    gpu.load_state_dict(cpu.state_dict());
    const Tensor x = random_tokens(3, 7, 11, 8), y = random_tokens(3, 7, 11, 9);
    const double lc = loss_and_grads(cpu, x, y, true), lg = loss_and_grads(gpu, x, y, true);
    const double tol = d == DType::f32 ? 1e-5 : 2e-2;
    EXPECT_NEAR(lg, lc, tol * std::fabs(lc)) << name_of(d);
    const auto pc = cpu.parameters(), pg = gpu.parameters();
    for (std::size_t i = 0; i < pc.size(); ++i) {
      const std::vector<float> gc = pc[i]->grad.to_floats();
      double scale = 0;
      for (float g : gc) scale = std::max(scale, double(std::fabs(g)));
      testing::expect_close(pg[i]->grad.to_floats(), gc, d == DType::f32 ? 1e-3 : 0.1,
                            (d == DType::f32 ? 1e-4 : 5e-2) * scale,
                            std::string(name_of(d)) + " grad of " + pc[i]->name);
    }
  }
  // Recomputation stays bit-identical on the GPU too.
  EXPECT_EQ(train("blocks", Device::cuda(0), DType::bf16), train("none", Device::cuda(0), DType::bf16));
}

}  // namespace
}  // namespace tutti::models
