// Shared by the DiLoCo tests (diloco_test.cc, diloco_overlap_test.cc): a small model trained
// by thread ranks on faked node maps.
#pragma once

#include <memory>
#include <vector>

#include "ddp_test_util.h"
#include "tutti/comm/groups.h"
#include "tutti/comm/thread_group.h"
#include "tutti/ddp/ddp.h"
#include "tutti/ddp/diloco.h"
#include "tutti/kernels/threads.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/loss.h"
#include "tutti/optim/adamw.h"
#include "tutti/optim/sgd.h"

namespace tutti::ddp {
namespace {

using testing::Batch;
using testing::kClasses;
using testing::relative_difference;
using testing::rows;
using testing::Values;
constexpr std::int64_t kIn = 12;
constexpr std::int64_t kRows = 16;  // global rows per step
constexpr std::uint64_t kSeed = 4321;
constexpr float kInnerLr = 0.1f;

std::unique_ptr<nn::Sequential> make_model() {
  auto m = std::make_unique<nn::Sequential>();
  m->add<nn::Linear>(kIn, 16).add<nn::ReLU>().add<nn::Linear>(16, 9).add<nn::GELU>();
  m->add<nn::Linear>(9, kClasses);
  return m;
}

Batch batch_of(int step) { return testing::global_batch({kIn}, kRows, 100 + static_cast<std::uint32_t>(step)); }

Values values_of(nn::Module& m) {
  Values v;
  for (nn::Parameter* p : m.parameters()) v.push_back(p->value.to_floats());
  return v;
}

std::vector<int> sizes(int nodes, int local) { return std::vector<int>(static_cast<std::size_t>(nodes), local); }

// One rank's training objects: a model, DDP over `comm`, an inner optimizer.
struct Trainer {
  std::unique_ptr<nn::Sequential> model = make_model();
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<optim::Optimizer> opt;
  nn::CrossEntropyLoss loss;

  Trainer(Communicator& comm, int rank, bool adamw, int zero_stage = 0) {
    model->init(rank == 0 ? kSeed : kSeed + 99);  // rank 0's values must reach everyone
    DdpOptions o;
    o.bucket_cap_mb = o.first_bucket_cap_mb = 3e-4;  // several buckets
    o.sharding = sharding_of_stage(zero_stage);
    ddp = std::make_unique<DistributedDataParallel>(comm, *model, o);
    if (adamw) {
      opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 1e-2f});
    } else {
      opt = std::make_unique<optim::SGD>(model->parameters(), optim::SgdOptions{.lr = kInnerLr});
    }
    ddp->attach(*opt);
  }
  // One step on rows [first, first + count) of the global batch of `step`.
  void step(int step, std::int64_t first, std::int64_t count) {
    const Batch mb = rows(batch_of(step), first, count);
    loss.forward(ddp->forward(mb.x), mb.y);
    EXPECT_TRUE(ddp->backward(loss.grad()));
    opt->step();
    ddp->zero_grad();
  }
};

// Every rank's parameters after `steps` steps of DDP over all ranks (SGD, or AdamW).
std::vector<Values> train_ddp(int ranks, int steps, bool adamw = false) {
  kernels::set_cpu_threads(1);
  ThreadGroup group(ranks, CommOptions{.timeout = std::chrono::seconds(20)});
  std::vector<Values> out(static_cast<std::size_t>(ranks));
  group.run([&](int rank) {
    Trainer t(group.communicator(rank), rank, adamw);
    for (int s = 0; s < steps; ++s) t.step(s, rank * (kRows / ranks), kRows / ranks);
    out[static_cast<std::size_t>(rank)] = values_of(*t.model);
  });
  return out;
}

// The parameters whole, whatever the stage (ZeRO-3 releases them outside forward and backward).
// COLLECTIVE over the DDP's ranks.
Values whole_values_of(Trainer& t) {
  if (!t.ddp->sharded()) return values_of(*t.model);
  const StateDict state = t.ddp->state().model_state_dict();
  Values v;
  for (nn::Parameter* p : t.model->parameters()) v.push_back(state.at(p->name).to_floats());
  return v;
}

// Every rank's parameters after `steps` steps of DiLoCo on nodes x local ranks.
std::vector<Values> train_diloco(int nodes, int local, DiLoCoOptions options, int steps, bool adamw = false,
                                 int zero_stage = 0) {
  kernels::set_cpu_threads(1);
  const int ranks = nodes * local;
  ThreadGroup group(ranks, CommOptions{.timeout = std::chrono::seconds(20)});
  std::vector<Values> out(static_cast<std::size_t>(ranks));
  group.run([&](int rank) {
    const NodeGroups g = group.node_groups(rank, sizes(nodes, local));
    Trainer t(*g.intra, rank, adamw, zero_stage);
    DiLoCo diloco(*t.ddp, *t.opt, g, options);
    int syncs = 0;
    for (int s = 0; s < steps; ++s) {
      t.step(s, rank * (kRows / ranks), kRows / ranks);
      syncs += diloco.end_inner_step() ? 1 : 0;
    }
    EXPECT_EQ(syncs, steps * options.fragments / options.sync_every);  // sync events (a fragment or all)
    out[static_cast<std::size_t>(rank)] = whole_values_of(t);
  });
  return out;
}

}  // namespace
}  // namespace tutti::ddp
