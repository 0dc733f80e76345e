// The Reducer over raw gradient buffers (the low-level API for programs with their own
// kernels): sums and averages across ranks exactly, whatever order gradients become ready
// in, in buckets of any size, with half-precision communication, and one flag for inf/nan.
#include "tutti/ddp/reducer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "ddp_world.h"

namespace tutti::ddp {
namespace {

using testing::world;

std::vector<nn::PlanParam> specs() { return {{"a", {3, 5}}, {"b", {7}}, {"c", {1}}, {"d", {4, 4, 2}}, {"e", {33}}}; }

// The plan of specs(): tiny buckets (one gradient each) when asked, sharded over `world`.
nn::FlatPlan plan(bool tiny_buckets = false, int world = 1, double first_bucket_mb = 1.0) {
  nn::FlatPlanOptions o;
  o.world_size = world;
  o.first_bucket_cap_mb = first_bucket_mb;
  if (tiny_buckets) o.bucket_cap_mb = o.first_bucket_cap_mb = 1e-9;
  return nn::make_flat_plan(specs(), o);
}

// Gradient i, element j on rank r: small integers, exact in every dtype and every sum.
float value(std::size_t i, std::int64_t j, int r) {
  return static_cast<float>((static_cast<int>(i) * 7 + j) % 13 - 6 + r);
}

void fill(Reducer& red, int rank) {
  for (std::size_t i = 0; i < red.size(); ++i) {
    Tensor g = red.grad(i);
    std::vector<float> v(static_cast<std::size_t>(g.numel()));
    for (std::int64_t j = 0; j < g.numel(); ++j) v[static_cast<std::size_t>(j)] = value(i, j, rank);
    g.copy_from(Tensor::from_floats(v, g.shape(), g.dtype()));
  }
}

// Marks every gradient ready in an order of this rank's own: the reducer must still launch
// the buckets in the same order everywhere.
void mark_all_in_rank_order(Reducer& red) {
  std::vector<std::size_t> order(red.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(static_cast<unsigned>(world().rank()) * 31u + 1u);
  std::shuffle(order.begin(), order.end(), rng);
  for (std::size_t i : order) red.mark_ready(i);
}

void expect_reduced(Reducer& red, bool average, double divisor, double tolerance) {
  const int n = world().world_size();
  for (std::size_t i = 0; i < red.size(); ++i) {
    const auto got = red.grad(i).to_floats();
    for (std::int64_t j = 0; j < static_cast<std::int64_t>(got.size()); ++j) {
      double sum = 0;
      for (int r = 0; r < n; ++r) sum += value(i, j, r);
      const double expected = sum / (average ? n : 1) / divisor;
      ASSERT_NEAR(got[static_cast<std::size_t>(j)], expected, tolerance * std::max(1.0, std::fabs(expected)))
          << "gradient " << i << " element " << j;
    }
  }
}

TEST(Reducer, AveragesInAnyReadyOrderWithTinyBuckets) {
  Reducer red(world().communicator(), plan(/*tiny_buckets=*/true), DType::f32, Device::cpu());
  EXPECT_EQ(red.bucket_count(), 5);
  // Reverse layout: the last gradient first.
  EXPECT_EQ(red.offset(4), 0);
  EXPECT_EQ(red.bucket_of(4), 0);
  for (std::size_t i = 0; i < red.size(); ++i) EXPECT_EQ(red.offset(i) % 8, 0) << "aligned offsets";
  red.prepare(true);
  fill(red, world().rank());
  mark_all_in_rank_order(red);
  const Tensor& found = red.finish(2.0);
  EXPECT_EQ(found.to_ints()[0], 0);
  expect_reduced(red, /*average=*/true, 2.0, 1e-6);
}

TEST(Reducer, SumsWithOverlapOffAndOneBucket) {
  ReducerOptions o;
  o.average = false;
  o.overlap = false;
  Reducer red(world().communicator(), plan(), DType::f32, Device::cpu(), o);
  EXPECT_EQ(red.bucket_count(), 1);
  red.prepare(true);
  fill(red, world().rank());
  mark_all_in_rank_order(red);
  red.finish(1.0);
  expect_reduced(red, /*average=*/false, 1.0, 0);
}

TEST(Reducer, HalfPrecisionOnTheWire) {
  for (DType wire : {DType::bf16, DType::f16}) {
    ReducerOptions o;
    o.grad_comm_dtype = wire;
    Reducer red(world().communicator(), plan(false, 1, 1e-4), DType::f32, Device::cpu(), o);
    red.prepare(true);
    fill(red, world().rank());
    mark_all_in_rank_order(red);
    red.finish(1.0);
    // Dividing by N before the sum rounds once per rank in the half type.
    expect_reduced(red, true, 1.0, wire == DType::bf16 ? 1e-2 : 2e-3);
  }
}

TEST(Reducer, HalfGradientsAreReducedInPlace) {
  Reducer red(world().communicator(), plan(), DType::bf16, Device::cpu(), {});
  EXPECT_EQ(red.buffer().dtype(), DType::bf16);
  red.prepare(true);
  fill(red, world().rank());
  mark_all_in_rank_order(red);
  red.finish(1.0);
  expect_reduced(red, true, 1.0, 1e-2);
}

TEST(Reducer, InfOnOneRankRaisesTheFlagOnEveryRank) {
  Reducer red(world().communicator(), plan(), DType::f32, Device::cpu(), {});
  red.prepare(true);
  fill(red, world().rank());
  if (world().rank() == 0) red.grad(3).data_as<float>()[5] = std::numeric_limits<float>::infinity();
  mark_all_in_rank_order(red);
  EXPECT_EQ(red.finish(1.0).to_ints()[0], 1);
  // The next clean pass clears it.
  red.zero();
  red.prepare(true);
  fill(red, world().rank());
  mark_all_in_rank_order(red);
  EXPECT_EQ(red.finish(1.0).to_ints()[0], 0);
}

TEST(Reducer, NonSyncPassesCommunicateNothingAndAccumulate) {
  Reducer red(world().communicator(), plan(), DType::f32, Device::cpu(), {});
  red.prepare(false);
  fill(red, world().rank());
  mark_all_in_rank_order(red);
  // Nothing was reduced: the local values are still there.
  EXPECT_EQ(red.grad(0).to_floats()[1], value(0, 1, world().rank()));
  EXPECT_THROW(red.finish(1.0), Error);
}

// The recipe of docs/user-guide.md ("Your own kernels: the Reducer"), step by step as written
// there: prepare(sync) opens every backward pass, gradients are ADDED into grad(i) and marked
// ready, finish(k) closes the step, zero() readies the reused buffer for the next one.
TEST(Reducer, TheUserGuideRecipeRunsAsWritten) {
  const int n = world().world_size(), rank = world().rank();
  // Each gradient's value on a (step, micro-batch): small integers, exact in any sum.
  auto contribution = [](std::size_t i, std::int64_t j, int r, int step, int micro) {
    return value(i, j, r) * static_cast<float>(1 + step + 2 * micro);
  };
  Reducer reducer(world().communicator(), plan(), DType::f32, Device::cpu());
  const Stream stream;  // the CPU's; a GPU program passes its compute stream
  const int k = 2;      // micro-batches per optimizer step
  for (int step = 0; step < 3; ++step) {
    for (int micro = 0; micro < k; ++micro) {
      reducer.prepare(/*sync=*/micro == k - 1, stream);
      for (std::size_t i = reducer.size(); i-- > 0;) {  // backward: last gradient first
        Tensor g = reducer.grad(i);
        std::vector<float> v = g.to_floats();
        for (std::int64_t j = 0; j < g.numel(); ++j) {
          v[static_cast<std::size_t>(j)] += contribution(i, j, rank, step, micro);
        }
        g.copy_from(Tensor::from_floats(v, g.shape()));
        reducer.mark_ready(i);
      }
    }
    const Tensor& found = reducer.finish(/*divisor=*/k);
    stream.synchronize();
    ASSERT_EQ(found.to_ints()[0], 0);
    // The optimizer would read the averaged gradients here.
    for (std::size_t i = 0; i < reducer.size(); ++i) {
      const std::vector<float> got = reducer.grad(i).to_floats();
      for (std::int64_t j = 0; j < static_cast<std::int64_t>(got.size()); ++j) {
        double sum = 0;
        for (int r = 0; r < n; ++r) {
          for (int micro = 0; micro < k; ++micro) sum += contribution(i, j, r, step, micro);
        }
        ASSERT_NEAR(got[static_cast<std::size_t>(j)], sum / (n * k), 1e-6 * std::max(1.0, std::fabs(sum)))
            << "step " << step << ", gradient " << i << ", element " << j;
      }
    }
    reducer.zero();
  }
  // Leaving out a step of the recipe is an error, not a wrong sum.
  EXPECT_THROW(reducer.mark_ready(0), Error);  // no prepare() since finish()
  reducer.prepare(true, stream);
  for (std::size_t i = 0; i < reducer.size(); ++i) reducer.mark_ready(i);
  try {
    reducer.prepare(true, stream);  // without finish(): the sums would never be averaged
    FAIL() << "a communicating pass that was never finished must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("never finished: call finish()"), std::string::npos) << e.what();
  }
  reducer.finish(k);
}

TEST(Reducer, MisuseIsAClearError) {
  Reducer red(world().communicator(), plan(), DType::f32, Device::cpu(), {});
  EXPECT_THROW(red.mark_ready(0), Error);  // before prepare
  red.prepare(false);
  red.mark_ready(2);
  try {
    red.mark_ready(2);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'c' was marked ready twice"), std::string::npos) << e.what();
  }
  EXPECT_THROW(red.mark_ready(99), InvalidArgument);
  EXPECT_THROW(Reducer(world().communicator(), plan(), DType::i32, Device::cpu(), {}), InvalidArgument);
}

// Sharded on the job's backend (mpi): every rank's chunks of every bucket hold the average of
// the ranks' gradients there, with halves on the wire too, and the found flag is agreed.
TEST(Reducer, ShardedReductionsGiveEachRankItsChunks) {
  const int n = world().world_size(), rank = world().rank();
  for (GradientSharding sharding : {GradientSharding::scatter, GradientSharding::shard_only}) {
    for (DType wire : {DType::f32, DType::bf16}) {
      ReducerOptions o;
      o.sharding = sharding;
      o.grad_comm_dtype = wire;
      Reducer red(world().communicator(), plan(/*tiny_buckets=*/true, n), DType::f32, Device::cpu(), o);
      red.prepare(true);
      fill(red, rank);
      if (rank == 0 && wire == DType::f32) red.grad(1).data_as<float>()[0] = std::numeric_limits<float>::infinity();
      mark_all_in_rank_order(red);
      // The inf lands in one rank's chunk; the flag is every rank's.
      EXPECT_EQ(red.finish(2.0).to_ints()[0], wire == DType::f32 ? 1 : 0);
      const nn::FlatPlan& p = red.plan();
      for (int b = 0; b < red.bucket_count(); ++b) {
        const std::vector<float> got = red.shard_grad(b).to_floats();
        const nn::ElementRange mine = p.buckets[static_cast<std::size_t>(b)].chunk_of(rank);
        for (std::int64_t j = mine.begin; j < mine.end; ++j) {
          double expected = 0;
          bool inf = false;
          for (std::size_t i = 0; i < p.entries.size(); ++i) {
            const nn::PlanEntry& e = p.entries[i];
            if (j < e.offset || j >= e.offset + e.numel) continue;
            for (int r = 0; r < n; ++r) expected += value(i, j - e.offset, r);
            inf = i == 1 && j == e.offset && wire == DType::f32;
          }
          expected /= 2.0 * n;
          const float g = got[static_cast<std::size_t>(j - mine.begin)];
          if (inf) {
            EXPECT_TRUE(std::isinf(g));
          } else {
            ASSERT_NEAR(g, expected, (wire == DType::bf16 ? 1e-2 : 1e-6) * std::max(1.0, std::fabs(expected)))
                << "bucket " << b << " element " << j;
          }
        }
      }
      red.zero();
    }
  }
}

}  // namespace
}  // namespace tutti::ddp

int main(int argc, char** argv) { return tutti::testing::run_world_tests(argc, argv); }
