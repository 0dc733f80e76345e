// nn::FlatStorage: the model's flat buffers and hooks, outside the layers' interface. The
// layout itself is tested in nn_test.cc (Flat.*); here: who owns the storage, how the layers
// reach its hooks, and that Module::to keeps the storage's own gradients.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "nn/nn_test_util.h"

namespace tutti {
namespace {

using testing::random_labels;
using testing::random_tensor;

// One storage, on the model only; the model's settings point at it, so every layer reaches it.
TEST(FlatStorage, OnlyTheModelHasOne) {
  nn::Sequential model;
  testing::build_mlp(model, 3, 4, 2);
  nn::FlatStorage& storage = model.storage();
  EXPECT_EQ(&model.storage(), &storage);
  EXPECT_EQ(model.settings().storage, &storage);
  nn::Module& child = *model.children().front().second;
  EXPECT_EQ(child.settings().storage, &storage);
  EXPECT_THROW(child.storage(), InvalidArgument);
}

// Hooks set before the layers are added reach them (the children adopt the model's settings,
// which point at its storage); emptied, they are no longer called. The param-use hook is called
// once per parameter in forward and once in backward (awaiting_backward() tells them apart).
TEST(FlatStorage, HooksReachLayersAddedLater) {
  nn::Sequential model;
  std::vector<std::string> ready;
  int uses = 0, backward_uses = 0;
  model.storage().set_grad_ready_hook([&](nn::Parameter& p) { ready.push_back(p.name); });
  model.storage().set_param_use_hook([&](nn::Parameter&) { ++(model.awaiting_backward() ? uses : backward_uses); });
  testing::build_mlp(model, 4, 5, 3);
  model.init(2);
  nn::CrossEntropyLoss loss;
  const Tensor x = random_tensor({3, 4}, DType::f32, 1);
  const Tensor y = random_labels(3, 3, DType::i32, 2);
  testing::forward_backward(model, loss, x, y);
  EXPECT_EQ(ready, (std::vector<std::string>{"2.bias", "2.weight", "0.bias", "0.weight"}));
  EXPECT_EQ(uses, 4);
  EXPECT_EQ(backward_uses, 4);
  model.storage().set_grad_ready_hook({});
  model.storage().set_param_use_hook({});
  testing::forward_backward(model, loss, x, y);
  EXPECT_EQ(ready.size(), 4u);
  EXPECT_EQ(uses, 4);
  EXPECT_EQ(backward_uses, 4);
}

// With a placement hook every gradient goes where the hook says, and backward allocates no
// flat buffer of the storage's own; the gradients equal those of a model without the hook.
TEST(FlatStorage, PlacementHookDecidesWhereGradientsGo) {
  nn::Sequential reference, placed;
  testing::build_mlp(reference, 4, 5, 3);
  testing::build_mlp(placed, 4, 5, 3);
  reference.init(5);
  placed.init(5);
  const nn::FlatPlan plan = placed.storage().make_plan();
  Tensor pool = Tensor::zeros({plan.total}, DType::f32);
  const std::vector<nn::Parameter*> params = placed.parameters();
  int calls = 0;
  placed.storage().set_grad_placement_hook([&](nn::Parameter& p) {
    ++calls;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (params[i] == &p) return pool.view(plan.entries[i].offset, p.shape());
    }
    return Tensor();
  });
  nn::CrossEntropyLoss loss;
  const Tensor x = random_tensor({3, 4}, DType::f32, 3);
  const Tensor y = random_labels(3, 3, DType::i32, 4);
  testing::forward_backward(reference, loss, x, y);
  testing::forward_backward(placed, loss, x, y);
  EXPECT_GE(calls, 4);
  EXPECT_FALSE(placed.storage().grads().defined());
  EXPECT_FALSE(placed.storage().owns_grad_buffer());
  for (nn::Parameter* p : params) EXPECT_TRUE(p->grad.shares_storage_with(pool)) << p->name;
  testing::expect_same_grads(placed, reference, 0, 0, "placed by the hook");
}

// Module::to moves the values and reallocates the storage's own gradients (zeroed) in their
// plan, as its comment says.
TEST(FlatStorage, ToKeepsTheStoragesOwnGradients) {
  nn::Sequential model;
  testing::build_mlp(model, 4, 5, 3);
  model.init(7);
  model.storage().flatten();
  nn::CrossEntropyLoss loss;
  testing::forward_backward(model, loss, random_tensor({3, 4}, DType::f32, 5), random_labels(3, 3, DType::i32, 6));
  ASSERT_TRUE(model.storage().owns_grad_buffer());
  const nn::FlatPlan plan = *model.storage().plan();
  const auto before = testing::parameter_values(model);
  model.to(Device::cpu());
  ASSERT_NE(model.storage().plan(), nullptr);
  EXPECT_TRUE(*model.storage().plan() == plan);
  EXPECT_TRUE(model.storage().owns_grad_buffer());
  ASSERT_NE(model.storage().grad_plan(), nullptr);
  EXPECT_TRUE(*model.storage().grad_plan() == plan);
  ASSERT_TRUE(model.storage().grads().defined());
  for (float g : model.storage().grads().to_floats()) ASSERT_EQ(g, 0.0f);
  const std::vector<nn::Parameter*> params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(params[i]->value.shares_storage_with(model.storage().values())) << params[i]->name;
    EXPECT_TRUE(params[i]->grad.shares_storage_with(model.storage().grads())) << params[i]->name;
    EXPECT_EQ(params[i]->value.to_floats(), before[i].second) << params[i]->name;
  }
}

}  // namespace
}  // namespace tutti
