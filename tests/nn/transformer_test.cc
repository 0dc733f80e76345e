// The transformer layers (nn/transformer.h): attention through the tiled kernel against the one that
// keeps the probabilities, as modules with grouped heads; the rotary table's frequencies (Llama 3's
// scaling, computed as in transformers), its sharing and growth, and the rotary module's round trip;
// the token embedding without positions; the attention kernel's names.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "kernels/kernel_test_util.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/transformer.h"

namespace tutti::nn {
namespace {

using tutti::testing::expect_close;
using tutti::testing::random_tensor;

// forward and backward of `attention` on qkv with dy; the output and dqkv.
std::pair<std::vector<float>, std::vector<float>> run(CausalSelfAttention& attention, const Tensor& qkv,
                                                      const Tensor& dy) {
  attention.set_input_grad(true);
  const std::vector<float> y = attention.forward(qkv).to_floats();
  return {y, attention.backward(dy).to_floats()};
}

TEST(Transformer, FlashAttentionModuleMatchesTheMaterializedOne) {
  const Tensor qkv = random_tensor({2, 9, 3 * 16}, DType::f32, 1, -2.f, 2.f),
               dy = random_tensor({2, 9, 16}, DType::f32, 2);
  CausalSelfAttention flash(4), materialized(4, {.kernel = AttentionKernel::materialized});
  flash.init(1);
  materialized.init(1);
  const auto [yf, gf] = run(flash, qkv, dy);
  const auto [ym, gm] = run(materialized, qkv, dy);
  expect_close(yf, ym, 1e-5, 1e-5, "output");
  expect_close(gf, gm, 1e-5, 1e-5, "dqkv");
  EXPECT_EQ(flash.describe(), "CausalSelfAttention(heads 4, flash)");
  // Grouped: [B, T, (4 + 2·2)·4] -> [B, T, 16], FLOPs of the 4 query heads.
  CausalSelfAttention grouped(4, {.kv_heads = 2, .query_tile = 3, .key_tile = 2});
  grouped.init(1);
  const auto [yg, gg] = run(grouped, random_tensor({2, 9, 32}, DType::f32, 3), dy);
  EXPECT_EQ(yg.size(), 2u * 9 * 16);
  EXPECT_EQ(gg.size(), 2u * 9 * 32);
  Shape out;
  EXPECT_EQ(grouped.flops({9, 32}, out).forward, 4.0 * 9 * 9 * 16);
  EXPECT_EQ(out, (Shape{9, 16}));
  EXPECT_EQ(grouped.describe(), "CausalSelfAttention(heads 4, kv_heads 2, flash)");
  testing::expect_invalid_argument([] { CausalSelfAttention a(4, {.kv_heads = 3}); }, "kv_heads divide");
  testing::expect_invalid_argument(
      [] { CausalSelfAttention a(4, {.kv_heads = 2, .kernel = AttentionKernel::materialized}); }, "grouped-query");
}

TEST(Transformer, AttentionKernelNames) {
  EXPECT_EQ(parse_attention_kernel("flash"), AttentionKernel::flash);
  EXPECT_EQ(parse_attention_kernel("materialized"), AttentionKernel::materialized);
  EXPECT_STREQ(name_of(AttentionKernel::materialized), "materialized");
  testing::expect_invalid_argument([] { parse_attention_kernel("fast"); }, "flash");
}

TEST(Transformer, RotaryFrequenciesFollowTransformers) {
  // Default: theta^(-2i/d) in f32.
  const std::vector<float> plain = rope_inv_freq(8, {10000.0});
  ASSERT_EQ(plain.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(plain[i], static_cast<float>(std::pow(10000.0, -2.0 * i / 8)));
  // Llama 3's scaling (factor 8, low 1, high 4, original context 8192) on theta 500000, head size
  // 128: wavelengths under 2048 kept, over 8192 divided by 8, those between interpolated.
  const RopeOptions llama3{500000.0, {8.0, 1.0, 4.0, 8192}};
  const std::vector<float> base = rope_inv_freq(128, {500000.0}), scaled = rope_inv_freq(128, llama3);
  int kept = 0, divided = 0, smoothed = 0;
  for (std::size_t i = 0; i < base.size(); ++i) {
    const double wavelen = 2 * M_PI / base[i];
    if (wavelen < 2048) {
      EXPECT_EQ(scaled[i], base[i]) << i;
      ++kept;
    } else if (wavelen > 8192) {
      EXPECT_FLOAT_EQ(scaled[i], base[i] / 8) << i;
      ++divided;
    } else {
      EXPECT_LT(scaled[i], base[i]) << i;
      EXPECT_GT(scaled[i], base[i] / 8) << i;
      ++smoothed;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smoothed, 0);
  testing::expect_invalid_argument([] { rope_inv_freq(7, {}); }, "even");
  testing::expect_invalid_argument([] { rope_inv_freq(8, {10000.0, {2.0, 4.0, 1.0, 8}}); }, "llama3");
}

TEST(Transformer, RotaryTableIsSharedAndGrows) {
  auto table = std::make_shared<RopeTable>(4, RopeOptions{});
  EXPECT_EQ(table->get(5, Device::cpu(), Stream()).dim(0), 5);
  EXPECT_EQ(table->get(3, Device::cpu(), Stream()).dim(0), 5);  // long enough already
  EXPECT_EQ(table->get(9, Device::cpu(), Stream()).dim(0), 9);
  EXPECT_EQ(table->bytes(), 9 * 2 * 2 * 4);
  // The module rotates q and k in place and its backward turns them back.
  RotaryEmbedding rope(2, 1, table);
  rope.init(1);
  rope.set_input_grad(true);
  const Tensor x = random_tensor({1, 6, 4 * 4}, DType::f32, 4);
  const std::vector<float> before = x.to_floats();
  const Tensor y = rope.forward(x);
  EXPECT_TRUE(y.shares_storage_with(x));
  EXPECT_NE(y.to_floats(), before);
  expect_close(rope.backward(y).to_floats(), before, 1e-6, 1e-6, "rotated back");
}

TEST(Transformer, TokenEmbeddingHasNoPositions) {
  TokenEmbedding embed(5, 3);
  embed.init(1);
  const Tensor tokens = Tensor::from_ints({4, 4, 0}, {1, 3}, DType::i32);
  const std::vector<float> y = embed.forward(tokens).to_floats(), w = embed.weight.value.to_floats();
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(y[c], w[12 + c]);
    EXPECT_EQ(y[3 + c], w[12 + c]);  // the same token at another position: the same row
    EXPECT_EQ(y[6 + c], w[c]);
  }
  EXPECT_TRUE(embed.weight.no_weight_decay);
}

}  // namespace
}  // namespace tutti::nn
