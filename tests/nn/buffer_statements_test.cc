// Module::buffer_statements against the allocator: every layer that states its buffers, run for
// one training step (forward and backward) as a model of its own, with and without an input
// gradient, its parameters frozen (so that the bytes it adds are its buffers alone, the frozen
// weights' scratch among them): the bytes it holds afterwards are the bytes it states, and the
// output shape is forward's. Slots are stated once each. What train::memory_plan builds on.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kernels/kernel_test_util.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/sequential.h"
#include "tutti/nn/transformer.h"

namespace tutti::nn {
namespace {

using tutti::testing::random_tensor;

struct Case {
  std::string name;
  std::function<std::unique_ptr<Module>()> make;
  Tensor input;
  bool f32_only = false;  // TiedLinear: the shared weight's compute copy is its owner's to make
};

// The bytes one step of c's layer adds to the live bytes, against its statements.
void check(const Case& c, bool input_grad, DType dtype) {
  const std::string what = c.name + (input_grad ? " with dx" : " without dx") + " " + std::string(name_of(dtype));
  std::unique_ptr<Module> layer = c.make();
  layer->init(1);
  for (Parameter* p : layer->parameters()) p->requires_grad = false;
  layer->set_precision(dtype);
  layer->set_input_grad(input_grad);
  const Tensor x = is_floating(c.input.dtype()) ? random_tensor(c.input.shape(), dtype, 1) : c.input;
  Shape stated_out;
  const std::vector<BufferStatement> statements = layer->buffer_statements(x.shape(), dtype, stated_out);
  std::set<int> slots;
  std::int64_t stated = 0;
  for (const BufferStatement& s : statements) {
    EXPECT_TRUE(slots.insert(s.slot).second) << what << ": slot " << s.slot << " stated twice";
    stated += s.bytes;
  }
  // A layer's buffer_bytes is its statements'; a container's (Residual) adds its children's.
  const std::int64_t whole = layer->buffer_bytes(x.shape(), dtype, stated_out);
  if (layer->children().empty()) EXPECT_EQ(whole, stated) << what;
  const std::int64_t before = Storage::live_bytes(Device::cpu());
  const Tensor y = layer->forward(x);
  const Tensor dy = random_tensor(y.shape(), dtype, 2);
  layer->backward(dy);
  const std::int64_t held = Storage::live_bytes(Device::cpu()) - before - static_cast<std::int64_t>(dy.nbytes());
  EXPECT_EQ(y.shape(), stated_out) << what;
  EXPECT_EQ(held, whole) << what;
}

TEST(BufferStatements, EveryLayerStatesWhatItHolds) {
  auto table = std::make_shared<RopeTable>(8, RopeOptions{});
  table->get(6, Device::cpu(), Stream());  // the shared table made before: not a layer's buffer
  auto tied = std::make_shared<Parameter>(Shape{12, 16}, InitSpec::normal(0.02));
  tied->value.copy_from(random_tensor({12, 16}, DType::f32, 5), Stream());
  tied->requires_grad = false;
  const Tensor tokens = Tensor::from_ints({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0}, {2, 6});
  const std::vector<Case> cases{
      {"Linear", [] { return std::make_unique<Linear>(16, 24); }, random_tensor({2, 6, 16}, DType::f32, 1)},
      {"ReLU", [] { return std::make_unique<ReLU>(); }, random_tensor({4, 16}, DType::f32, 1)},
      {"GELU", [] { return std::make_unique<GELU>(); }, random_tensor({4, 16}, DType::f32, 1)},
      {"SwiGLU", [] { return std::make_unique<SwiGLU>(); }, random_tensor({2, 6, 16}, DType::f32, 1)},
      {"Dropout", [] { return std::make_unique<Dropout>(0.25f); }, random_tensor({4, 16}, DType::f32, 1)},
      {"LayerNorm", [] { return std::make_unique<LayerNorm>(16); }, random_tensor({2, 6, 16}, DType::f32, 1)},
      {"RMSNorm", [] { return std::make_unique<RMSNorm>(16); }, random_tensor({2, 6, 16}, DType::f32, 1)},
      {"Conv2d", [] { return std::make_unique<Conv2d>(2, 3, 3, Conv2dOptions{.padding = 1}); },
       random_tensor({2, 2, 6, 6}, DType::f32, 1)},
      {"MaxPool2d", [] { return std::make_unique<MaxPool2d>(); }, random_tensor({2, 2, 6, 6}, DType::f32, 1)},
      {"Flatten", [] { return std::make_unique<Flatten>(); }, random_tensor({2, 2, 3, 3}, DType::f32, 1)},
      {"TokenEmbedding", [] { return std::make_unique<TokenEmbedding>(12, 16); }, tokens},
      {"TokenPositionEmbedding", [] { return std::make_unique<TokenPositionEmbedding>(12, 8, 16); }, tokens},
      {"RotaryEmbedding", [table] { return std::make_unique<RotaryEmbedding>(2, 1, table); },
       random_tensor({2, 6, 32}, DType::f32, 1)},
      {"CausalSelfAttention flash",
       [] { return std::make_unique<CausalSelfAttention>(4, AttentionOptions{.kv_heads = 2}); },
       random_tensor({2, 6, 32}, DType::f32, 1)},
      {"CausalSelfAttention materialized",
       [] {
         return std::make_unique<CausalSelfAttention>(2, AttentionOptions{.kernel = AttentionKernel::materialized});
       },
       random_tensor({2, 6, 24}, DType::f32, 1)},
      {"TiedLinear", [tied] { return std::make_unique<TiedLinear>(*tied); }, random_tensor({2, 6, 16}, DType::f32, 1),
       true},
      {"Residual", [] { return std::make_unique<Residual>(std::make_unique<Linear>(16, 16)); },
       random_tensor({2, 6, 16}, DType::f32, 1)},
  };
  for (const Case& c : cases)
    for (const bool input_grad : {false, true})
      for (const DType dtype : {DType::f32, DType::bf16})
        if (dtype == DType::f32 || !c.f32_only) check(c, input_grad, dtype);
}

}  // namespace
}  // namespace tutti::nn
