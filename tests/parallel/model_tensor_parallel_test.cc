// GPT and Llama with tensor parallelism (models::Gpt(config, group), models::Llama(config, group):
// heads and MLP features split, the [q | k | v] and [gate | up] projections by blocks) on thread
// ranks, against the unsplit model on one rank with the whole batch: at tp 2 and 4, and at dp 2
// x tp 2 with DDP over the dp groups (ZeRO 0 and 3), 20 steps of 2 micro-batches with gradient
// clipping give every step's loss and the whole trained model (whole_state_dict) within 1e-5 of
// the reference's (a Llama with grouped-query heads, tied and untied heads); the split model's
// state cut from the whole (split_state_dict) is the rank's own, and a resumed tp 2 run continues
// the reference; heads that do not divide are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tutti/comm/mesh.h"
#include "tutti/comm/thread_group.h"
#include "tutti/core/error.h"
#include "tutti/ddp/ddp.h"
#include "tutti/kernels/threads.h"
#include "tutti/models/gpt.h"
#include "tutti/models/llama.h"
#include "tutti/nn/loss.h"
#include "tutti/optim/sgd.h"
#include "tutti/parallel/tensor_parallel.h"
#include "tutti/parallel/vocab_parallel.h"

namespace tutti::parallel {
namespace {

constexpr int kSteps = 20, kMicro = 2;
constexpr std::int64_t kBatch = 4, kT = 8;  // sequences of one micro-batch, over all dp ranks
constexpr std::uint64_t kSeed = 5;
constexpr double kClip = 0.5;  // most steps' gradients are larger: clipping acts

models::GptConfig config() {
  models::GptConfig c;
  c.vocab = c.padded_vocab = 32;
  c.context = kT;
  c.layers = 2;
  c.heads = 4;
  c.width = 32;
  return c;
}

// Token ids of a micro-batch (the same function of (step, micro, row, position) everywhere).
Tensor tokens(int step, int micro, std::int64_t first, std::int64_t rows, int shift) {
  std::vector<std::int64_t> ids;
  for (std::int64_t b = first; b < first + rows; ++b) {
    for (std::int64_t t = 0; t < kT; ++t) ids.push_back((7 * b + 3 * t + 5 * step + micro + shift * t * t) % 32);
  }
  return Tensor::from_ints(ids, {rows, kT}, DType::i32);
}

// 8 query heads over 4 key/value heads (tp 2 and 4 split both), an MLP of 64, no biases.
models::LlamaConfig llama_config(bool tied) {
  models::LlamaConfig c;
  c.vocab = 32;
  c.context = kT;
  c.layers = 2;
  c.heads = 8;
  c.kv_heads = 4;
  c.width = 32;
  c.ffn = 64;
  c.tied_head = tied;
  return c;
}

enum class Kind { gpt, llama, llama_tied };

// The model of `kind`, split over `tp` when given (with sequence parallelism when `sequence`).
std::unique_ptr<models::CausalLm> make(Kind kind, Communicator* tp, bool sequence = false) {
  const models::TensorParallelOptions options{.sequence_parallel = sequence};
  if (kind == Kind::gpt)
    return tp ? std::make_unique<models::Gpt>(config(), *tp, options) : std::make_unique<models::Gpt>(config());
  const models::LlamaConfig c = llama_config(kind == Kind::llama_tied);
  return tp ? std::make_unique<models::Llama>(c, *tp, options) : std::make_unique<models::Llama>(c);
}

std::function<std::string(const std::string&)> gather_group(Kind kind) {
  if (kind == Kind::gpt) return models::Gpt::gather_group;
  return models::Llama::gather_groups(llama_config(kind == Kind::llama_tied));
}

struct Trained {
  std::vector<double> losses;  // rank 0's, each step's mean over its micro-batches
  StateDict whole, optim;      // the whole model and its optimizer's state at the end (rank 0's)
  int clipped = 0;             // steps where clipping cut (rank 0's)
};

// Steps [first_step, first_step + steps) of SGD with momentum on a dp x tp mesh of thread ranks (tp 1: the
// unsplit Gpt), from `from`'s whole state (cut for this tp) when given.
Trained train(int dp, int tp, int zero, const Trained* from = nullptr, int first_step = 0, int steps = kSteps,
              Kind kind = Kind::gpt, bool sequence = false) {
  kernels::set_cpu_threads(1);
  Trained out;
  ThreadGroup group(dp * tp, CommOptions{.timeout = std::chrono::seconds(30)});
  group.run([&](int r) {
    const DeviceMesh mesh = group.mesh(r, {{"dp", dp}, {"tp", tp}});
    Communicator& tp_group = mesh.group("tp");
    const std::unique_ptr<models::CausalLm> model = make(kind, tp == 1 ? nullptr : &tp_group, sequence);
    model->init(kSeed);
    if (from) model->load_state_dict(split_state_dict(from->whole, *model));
    ddp::DistributedDataParallel ddp(
        mesh.group("dp"), *model,
        {.accumulation_steps = kMicro, .sharding = ddp::sharding_of_stage(zero, gather_group(kind))});
    optim::SGD sgd(model->parameters(), {.lr = 0.1f, .momentum = 0.9f});
    ddp.attach(sgd);
    if (from) ddp.state().load_optimizer_state_dict(sgd, split_state_dict(from->optim, *model));
    const std::unique_ptr<nn::CrossEntropyLoss> loss = model->make_loss();
    const std::int64_t rows = kBatch / dp, first = mesh.coordinate("dp") * rows;
    for (int step = first_step; step < first_step + steps; ++step) {
      double sum = 0;
      for (int micro = 0; micro < kMicro; ++micro) {
        const Tensor x = tokens(step, micro, first, rows, 0);
        const Tensor y = tokens(step, micro, first, rows, 1);
        loss->forward(ddp.forward(x), y);
        sum += nn::item(loss->loss());
        ddp.backward(loss->grad());
      }
      const optim::GradNorm norm = tp > 1 ? grad_norm(ddp, tp_group, kClip) : ddp.grad_norm(kClip);
      if (r == 0 && norm.coefficient < 1) ++out.clipped;
      sgd.step(norm.coefficient);
      ddp.zero_grad();
      if (r == 0) out.losses.push_back(sum / kMicro);  // rank 0's dp slice: compared at equal dp only
    }
    // Whole over dp (ZeRO's shards gathered), then over tp.
    const StateDict whole = whole_state_dict(ddp.state().model_state_dict(), *model, tp_group);
    const StateDict optim = whole_state_dict(ddp.state().optimizer_state_dict(sgd), *model, tp_group);
    if (r == 0) out.whole = whole, out.optim = optim;
  });
  return out;
}

// What building a model over a group of 4 thread ranks throws ("(no error)" when it builds).
std::string refusal(const std::function<void(Communicator&)>& build) {
  ThreadGroup group(4);
  try {
    group.run([&](int r) { build(group.communicator(r)); });
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

double relative_difference(const StateDict& a, const StateDict& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, ref = 0;
  for (const auto& [key, t] : b) {
    if (!a.count(key) || t.dtype() != DType::f32) continue;
    const std::vector<float> x = a.at(key).to_floats(), y = t.to_floats();
    EXPECT_EQ(x.size(), y.size()) << key;
    for (std::size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
      diff = std::max(diff, std::fabs(double(x[i]) - y[i]));
      ref = std::max(ref, std::fabs(double(y[i])));
    }
  }
  return diff / ref;
}

double max_step_difference(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

TEST(GptTensorParallel, TpTwoAndFourAndDpTimesTpTrainLikeTheUnsplitModel) {
  const Trained one = train(1, 1, 0);
  ASSERT_EQ(one.losses.size(), static_cast<std::size_t>(kSteps));
  EXPECT_LT(one.losses.back(), one.losses.front() - 0.3) << "the reference learned (else the test shows little)";
  EXPECT_GT(one.clipped, kSteps / 2) << "clipping acted on most steps";
  StateDict start;
  {
    models::Gpt fresh(config());
    fresh.init(kSeed);
    start = fresh.state_dict();
  }
  EXPECT_GT(relative_difference(one.whole, start), 1e-2) << "the reference moved";
  for (int tp : {2, 4}) {
    const Trained split = train(1, tp, 0);
    std::printf("tp %d: parameters %.2e, losses %.2e from tp 1\n", tp, relative_difference(split.whole, one.whole),
                max_step_difference(split.losses, one.losses));
    EXPECT_LT(relative_difference(split.whole, one.whole), 1e-5) << "tp " << tp;
    EXPECT_LT(max_step_difference(split.losses, one.losses), 1e-5) << "tp " << tp;
    EXPECT_EQ(split.clipped, one.clipped) << "tp " << tp;
  }
  const Trained dp_one = train(2, 1, 0);
  for (int zero : {0, 3}) {
    const Trained mesh = train(2, 2, zero);
    std::printf("dp 2 x tp 2, ZeRO %d: parameters %.2e from tp 1\n", zero, relative_difference(mesh.whole, one.whole));
    EXPECT_LT(relative_difference(mesh.whole, one.whole), 1e-5) << "ZeRO " << zero;
    EXPECT_LT(max_step_difference(mesh.losses, dp_one.losses), 1e-5) << "ZeRO " << zero;
  }
}

TEST(GptTensorParallel, TheFusedProjectionSplitsByHeadsAndAResumeContinues) {
  // 10 steps at tp 1, its whole state cut for tp 2, 10 more at tp 2: as 20 at tp 1.
  const Trained whole = train(1, 1, 0);
  const Trained first = train(1, 1, 0, nullptr, 0, kSteps / 2);
  // A tp 2 run of 0 steps from `first` hands its state back whole: split and gathered exactly.
  const Trained round_trip = train(1, 2, 0, &first, 0, 0);
  for (const auto& [key, t] : first.whole) {
    ASSERT_TRUE(round_trip.whole.count(key)) << key;
    EXPECT_EQ(round_trip.whole.at(key).to_floats(), t.to_floats()) << key;
  }
  // The fused [q | k | v] weight of layer 0 on rank 1 of 2: rows [C/2, C) of each of q, k, v.
  const models::GptConfig c = config();
  ThreadGroup group(2);
  group.run([&](int r) {
    models::Gpt model(c, group.communicator(r));
    model.init(kSeed);
    const StateDict part = split_state_dict(first.whole, model);
    std::string qkv;
    for (const auto& [key, t] : part) {
      if (t.ndim() == 2 && t.dim(0) == 3 * c.width / 2) qkv = key;
    }
    ASSERT_FALSE(qkv.empty()) << "no [3C/2, C] weight in the split model";
    const std::vector<float> got = part.at(qkv).to_floats(), all = first.whole.at(qkv).to_floats();
    const std::int64_t half = c.width / 2;
    for (std::int64_t block = 0; block < 3; ++block) {
      for (std::int64_t row = 0; row < half; ++row) {
        const std::int64_t from = (block * c.width + r * half + row) * c.width;
        const std::int64_t to = (block * half + row) * c.width;
        for (std::int64_t col = 0; col < c.width; ++col) {
          ASSERT_EQ(got[static_cast<std::size_t>(to + col)], all[static_cast<std::size_t>(from + col)])
              << qkv << " block " << block << " row " << row;
        }
      }
    }
  });
  const Trained resumed = train(1, 2, 0, &first, kSteps / 2, kSteps / 2);
  EXPECT_LT(relative_difference(resumed.whole, whole.whole), 1e-5);
  EXPECT_LT(relative_difference(resumed.optim, whole.optim), 1e-5);
}

TEST(LlamaTensorParallel, GroupedHeadsAndTheGatedMlpSplitAndTrainLikeTheUnsplitModel) {
  for (const Kind kind : {Kind::llama, Kind::llama_tied}) {
    SCOPED_TRACE(kind == Kind::llama ? "untied head" : "tied head");
    const Trained one = train(1, 1, 0, nullptr, 0, kSteps, kind);
    EXPECT_LT(one.losses.back(), one.losses.front() - 0.3) << "the reference learned";
    for (int tp : {2, 4}) {
      const Trained split = train(1, tp, 0, nullptr, 0, kSteps, kind);
      std::printf("llama%s tp %d: parameters %.2e, losses %.2e from tp 1\n", kind == Kind::llama ? "" : " (tied)", tp,
                  relative_difference(split.whole, one.whole), max_step_difference(split.losses, one.losses));
      EXPECT_LT(relative_difference(split.whole, one.whole), 1e-5) << "tp " << tp;
      EXPECT_LT(max_step_difference(split.losses, one.losses), 1e-5) << "tp " << tp;
    }
    const Trained mesh = train(2, 2, 3, nullptr, 0, kSteps, kind);
    EXPECT_LT(relative_difference(mesh.whole, one.whole), 1e-5) << "dp 2 x tp 2, ZeRO 3";
  }
  // Key/value heads that do not divide: 4 query heads sharing 2 over 4 ranks.
  models::LlamaConfig c = llama_config(false);
  c.heads = 4;
  c.kv_heads = 2;
  EXPECT_NE(refusal([&](Communicator& tp) {
              models::Llama model(c, tp);
            }).find("must divide by the tensor-parallel group's 4"),
            std::string::npos);
}

TEST(GptTensorParallel, HeadsOrAVocabularyThatDoNotDivideAreRefused) {
  models::GptConfig c = config();
  c.heads = 2;
  EXPECT_NE(refusal([&](Communicator& tp) {
              models::Gpt model(c, tp);
            }).find("2 heads and the padded vocabulary 32 must divide by the tensor-parallel group's 4"),
            std::string::npos);
  c = config();
  c.vocab = c.padded_vocab = 30;
  EXPECT_NE(refusal([&](Communicator& tp) { models::Gpt model(c, tp); }).find("the padded vocabulary 30 must divide"),
            std::string::npos);
}

TEST(GptTensorParallel, EachRankHoldsItsRowsOfTheVocabularyAndItsColumnsOfTheLogits) {
  // At tp 2: wte [V/2, C] (rows [r·V/2, (r+1)·V/2) of the unsplit model's), logits [B, T, V/2]
  // (the unsplit logits' columns of those rows), and the loss make_loss() gives is the whole
  // vocabulary's: the unsplit model's loss on every rank.
  const models::GptConfig c = config();
  models::Gpt whole(c);
  whole.init(kSeed);
  const Tensor x = tokens(0, 0, 0, 2, 0), y = tokens(0, 0, 0, 2, 1);
  const Tensor whole_logits = whole.forward(x);
  nn::CrossEntropyLoss whole_loss;
  whole_loss.forward(whole_logits, y);
  const std::vector<float> wl = whole_logits.to_floats(), wte = whole.embed_weight().value.to_floats();
  const std::vector<float> whole_grad = whole_loss.grad().to_floats();
  ThreadGroup group(2);
  group.run([&](int r) {
    models::Gpt model(c, group.communicator(r));
    model.init(kSeed);
    ASSERT_EQ(model.embed_weight().shape(), (Shape{c.padded_vocab / 2, c.width}));
    const std::vector<float> mine = model.embed_weight().value.to_floats();
    for (std::size_t i = 0; i < mine.size(); ++i)
      ASSERT_EQ(mine[i], wte[static_cast<std::size_t>(r) * mine.size() + i]) << "rank " << r << " element " << i;
    const Tensor logits = model.forward(x);
    ASSERT_EQ(logits.shape(), (Shape{2, kT, c.padded_vocab / 2}));
    const std::vector<float> l = logits.to_floats();
    const std::int64_t half = c.padded_vocab / 2;
    double most = 0;
    for (std::int64_t row = 0; row < 2 * kT; ++row)
      for (std::int64_t v = 0; v < half; ++v)
        most = std::max(most, std::fabs(double(l[static_cast<std::size_t>(row * half + v)]) -
                                        wl[static_cast<std::size_t>(row * c.padded_vocab + r * half + v)]));
    EXPECT_LT(most, 1e-5) << "rank " << r << "'s logits against the unsplit model's columns";
    const std::unique_ptr<nn::CrossEntropyLoss> loss = model.make_loss();
    EXPECT_NE(dynamic_cast<VocabParallelCrossEntropy*>(loss.get()), nullptr);
    loss->forward(logits, y, 8.0f);
    EXPECT_NEAR(nn::item(loss->loss()), nn::item(whole_loss.loss()), 1e-6) << "rank " << r;
    // Its gradient: this rank's columns of the unsplit loss's (times the grad scale).
    const std::vector<float> g = loss->grad().to_floats(), wg = whole_grad;
    most = 0;
    for (std::int64_t row = 0; row < 2 * kT; ++row)
      for (std::int64_t v = 0; v < half; ++v)
        most = std::max(most, std::fabs(double(g[static_cast<std::size_t>(row * half + v)]) -
                                        8.0 * wg[static_cast<std::size_t>(row * c.padded_vocab + r * half + v)]));
    EXPECT_LT(most, 1e-6) << "rank " << r << "'s gradient columns";
  });
}

// ---- sequence parallelism (TensorParallelOptions::sequence_parallel) --------------------------

TEST(SequenceParallel, GptAndLlamaTrainLikeTheUnsplitModelWithTheirRowsSplit) {
  for (const Kind kind : {Kind::gpt, Kind::llama, Kind::llama_tied}) {
    const char* name = kind == Kind::gpt ? "gpt" : kind == Kind::llama ? "llama" : "llama (tied)";
    SCOPED_TRACE(name);
    const Trained one = train(1, 1, 0, nullptr, 0, kSteps, kind);
    EXPECT_LT(one.losses.back(), one.losses.front() - 0.3) << "the reference learned";
    for (int tp : {2, 4}) {
      const Trained split = train(1, tp, 0, nullptr, 0, kSteps, kind, /*sequence=*/true);
      std::printf("%s tp %d, sequence-parallel: parameters %.2e, losses %.2e from tp 1\n", name, tp,
                  relative_difference(split.whole, one.whole), max_step_difference(split.losses, one.losses));
      EXPECT_LT(relative_difference(split.whole, one.whole), 1e-5) << "tp " << tp;
      EXPECT_LT(max_step_difference(split.losses, one.losses), 1e-5) << "tp " << tp;
      EXPECT_EQ(split.clipped, one.clipped) << "tp " << tp;
    }
    const Trained dp_one = train(2, 1, 0, nullptr, 0, kSteps, kind);
    for (int zero : {0, 3}) {
      const Trained mesh = train(2, 2, zero, nullptr, 0, kSteps, kind, /*sequence=*/true);
      std::printf("%s dp 2 x tp 2, ZeRO %d, sequence-parallel: parameters %.2e from tp 1\n", name, zero,
                  relative_difference(mesh.whole, one.whole));
      EXPECT_LT(relative_difference(mesh.whole, one.whole), 1e-5) << "ZeRO " << zero;
      EXPECT_LT(max_step_difference(mesh.losses, dp_one.losses), 1e-5) << "ZeRO " << zero;
    }
  }
}

TEST(SequenceParallel, EachRankHoldsItsRowsAndRowsThatDoNotDivideRunWhole) {
  // At tp 2: a [2, 8] batch's 16 rows split 8 and 8 (the final norm's output [8, C]) with the
  // logits of tensor parallelism without the split; a [1, 3] batch (3 rows) runs unsplit, its
  // logits and gradients the same bits as without sequence parallelism.
  const models::GptConfig c = config();
  ThreadGroup group(2);
  group.run([&](int r) {
    Communicator& tp = group.communicator(r);
    models::Gpt plain(c, tp), split(c, tp, {.sequence_parallel = true});
    plain.init(kSeed);
    split.init(kSeed);
    ASSERT_NE(split.sequence_parallel(), nullptr);
    EXPECT_EQ(plain.sequence_parallel(), nullptr);
    EXPECT_NE(split.describe().find("sequence-parallel"), std::string::npos);
    for (const std::int64_t rows : {std::int64_t{2}, std::int64_t{1}}) {
      const std::int64_t T = rows == 2 ? kT : 3;
      SCOPED_TRACE("batch [" + std::to_string(rows) + ", " + std::to_string(T) + "]");
      const auto ids = [&](int shift) {
        std::vector<std::int64_t> v;
        for (std::int64_t i = 0; i < rows * T; ++i) v.push_back((7 * i + 3 + shift * i * i) % 32);
        return Tensor::from_ints(v, {rows, T}, DType::i32);
      };
      const Tensor x = ids(0), y = ids(1);
      const std::vector<float> a = plain.forward(x).to_floats(), b = split.forward(x).to_floats();
      const bool splits = rows * T % 2 == 0;
      EXPECT_EQ(split.sequence_parallel()->active(), splits);
      EXPECT_EQ(split.last_hidden().shape(), splits ? (Shape{rows * T / 2, c.width}) : (Shape{rows, T, c.width}));
      ASSERT_EQ(a.size(), b.size());
      double most = 0;
      for (std::size_t i = 0; i < a.size(); ++i) most = std::max(most, std::fabs(double(a[i]) - b[i]));
      if (splits) {
        EXPECT_LT(most, 1e-6) << "rank " << r;
      } else {
        EXPECT_EQ(most, 0.0) << "rank " << r << ": the same path, the same bits";
      }
      const std::unique_ptr<nn::CrossEntropyLoss> plain_loss = plain.make_loss(), split_loss = split.make_loss();
      plain_loss->forward(plain.forward(x), y);
      split_loss->forward(split.forward(x), y);
      plain.zero_grad();
      split.zero_grad();
      plain.backward(plain_loss->grad());
      split.backward(split_loss->grad());
      most = 0;
      const std::vector<nn::Parameter*> pp = plain.parameters(), sp = split.parameters();
      ASSERT_EQ(pp.size(), sp.size());
      for (std::size_t i = 0; i < pp.size(); ++i) {
        const std::vector<float> ga = pp[i]->grad.to_floats(), gb = sp[i]->grad.to_floats();
        for (std::size_t j = 0; j < ga.size(); ++j) most = std::max(most, std::fabs(double(ga[j]) - gb[j]));
      }
      if (splits) {
        EXPECT_LT(most, 1e-6) << "rank " << r << "'s gradients (the norms' summed over the group)";
      } else {
        EXPECT_EQ(most, 0.0) << "rank " << r << "'s gradients";
      }
    }
  });
  // A group of one has nothing to split over: the rows stay whole.
  ThreadGroup one(1);
  one.run([&](int r) {
    models::Gpt model(c, one.communicator(r), {.sequence_parallel = true});
    model.init(kSeed);
    model.forward(tokens(0, 0, 0, 2, 0));
    EXPECT_FALSE(model.sequence_parallel()->active());
    EXPECT_EQ(model.last_hidden().shape(), (Shape{2, kT, c.width}));
  });
}

}  // namespace
}  // namespace tutti::parallel
