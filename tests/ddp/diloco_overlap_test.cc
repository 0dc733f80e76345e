// DiLoCo's overlapped syncs (DiLoCoOptions::overlap_steps, ddp/diloco.h) with thread ranks: the
// fragment launched at its step is applied τ steps later by the documented merge rule
// (global_new + local_now − local_at_launch, checked against values taken here), every rank
// ends with the same global parameters, and the overlapped run trains close to the blocking one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "diloco_test_util.h"
#include "tutti/core/error.h"

namespace tutti::ddp {
namespace {

std::vector<float> node_average(Communicator& inter, const Tensor& flat) {
  const std::int64_t n = flat.numel();
  const Tensor all = Tensor::empty({inter.size() * n}, DType::f32);
  inter.allgather(flat, all).wait();
  const std::vector<float> a = all.to_floats();
  std::vector<float> avg(static_cast<std::size_t>(n));
  for (int k = 0; k < inter.size(); ++k)
    for (std::int64_t i = 0; i < n; ++i)
      avg[static_cast<std::size_t>(i)] += a[static_cast<std::size_t>(k * n + i)] / static_cast<float>(inter.size());
  return avg;
}

// H = 4, F = 2, τ = 1, plain outer SGD of lr 1 (global_new = the nodes' average at launch):
// fragment 1 launched at steps 2 and 6 is applied at 3 and 7, fragment 0 launched at 4 and 8 at
// 5 (and 9). At an apply step the fragment becomes avg(snapshot) + (local − own snapshot); the
// rest of the vector is untouched, bit for bit; at a launch step nothing changes.
TEST(DiLoCoOverlap, AppliesTheMergeRuleTauStepsLater) {
  kernels::set_cpu_threads(1);
  constexpr int kNodes = 2, kLocal = 2;
  ThreadGroup group(kNodes * kLocal, CommOptions{.timeout = std::chrono::seconds(20)});
  std::vector<std::vector<float>> globals(kNodes * kLocal);
  group.run([&](int rank) {
    const NodeGroups g = group.node_groups(rank, sizes(kNodes, kLocal));
    Trainer t(*g.intra, rank, false);
    DiLoCo diloco(*t.ddp, *t.opt, g,
                  {.sync_every = 4,
                   .outer_lr = 1.0,
                   .outer_momentum = 0.0,
                   .nesterov = false,
                   .fragments = 2,
                   .overlap_steps = 1});
    const std::int64_t n = t.ddp->reducer().plan().total, half = n / 2;
    std::vector<float> snapshot, snapshot_avg;
    for (int s = 0; s < 9; ++s) {
      t.step(s, rank * 4, 4);
      const std::vector<float> b = t.ddp->state().parameters_flat().to_floats();
      const int pending = diloco.pending_fragment();
      const bool launched = diloco.end_inner_step();
      const std::vector<float> a = t.ddp->state().parameters_flat().to_floats();
      const int c = (s + 1) % 4;
      EXPECT_EQ(launched, c == 0 || c == 2) << "step " << s + 1;
      EXPECT_EQ(diloco.pending_fragment(), c == 2 ? 1 : c == 0 ? 0 : -1) << "step " << s + 1;
      int off = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        const bool in_applied = (pending == 1 && i >= half) || (pending == 0 && i < half);
        if (in_applied) {
          const float want = snapshot_avg[k] + (b[k] - snapshot[k]);
          off += std::abs(a[k] - want) > 1e-6f * (1.0f + std::abs(want)) ? 1 : 0;
        } else {
          off += a[k] != b[k] ? 1 : 0;
        }
      }
      EXPECT_EQ(off, 0) << "step " << s + 1 << " rank " << rank << " (applied fragment " << pending << ")";
      if (launched) {
        snapshot = b;
        snapshot_avg = node_average(*g.inter, Tensor::from_floats(b, {n}));
      }
    }
    diloco.sync();  // completes fragment 0 launched at step 8, then syncs both
    EXPECT_EQ(diloco.pending_fragment(), -1);
    globals[static_cast<std::size_t>(rank)] = diloco.global_parameters().to_floats();
  });
  for (std::size_t r = 1; r < globals.size(); ++r) EXPECT_EQ(globals[r], globals[0]) << "rank " << r;
}

// AdamW inside, the default outer Nesterov, H = 4, F = 2: overlapped by τ = 2 (and τ = 1 with
// one fragment, the whole vector), every rank of a node ends with the same parameters, and they
// stay close to the blocking run's (their distance a small part of the distance trained).
TEST(DiLoCoOverlap, TrainsCloseToTheBlockingRun) {
  constexpr int kSteps = 16;
  const std::vector<Values> blocking = train_diloco(2, 2, {.sync_every = 4, .fragments = 2}, kSteps, true);
  auto start = make_model();
  start->init(kSeed);
  const double trained = relative_difference(blocking[0], values_of(*start));
  EXPECT_GT(trained, 1e-2);
  for (const auto [fragments, tau] : {std::pair{2, 2}, std::pair{1, 1}}) {
    const std::vector<Values> overlapped =
        train_diloco(2, 2, {.sync_every = 4, .fragments = fragments, .overlap_steps = tau}, kSteps, true);
    const double apart = relative_difference(overlapped[0], blocking[0]);
    std::printf("F = %d, tau = %d: overlapped vs blocking %.4f (trained %.4f)\n", fragments, tau, apart, trained);
    EXPECT_GT(apart, 0.0);  // it did overlap
    EXPECT_LT(apart, 0.25 * trained);
    for (std::size_t r = 0; r < overlapped.size(); ++r)
      EXPECT_EQ(overlapped[r], overlapped[r / 2 * 2]) << "rank " << r << " differs from its node";
  }
}

TEST(DiLoCoOverlap, RefusesAnOverlapLongerThanTheFragmentSpacing) {
  kernels::set_cpu_threads(1);
  ThreadGroup group(2, CommOptions{.timeout = std::chrono::seconds(20)});
  group.run([&](int rank) {
    const NodeGroups g = group.node_groups(rank, sizes(2, 1));
    Trainer t(*g.intra, rank, false);
    EXPECT_THROW(DiLoCo(*t.ddp, *t.opt, g, {.sync_every = 4, .fragments = 2, .overlap_steps = 3}), InvalidArgument);
  });
}

}  // namespace
}  // namespace tutti::ddp
