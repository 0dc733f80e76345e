// CrossEntropyLoss over logits of any rank ([..., C] with labels [...]), against the [N, C]
// path; and Module::backward's check that dy has the shape of the forward's output.
#include <gtest/gtest.h>

#include "nn/nn_test_util.h"

namespace tutti {
namespace {

using testing::expect_close;
using testing::random_labels;
using testing::random_tensor;

TEST(Loss, LeadingDimensionsAreRows) {
  const std::int64_t B = 2, T = 5, C = 7;
  for (DType d : {DType::f32, DType::bf16}) {
    const Tensor logits = random_tensor({B, T, C}, d, 1, -3.f, 3.f);
    Tensor labels = random_labels(B * T, C, DType::i64, 2);
    labels.data_as<std::int64_t>()[3] = -100;  // an ignored row counts neither in the loss nor in the mean
    nn::CrossEntropyLoss rows, stacked;
    rows.forward(logits.reshape({B * T, C}), labels, 0.5f);
    stacked.forward(logits, labels.reshape({B, T}), 0.5f);
    EXPECT_EQ(nn::item(stacked.loss()), nn::item(rows.loss())) << name_of(d);
    EXPECT_EQ(stacked.grad().shape(), (Shape{B, T, C}));
    EXPECT_EQ(stacked.grad().dtype(), d);
    expect_close(stacked.grad().to_floats(), rows.grad().to_floats(), 0, 0, "[B, T, C] gradient against [N, C]");
    // And a 4-D one.
    nn::CrossEntropyLoss four;
    four.forward(logits.reshape({B, 1, T, C}), labels.reshape({B, 1, T}), 0.5f);
    EXPECT_EQ(nn::item(four.loss()), nn::item(rows.loss()));
  }
}

TEST(Loss, LabelsMustHaveTheLeadingShape) {
  const Tensor logits = random_tensor({2, 3, 4}, DType::f32, 3);
  nn::CrossEntropyLoss loss;
  EXPECT_THROW(loss.forward(logits, random_labels(6, 4, DType::i32, 4)), InvalidArgument);  // [6], not [2, 3]
  EXPECT_THROW(loss.forward(logits, random_labels(6, 4, DType::i32, 4).reshape({3, 2})), InvalidArgument);
  EXPECT_THROW(loss.forward(random_tensor({4}, DType::f32, 5), random_labels(1, 4, DType::i32, 4)), InvalidArgument);
}

// A model whose output is [B, T, C] (Linear over the last dimension): the loss's [B, T, C]
// gradient trains it exactly as the same model fed [B·T, in] rows.
TEST(Loss, SequenceModelTrainsAsRows) {
  const std::int64_t B = 3, T = 4, in = 6, C = 5;
  nn::Sequential seq, flat;
  testing::build_mlp(seq, in, 8, C);
  testing::build_mlp(flat, in, 8, C);
  seq.init(7);
  flat.init(7);
  const Tensor x = random_tensor({B, T, in}, DType::f32, 8);
  const Tensor y = random_labels(B * T, C, DType::i32, 9);
  nn::CrossEntropyLoss a, b;
  a.forward(seq.forward(x), y.reshape({B, T}));
  seq.backward(a.grad());
  b.forward(flat.forward(x.reshape({B * T, in})), y);
  flat.backward(b.grad());
  EXPECT_EQ(nn::item(a.loss()), nn::item(b.loss()));
  testing::expect_same_grads(seq, flat, 0, 0, "[B, T, in] model against [B·T, in] rows");
}

TEST(Backward, GradientMustHaveTheOutputsShape) {
  const std::int64_t B = 2, T = 3, in = 4, C = 5;
  nn::Sequential model;
  testing::build_mlp(model, in, 6, C);
  model.init(1);
  const Tensor x = random_tensor({B, T, in}, DType::f32, 2);
  model.forward(x);
  // [B·T, C] for a [B, T, C] output: the same elements, but not the output's gradient.
  try {
    model.backward(random_tensor({B * T, C}, DType::f32, 3));
    FAIL() << "a [B·T, C] gradient for a [B, T, C] output must be refused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3, 5]"), std::string::npos) << e.what();
  }
  // The right shape still works after the refusal (the forward was not consumed).
  model.backward(random_tensor({B, T, C}, DType::f32, 3));
  for (auto* p : model.parameters()) EXPECT_TRUE(p->grad.defined()) << p->name;
}

}  // namespace
}  // namespace tutti
