// DistributedDataParallel misused, and the parts of a model that used to differ between N ranks
// and one: each misuse is a clear error on every rank (never a silent wrong answer), Dropout
// masks as one rank with the whole batch would and resumes bit-identically, and the precision
// policy decides what goes on the wire. Run under mpiexec with 1 to 3 ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <random>

#include "ddp_test_util.h"
#include "ddp_world.h"
#include "tutti/amp/policy.h"
#include "tutti/ddp/ddp.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/loss.h"
#include "tutti/optim/sgd.h"

namespace tutti::ddp {
namespace {

using testing::world;

using testing::kClasses;  // the labels of testing::global_batch
constexpr std::int64_t kIn = 12;
constexpr std::uint64_t kSeed = 99;

std::unique_ptr<nn::Sequential> make_mlp(float dropout = 0.0f) {
  auto m = std::make_unique<nn::Sequential>();
  m->add<nn::Linear>(kIn, 16).add<nn::ReLU>();
  if (dropout > 0) m->add<nn::Dropout>(dropout);
  m->add<nn::Linear>(16, 9).add<nn::GELU>();
  if (dropout > 0) m->add<nn::Dropout>(dropout);
  m->add<nn::Linear>(9, kClasses);
  return m;
}

using testing::Batch;
using testing::my_slice;
using testing::rows;
// Global batch `seed`: [n, kIn] inputs and [n] labels, the same on every rank (ddp_test_util.h).
Batch global_batch(std::int64_t n, std::uint32_t seed) { return testing::global_batch({kIn}, n, seed); }

// The sequence number the next collective on the world communicator gets, found with a
// barrier (which itself takes one).
std::uint64_t next_seq() { return world().communicator().barrier().info().seq + 1; }

// ---- misuse: clear errors on every rank ------------------------------------------------

TEST(DdpMisuse, BackwardTwiceAfterOneForwardIsAnErrorBeforeAnyCommunication) {
  for (const int accumulation : {1, 2}) {
    auto model = make_mlp();
    model->init(kSeed);
    DdpOptions o;
    o.accumulation_steps = accumulation;
    DistributedDataParallel ddp(world().communicator(), *model, o);
    nn::CrossEntropyLoss loss;
    const Batch b = my_slice(global_batch(6, 1));
    for (int micro = 0; micro < accumulation; ++micro) {
      loss.forward(ddp.forward(b.x), b.y);
      const bool synced = ddp.backward(loss.grad());
      ASSERT_EQ(synced, micro == accumulation - 1);
      // The same backward again, on every rank: refused, and nothing goes on the wire.
      const std::uint64_t before = next_seq();
      const char* consequence = ddp.next_backward_syncs() ? "reduce them across ranks" : "count them twice";
      try {
        ddp.backward(loss.grad());
        FAIL() << "a second backward of one forward must throw";
      } catch (const InvalidArgument& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("no forward since the last backward"), std::string::npos) << msg;
        EXPECT_NE(msg.find(consequence), std::string::npos) << msg;
      }
      EXPECT_EQ(next_seq(), before + 1) << "the refused backward issued a collective";
    }
    // The model and the runtime go on: the next step's gradients are one step's.
    ddp.zero_grad();
    for (int micro = 0; micro < accumulation; ++micro) {
      loss.forward(ddp.forward(b.x), b.y);
      ddp.backward(loss.grad());
    }
    EXPECT_FALSE(ddp.found_nonfinite());
    const std::vector<float> grads = model->parameters().back()->grad.to_floats();
    auto fresh = make_mlp();
    fresh->init(kSeed);
    DistributedDataParallel reference(world().communicator(), *fresh, o);
    for (int micro = 0; micro < accumulation; ++micro) {
      loss.forward(reference.forward(b.x), b.y);
      reference.backward(loss.grad());
    }
    EXPECT_EQ(grads, fresh->parameters().back()->grad.to_floats());
  }
}

TEST(DdpMisuse, AModelNeverInitializedOnRankZeroIsAnErrorOnEveryRank) {
  auto model = make_mlp();
  if (world().rank() != 0) model->init(kSeed);  // rank 0 forgot
  try {
    DistributedDataParallel ddp(world().communicator(), *model, {});
    FAIL() << "rank " << world().rank() << ": an uninitialized rank 0 must be refused";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("parameter '0.weight' was never initialized on rank 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("call init(seed)"), std::string::npos) << msg;
  }
  // The refused DDP left no hook behind: the model trains on its own (no call into a DDP
  // that was never made).
  model->init(kSeed);
  {
    nn::CrossEntropyLoss loss;
    const Batch b = global_batch(4, 5);
    loss.forward(model->forward(b.x), b.y);
    EXPECT_NO_THROW(model->backward(loss.grad()));
  }
  // Rank 0 initialized, the others never: they get rank 0's values and may train.
  auto ok = make_mlp();
  if (world().rank() == 0) ok->init(kSeed);
  DistributedDataParallel ddp(world().communicator(), *ok, {});
  auto reference = make_mlp();
  reference->init(kSeed);
  EXPECT_EQ(testing::values_of(*ok), testing::values_of(*reference));
  nn::CrossEntropyLoss loss;
  const Batch b = my_slice(global_batch(6, 2));
  loss.forward(ddp.forward(b.x), b.y);
  EXPECT_TRUE(ddp.backward(loss.grad()));
}

// ---- Dropout: N ranks mask as one, and resume bit-identically --------------------------

// Trains `reference` without communication on whole global batches and `distributed` under
// DDP on this rank's slices, with SGD, `steps` steps of `accumulation` micro-batches of
// `micro_rows` global rows, starting at step `first`.
void train(nn::Module& model, DistributedDataParallel* ddp, optim::SGD& opt, int first, int steps, int accumulation,
           std::int64_t micro_rows) {
  nn::CrossEntropyLoss loss;
  for (int step = first; step < first + steps; ++step) {
    const Batch big = global_batch(micro_rows * accumulation, 100 + static_cast<std::uint32_t>(step));
    if (ddp == nullptr) {  // one process, the whole step's batch at once
      model.zero_grad();
      loss.forward(model.forward(big.x), big.y);
      model.backward(loss.grad());
      opt.step();
      continue;
    }
    for (int micro = 0; micro < accumulation; ++micro) {
      const Batch mb = my_slice(rows(big, micro * micro_rows, micro_rows));
      loss.forward(ddp->forward(mb.x), mb.y);
      if (ddp->backward(loss.grad())) {
        opt.step();
        ddp->zero_grad();
      }
    }
  }
}

optim::SgdOptions sgd() { return {.lr = 0.1f, .momentum = 0.9f}; }

TEST(DdpDropout, NRanksWithSlicesMatchOneRankWithTheWholeBatch) {
  for (const int accumulation : {1, 2}) {
    auto reference = make_mlp(0.4f);
    reference->init(kSeed);
    optim::SGD ref_opt(reference->parameters(), sgd());
    train(*reference, nullptr, ref_opt, 0, 4, accumulation, 12);

    auto distributed = make_mlp(0.4f);
    // Other ranks start from another seed: DDP gives them rank 0's weights AND Dropout state.
    distributed->init(world().rank() == 0 ? kSeed : kSeed + 5);
    DdpOptions o;
    o.accumulation_steps = accumulation;
    {
      DistributedDataParallel ddp(world().communicator(), *distributed, o);
      optim::SGD opt(distributed->parameters(), sgd());
      train(*distributed, &ddp, opt, 0, 4, accumulation, 12);
      EXPECT_LE(testing::relative_difference(*distributed, *reference), 1e-5)
          << "k = " << accumulation << ", rank " << world().rank() << " of " << world().world_size();
    }
    // Dropout did drop: without it the same steps end elsewhere.
    auto plain = make_mlp();
    plain->init(kSeed);
    optim::SGD plain_opt(plain->parameters(), sgd());
    train(*plain, nullptr, plain_opt, 0, 4, accumulation, 12);
    EXPECT_GT(testing::relative_difference(*plain, *reference), 1e-3);
    // The DDP is gone: the model is a whole batch's again.
    EXPECT_EQ(distributed->settings().batch_slice, 0);
    EXPECT_EQ(distributed->settings().batch_slices, 1);
  }
}

TEST(DdpDropout, ResumeFromTheStateDictsIsBitIdentical) {
  // Uninterrupted: 4 steps.
  auto whole = make_mlp(0.3f);
  whole->init(kSeed);
  testing::Values uninterrupted;
  StateDict model_at_2, optim_at_2;
  {
    DistributedDataParallel ddp(world().communicator(), *whole, {});
    optim::SGD opt(whole->parameters(), sgd());
    train(*whole, &ddp, opt, 0, 2, 1, 12);
    model_at_2 = whole->state_dict();  // what a checkpoint holds
    optim_at_2 = opt.state_dict();
    train(*whole, &ddp, opt, 2, 2, 1, 12);
    uninterrupted = testing::values_of(*whole);
  }
  // Resumed at step 2 into a fresh model (another seed: everything must come from the state).
  auto resumed = make_mlp(0.3f);
  resumed->init(kSeed + 1);
  resumed->load_state_dict(model_at_2);
  DistributedDataParallel ddp(world().communicator(), *resumed, {});
  optim::SGD opt(resumed->parameters(), sgd());
  opt.load_state_dict(optim_at_2);
  train(*resumed, &ddp, opt, 2, 2, 1, 12);
  EXPECT_EQ(testing::values_of(*resumed), uninterrupted);
  // Without the Dropout state (weights and optimizer only) the masks are other ones.
  auto weights_only = make_mlp(0.3f);
  weights_only->init(kSeed + 1);
  StateDict params = model_at_2;
  std::erase_if(params, [](const auto& entry) { return entry.first.find(".rng_") != std::string::npos; });
  weights_only->load_state_dict(params, /*strict=*/false);
  DistributedDataParallel ddp2(world().communicator(), *weights_only, {});
  optim::SGD opt2(weights_only->parameters(), sgd());
  opt2.load_state_dict(optim_at_2);
  train(*weights_only, &ddp2, opt2, 2, 2, 1, 12);
  EXPECT_NE(testing::values_of(*weights_only), uninterrupted);
}

// ---- the precision policy decides what goes on the wire ---------------------------------

TEST(DdpPolicy, Bf16GradientsAreSentAsBf16ByDefault) {
  struct Case {
    amp::Policy policy;
    std::optional<DType> option;
    DType wire;
  };
  const std::vector<Case> cases = {
      {amp::Policy::bf16(), std::nullopt, DType::bf16},  // what the user guide's program does
      {amp::Policy::fp16(), std::nullopt, DType::f32},  {amp::Policy::fp32(), std::nullopt, DType::f32},
      {amp::Policy::bf16(), DType::f32, DType::f32},  // an explicit option wins
      {amp::Policy::fp32(), DType::bf16, DType::bf16},
  };
  for (const Case& c : cases) {
    auto model = make_mlp();
    amp::apply(c.policy, *model);
    model->init(kSeed);
    DdpOptions o;
    o.reducer.grad_comm_dtype = c.option;
    DistributedDataParallel ddp(world().communicator(), *model, o);
    const std::string what = std::string(name_of(c.policy.compute)) + " policy, option " +
                             (c.option ? std::string(name_of(*c.option)) : "unset");
    EXPECT_EQ(ddp.options().reducer.grad_comm_dtype, c.wire) << what;
    nn::CrossEntropyLoss loss;
    const Batch b = my_slice(global_batch(6, 3));
    loss.forward(ddp.forward(b.x), b.y);
    ASSERT_TRUE(ddp.backward(loss.grad()));
    // The gradients stay f32; the wire carries 2 or 4 bytes per element.
    EXPECT_EQ(ddp.reducer().buffer().dtype(), DType::f32) << what;
    const auto wire_bytes = static_cast<std::int64_t>(size_of(c.wire));
    EXPECT_EQ(ddp.reducer().last_stats().bytes_reduced, ddp.reducer().buffer().numel() * wire_bytes) << what;
  }
}

}  // namespace
}  // namespace tutti::ddp

int main(int argc, char** argv) { return tutti::testing::run_world_tests(argc, argv); }
