// PowerSGD's state in checkpoints (PowerSgdHook::state_dict and load_state_dict, ddp/powersgd.h
// "Checkpoints"), with thread ranks on the CPU: a run
// checkpointed mid-way (past start_step) and resumed in fresh objects ends with the parameters
// of the uninterrupted run, bit for bit, on 2 and 3 ranks, and differs when PowerSGD's state is
// dropped; Q and the step count are the same bits on every rank and every rank's error reaches
// rank 0's result; another world size keeps Q and the step count and zeroes the error; another
// bucket layout finds the entries by name and goes on alike; no state, or a state of other
// options, restarts the warm-up; truncated or mismatched entries are refused, naming the entry.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <optional>
#include <string>

#include "ddp_test_util.h"
#include "tutti/comm/thread_group.h"
#include "tutti/ddp/ddp.h"
#include "tutti/ddp/powersgd.h"
#include "tutti/kernels/threads.h"
#include "tutti/nn/loss.h"
#include "tutti/optim/sgd.h"

namespace tutti::ddp {
namespace {

using testing::refusal;
using testing::Values;

constexpr int kStart = 3;   // start_step: steps 0-2 allreduce whole
constexpr int kSteps = 12;  // the whole run
constexpr int kCut = 7;     // the checkpoint's step (past kStart: compressing, Q warm, error kept)

PowerSgdOptions options(int rank = 2) { return PowerSgdOptions{.rank = rank, .start_step = kStart}; }

struct Saved {
  StateDict model, optim, powersgd;  // rank 0's
};

// What each rank ends with.
struct Ranks {
  std::vector<Values> params;
  std::vector<StateDict> powersgd;  // each rank's powersgd_state_dict() at the end
  std::vector<std::string> notes;   // what load_powersgd_state_dict returned
  std::vector<std::int64_t> last_bytes;
  std::int64_t total = 0;  // the plan's elements
};

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// Fresh objects on `ranks` thread ranks (the model initialized with another seed when it loads,
// so that the load must matter), loaded from *load (its PowerSGD part replaced by
// `powersgd_override` when given), trained from step `from` to `to` on a fixed data set (rows of
// the step's global batch of 60); *save (rank 0's) and every rank's PowerSGD state at the end.
Ranks train(int ranks, int from, int to, const Saved* load, Saved* save, std::optional<PowerSgdOptions> psgd,
            const StateDict* powersgd_override = nullptr, bool bucket_per_parameter = false) {
  kernels::set_cpu_threads(1);  // the GEMMs' bits do not depend on the thread count
  ThreadGroup group(ranks, CommOptions{.timeout = std::chrono::seconds(30)});
  const testing::Batch all = testing::global_batch({12}, 240, 77);
  Ranks out;
  out.params.resize(static_cast<std::size_t>(ranks));
  out.powersgd.resize(static_cast<std::size_t>(ranks));
  out.notes.resize(static_cast<std::size_t>(ranks));
  out.last_bytes.resize(static_cast<std::size_t>(ranks));
  group.run([&](int rank) {
    const auto r = static_cast<std::size_t>(rank);
    auto model = testing::make_mlp();
    model->init(testing::kSeed + (load ? 1 : 0));
    DdpOptions o;
    if (bucket_per_parameter) o.bucket_cap_mb = o.first_bucket_cap_mb = 1e-6;  // (the default: one bucket)
    DistributedDataParallel ddp(group.communicator(rank), *model, o);
    std::shared_ptr<PowerSgdHook> hook;
    if (psgd) ddp.register_comm_hook(hook = std::make_shared<PowerSgdHook>(*psgd));
    const Stream& stream = model->stream();
    if (rank == 0) EXPECT_EQ(ddp.reducer().plan().buckets.size(), bucket_per_parameter ? 6U : 1U);
    optim::SGD opt(model->parameters(), optim::SgdOptions{.lr = 0.05f, .momentum = 0.9f});
    ddp.attach(opt);
    if (load) {
      ddp.state().load_model_state_dict(load->model);
      ddp.state().load_optimizer_state_dict(opt, load->optim);
      if (hook) out.notes[r] = hook->load_state_dict(powersgd_override ? *powersgd_override : load->powersgd, stream);
    }
    nn::CrossEntropyLoss loss;
    const std::int64_t per_rank = 60 / ranks;
    for (int step = from; step < to; ++step) {
      const testing::Batch mb = testing::rows(all, (step % 4) * 60 + rank * per_rank, per_rank);
      loss.forward(ddp.forward(mb.x), mb.y);
      EXPECT_TRUE(ddp.backward(loss.grad()));
      opt.step();
      ddp.zero_grad();
      out.last_bytes[r] = ddp.reducer().last_stats().bytes_reduced;
    }
    if (hook) out.powersgd[r] = hook->state_dict(stream);  // COLLECTIVE
    const StateDict m = ddp.state().model_state_dict(), op = ddp.state().optimizer_state_dict(opt);
    if (save && rank == 0) *save = Saved{m, op, out.powersgd[r]};
    out.params[r] = testing::values_of(*model);
    if (rank == 0) out.total = ddp.reducer().plan().total;
  });
  return out;
}

// The names of the compressed parameters (from a state's "q.<name>" entries).
std::vector<std::string> compressed(const StateDict& state) {
  std::vector<std::string> names;
  for (const auto& [key, t] : state)
    if (key.rfind("q.", 0) == 0) names.push_back(key.substr(2));
  return names;
}

TEST(PowerSgdCheckpoint, ResumeIsBitIdenticalAndDroppingTheStateIsNot) {
  for (int ranks : {2, 3}) {
    const Ranks whole = train(ranks, 0, kSteps, nullptr, nullptr, options());
    Saved saved;
    const Ranks first = train(ranks, 0, kCut, nullptr, &saved, options());
    ASSERT_EQ(compressed(saved.powersgd).size(), 3U) << "every weight matrix of the MLP";
    EXPECT_EQ(get_int_scalar(saved.powersgd, "step"), kCut);
    EXPECT_EQ(get_int_scalar(saved.powersgd, "q_drawn"), 1);
    EXPECT_LT(first.last_bytes[0], first.total * 4) << "compressing at the checkpoint";
    const Ranks resumed = train(ranks, kCut, kSteps, &saved, nullptr, options());
    for (int r = 0; r < ranks; ++r) {
      const auto i = static_cast<std::size_t>(r);
      EXPECT_EQ(resumed.notes[i], "") << "rank " << r;
      EXPECT_EQ(resumed.params[i], whole.params[i]) << ranks << " ranks, rank " << r << ": not bit-identical";
      EXPECT_EQ(resumed.params[i], resumed.params[0]) << "rank " << r;
    }
    // The same resume without PowerSGD's state (as before it was kept): the warm-up restarts
    // with zero error and a new Q, and the parameters differ.
    const StateDict none;
    const Ranks dropped = train(ranks, kCut, kSteps, &saved, nullptr, options(), &none);
    EXPECT_NE(dropped.notes[0].find("holds no PowerSGD state"), std::string::npos) << dropped.notes[0];
    EXPECT_NE(dropped.params[0], whole.params[0]) << ranks << " ranks: dropping the state changed nothing";
    // And with only the error dropped (every rank's zero), too.
    StateDict no_error = saved.powersgd;
    for (auto& [key, t] : no_error)
      if (key.rfind("rank", 0) == 0 && key.rfind("ranks", 0) != 0) t = Tensor::zeros(t.shape(), DType::f32);
    const Ranks zeroed = train(ranks, kCut, kSteps, &saved, nullptr, options(), &no_error);
    EXPECT_EQ(zeroed.notes[0], "");
    EXPECT_NE(zeroed.params[0], whole.params[0]) << ranks << " ranks: the error changed nothing";
  }
}

TEST(PowerSgdCheckpoint, QAndStepAreEveryRanksAndEachErrorReachesRankZero) {
  constexpr int kRanks = 3;
  const Ranks got = train(kRanks, 0, kCut, nullptr, nullptr, options());
  const StateDict& zero = got.powersgd[0];
  const std::vector<std::string> names = compressed(zero);
  ASSERT_EQ(names.size(), 3U);
  for (int r = 1; r < kRanks; ++r) {
    const StateDict& mine = got.powersgd[static_cast<std::size_t>(r)];
    for (const auto& [key, t] : zero) {
      if (key.rfind("rank", 0) == 0 && key.rfind("ranks", 0) != 0) continue;  // errors: below
      ASSERT_TRUE(mine.count(key)) << key;
      EXPECT_TRUE(same_bits(mine.at(key), t)) << key << " differs between rank 0 and rank " << r;
    }
    for (const std::string& name : names) {
      const std::string key = "rank" + std::to_string(r) + ".error." + name;
      ASSERT_TRUE(zero.count(key) && mine.count(key)) << key;
      EXPECT_TRUE(same_bits(zero.at(key), mine.at(key))) << key << ": rank 0 holds another error than rank " << r;
      EXPECT_FALSE(same_bits(zero.at(key), zero.at("rank0.error." + name))) << key << ": errors are per rank";
      EXPECT_EQ(mine.count("rank0.error." + name), 0U) << "rank " << r << " holds only its own error";
    }
  }
}

TEST(PowerSgdCheckpoint, AnotherWorldSizeKeepsQAndTheStepAndZeroesTheError) {
  Saved saved;
  train(2, 0, kCut, nullptr, &saved, options());
  // Loaded on 3 ranks, nothing trained: the state as it was loaded.
  const Ranks loaded = train(3, kCut, kCut, &saved, nullptr, options());
  for (int r = 0; r < 3; ++r) {
    const auto i = static_cast<std::size_t>(r);
    EXPECT_NE(loaded.notes[i].find("written on 2 rank(s), here 3"), std::string::npos) << loaded.notes[i];
    const StateDict& s = loaded.powersgd[i];
    EXPECT_EQ(get_int_scalar(s, "step"), kCut);
    EXPECT_EQ(get_int_scalar(s, "ranks"), 3);
    for (const std::string& name : compressed(saved.powersgd)) {
      EXPECT_TRUE(same_bits(s.at("q." + name), saved.powersgd.at("q." + name))) << name;
      const std::vector<float> err = s.at("rank" + std::to_string(r) + ".error." + name).to_floats();
      EXPECT_EQ(err, std::vector<float>(err.size(), 0.f)) << name << " on rank " << r;
    }
  }
  // It trains on, compressing from the first step (no second warm-up), every rank alike.
  const Ranks on = train(3, kCut, kCut + 2, &saved, nullptr, options());
  EXPECT_LT(on.last_bytes[0], on.total * 4);
  EXPECT_EQ(on.params[1], on.params[0]);
  EXPECT_EQ(on.params[2], on.params[0]);
}

TEST(PowerSgdCheckpoint, AnotherBucketLayoutFindsTheEntriesByName) {
  Saved saved;
  train(2, 0, kCut, nullptr, &saved, options());  // one bucket
  const Ranks whole = train(2, 0, kSteps, nullptr, nullptr, options());
  // Resumed with a bucket per parameter: the same state, and (the thread backend sums in rank
  // order whatever the bucket) the same parameters at the end.
  const Ranks loaded = train(2, kCut, kCut, &saved, nullptr, options(), nullptr, true);
  EXPECT_EQ(loaded.notes[0], "");
  EXPECT_EQ(loaded.powersgd[0].size(), saved.powersgd.size());
  for (const auto& [key, t] : loaded.powersgd[0]) {  // rank 0's: every rank's error too
    ASSERT_TRUE(saved.powersgd.count(key)) << key;
    EXPECT_TRUE(same_bits(t, saved.powersgd.at(key))) << key;
  }
  const Ranks resumed = train(2, kCut, kSteps, &saved, nullptr, options(), nullptr, true);
  EXPECT_EQ(resumed.params[0], whole.params[0]);
}

// (A run without PowerSGD has no hook to read the state: train::Run's note says that it is not
// used, tests/train/powersgd_resume_test.cc.)
TEST(PowerSgdCheckpoint, NoStateOrOtherOptionsRestart) {
  Saved saved;
  train(2, 0, kCut, nullptr, &saved, options());
  // No state: step 0 again, so the next step allreduces whole (the warm-up).
  const StateDict none;
  const Ranks fresh = train(2, kCut, kCut + 1, &saved, nullptr, options(), &none);
  EXPECT_NE(fresh.notes[0].find("holds no PowerSGD state: PowerSGD starts afresh (3 plain step(s)"), std::string::npos)
      << fresh.notes[0];
  EXPECT_EQ(fresh.last_bytes[0], fresh.total * 4);
  EXPECT_EQ(get_int_scalar(fresh.powersgd[0], "step"), 1);
  // Another rank of approximation: restarted, naming the option.
  const Ranks other = train(2, kCut, kCut + 1, &saved, nullptr, options(4));
  EXPECT_NE(other.notes[0].find("other options (options.rank 2, here 4)"), std::string::npos) << other.notes[0];
  EXPECT_EQ(other.last_bytes[0], other.total * 4);
}

TEST(PowerSgdCheckpoint, BadEntriesAreRefusedNamingThem) {
  Saved saved;
  train(2, 0, kCut, nullptr, &saved, options());
  const std::string w = compressed(saved.powersgd).front();
  std::vector<std::pair<StateDict, std::string>> cases;  // (state, what the error names)
  auto with = [&](const std::function<void(StateDict&)>& change, const std::string& named) {
    StateDict s = saved.powersgd;
    change(s);
    cases.emplace_back(std::move(s), named);
  };
  with([&](StateDict& s) { s.erase("rank1.error." + w); }, "'rank1.error." + w + "'");
  with([&](StateDict& s) { s.erase("q." + w); }, "'q." + w + "'");
  with([&](StateDict& s) { s.erase("step"); }, "'step'");
  with([&](StateDict& s) { s["q." + w] = Tensor::zeros({3}, DType::f32); }, "'q." + w + "' is Tensor[3] f32");
  with([&](StateDict& s) { s["rank0.error." + w] = Tensor::zeros({2, 2}, DType::f32); }, "'rank0.error." + w + "'");
  with([&](StateDict& s) { s["q.nope"] = Tensor::zeros({1}, DType::f32); }, "'q.nope'");
  with([&](StateDict& s) { s["ranks"] = scalar_tensor(2); }, "'ranks'");
  ThreadGroup group(2, CommOptions{.timeout = std::chrono::seconds(30)});
  group.run([&](int rank) {
    auto model = testing::make_mlp();
    model->init(testing::kSeed);
    DistributedDataParallel ddp(group.communicator(rank), *model);
    auto hook = std::make_shared<PowerSgdHook>(options());
    ddp.register_comm_hook(hook);
    for (const auto& [state, named] : cases) {
      const std::string what = refusal([&] { hook->load_state_dict(state, model->stream()); });
      EXPECT_NE(what.find("PowerSgdHook::load_state_dict"), std::string::npos) << what;
      EXPECT_NE(what.find(named), std::string::npos) << "expected " << named << " in: " << what;
    }
    // Nothing changed: still a fresh PowerSGD (step 0, no Q drawn).
    const StateDict now = hook->state_dict(model->stream());
    EXPECT_EQ(get_int_scalar(now, "step"), 0);
    EXPECT_EQ(get_int_scalar(now, "q_drawn"), 0);
  });
}

}  // namespace
}  // namespace tutti::ddp
