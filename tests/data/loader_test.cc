// DistributedLoader: the global order is a function of (seed, epoch) only, every world size
// splits the same global batches, and a saved position resumes exactly.
#include "tutti/data/loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>

namespace tutti::data {
namespace {

// A dataset whose rows are random (never a function of the index), [n, row_shape...] f32,
// labels i32 random in [0, 10).
Dataset random_dataset(std::int64_t n, Shape row_shape, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Shape shape = {n};
  shape.insert(shape.end(), row_shape.begin(), row_shape.end());
  std::vector<float> x(static_cast<std::size_t>(numel_of(shape)));
  for (auto& v : x) v = u(rng);
  std::vector<std::int64_t> y(static_cast<std::size_t>(n));
  for (auto& v : y) v = static_cast<std::int64_t>(rng() % 10);
  return Dataset{Tensor::from_floats(x, shape), Tensor::from_ints(y, {n})};
}

// The permutation as documented in loader.h, written out again from the spec.
std::vector<std::int64_t> spec_permutation(std::int64_t n, std::uint64_t seed, std::int64_t epoch) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(epoch + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z = z ^ (z >> 31);
  std::mt19937_64 engine(z);
  std::vector<std::int64_t> p(static_cast<std::size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  for (std::int64_t i = n - 1; i > 0; --i) {
    const unsigned __int128 two64 = static_cast<unsigned __int128>(1) << 64;
    const std::uint64_t bound = static_cast<std::uint64_t>(i + 1);
    const std::uint64_t threshold = static_cast<std::uint64_t>(two64 % bound);
    std::uint64_t x;
    do x = engine();
    while (x < threshold);
    std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(x % bound)]);
  }
  return p;
}

// Rows `indices` of a dataset, gathered naively through to_floats / to_ints.
std::pair<std::vector<float>, std::vector<std::int64_t>> naive_rows(const Dataset& d,
                                                                    const std::vector<std::int64_t>& indices) {
  const auto x = d.images.to_floats();
  const auto y = d.labels.to_ints();
  const std::size_t row = x.size() / static_cast<std::size_t>(d.size());
  std::pair<std::vector<float>, std::vector<std::int64_t>> out;
  for (std::int64_t i : indices) {
    out.first.insert(out.first.end(), x.begin() + static_cast<std::ptrdiff_t>(i * row),
                     x.begin() + static_cast<std::ptrdiff_t>((i + 1) * row));
    out.second.push_back(y[static_cast<std::size_t>(i)]);
  }
  return out;
}

TEST(EpochPermutation, IsAPermutationAndFollowsTheSpec) {
  for (std::int64_t n : {0, 1, 2, 7, 1000, 60000}) {
    for (std::uint64_t seed : {0ull, 1ull, 0xDEADBEEFCAFEull}) {
      for (std::int64_t epoch : {0, 1, 17}) {
        const auto p = epoch_permutation(n, seed, epoch);
        ASSERT_EQ(p, spec_permutation(n, seed, epoch)) << "n " << n << " seed " << seed << " epoch " << epoch;
        auto sorted = p;
        std::sort(sorted.begin(), sorted.end());
        for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(sorted[static_cast<std::size_t>(i)], i);
      }
    }
  }
}

TEST(EpochPermutation, DependsOnSeedAndEpoch) {
  const auto a = epoch_permutation(1000, 42, 0);
  EXPECT_EQ(a, epoch_permutation(1000, 42, 0));
  EXPECT_NE(a, epoch_permutation(1000, 42, 1));
  EXPECT_NE(a, epoch_permutation(1000, 43, 0));
  std::vector<std::int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(a, identity);
}

TEST(EpochPermutation, IsUniformOverPermutationsOfThree) {
  // 6 permutations, 6000 epochs: each should appear ~1000 times. A chi-square with 5 degrees
  // of freedom exceeds 25 with probability < 2e-4.
  std::map<std::vector<std::int64_t>, int> counts;
  const int trials = 6000;
  for (int e = 0; e < trials; ++e) ++counts[epoch_permutation(3, 7, e)];
  ASSERT_EQ(counts.size(), 6u);
  double chi2 = 0;
  for (const auto& [perm, c] : counts) chi2 += (c - 1000.0) * (c - 1000.0) / 1000.0;
  EXPECT_LT(chi2, 25.0);
}

TEST(DistributedLoader, EveryWorldSizeSplitsTheSameGlobalBatches) {
  // 89 samples, global batch 12: 7 steps per epoch, 5 samples dropped per epoch.
  const Dataset data = random_dataset(89, {3, 5}, 1);
  DistributedLoader one(data, {.global_micro_batch_size = 12, .rank = 0, .world_size = 1, .seed = 9});
  ASSERT_EQ(one.steps_per_epoch(), 7);
  for (int world : {1, 2, 3, 4}) {
    std::vector<DistributedLoader> ranks;
    for (int r = 0; r < world; ++r) {
      ranks.emplace_back(data, LoaderOptions{.global_micro_batch_size = 12, .rank = r, .world_size = world, .seed = 9});
      EXPECT_EQ(ranks.back().local_micro_batch_size(), 12 / world);
      EXPECT_EQ(ranks.back().steps_per_epoch(), 7);
    }
    for (std::int64_t epoch : {0, 1, 5}) {
      for (std::int64_t step = 0; step < 7; ++step) {
        const Batch global = one.batch(epoch, step);
        std::vector<float> x;
        std::vector<std::int64_t> y, idx;
        for (int r = 0; r < world; ++r) {
          const Batch b = ranks[r].batch(epoch, step);
          EXPECT_EQ(b.images.shape(), (Shape{12 / world, 3, 5}));
          EXPECT_EQ(b.labels.shape(), (Shape{12 / world}));
          EXPECT_EQ(b.epoch, epoch);
          EXPECT_EQ(b.step, step);
          const auto bx = b.images.to_floats();
          const auto by = b.labels.to_ints();
          x.insert(x.end(), bx.begin(), bx.end());
          y.insert(y.end(), by.begin(), by.end());
          const auto bi = ranks[r].batch_indices(epoch, step);
          idx.insert(idx.end(), bi.begin(), bi.end());
        }
        ASSERT_EQ(x, global.images.to_floats()) << "world " << world << " epoch " << epoch << " step " << step;
        ASSERT_EQ(y, global.labels.to_ints());
        // ... and those are the rows named by the spec's permutation.
        const auto perm = spec_permutation(89, 9, epoch);
        const std::vector<std::int64_t> expected(perm.begin() + step * 12, perm.begin() + (step + 1) * 12);
        ASSERT_EQ(idx, expected);
        const auto naive = naive_rows(data, expected);
        ASSERT_EQ(x, naive.first);
        ASSERT_EQ(y, naive.second);
      }
    }
  }
}

TEST(DistributedLoader, AnEpochVisitsDistinctSamplesAndDropsTheRemainder) {
  const Dataset data = random_dataset(50, {4}, 2);
  for (int world : {1, 2, 4}) {
    for (int r = 0; r < world; ++r) {
      DistributedLoader loader(data, {.global_micro_batch_size = 8, .rank = r, .world_size = world, .seed = 3});
      std::set<std::int64_t> seen;
      for (std::int64_t s = 0; s < loader.steps_per_epoch(); ++s) {
        for (std::int64_t i : loader.batch_indices(2, s)) EXPECT_TRUE(seen.insert(i).second) << i;
      }
      EXPECT_EQ(seen.size(), static_cast<std::size_t>(6 * 8 / world));  // 50 / 8 = 6 steps, 2 dropped
    }
  }
  // Different epochs drop different samples (the remainder is the permutation's tail).
  DistributedLoader loader(data, {.global_micro_batch_size = 8, .seed = 3});
  std::set<std::int64_t> dropped_union;
  for (std::int64_t e = 0; e < 10; ++e) {
    const auto p = epoch_permutation(50, 3, e);
    dropped_union.insert(p.end() - 2, p.end());
  }
  EXPECT_GT(dropped_union.size(), 2u);
}

TEST(DistributedLoader, NextWalksEpochsInOrder) {
  const Dataset data = random_dataset(23, {2}, 3);
  DistributedLoader a(data, {.global_micro_batch_size = 5, .seed = 11});
  DistributedLoader b(data, {.global_micro_batch_size = 5, .seed = 11});
  ASSERT_EQ(a.steps_per_epoch(), 4);
  for (int i = 0; i < 13; ++i) {
    const Batch n = a.next();
    EXPECT_EQ(n.epoch, i / 4);
    EXPECT_EQ(n.step, i % 4);
    EXPECT_EQ(n.images.to_floats(), b.batch(i / 4, i % 4).images.to_floats());
    EXPECT_EQ(a.position(), (LoaderPosition{i / 4, i % 4 + 1}));
  }
}

TEST(DistributedLoader, ShuffleOffKeepsStoredOrder) {
  const Dataset data = random_dataset(10, {1}, 4);
  DistributedLoader loader(data, {.global_micro_batch_size = 4, .rank = 1, .world_size = 2, .shuffle = false});
  EXPECT_EQ(loader.batch_indices(3, 1), (std::vector<std::int64_t>{6, 7}));
}

TEST(DistributedLoader, BatchesAreCopiesOnTheCpu) {
  const Dataset data = random_dataset(16, {1, 28, 28}, 5);
  DistributedLoader loader(data, {.global_micro_batch_size = 8, .seed = 1});
  Batch b = loader.batch(0, 0);
  EXPECT_EQ(b.images.shape(), (Shape{8, 1, 28, 28}));
  EXPECT_EQ(b.labels.dtype(), DType::i32);
  EXPECT_TRUE(b.images.device().is_cpu());
  EXPECT_FALSE(b.images.shares_storage_with(data.images));
  const float before = data.images.to_floats()[0];
  b.images.data_as<float>()[0] = 1234.5f;
  EXPECT_EQ(data.images.to_floats()[0], before);
}

TEST(DistributedLoader, PositionResumesExactlyOnAnyWorldSize) {
  const Dataset data = random_dataset(40, {3}, 6);
  DistributedLoader run(data, {.global_micro_batch_size = 6, .seed = 77});  // 6 steps per epoch
  for (int i = 0; i < 9; ++i) run.next();
  const StateDict saved = run.state_dict();
  std::vector<Batch> expected;
  for (int i = 0; i < 8; ++i) expected.push_back(run.next());

  // The same world size.
  DistributedLoader resumed(data, {.global_micro_batch_size = 6, .seed = 77});
  resumed.load_state_dict(saved);
  EXPECT_EQ(resumed.position(), (LoaderPosition{1, 3}));
  for (const Batch& e : expected) {
    const Batch b = resumed.next();
    EXPECT_EQ(b.epoch, e.epoch);
    EXPECT_EQ(b.step, e.step);
    ASSERT_EQ(b.images.to_floats(), e.images.to_floats());
    ASSERT_EQ(b.labels.to_ints(), e.labels.to_ints());
  }
  // Three ranks resume the same global batches.
  std::vector<DistributedLoader> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back(data, LoaderOptions{.global_micro_batch_size = 6, .rank = r, .world_size = 3, .seed = 77});
    ranks.back().load_state_dict(saved);
  }
  for (const Batch& e : expected) {
    std::vector<float> x;
    for (auto& l : ranks) {
      const auto bx = l.next().images.to_floats();
      x.insert(x.end(), bx.begin(), bx.end());
    }
    ASSERT_EQ(x, e.images.to_floats());
  }
  // At the end of an epoch: next() starts the following one.
  DistributedLoader at_end(data, {.global_micro_batch_size = 6, .seed = 77});
  at_end.set_position({2, 6});
  const Batch b = at_end.next();
  EXPECT_EQ(b.epoch, 3);
  EXPECT_EQ(b.step, 0);
}

TEST(DistributedLoader, RefusesAStateFromAnotherOrder) {
  const Dataset data = random_dataset(40, {3}, 6);
  const StateDict saved = DistributedLoader(data, {.global_micro_batch_size = 6, .seed = 77}).state_dict();
  auto expect_refused = [&](DistributedLoader l, const std::string& what) {
    try {
      l.load_state_dict(saved);
      ADD_FAILURE() << "a state with a different " << what << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_refused(DistributedLoader(data, {.global_micro_batch_size = 6, .seed = 78}), "seed");
  // Another micro-batch size is refused where the position is not a whole number of its batches.
  DistributedLoader one_in(data, {.global_micro_batch_size = 6, .seed = 77});
  one_in.next();
  const StateDict after_one = one_in.state_dict();
  try {
    DistributedLoader(data, {.global_micro_batch_size = 8, .seed = 77}).load_state_dict(after_one);
    ADD_FAILURE() << "a position of 6 samples was accepted for micro-batches of 8";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("global micro-batch size 6 at sample 6"), std::string::npos) << e.what();
  }
  expect_refused(DistributedLoader(data.slice(0, 39), {.global_micro_batch_size = 6, .seed = 77}), "dataset");
  expect_refused(DistributedLoader(data, {.global_micro_batch_size = 6, .seed = 77, .shuffle = false}), "shuffling");
  DistributedLoader l(data, {.global_micro_batch_size = 6, .seed = 77});
  EXPECT_THROW(l.load_state_dict({}), InvalidArgument);   // entries missing
  EXPECT_THROW(l.set_position({0, 7}), InvalidArgument);  // past the epoch's end
  EXPECT_THROW(l.set_position({-1, 0}), InvalidArgument);
}

// Accumulation steps that rise when ranks fall (at the same global batch of 12): a position
// saved with micro-batches of 6 continues with micro-batches of 3 on the same samples.
TEST(DistributedLoader, AnotherMicroBatchSizeContinuesWithTheSameSamples) {
  const Dataset data = random_dataset(40, {3}, 6);
  DistributedLoader before(data, {.global_micro_batch_size = 6, .seed = 77});
  for (int i = 0; i < 4; ++i) before.next();  // 2 optimizer steps of 2 micro-batches
  DistributedLoader after(data, {.global_micro_batch_size = 3, .rank = 0, .world_size = 1, .seed = 77});
  after.load_state_dict(before.state_dict());
  EXPECT_EQ(after.position().step, 8);
  std::vector<float> expected, got;
  for (int i = 0; i < 2; ++i) {
    const auto v = before.next().images.to_floats();
    expected.insert(expected.end(), v.begin(), v.end());
  }
  for (int i = 0; i < 4; ++i) {
    const auto v = after.next().images.to_floats();
    got.insert(got.end(), v.begin(), v.end());
  }
  EXPECT_EQ(got, expected);
}

TEST(DistributedLoader, BadOptionsAreRefusedWithTheNumbers) {
  const Dataset data = random_dataset(30, {2}, 7);
  try {
    DistributedLoader(data, {.global_micro_batch_size = 10, .rank = 0, .world_size = 3});
    ADD_FAILURE() << "an indivisible global batch was accepted";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("global micro-batch size 10"), std::string::npos) << msg;
    EXPECT_NE(msg.find("world size 3"), std::string::npos) << msg;
  }
  EXPECT_THROW(DistributedLoader(data, {.global_micro_batch_size = 0}), InvalidArgument);
  EXPECT_THROW(DistributedLoader(data, {.global_micro_batch_size = 31}), InvalidArgument);
  EXPECT_THROW(DistributedLoader(data, {.global_micro_batch_size = 4, .rank = 2, .world_size = 2}), InvalidArgument);
  EXPECT_THROW(DistributedLoader(data, {.global_micro_batch_size = 4, .rank = -1, .world_size = 2}), InvalidArgument);
  EXPECT_THROW(DistributedLoader(Dataset{data.images, data.labels.view(0, {29})}, {.global_micro_batch_size = 4}),
               InvalidArgument);
  DistributedLoader ok(data, {.global_micro_batch_size = 30});
  EXPECT_EQ(ok.steps_per_epoch(), 1);
  EXPECT_THROW(ok.batch(0, 1), InvalidArgument);
}

TEST(EvalShard, CoversEveryRowOnceForAnyWorldSize) {
  const Dataset data = random_dataset(10, {3}, 8);
  const auto all = data.images.to_floats();
  for (int world = 1; world <= 4; ++world) {
    std::vector<float> x;
    std::int64_t rows = 0;
    for (int r = 0; r < world; ++r) {
      const Dataset s = eval_shard(data, r, world);
      EXPECT_TRUE(s.images.shares_storage_with(data.images));
      EXPECT_GE(s.size(), 10 / world);
      EXPECT_LE(s.size(), 10 / world + 1);
      rows += s.size();
      const auto sx = s.images.to_floats();
      x.insert(x.end(), sx.begin(), sx.end());
    }
    EXPECT_EQ(rows, 10);
    EXPECT_EQ(x, all);
  }
  EXPECT_THROW(eval_shard(data, 3, 3), InvalidArgument);
}

}  // namespace
}  // namespace tutti::data
