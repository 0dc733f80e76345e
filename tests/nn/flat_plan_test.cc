// The flat plan: parameters and gradients as views of flat buffers, placed buffers, plans
// that do not fit, buckets and shards, coalesced views; and a flat model on the GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "nn/nn_test_util.h"
#include "tutti/kernels/cross_entropy.h"
#include "tutti/kernels/elementwise.h"
#include "tutti/kernels/linear.h"
#include "tutti/kernels/optimizer.h"
#include "tutti/nn/init.h"
#include "tutti/optim/sgd.h"

namespace tutti {
namespace {

using testing::build_conv_model;
using testing::expect_close;
using testing::random_labels;
using testing::random_tensor;

// ---- flat buffers ----------------------------------------------------------------------

TEST(Flat, ParametersAndGradsAreViewsInReverseOrder) {
  nn::Sequential model;
  build_conv_model(model);
  model.init(6);
  const auto before = testing::parameter_values(model);
  model.storage().flatten();
  const auto params = model.parameters();
  ASSERT_NE(model.storage().plan(), nullptr);
  const nn::FlatPlan& plan = *model.storage().plan();
  ASSERT_TRUE(model.storage().values().defined());
  EXPECT_EQ(model.storage().values().numel(), plan.total);
  // Reverse registration order: the last parameter starts the buffer, the first ends it;
  // every offset aligned to 8 elements.
  EXPECT_EQ(plan.entries.back().offset, 0);
  EXPECT_LE(plan.entries.front().offset + params.front()->numel(), plan.total);
  EXPECT_GT(plan.entries.front().offset + params.front()->numel(), plan.total - 8) << "padding: one block at most";
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(plan.entries[i].offset % 8, 0);
    EXPECT_TRUE(params[i]->value.shares_storage_with(model.storage().values())) << params[i]->name;
    EXPECT_EQ(params[i]->value.data(), model.storage().values().view(plan.entries[i].offset, {1}).data());
    EXPECT_EQ(params[i]->value.to_floats(), before[i].second) << params[i]->name;
  }
  nn::CrossEntropyLoss loss;
  testing::forward_backward(model, loss, random_tensor({2, 2, 6, 6}, DType::f32, 1),
                            random_labels(2, 5, DType::i32, 1));
  ASSERT_TRUE(model.storage().grads().defined());
  EXPECT_TRUE(model.storage().owns_grad_buffer());
  ASSERT_NE(model.storage().grad_plan(), nullptr);
  EXPECT_EQ(model.storage().grad_plan(), model.storage().plan())
      << "the first backward lays gradients out by the values' plan";
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(params[i]->grad.shares_storage_with(model.storage().grads())) << params[i]->name;
  }
}

// The data-parallel runtime's way: its own buffer, with gaps between parameters.
TEST(Flat, GradientsGoIntoAPlacedBufferWithGaps) {
  nn::Sequential reference, placed;
  build_conv_model(reference);
  build_conv_model(placed);
  reference.init(8);
  placed.init(8);
  const nn::FlatPlan plan = placed.storage().make_plan({.align_elements = 16});
  EXPECT_EQ(plan.entries.back().offset, 0);
  for (const nn::PlanEntry& e : plan.entries) EXPECT_EQ(e.offset % 16, 0);
  Tensor bucket = Tensor::zeros({plan.total + 3}, DType::f32);
  placed.storage().set_grad_buffer(bucket, plan);
  EXPECT_TRUE(placed.storage().grads().defined());
  EXPECT_FALSE(placed.storage().owns_grad_buffer());  // not the model's own
  const Tensor x = random_tensor({3, 2, 6, 6}, DType::f32, 2);
  const Tensor y = random_labels(3, 5, DType::i32, 3);
  nn::CrossEntropyLoss loss;
  testing::forward_backward(reference, loss, x, y);
  testing::forward_backward(placed, loss, x, y);
  testing::expect_same_grads(placed, reference, 0, 0, "placed grads");
  const std::vector<float> flat = bucket.to_floats();
  const auto params = placed.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::vector<float> g = params[i]->grad.to_floats();
    for (std::int64_t j = 0; j < params[i]->numel(); ++j) {
      ASSERT_EQ(flat[static_cast<std::size_t>(plan.entries[i].offset + j)], g[static_cast<std::size_t>(j)]);
    }
  }
  // Gaps stay zero.
  std::vector<bool> used(flat.size(), false);
  for (std::size_t i = 0; i < params.size(); ++i) {
    for (std::int64_t j = 0; j < params[i]->numel(); ++j)
      used[static_cast<std::size_t>(plan.entries[i].offset + j)] = true;
  }
  for (std::size_t j = 0; j < flat.size(); ++j) {
    if (!used[j]) ASSERT_EQ(flat[j], 0.0f) << "gap element " << j;
  }
  // Direct placement works too: param.grad = buffer.view(offset, shape).
  Tensor other = Tensor::zeros({plan.total}, DType::f32);
  for (std::size_t i = 0; i < params.size(); ++i)
    params[i]->grad = other.view(plan.entries[i].offset, params[i]->shape());
  testing::forward_backward(placed, loss, x, y);
  testing::expect_same_grads(placed, reference, 0, 0, "directly placed grads");
}

// One plan: buffers laid out by two different plans, or a plan of another model, are errors.
TEST(Flat, PlansThatDoNotFitAreRejected) {
  nn::Sequential model, other;
  testing::build_mlp(model, 3, 4, 2);
  testing::build_mlp(other, 3, 5, 2);
  model.init(1);
  const nn::FlatPlan plan = model.storage().make_plan();
  EXPECT_THROW(model.storage().flatten(other.storage().make_plan()), InvalidArgument);
  EXPECT_THROW(model.storage().set_grad_buffer(Tensor::zeros({plan.total - 1}, DType::f32), plan), InvalidArgument);
  model.storage().flatten(plan);
  const nn::FlatPlan wider = model.storage().make_plan({.align_elements = 32});
  ASSERT_FALSE(wider == plan);
  try {
    model.storage().set_grad_buffer(Tensor::zeros({wider.total}, DType::f32), wider);
    FAIL() << "gradients in another plan than the values must be refused";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("values and gradients must share one"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model.storage().allocate_grads(wider), InvalidArgument);
  model.storage().allocate_grads(plan);
  EXPECT_EQ(model.storage().grad_plan(), model.storage().plan());
}

// The plan itself: buckets cut at parameter boundaries by the caps, padded so that every
// rank's chunk is aligned; chunks tile each bucket; shard offsets follow each other.
TEST(Flat, PlanBucketsAndShards) {
  std::vector<nn::PlanParam> params = {{"a", {1000}}, {"b", {3}}, {"c", {7, 9}}, {"d", {1}}, {"e", {333}}};
  for (int world : {1, 2, 3, 4}) {
    nn::FlatPlanOptions o;
    o.world_size = world;
    o.first_bucket_cap_mb = 1000 * 4.0 / (1024 * 1024);  // 1000 f32: e, d, c, b fit; a does not
    o.bucket_cap_mb = 1e-9;                              // then one parameter per bucket
    const nn::FlatPlan plan = nn::make_flat_plan(params, o);
    ASSERT_EQ(plan.buckets.size(), 2u) << plan.describe();
    EXPECT_EQ(plan.entries[4].offset, 0);
    EXPECT_EQ(plan.entries[4].bucket, 0);
    EXPECT_EQ(plan.entries[1].bucket, 0);
    EXPECT_EQ(plan.entries[0].bucket, 1);
    std::int64_t shard = 0, at = 0;
    for (const nn::PlanBucket& b : plan.buckets) {
      EXPECT_EQ(b.begin, at);
      EXPECT_EQ(b.numel() % (8 * world), 0) << "bucket padded to a multiple of world size x alignment";
      EXPECT_EQ(b.chunk * world, b.numel());
      EXPECT_EQ(b.shard_offset, shard);
      for (std::size_t i : b.entries) {
        EXPECT_GE(plan.entries[i].offset, b.begin);
        EXPECT_LE(plan.entries[i].offset + plan.entries[i].numel, b.end);
      }
      shard += b.chunk;
      at = b.end;
    }
    EXPECT_EQ(plan.total, at);
    EXPECT_EQ(plan.shard_numel, shard);
    // Every element of the buffer belongs to exactly one rank's shard.
    std::vector<int> owner(static_cast<std::size_t>(plan.total), -1);
    for (int r = 0; r < world; ++r) {
      for (const nn::ElementRange& range : plan.shard_ranges(r)) {
        for (std::int64_t j = range.begin; j < range.end; ++j) {
          ASSERT_EQ(owner[static_cast<std::size_t>(j)], -1);
          owner[static_cast<std::size_t>(j)] = r;
        }
      }
    }
    EXPECT_EQ(std::count(owner.begin(), owner.end(), -1), 0);
    // Less than one alignment block of padding per rank and bucket beyond the parameters'.
    std::int64_t params_numel = 0;
    for (const nn::PlanEntry& e : plan.entries) params_numel += e.numel;
    EXPECT_LT(plan.total - params_numel, static_cast<std::int64_t>(plan.buckets.size() * 8 * world + 5 * 8));
  }
  EXPECT_THROW(nn::make_flat_plan(params, {.world_size = 0}), InvalidArgument);
}

TEST(Flat, SegmentsCutBuckets) {
  // Five parameters in three segments (0, 0, 1, 1, 2) under caps that would hold them all: a
  // bucket per segment, in reverse order; the caps still cut inside a segment.
  const std::vector<nn::PlanParam> specs = {{"a", {10}}, {"b", {6}}, {"c", {20}}, {"d", {3}}, {"e", {7}}};
  nn::FlatPlanOptions o;
  o.segments = {0, 0, 1, 1, 2};
  o.world_size = 2;
  const nn::FlatPlan plan = nn::make_flat_plan(specs, o);
  ASSERT_EQ(plan.buckets.size(), 3u);
  EXPECT_EQ(plan.buckets[0].entries, (std::vector<std::size_t>{4}));
  EXPECT_EQ(plan.buckets[1].entries, (std::vector<std::size_t>{3, 2}));
  EXPECT_EQ(plan.buckets[2].entries, (std::vector<std::size_t>{1, 0}));
  for (const nn::PlanBucket& b : plan.buckets) EXPECT_EQ(b.numel() % 16, 0) << "aligned for two shards";
  o.bucket_cap_mb = o.first_bucket_cap_mb = 15 * 4 / (1024.0 * 1024);  // 15 f32: no pair fits
  EXPECT_EQ(nn::make_flat_plan(specs, o).buckets.size(), 5u);
  o.segments = {0, 1};
  EXPECT_THROW(nn::make_flat_plan(specs, o), InvalidArgument);
}

TEST(Flat, CoalesceViewsMergesNeighbours) {
  Tensor buf = Tensor::zeros({20}, DType::f32);
  // Reverse order, as gradients are laid out: b before a in memory, listed a then b.
  const Tensor a = buf.view(10, {2, 5}), b = buf.view(4, {6}), c = buf.view(0, {3});
  auto merged = nn::coalesce_views({a, b, c, Tensor::zeros({4}, DType::f32)});
  ASSERT_EQ(merged.size(), 3u);  // a+b merged; c is not adjacent to b (gap at 3); the separate one
  EXPECT_EQ(merged[0].numel(), 16);
  EXPECT_EQ(merged[0].data(), b.data());
  EXPECT_EQ(merged[1].numel(), 3);
}

// ---- GPU twin --------------------------------------------------------------------------

TEST(Gpu, FlatModelAndAccumulationMatchCpu) {
  TUTTI_REQUIRE_GPU();
  nn::Sequential cpu, gpu;
  build_conv_model(cpu);
  build_conv_model(gpu);
  cpu.init(3);
  gpu.to(Device::cuda(0)).init(3);
  cpu.storage().flatten();
  gpu.storage().flatten();
  const Tensor x = random_tensor({6, 2, 6, 6}, DType::f32, 4);
  const Tensor y = random_labels(6, 5, DType::i64, 5);
  nn::CrossEntropyLoss lc, lg;
  cpu.zero_grad();
  gpu.zero_grad();
  for (int i = 0; i < 2; ++i) {
    testing::forward_backward(cpu, lc, testing::rows(x, 3 * i, 3), testing::rows(y, 3 * i, 3), 0.5f);
    testing::forward_backward(gpu, lg, testing::rows(x, 3 * i, 3).to(Device::cuda(0)),
                              testing::rows(y, 3 * i, 3).to(Device::cuda(0)), 0.5f);
  }
  testing::expect_same_grads(gpu, cpu, 1e-3, 1e-5, "accumulated GPU grads");
  EXPECT_TRUE(gpu.storage().grads().defined());
  EXPECT_TRUE(gpu.storage().grads().device().is_cuda());
}

}  // namespace
}  // namespace tutti
