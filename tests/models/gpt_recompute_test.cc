// models/gpt's activation checkpointing (Gpt::set_recompute, Recompute) and presets: for every
// policy, the loss and every gradient over a few AdamW steps are bit-identical to no
// recomputation, in f32 and bf16, on the CPU and the GPU (emulated in CI); a step's activation
// bytes (the allocator's peak over the bytes held before it) drop; bad policies are refused;
// the GPT-2 presets have llm.c's sizes and the parameters the formula of their configuration gives.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernel_test_util.h"
#include "models/model_test_util.h"
#include "tutti/core/tensor.h"
#include "tutti/models/gpt.h"
#include "tutti/nn/loss.h"
#include "tutti/optim/adamw.h"

namespace tutti::models {
namespace {

GptConfig small() {
  GptConfig c;
  c.vocab = c.padded_vocab = 13;
  c.context = 8;
  c.layers = 3;  // every:2 then checkpoints layers 0 and 2, not 1
  c.heads = 2;
  c.width = 8;
  return c;
}

Tensor tokens(std::int64_t B, std::int64_t T, std::int64_t V, std::uint32_t seed) {
  return testing::random_tokens(B, T, V, seed);
}

struct Trace {
  std::vector<std::vector<float>> losses;  // per step
  std::vector<std::vector<float>> grads;   // per step and parameter, concatenated
};

// `steps` AdamW steps of a fresh model with the policy, on `device` in `dtype`.
Trace train(const std::string& policy, Device device, DType dtype, int steps) {
  Gpt model(small());
  model.init(7);
  model.set_recompute(Recompute::parse(policy));
  const Stream stream = device.is_cpu() ? Stream() : Stream::create(device);
  model.set_precision(dtype);
  model.to(device, stream);
  optim::AdamW opt(model.parameters(), {.lr = 3e-2f});
  Trace t;
  for (int s = 0; s < steps; ++s) {
    const Tensor x = tokens(2, 8, 13, 10 + s).to(device, stream), y = tokens(2, 8, 13, 20 + s).to(device, stream);
    nn::CrossEntropyLoss loss;
    loss.forward(model.forward(x), y, 1.0f, stream);
    model.zero_grad();
    model.backward(loss.grad());
    t.losses.push_back(loss.loss().to_floats());
    std::vector<float> g;
    for (auto* p : model.parameters()) {
      const std::vector<float> v = p->grad.to_floats();
      g.insert(g.end(), v.begin(), v.end());
    }
    t.grads.push_back(std::move(g));
    opt.step();
  }
  return t;
}

void expect_bit_identical(Device device) {
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Trace none = train("none", device, dtype, 3);
    for (const char* policy : {"blocks", "every:2", "attn", "mlp"}) {
      const Trace r = train(policy, device, dtype, 3);
      for (std::size_t s = 0; s < none.losses.size(); ++s) {
        EXPECT_EQ(r.losses[s], none.losses[s]) << policy << " " << name_of(dtype) << " loss, step " << s;
        EXPECT_EQ(r.grads[s], none.grads[s]) << policy << " " << name_of(dtype) << " gradients, step " << s;
      }
    }
    // The steps changed the model: the comparison was of three different points.
    EXPECT_NE(none.losses[0], none.losses[2]);
  }
}

TEST(GptRecompute, EveryPolicyIsBitIdenticalOnTheCpu) { expect_bit_identical(Device::cpu()); }

// Bytes of the first step's activations of a fresh model (the layers allocate their buffers
// then): the allocator's peak over a forward and backward, minus what was held before it
// (parameters, gradients).
std::int64_t activation_bytes(const std::string& policy, Device device) {
  GptConfig c = small();
  c.context = 64;
  c.width = 32;
  c.layers = 4;
  Gpt model(c);
  model.set_recompute(Recompute::parse(policy));
  const Stream stream = device.is_cpu() ? Stream() : Stream::create(device);
  model.to(device, stream).init(3);
  model.storage().allocate_grads();
  const Tensor x = tokens(4, 64, 13, 1).to(device, stream), y = tokens(4, 64, 13, 2).to(device, stream);
  stream.synchronize();
  Storage::reset_peak_bytes(device);
  const std::int64_t before = Storage::live_bytes(device);
  nn::CrossEntropyLoss loss;
  loss.forward(model.forward(x), y, 1.0f, stream);
  model.backward(loss.grad());
  stream.synchronize();
  return Storage::peak_bytes(device) - before;
}

void expect_fewer_bytes(Device device) {
  const std::int64_t none = activation_bytes("none", device), blocks = activation_bytes("blocks", device);
  const std::int64_t mlp = activation_bytes("mlp", device), every2 = activation_bytes("every:2", device);
  EXPECT_GT(none, 0);
  // 4 layers: blocks keeps each residual's input and output and one body's workspace.
  EXPECT_LT(blocks, none / 2) << "none " << none << ", blocks " << blocks;
  EXPECT_LT(mlp, none) << "none " << none << ", mlp " << mlp;
  EXPECT_LT(blocks, every2) << "every:2 " << every2 << ", blocks " << blocks;
  EXPECT_LT(every2, none) << "none " << none << ", every:2 " << every2;
}

TEST(GptRecompute, ActivationBytesDropOnTheCpu) { expect_fewer_bytes(Device::cpu()); }

TEST(GptRecompute, PoliciesParseAndBadOnesAreRefused) {
  for (const char* p : {"none", "blocks", "every:1", "every:3", "attn", "mlp"}) {
    EXPECT_EQ(Recompute::parse(p).str(), p);
  }
  for (const char* p : {"", "all", "every", "every:", "every:0", "every:-1", "every:2x", "Blocks"}) {
    try {
      Recompute::parse(p);
      ADD_FAILURE() << "'" << p << "' was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("none, blocks, every:K"), std::string::npos) << e.what();
    }
  }
  const Recompute every2 = Recompute::parse("every:2");
  EXPECT_TRUE(every2.checkpoints(0, false) && every2.checkpoints(0, true) && every2.checkpoints(2, true));
  EXPECT_FALSE(every2.checkpoints(1, false) || every2.checkpoints(1, true));
  EXPECT_TRUE(Recompute::parse("mlp").checkpoints(1, true));
  EXPECT_FALSE(Recompute::parse("mlp").checkpoints(1, false));
  Gpt model(small());
  model.init(1);
  EXPECT_THROW(model.set_recompute(Recompute::parse("every:4")), InvalidArgument);  // 3 layers
  EXPECT_EQ(model.recompute().str(), "none");
  model.forward(tokens(1, 4, 13, 3));
  EXPECT_THROW(model.set_recompute(Recompute::parse("blocks")), InvalidArgument);  // awaiting backward
  EXPECT_EQ(model.recompute_workspace_bytes(), 0);
}

TEST(GptPresets, Gpt2SizesHaveLlmcsConfigurationsAndParameterCounts) {
  // llm.c's GPT-2 configurations (train_gpt2.cu: d12, d24, d36, d48), context 1024, the
  // vocabulary 50257 padded to 50304; parameters by the formula of GPT-2's shapes: the
  // embeddings, per layer 4 matrices (3C·C + C·C + 4C·C + C·4C) with their biases (3C + C + 4C + C)
  // and 2 LayerNorms (4C), and the final LayerNorm.
  struct Size {
    const char* name;
    std::int64_t L, H, C;
  };
  for (const Size& s : {Size{"gpt2-124m", 12, 12, 768}, Size{"gpt2-350m", 24, 16, 1024},
                        Size{"gpt2-774m", 36, 20, 1280}, Size{"gpt2-1558m", 48, 25, 1600}}) {
    const GptConfig c = GptConfig::preset(s.name);
    EXPECT_EQ(c.layers, s.L) << s.name;
    EXPECT_EQ(c.heads, s.H) << s.name;
    EXPECT_EQ(c.width, s.C) << s.name;
    EXPECT_EQ(c.context, 1024);
    EXPECT_EQ(c.vocab, 50257);
    EXPECT_EQ(c.padded_vocab, 50304);
    const std::int64_t C = s.C,
                       per_layer = (3 * C * C + C * C + 4 * C * C + 4 * C * C) + (3 * C + C + 4 * C + C) + 4 * C;
    EXPECT_EQ(c.parameter_count(), 50304 * C + 1024 * C + s.L * per_layer + 2 * C) << s.name;
  }
  // parameter_count() against models built, every parameter counted: gpt-tiny and a shape of
  // its own (padded vocabulary, another context), so that it counts what Gpt builds.
  GptConfig odd = small();
  odd.vocab = 1000;
  odd.padded_vocab = pad_vocab(odd.vocab);
  odd.context = 50;
  odd.width = 96;
  odd.heads = 3;
  for (const GptConfig& c : {GptConfig::preset("gpt-tiny"), odd}) {
    Gpt model(c);
    std::int64_t n = 0;
    for (auto* p : model.parameters()) n += p->numel();
    EXPECT_EQ(n, c.parameter_count()) << c.fingerprint();
  }
  // Published sizes: GPT-2 124M in llm.c is 124,475,904 with the padded vocabulary; the
  // larger ones are ~350M, ~774M and ~1558M (with the vocabulary unpadded, as OpenAI counts).
  EXPECT_EQ(GptConfig::preset("gpt2-124m").parameter_count(), 124475904);
  for (const auto& [name, millions] : std::vector<std::pair<std::string, double>>{
           {"gpt2-350m", 354.8}, {"gpt2-774m", 774.0}, {"gpt2-1558m", 1557.6}}) {
    GptConfig c = GptConfig::preset(name);
    c.padded_vocab = c.vocab;
    EXPECT_NEAR(static_cast<double>(c.parameter_count()) / 1e6, millions, 0.5) << name;
  }
  EXPECT_EQ(GptConfig::preset_names().size(), 5u);
}

TEST(Gpu, GptRecomputeIsBitIdenticalAndDropsBytes) {
  TUTTI_REQUIRE_GPU();
  expect_bit_identical(Device::cuda(0));
  expect_fewer_bytes(Device::cuda(0));
}

}  // namespace
}  // namespace tutti::models
