// Tensor-parallel Linear layers on thread ranks, against the same MLP of nn::Linear layers on
// one rank (the reference): ColumnParallelLinear -> GELU -> RowParallelLinear at tp 1, 2 and 4
// starts from the reference's values (each rank's slice of them), gives its output and its
// input gradient on every rank within 1e-5, and each rank's weight gradients are the slices of
// the reference's; two SGD steps keep it there. On a dp 2 x tp 2 mesh, DDP over the dp groups
// of that model, with 2 accumulation steps, at ZeRO 0 and 1, trains like the unsplit model on
// one rank with the whole batch. A tp 4 state gathered whole (whole_state_dict) equals the
// unsplit run's, and cut for tp 2, tp 1 and tp 2 x dp 2 (split_state_dict) continues it;
// clipping by parallel::grad_norm clips as one rank does, at ZeRO 0, 1 and 3. Sizes that do
// not divide are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tutti/comm/mesh.h"
#include "tutti/comm/thread_group.h"
#include "tutti/core/error.h"
#include "tutti/ddp/ddp.h"
#include "tutti/kernels/threads.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/loss.h"
#include "tutti/nn/sequential.h"
#include "tutti/optim/sgd.h"
#include "tutti/parallel/tensor_parallel.h"

namespace tutti::parallel {
namespace {

constexpr std::int64_t kRows = 6, kIn = 8, kHidden = 12, kOut = 4;
constexpr std::uint64_t kSeed = 77;

Tensor values(std::int64_t rows, std::int64_t cols, std::uint32_t salt) {
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * static_cast<float>(i + salt)) * 0.8f;
  return Tensor::from_floats(v, {rows, cols});
}

// Elements [begin, begin + count) of `whole` ([rows, cols]) along `dim`, row-major.
std::vector<float> slice(const std::vector<float>& whole, std::int64_t rows, std::int64_t cols, int dim,
                         std::int64_t begin, std::int64_t count) {
  std::vector<float> out;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::int64_t at = dim == 0 ? r : c;
      if (at >= begin && at < begin + count) out.push_back(whole[static_cast<std::size_t>(r * cols + c)]);
    }
  }
  return out;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}

struct Snapshot {
  std::vector<float> y, dx, w1, b1, w2, b2, gw1, gb1, gw2, gb2;
};

// Two SGD steps of `model` (input gradient on); the state after the first backward and the
// output of a third forward.
Snapshot train(nn::Module& model, std::vector<nn::Parameter*> p) {
  model.set_input_grad(true);
  optim::SGD sgd(model.parameters(), {.lr = 0.1f});
  Snapshot s;
  for (int step = 0; step < 2; ++step) {
    const Tensor y = model.forward(values(kRows, kIn, 10 + step));
    const Tensor dx = model.backward(values(kRows, kOut, 50 + step));
    if (step == 0) {
      s.dx = dx.to_floats();
      s.gw1 = p[0]->grad.to_floats(), s.gb1 = p[1]->grad.to_floats();
      s.gw2 = p[2]->grad.to_floats(), s.gb2 = p[3]->grad.to_floats();
    }
    sgd.step();
    model.zero_grad();
  }
  s.y = model.forward(values(kRows, kIn, 99)).to_floats();
  s.w1 = p[0]->value.to_floats(), s.b1 = p[1]->value.to_floats();
  s.w2 = p[2]->value.to_floats(), s.b2 = p[3]->value.to_floats();
  return s;
}

Snapshot reference() {
  nn::Sequential m;
  m.add<nn::Linear>(kIn, kHidden).add<nn::GELU>().add<nn::Linear>(kHidden, kOut);
  m.init(kSeed);
  auto& a = dynamic_cast<nn::Linear&>(*m.children()[0].second);
  auto& b = dynamic_cast<nn::Linear&>(*m.children()[2].second);
  return train(m, {&a.weight, &a.bias, &b.weight, &b.bias});
}

std::vector<float> initial_reference_weight(int layer) {
  nn::Sequential m;
  m.add<nn::Linear>(kIn, kHidden).add<nn::GELU>().add<nn::Linear>(kHidden, kOut);
  m.init(kSeed);
  return dynamic_cast<nn::Linear&>(*m.children()[static_cast<std::size_t>(layer)].second).weight.value.to_floats();
}

class TensorParallelMlp : public ::testing::TestWithParam<int> {};

TEST_P(TensorParallelMlp, EqualsTheUnsplitMlp) {
  kernels::set_cpu_threads(1);
  const int tp = GetParam();
  const Snapshot ref = reference();
  const std::vector<float> w1_0 = initial_reference_weight(0), w2_0 = initial_reference_weight(2);
  const std::int64_t part = kHidden / tp;
  ThreadGroup group(tp);
  group.run([&](int r) {
    Communicator& comm = group.communicator(r);
    nn::Sequential m;
    m.add<ColumnParallelLinear>(comm, kIn, kHidden).add<nn::GELU>().add<RowParallelLinear>(comm, kHidden, kOut);
    m.init(kSeed);
    auto& col = dynamic_cast<ColumnParallelLinear&>(*m.children()[0].second);
    auto& row = dynamic_cast<RowParallelLinear&>(*m.children()[2].second);
    EXPECT_EQ(col.weight.shape(), (Shape{part, kIn}));
    EXPECT_EQ(row.weight.shape(), (Shape{kOut, part}));
    // The initial values are the reference's slices, bit for bit.
    EXPECT_EQ(col.weight.value.to_floats(), slice(w1_0, kHidden, kIn, 0, r * part, part));
    EXPECT_EQ(row.weight.value.to_floats(), slice(w2_0, kOut, kHidden, 1, r * part, part));
    const Snapshot s = train(m, {&col.weight, &col.bias, &row.weight, &row.bias});
    const std::string at = "tp " + std::to_string(tp) + " rank " + std::to_string(r);
    EXPECT_LT(max_diff(s.dx, ref.dx), 1e-5) << at << ": the input gradient, summed over the group";
    EXPECT_LT(max_diff(s.gw1, slice(ref.gw1, kHidden, kIn, 0, r * part, part)), 1e-5) << at;
    EXPECT_LT(max_diff(s.gb1, slice(ref.gb1, 1, kHidden, 1, r * part, part)), 1e-5) << at;
    EXPECT_LT(max_diff(s.gw2, slice(ref.gw2, kOut, kHidden, 1, r * part, part)), 1e-5) << at;
    EXPECT_LT(max_diff(s.gb2, ref.gb2), 1e-5) << at << ": the replicated bias's whole gradient";
    EXPECT_LT(max_diff(s.w1, slice(ref.w1, kHidden, kIn, 0, r * part, part)), 1e-5) << at << " after 2 steps";
    EXPECT_LT(max_diff(s.w2, slice(ref.w2, kOut, kHidden, 1, r * part, part)), 1e-5) << at << " after 2 steps";
    EXPECT_LT(max_diff(s.y, ref.y), 1e-5) << at << ": the output after 2 steps, on every rank";
    // This rank's share of the work.
    EXPECT_DOUBLE_EQ(m.training_flops_per_sample({kIn}), 3.0 * 2.0 * (kIn * kHidden + kHidden * kOut) / tp);
  });
}

INSTANTIATE_TEST_SUITE_P(Tp, TensorParallelMlp, ::testing::Values(1, 2, 4));

// 20 steps of DDP (SGD with momentum, 2 micro-batches a step): the unsplit model on one rank
// with the whole batch, or on a mesh of `dp` x `tp` thread ranks, the tensor-parallel model over
// the tp groups and DDP over the dp groups, each dp group taking its rows of every micro-batch.
// Rank r's weights at the end (the first layer's, the second's), f32.
// With clip > 0, the gradients are clipped to that global norm (parallel::grad_norm at tp > 1,
// DistributedDataParallel::grad_norm at tp 1); `clipped` counts the steps where it cut.
std::vector<std::vector<float>> train_ddp(int dp, int tp, int zero, double clip = 0, int* clipped = nullptr) {
  constexpr int kSteps = 20, kMicro = 2;
  constexpr std::int64_t kBatch = 8;  // rows of one micro-batch, over all dp ranks
  std::vector<std::vector<float>> out(static_cast<std::size_t>(2 * dp * tp));
  ThreadGroup group(dp * tp);
  group.run([&](int r) {
    const DeviceMesh mesh = group.mesh(r, {{"dp", dp}, {"tp", tp}});
    nn::Sequential m;
    if (tp == 1) {
      m.add<nn::Linear>(kIn, kHidden).add<nn::GELU>().add<nn::Linear>(kHidden, kOut);
    } else {
      m.add<ColumnParallelLinear>(mesh.group("tp"), kIn, kHidden).add<nn::GELU>();
      m.add<RowParallelLinear>(mesh.group("tp"), kHidden, kOut);
    }
    m.init(kSeed);
    ddp::DistributedDataParallel ddp(mesh.group("dp"), m,
                                     {.accumulation_steps = kMicro, .sharding = ddp::sharding_of_stage(zero)});
    optim::SGD sgd(m.parameters(), {.lr = 0.2f, .momentum = 0.9f});
    ddp.attach(sgd);
    nn::CrossEntropyLoss loss;
    const std::int64_t rows = kBatch / dp, first = mesh.coordinate("dp") * rows;
    for (int step = 0; step < kSteps; ++step) {
      for (int micro = 0; micro < kMicro; ++micro) {
        const std::uint32_t salt = static_cast<std::uint32_t>(1000 + 10 * step + micro);
        const Tensor x = values(kBatch, kIn, salt).view(first * kIn, {rows, kIn}).clone();
        std::vector<std::int64_t> labels;
        for (std::int64_t i = first; i < first + rows; ++i) labels.push_back((i * 7 + salt) % kOut);
        loss.forward(ddp.forward(x), Tensor::from_ints(labels, {rows}, DType::i32));
        ddp.backward(loss.grad());
      }
      float coefficient = 1;
      if (clip > 0) {
        coefficient = (tp > 1 ? grad_norm(ddp, mesh.group("tp"), clip) : ddp.grad_norm(clip)).coefficient;
        if (r == 0 && clipped != nullptr && coefficient < 1) ++*clipped;
      }
      sgd.step(coefficient);
      ddp.zero_grad();
    }
    const StateDict state = ddp.state().model_state_dict();  // whole tensors over dp (this rank's tp slices)
    out[static_cast<std::size_t>(2 * r)] = state.at("0.weight").to_floats();
    out[static_cast<std::size_t>(2 * r + 1)] = state.at("2.weight").to_floats();
  });
  return out;
}

class TensorParallelDdp : public ::testing::TestWithParam<int> {};

TEST_P(TensorParallelDdp, DpTimesTpTrainsLikeOneRankWithTheWholeBatch) {
  kernels::set_cpu_threads(1);
  const int zero = GetParam();
  const std::vector<std::vector<float>> one = train_ddp(1, 1, 0);
  const std::vector<std::vector<float>> mesh = train_ddp(2, 2, zero);
  const std::vector<float> w1_0 = initial_reference_weight(0);
  const std::int64_t part = kHidden / 2;
  double moved = 0;
  for (std::size_t i = 0; i < w1_0.size(); ++i) moved = std::max(moved, std::fabs(double(one[0][i]) - w1_0[i]));
  EXPECT_GT(moved, 1e-2) << "the reference trained (else the comparison shows nothing)";
  for (int r = 0; r < 4; ++r) {
    const int t = r % 2;  // the tp coordinate: the last dimension varies fastest
    const auto& w1 = mesh[static_cast<std::size_t>(2 * r)];
    const auto& w2 = mesh[static_cast<std::size_t>(2 * r + 1)];
    EXPECT_LT(max_diff(w1, slice(one[0], kHidden, kIn, 0, t * part, part)), 1e-5) << "rank " << r;
    EXPECT_LT(max_diff(w2, slice(one[1], kOut, kHidden, 1, t * part, part)), 1e-5) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Zero, TensorParallelDdp, ::testing::Values(0, 1, 2, 3));

// Clipping to a global norm that most steps exceed: parallel::grad_norm over the tp group gives
// the unsplit model's norm (the split weights' squares summed over the group, the replicated
// bias's once), so dp 2 x tp 2 clips as one rank does.
TEST(TensorParallel, ClippingByTheWholeModelsNormTrainsLikeOneRank) {
  kernels::set_cpu_threads(1);
  int clipped_one = 0, clipped_mesh = 0;
  const std::vector<std::vector<float>> one = train_ddp(1, 1, 0, 0.05, &clipped_one);
  const std::vector<std::vector<float>> mesh = train_ddp(2, 2, 0, 0.05, &clipped_mesh);
  EXPECT_GT(clipped_one, 10) << "the reference clipped most steps (else the test shows little)";
  EXPECT_EQ(clipped_mesh, clipped_one);
  const std::int64_t part = kHidden / 2;
  for (int r = 0; r < 4; ++r) {
    const int t = r % 2;
    EXPECT_LT(max_diff(mesh[static_cast<std::size_t>(2 * r)], slice(one[0], kHidden, kIn, 0, t * part, part)), 1e-5)
        << "rank " << r;
    EXPECT_LT(max_diff(mesh[static_cast<std::size_t>(2 * r + 1)], slice(one[1], kOut, kHidden, 1, t * part, part)),
              1e-5)
        << "rank " << r;
  }
  // Under ZeRO each rank holds a gradient shard: the norm sums the shards over dp too.
  for (int zero : {1, 3}) {
    int clipped_zero = 0;
    const std::vector<std::vector<float>> sharded = train_ddp(2, 2, zero, 0.05, &clipped_zero);
    EXPECT_EQ(clipped_zero, clipped_one) << "ZeRO " << zero;
    for (int r = 0; r < 4; ++r) {
      const int t = r % 2;
      EXPECT_LT(max_diff(sharded[static_cast<std::size_t>(2 * r)], slice(one[0], kHidden, kIn, 0, t * part, part)),
                1e-5)
          << "ZeRO " << zero << ", rank " << r;
    }
  }
}

// A model and its optimizer at one tensor-parallel size (1: nn::Linear layers on one rank).
struct Split {
  nn::Sequential m;
  std::unique_ptr<optim::SGD> sgd;
  Split(Communicator& comm, int tp, std::uint64_t seed) {
    if (tp == 1) {
      m.add<nn::Linear>(kIn, kHidden).add<nn::GELU>().add<nn::Linear>(kHidden, kOut);
    } else {
      m.add<ColumnParallelLinear>(comm, kIn, kHidden).add<nn::GELU>().add<RowParallelLinear>(comm, kHidden, kOut);
    }
    m.init(seed);
    sgd = std::make_unique<optim::SGD>(m.parameters(), optim::SgdOptions{.lr = 0.2f, .momentum = 0.9f});
  }
  void steps(int first, int count) {
    for (int step = first; step < first + count; ++step) {
      m.forward(values(kRows, kIn, 10 + step));
      m.backward(values(kRows, kOut, 50 + step));
      sgd->step();
      m.zero_grad();
    }
  }
};

// Whole tensors from tp 4 (whole_state_dict), taken up at tp 2, at tp 1, and at tp 2 x dp 2
// under DDP with ZeRO 1 (split_state_dict): the model and its momentum continue as the unsplit
// run that never stopped.
TEST(TensorParallel, ATp4CheckpointResumesAtTp2Tp1AndTp2TimesDp2) {
  kernels::set_cpu_threads(1);
  ThreadGroup one(1);
  Split reference(one.communicator(0), 1, kSeed);
  reference.steps(0, 2);
  const StateDict ref_model = reference.m.state_dict(), ref_optim = reference.sgd->state_dict();
  reference.steps(2, 2);
  const StateDict ref_end = reference.m.state_dict();

  StateDict whole_model, whole_optim;
  ThreadGroup four(4);
  four.run([&](int r) {
    Split tp4(four.communicator(r), 4, kSeed);
    tp4.steps(0, 2);
    const StateDict model = whole_state_dict(tp4.m.state_dict(), tp4.m, four.communicator(r));
    const StateDict optim = whole_state_dict(tp4.sgd->state_dict(), tp4.m, four.communicator(r));
    if (r == 0) whole_model = model, whole_optim = optim;
  });
  ASSERT_EQ(whole_model.size(), ref_model.size());
  for (const auto& [key, t] : ref_model) {
    EXPECT_EQ(whole_model.at(key).shape(), t.shape()) << key;
    EXPECT_LT(max_diff(whole_model.at(key).to_floats(), t.to_floats()), 1e-5) << key;
  }
  for (const auto& [key, t] : ref_optim) {
    if (t.dtype() == DType::f32) EXPECT_LT(max_diff(whole_optim.at(key).to_floats(), t.to_floats()), 1e-5) << key;
  }

  for (int tp : {2, 1}) {
    ThreadGroup group(tp);
    group.run([&](int r) {
      Split resumed(group.communicator(r), tp, kSeed + 1);  // other values: the load must replace them
      resumed.m.load_state_dict(split_state_dict(whole_model, resumed.m));
      resumed.sgd->load_state_dict(split_state_dict(whole_optim, resumed.m));
      resumed.steps(2, 2);
      const std::int64_t part = kHidden / tp;
      const StateDict end = resumed.m.state_dict();
      const std::string at = "tp " + std::to_string(tp) + " rank " + std::to_string(r);
      EXPECT_LT(max_diff(end.at("0.weight").to_floats(),
                         slice(ref_end.at("0.weight").to_floats(), kHidden, kIn, 0, r * part, part)),
                1e-5)
          << at;
      EXPECT_LT(max_diff(end.at("2.weight").to_floats(),
                         slice(ref_end.at("2.weight").to_floats(), kOut, kHidden, 1, r * part, part)),
                1e-5)
          << at;
      EXPECT_LT(max_diff(end.at("2.bias").to_floats(), ref_end.at("2.bias").to_floats()), 1e-5) << at;
    });
  }
  // tp 2 x dp 2 under DDP (ZeRO 1): every dp rank runs the same rows, so the average over dp
  // is the one rank's gradient.
  ThreadGroup mesh_ranks(4);
  mesh_ranks.run([&](int r) {
    const DeviceMesh mesh = mesh_ranks.mesh(r, {{"dp", 2}, {"tp", 2}});
    Split resumed(mesh.group("tp"), 2, kSeed + 1);
    ddp::DistributedDataParallel ddp(mesh.group("dp"), resumed.m, {.sharding = ddp::ShardOptimizer{}});
    ddp.attach(*resumed.sgd);
    ddp.state().load_model_state_dict(split_state_dict(whole_model, resumed.m));
    ddp.state().load_optimizer_state_dict(*resumed.sgd, split_state_dict(whole_optim, resumed.m));
    for (int step = 2; step < 4; ++step) {
      ddp.forward(values(kRows, kIn, 10 + step));
      ddp.backward(values(kRows, kOut, 50 + step));
      resumed.sgd->step();
      ddp.zero_grad();
    }
    const StateDict end = ddp.state().model_state_dict();
    const int t = mesh.coordinate("tp");
    const std::int64_t part = kHidden / 2;
    EXPECT_LT(max_diff(end.at("0.weight").to_floats(),
                       slice(ref_end.at("0.weight").to_floats(), kHidden, kIn, 0, t * part, part)),
              1e-5)
        << "tp 2 x dp 2, rank " << r;
    EXPECT_LT(max_diff(end.at("2.weight").to_floats(),
                       slice(ref_end.at("2.weight").to_floats(), kOut, kHidden, 1, t * part, part)),
              1e-5)
        << "tp 2 x dp 2, rank " << r;
  });
  try {
    (void)split_state_dict({{"0.weight", Tensor::zeros({3, 3}, DType::f32)}}, reference.m);  // not split: kept
    ThreadGroup two(2);
    two.run([&](int r) {
      Split tp2(two.communicator(r), 2, kSeed);
      (void)split_state_dict({{"0.weight", Tensor::zeros({3, 3}, DType::f32)}}, tp2.m);
    });
    ADD_FAILURE() << "a tensor of the wrong shape was cut";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("split_state_dict: '0.weight' is"), std::string::npos) << e.what();
  }
}

TEST(TensorParallel, RefusesSizesThatDoNotDivide) {
  ThreadGroup group(4);
  group.run([&](int r) {
    Communicator& comm = group.communicator(r);
    try {
      ColumnParallelLinear bad(comm, kIn, 10);
      ADD_FAILURE() << "out_features 10 over 4 ranks accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("ColumnParallelLinear: out_features 10 must divide by the tensor-parallel "
                                           "group's 4 rank(s)"),
                std::string::npos)
          << e.what();
    }
    try {
      RowParallelLinear bad(comm, 6, kOut);
      ADD_FAILURE() << "in_features 6 over 4 ranks accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("in_features 6 must divide"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace tutti::parallel
