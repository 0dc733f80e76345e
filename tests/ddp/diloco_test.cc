// DiLoCo (ddp/diloco.h) with thread ranks and faked node maps: H = 1 with a plain outer SGD of
// lr 1 equals DDP over every rank; H = 4 with the default outer Nesterov equals a reference
// computed here (each node's local steps from the same start, then the outer formula); the
// compressed pseudo-gradients' quality (int8 single trip, 4-bit with error feedback over
// several syncs); checkpoints mid-period and at a sync resume exactly; bad input is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>

#include "diloco_test_util.h"
#include "tutti/comm/groups.h"
#include "tutti/comm/thread_group.h"
#include "tutti/core/error.h"
#include "tutti/ddp/ddp.h"
#include "tutti/ddp/diloco.h"
#include "tutti/io/checkpoint.h"
#include "tutti/kernels/threads.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/loss.h"
#include "tutti/optim/adamw.h"
#include "tutti/optim/sgd.h"

namespace tutti::ddp {
namespace {

void expect_h1_equals_ddp(int nodes, int local) {
  DiLoCoOptions o{.sync_every = 1, .outer_lr = 1.0, .outer_momentum = 0.0, .nesterov = false};
  const std::vector<Values> ddp = train_ddp(nodes * local, 10);
  const std::vector<Values> diloco = train_diloco(nodes, local, o, 10);
  for (std::size_t r = 0; r < ddp.size(); ++r) {
    EXPECT_LT(relative_difference(diloco[r], ddp[r]), 1e-5) << "rank " << r;
    EXPECT_EQ(diloco[r], diloco[0]) << "rank " << r << " differs from rank 0";
  }
  auto initial = make_model();
  initial->init(kSeed);
  EXPECT_GT(relative_difference(ddp[0], values_of(*initial)), 1e-3);  // it trained
}

TEST(DiLoCo, H1WithPlainOuterSgdEqualsDdpOnTwoNodesOfTwo) { expect_h1_equals_ddp(2, 2); }
TEST(DiLoCo, H1WithPlainOuterSgdEqualsDdpOnTwoNodesOfOne) { expect_h1_equals_ddp(2, 1); }

// H = 1 with a plain outer SGD of lr 1 is DDP only with SGD inside. With AdamW inside, each
// node's AdamW steps on its node's gradient with moments of its own, and the nodes' parameters
// are averaged after every step (the reference, by hand); DDP's one AdamW steps on the average
// gradient, and ends elsewhere.
TEST(DiLoCo, H1WithAdamWInsideAveragesTheNodesAdamWStepsAndIsNotDdp) {
  constexpr int kNodes = 2, kLocal = 2, kSteps = 10;
  const DiLoCoOptions o{.sync_every = 1, .outer_lr = 1.0, .outer_momentum = 0.0, .nesterov = false};
  const std::vector<Values> got = train_diloco(kNodes, kLocal, o, kSteps, /*adamw=*/true);

  auto start = make_model();
  start->init(kSeed);
  Values global = values_of(*start);
  std::vector<std::unique_ptr<nn::Sequential>> models;
  std::vector<std::unique_ptr<optim::AdamW>> adams;  // one per node: its moments persist across syncs
  for (int node = 0; node < kNodes; ++node) {
    models.push_back(make_model());
    models.back()->init(kSeed);
    adams.push_back(std::make_unique<optim::AdamW>(models.back()->parameters(), optim::AdamWOptions{.lr = 1e-2f}));
  }
  nn::CrossEntropyLoss loss;
  const std::int64_t per_node = kRows / kNodes;
  for (int s = 0; s < kSteps; ++s) {
    Values avg = global;
    for (auto& v : avg) std::fill(v.begin(), v.end(), 0.0f);
    for (int node = 0; node < kNodes; ++node) {
      nn::Sequential& m = *models[static_cast<std::size_t>(node)];
      const std::vector<nn::Parameter*> ps = m.parameters();
      for (std::size_t i = 0; i < ps.size(); ++i)
        ps[i]->value.copy_from(Tensor::from_floats(global[i], ps[i]->shape()));
      const Batch b = rows(batch_of(s), node * per_node, per_node);
      loss.forward(m.forward(b.x), b.y);
      m.backward(loss.grad());
      adams[static_cast<std::size_t>(node)]->step();
      m.zero_grad();
      const Values local = values_of(m);
      for (std::size_t i = 0; i < avg.size(); ++i)
        for (std::size_t j = 0; j < avg[i].size(); ++j) avg[i][j] += local[i][j] / kNodes;
    }
    global = avg;
  }
  for (std::size_t r = 0; r < got.size(); ++r) EXPECT_LT(relative_difference(got[r], global), 1e-5) << "rank " << r;
  const std::vector<Values> ddp = train_ddp(kNodes * kLocal, kSteps, /*adamw=*/true);
  const double apart = relative_difference(ddp[0], global);
  std::printf("H = 1, AdamW inside, outer SGD lr 1: %.3g from DDP's parameters (relative L2)\n", apart);
  EXPECT_GT(apart, 1e-3) << "with AdamW inside, H = 1 is not DDP";
}

// Inside each node, any ZeRO stage: the same training as stage 0 (AdamW inside, the default outer
// Nesterov); at stage 3 the outer sync reads and sets parameters that live as shards. (Not with
// streaming: fragments are cut in the plan's layout, whose padding depends on the stage.)
TEST(DiLoCo, InnerZeroStagesTrainAlike) {
  const DiLoCoOptions o{.sync_every = 4};
  const std::vector<Values> stage0 = train_diloco(2, 2, o, 8, true, 0);
  for (int stage : {1, 2, 3}) {
    const std::vector<Values> got = train_diloco(2, 2, o, 8, true, stage);
    for (std::size_t r = 0; r < got.size(); ++r)
      EXPECT_LT(relative_difference(got[r], stage0[r]), 1e-5) << "stage " << stage << ", rank " << r;
  }
}

// The reference for H = 4: each node's model steps alone on its node's rows (SGD), then the
// outer Nesterov step on plain vectors.
TEST(DiLoCo, H4NesterovMatchesHandComputedReference) {
  constexpr int kNodes = 2, kLocal = 2, kH = 4, kPeriods = 2;
  const DiLoCoOptions o{.sync_every = kH};  // outer lr 0.7, momentum 0.9, Nesterov
  const std::vector<Values> got = train_diloco(kNodes, kLocal, o, kH * kPeriods);

  auto start = make_model();
  start->init(kSeed);
  Values global = values_of(*start), momentum = global;
  for (auto& v : momentum) std::fill(v.begin(), v.end(), 0.0f);
  for (int period = 0; period < kPeriods; ++period) {
    Values avg = global;
    for (auto& v : avg) std::fill(v.begin(), v.end(), 0.0f);
    for (int node = 0; node < kNodes; ++node) {
      auto m = make_model();
      m->init(kSeed);
      const std::vector<nn::Parameter*> ps = m->parameters();
      for (std::size_t i = 0; i < ps.size(); ++i)
        ps[i]->value.copy_from(Tensor::from_floats(global[i], ps[i]->shape()));
      optim::SGD sgd(ps, optim::SgdOptions{.lr = kInnerLr});
      nn::CrossEntropyLoss loss;
      const std::int64_t per_node = kRows / kNodes;
      for (int s = period * kH; s < (period + 1) * kH; ++s) {
        const Batch b = rows(batch_of(s), node * per_node, per_node);
        loss.forward(m->forward(b.x), b.y);
        m->backward(loss.grad());
        sgd.step();
        m->zero_grad();
      }
      const Values local = values_of(*m);
      for (std::size_t i = 0; i < avg.size(); ++i)
        for (std::size_t j = 0; j < avg[i].size(); ++j) avg[i][j] += (global[i][j] - local[i][j]) / kNodes;
    }
    for (std::size_t i = 0; i < avg.size(); ++i) {
      for (std::size_t j = 0; j < avg[i].size(); ++j) {
        momentum[i][j] = 0.9f * momentum[i][j] + avg[i][j];
        global[i][j] -= 0.7f * (avg[i][j] + 0.9f * momentum[i][j]);
      }
    }
  }
  for (std::size_t r = 0; r < got.size(); ++r) EXPECT_LT(relative_difference(got[r], global), 1e-5) << "rank " << r;
  EXPECT_GT(relative_difference(global, values_of(*start)), 1e-3);
}

// Compression: the pseudo-gradients are set by hand (local = global − Δ, Δ Gaussian, its own
// per node and sync) and what the sync averaged is compared with the true average. Returns the
// relative L2 error of the first sync's average, and of the running sum after `syncs` syncs.
// identical: every rank's average equal to rank 0's, bit for bit, at every sync; bytes: rank 0's
// last_sync_bytes().
struct Quality {
  double single = 0, running_sum = 0;
  bool identical = true;
  std::int64_t bytes = 0;
};
Quality compression_quality(OuterDType dtype, bool error_feedback, int syncs, int kNodes = 2, int kLocal = 2,
                            OuterExchange exchange = OuterExchange::automatic, std::int64_t block = 64) {
  kernels::set_cpu_threads(1);
  ThreadGroup group(kNodes * kLocal, CommOptions{.timeout = std::chrono::seconds(20)});
  Quality q;
  std::vector<std::vector<float>> first(static_cast<std::size_t>(kNodes * kLocal));
  group.run([&](int rank) {
    const NodeGroups g = group.node_groups(rank, sizes(kNodes, kLocal));
    Trainer t(*g.intra, rank, false);
    DiLoCo diloco(*t.ddp, *t.opt, g,
                  {.outer_dtype = dtype, .error_feedback = error_feedback, .block = block, .exchange = exchange});
    const std::int64_t n = t.ddp->reducer().plan().total;
    std::vector<double> sent_sum(static_cast<std::size_t>(n)), true_sum(static_cast<std::size_t>(n));
    for (int s = 0; s < syncs; ++s) {
      std::vector<float> true_avg(static_cast<std::size_t>(n));
      std::vector<float> mine;
      for (int node = 0; node < kNodes; ++node) {
        std::mt19937 gen(static_cast<std::uint32_t>(1000 * s + node));
        std::normal_distribution<float> normal(0.0f, 1e-2f);
        std::vector<float> delta(static_cast<std::size_t>(n));
        for (float& d : delta) d = normal(gen);
        for (std::size_t i = 0; i < delta.size(); ++i) true_avg[i] += delta[i] / kNodes;
        if (node == g.node) mine = delta;
      }
      std::vector<float> local = diloco.global_parameters().to_floats();
      for (std::size_t i = 0; i < local.size(); ++i) local[i] -= mine[i];
      t.ddp->state().load_parameters_flat(Tensor::from_floats(local, {n}));
      diloco.sync();
      const std::vector<float> got = diloco.last_pseudo_gradient().view(0, {n}).to_floats();
      first[static_cast<std::size_t>(rank)] = got;
      group.communicator(rank).barrier().wait();
      if (rank == 0) {
        q.bytes = diloco.last_sync_bytes();
        for (const auto& other : first) q.identical = q.identical && other == got;
      }
      group.communicator(rank).barrier().wait();
      double err = 0, ref = 0, serr = 0, sref = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        err += std::pow(got[i] - true_avg[i], 2.0);
        ref += std::pow(true_avg[i], 2.0);
        sent_sum[i] += got[i];
        true_sum[i] += true_avg[i];
        serr += std::pow(sent_sum[i] - true_sum[i], 2.0);
        sref += std::pow(true_sum[i], 2.0);
      }
      if (rank == 0 && s == 0) q.single = std::sqrt(err / ref);
      if (rank == 0) q.running_sum = std::sqrt(serr / sref);
    }
  });
  return q;
}

TEST(DiLoCo, Int8PseudoGradientsWithinOnePercentOfF32) {
  const Quality f32 = compression_quality(OuterDType::f32, false, 1);
  EXPECT_LT(f32.single, 1e-4);  // f32 is the true average (up to the rounding of global − Δ)
  const Quality bf16 = compression_quality(OuterDType::bf16, false, 1);
  const Quality int8 = compression_quality(OuterDType::int8, false, 1);
  std::printf("single-trip relative L2 error: bf16 %.4f, int8 %.4f\n", bf16.single, int8.single);
  EXPECT_LT(bf16.single, 0.01);
  EXPECT_LT(int8.single, 0.01);
  EXPECT_GT(int8.single, 0.0);  // it did quantize
}

TEST(DiLoCo, Int4ErrorFeedbackRunningSumConverges) {
  const Quality plain = compression_quality(OuterDType::int4, false, 8);
  const Quality ef = compression_quality(OuterDType::int4, true, 8);
  std::printf("int4: single trip %.4f; running sum after 8 syncs %.4f without, %.4f with error feedback\n",
              plain.single, plain.running_sum, ef.running_sum);
  EXPECT_GT(plain.single, 0.05);    // one 4-bit trip cannot reach 5% on Gaussian data
  EXPECT_LT(plain.single, 0.15);    // but is in the expected range
  EXPECT_LT(ef.running_sum, 0.05);  // what was sent sums to what was meant
  EXPECT_LT(ef.running_sum, plain.running_sum / 2);
}

// The reduce-scatter exchange on 3 and 4 nodes: every rank gets the same bits, int8 stays within
// 1% in one trip despite the owner's second quantization, 4-bit with error feedback (at the
// sender and at the owner) still sums to what was meant, and fewer bytes leave each rank (blocks
// of 16: chunks are whole blocks, and this model's slices are a few hundred values).
TEST(DiLoCo, ReduceScatterExchangeKeepsRanksIdenticalAndQuality) {
  for (const auto [nodes, local] : {std::pair{3, 2}, std::pair{4, 1}}) {
    const Quality ag = compression_quality(OuterDType::int8, false, 1, nodes, local, OuterExchange::allgather, 16);
    const Quality rs = compression_quality(OuterDType::int8, false, 1, nodes, local, OuterExchange::reduce_scatter, 16);
    const Quality rs4 = compression_quality(OuterDType::int4, true, 8, nodes, local, OuterExchange::reduce_scatter, 16);
    std::printf(
        "%d nodes x %d: int8 single trip %.4f allgather (%lld B), %.4f reduce_scatter (%lld B); int4 + EF "
        "reduce_scatter running sum %.4f\n",
        nodes, local, ag.single, static_cast<long long>(ag.bytes), rs.single, static_cast<long long>(rs.bytes),
        rs4.running_sum);
    EXPECT_TRUE(ag.identical && rs.identical && rs4.identical) << nodes << " nodes";
    EXPECT_GT(rs.single, 0.0);
    EXPECT_LT(rs.single, 0.01) << nodes << " nodes";
    EXPECT_LT(rs4.running_sum, 0.05) << nodes << " nodes";
    EXPECT_LT(rs.bytes, ag.bytes * (nodes - 1));  // 2 (N − 1) / N Q < (N − 1) Q (a ring all-gather)
  }
}

// Checkpoints: a run of 10 steps (H = 4, AdamW inside) stopped after `save_at` steps, its
// state_dict() taken on every rank and rank 0's loaded into fresh objects (other initial
// values) on every rank, continues to the same parameters, bit for bit.
void expect_resume_exact(int save_at, int fragments = 1, int overlap = 0, int kNodes = 2, int kLocal = 2) {
  kernels::set_cpu_threads(1);
  constexpr int kSteps = 10;
  const int per_rank = kRows / (kNodes * kLocal);
  const DiLoCoOptions o{.sync_every = 4,
                        .outer_dtype = OuterDType::int8,
                        .error_feedback = true,
                        .fragments = fragments,
                        .overlap_steps = overlap};
  const std::vector<Values> straight = train_diloco(kNodes, kLocal, o, kSteps, true);
  ThreadGroup group(kNodes * kLocal, CommOptions{.timeout = std::chrono::seconds(20)});
  StateDict saved;
  std::vector<Values> resumed(static_cast<std::size_t>(kNodes * kLocal));
  group.run([&](int rank) {
    const NodeGroups g = group.node_groups(rank, sizes(kNodes, kLocal));
    {
      Trainer t(*g.intra, rank, true);
      DiLoCo diloco(*t.ddp, *t.opt, g, o);
      for (int s = 0; s < save_at; ++s) {
        t.step(s, rank * per_rank, per_rank);
        diloco.end_inner_step();
      }
      EXPECT_EQ(diloco.inner_step(), save_at % 4);
      if (overlap > 0) EXPECT_GE(diloco.pending_fragment(), 0) << "no sync in flight at the checkpoint";
      StateDict mine = diloco.state_dict();
      if (rank == 0) saved = std::move(mine);
    }
    group.communicator(rank).barrier().wait();
    Trainer t(*g.intra, rank + 7, true);  // other initial values
    DiLoCo diloco(*t.ddp, *t.opt, g, o);
    diloco.load_state_dict(saved);
    for (int s = save_at; s < kSteps; ++s) {
      t.step(s, rank * per_rank, per_rank);
      diloco.end_inner_step();
    }
    resumed[static_cast<std::size_t>(rank)] = values_of(*t.model);
  });
  for (std::size_t r = 0; r < straight.size(); ++r) EXPECT_EQ(resumed[r], straight[r]) << "rank " << r;
}

TEST(DiLoCo, ResumeMidPeriodIsExact) { expect_resume_exact(6); }
TEST(DiLoCo, ResumeAtSyncIsExact) { expect_resume_exact(8); }
TEST(DiLoCo, StreamingResumeMidPeriodIsExact) { expect_resume_exact(5, 2); }
// Overlapped (τ = 2): fragment 1 launched at step 2 is in flight at step 3, fragment 0 launched
// at step 4 at step 5; saved with the sync in flight, applied after the resume.
TEST(DiLoCo, OverlappedResumeWithSyncInFlightIsExact) {
  expect_resume_exact(3, 2, 2);
  expect_resume_exact(5, 2, 2);
}
// The reduce-scatter exchange (3 nodes), its owner residuals and a sync in flight at step 6.
TEST(DiLoCo, ReduceScatterOverlappedResumeIsExact) { expect_resume_exact(6, 2, 1, 3, 1); }

// Streaming, F = 2 fragments, H = 4: fragment 1 syncs at inner steps 2 and 6, fragment 0 at 4
// and 8. With a plain outer SGD of lr 1 the fragment synced becomes the nodes' average of their
// parameters there, and the other keeps each node's own, bit for bit.
TEST(DiLoCo, StreamingSyncsEachFragmentAtItsStep) {
  kernels::set_cpu_threads(1);
  constexpr int kNodes = 2, kLocal = 2;
  ThreadGroup group(kNodes * kLocal, CommOptions{.timeout = std::chrono::seconds(20)});
  group.run([&](int rank) {
    const NodeGroups g = group.node_groups(rank, sizes(kNodes, kLocal));
    Trainer t(*g.intra, rank, false);
    DiLoCo diloco(*t.ddp, *t.opt, g,
                  {.sync_every = 4, .outer_lr = 1.0, .outer_momentum = 0.0, .nesterov = false, .fragments = 2});
    const std::int64_t n = t.ddp->reducer().plan().total, half = n / 2;
    for (int s = 0; s < 8; ++s) {
      t.step(s, rank * 4, 4);
      const Tensor before = t.ddp->state().parameters_flat();
      const Tensor nodes = Tensor::empty({kNodes * n}, DType::f32);
      g.inter->allgather(before, nodes).wait();
      const std::vector<float> b = before.to_floats(), all = nodes.to_floats();
      const bool synced = diloco.end_inner_step();
      const std::vector<float> a = t.ddp->state().parameters_flat().to_floats();
      const int c = (s + 1) % 4;  // 2: fragment 1 [n/2, n); 0: fragment 0 [0, n/2)
      EXPECT_EQ(synced, c == 0 || c == 2) << "step " << s + 1;
      int off = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const bool in_synced = (c == 2 && i >= half) || (c == 0 && i < half);
        const auto k = static_cast<std::size_t>(i);
        if (in_synced) {
          off += std::abs(a[k] - 0.5f * (all[k] + all[k + static_cast<std::size_t>(n)])) > 1e-6f ? 1 : 0;
        } else {
          off += a[k] != b[k] ? 1 : 0;
        }
      }
      EXPECT_EQ(off, 0) << "step " << s + 1 << " rank " << rank;
    }
  });
}

// end_inner_step(last_step): H = 4, a run of 6 steps. Step 4 syncs by the schedule; step 5 does
// not; step 6, the last, syncs although the period is not over: the run ends with the nodes'
// parameters equal (with plain outer SGD of lr 1, their average), and the count says 2 syncs.
TEST(DiLoCo, TheLastStepSyncsWhateverTheSchedule) {
  kernels::set_cpu_threads(1);
  constexpr int kNodes = 2, kLocal = 1;
  ThreadGroup group(kNodes * kLocal, CommOptions{.timeout = std::chrono::seconds(20)});
  group.run([&](int rank) {
    const NodeGroups g = group.node_groups(rank, sizes(kNodes, kLocal));
    Trainer t(*g.intra, rank, false);
    DiLoCo diloco(*t.ddp, *t.opt, g, {.sync_every = 4, .outer_lr = 1.0, .outer_momentum = 0.0, .nesterov = false});
    const std::int64_t n = t.ddp->reducer().plan().total;
    std::vector<bool> synced;
    std::vector<float> all;
    for (int s = 0; s < 6; ++s) {
      t.step(s, rank * 8, 8);
      const Tensor nodes = Tensor::empty({kNodes * n}, DType::f32);
      g.inter->allgather(t.ddp->state().parameters_flat(), nodes).wait();
      all = nodes.to_floats();
      synced.push_back(diloco.end_inner_step(/*last_step=*/s == 5));
    }
    EXPECT_EQ(synced, (std::vector<bool>{false, false, false, true, false, true})) << "rank " << rank;
    EXPECT_EQ(diloco.syncs(), 2);
    const std::vector<float> a = t.ddp->state().parameters_flat().to_floats();
    int off = 0, differed = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      off += std::abs(a[k] - 0.5f * (all[k] + all[k + static_cast<std::size_t>(n)])) > 1e-6f ? 1 : 0;
      differed += all[k] != all[k + static_cast<std::size_t>(n)] ? 1 : 0;
    }
    EXPECT_GT(differed, 0) << "the nodes' parameters before the last sync differ (else the test shows nothing)";
    EXPECT_EQ(off, 0) << "rank " << rank << ": the final model is the nodes' average";
  });
}

// A 2-node checkpoint on 4 nodes: the period restarts from the global parameters. A state
// without DiLoCo entries (a --sync ddp checkpoint's) is refused, naming --sync, and one with a
// global parameter missing or misshaped, naming the entry.
TEST(DiLoCo, ResumeOnOtherNodeCountRestartsFromGlobalAndRefusesDdpState) {
  kernels::set_cpu_threads(1);
  StateDict saved;
  Values global;
  {
    ThreadGroup group(4, CommOptions{.timeout = std::chrono::seconds(20)});
    group.run([&](int rank) {
      const NodeGroups g = group.node_groups(rank, sizes(2, 2));
      Trainer t(*g.intra, rank, true);
      DiLoCo diloco(*t.ddp, *t.opt, g, {.sync_every = 4});
      for (int s = 0; s < 6; ++s) {
        t.step(s, rank * 4, 4);
        diloco.end_inner_step();
      }
      StateDict mine = diloco.state_dict();
      if (rank == 0) {
        saved = std::move(mine);
        global.clear();
        for (nn::Parameter* p : t.model->parameters())
          global.push_back(io::strip_prefix(saved, "global.").at(p->name).to_floats());
      }
    });
  }
  ThreadGroup group(4, CommOptions{.timeout = std::chrono::seconds(20)});
  group.run([&](int rank) {
    const NodeGroups g = group.node_groups(rank, sizes(4, 1));
    Trainer t(*g.intra, rank, true);
    DiLoCo diloco(*t.ddp, *t.opt, g, {.sync_every = 4});
    try {
      diloco.load_state_dict(t.ddp->state().model_state_dict());
      ADD_FAILURE() << "a state without DiLoCo entries was loaded";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("--sync ddp"), std::string::npos) << e.what();
    }
    // A global parameter missing, or of another shape, is refused naming its entry.
    const std::string key = "global." + t.model->parameters().front()->name;
    for (const bool missing : {true, false}) {
      StateDict bad = saved;
      if (missing)
        bad.erase(key);
      else
        bad[key] = Tensor::zeros({3}, DType::f32);
      try {
        diloco.load_state_dict(bad);
        ADD_FAILURE() << "loaded with '" << key << "' " << (missing ? "missing" : "of shape [3]");
      } catch (const InvalidArgument& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(missing ? "no entry for parameter '" + key + "'" : "'" + key + "' is Tensor[3] f32"),
                  std::string::npos)
            << what;
      }
    }
    diloco.load_state_dict(saved);
    EXPECT_EQ(diloco.inner_step(), 0);
    EXPECT_EQ(values_of(*t.model), global);
  });
}

// Bad input: the same InvalidArgument on every rank, naming the flag.
void expect_refused(int ranks, const std::vector<int>& node_sizes, const DiLoCoOptions& o, const std::string& words) {
  kernels::set_cpu_threads(1);
  ThreadGroup group(ranks, CommOptions{.timeout = std::chrono::seconds(20)});
  group.run([&](int rank) {
    const NodeGroups g = group.node_groups(rank, node_sizes);
    Trainer t(*g.intra, rank, false);
    try {
      DiLoCo diloco(*t.ddp, *t.opt, g, o);
      ADD_FAILURE() << "not refused: " << words;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  });
}

TEST(DiLoCo, RefusesBadInput) {
  expect_refused(2, {1, 1}, {.sync_every = 0}, "--sync diloco:H");
  expect_refused(2, {1, 1}, {.outer_lr = 0.0}, "--outer-lr");
  expect_refused(2, {1, 1}, {.outer_lr = -1.0}, "--outer-lr");
  expect_refused(2, {2}, {}, "needs at least 2 nodes");
  expect_refused(4, {3, 1}, {}, "3, 1 rank(s)");
  expect_refused(2, {1, 1}, {.sync_every = 2, .fragments = 3}, "--streaming");
  EXPECT_THROW(parse_outer_dtype("int3"), InvalidArgument);
  EXPECT_EQ(parse_outer_dtype("int4"), OuterDType::int4);
}

}  // namespace
}  // namespace tutti::ddp
