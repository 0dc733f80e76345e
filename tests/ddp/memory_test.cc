// ddp::predict_memory (ddp/memory.h), each part's statement of its bytes, against what
// DistributedDataParallel::memory() measures once the model is built, attached and has stepped:
// byte for byte, by component, for every sharding, f32 and bf16, 1 to 3 thread ranks, an MLP and
// a GPT (whose ZeRO-3 groups are its layers), with and without bucket caps that cut the plan.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "ddp_test_util.h"
#include "tutti/amp/policy.h"
#include "tutti/comm/thread_group.h"
#include "tutti/ddp/ddp.h"
#include "tutti/ddp/memory.h"
#include "tutti/kernels/threads.h"
#include "tutti/models/gpt.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/loss.h"
#include "tutti/optim/adamw.h"

namespace tutti::ddp {
namespace {

constexpr std::int64_t kVocab = 32, kT = 8, kBatch = 6;

enum class Model { mlp, gpt };

std::unique_ptr<nn::Module> make_model(Model kind) {
  if (kind == Model::gpt) {
    models::GptConfig c;
    c.vocab = c.padded_vocab = kVocab;
    c.context = kT;
    c.layers = 2;
    c.heads = 2;
    c.width = 16;
    return std::make_unique<models::Gpt>(c);
  }
  return testing::make_mlp();
}

testing::Batch batch(Model kind, std::int64_t n) {
  if (kind == Model::mlp) return testing::global_batch({12}, n, 7);
  std::vector<std::int64_t> x(static_cast<std::size_t>(n * kT)), y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<std::int64_t>((i * 7) % kVocab), y[i] = x[i] / 2;
  return {Tensor::from_ints(x, {n, kT}, DType::i32), Tensor::from_ints(y, {n, kT}, DType::i32)};
}

// One backward pass's gradient placements and reports, recorded on a model of its own: the
// order the reducer's pool sees.
std::vector<GradientEvent> backward_order(Model kind, const amp::Policy& policy) {
  const std::unique_ptr<nn::Module> model = make_model(kind);
  amp::apply(policy, *model);
  model->init(1);
  const std::vector<nn::Parameter*> params = model->parameters();
  auto index_of = [&](const nn::Parameter& p) {
    for (std::size_t i = 0; i < params.size(); ++i)
      if (params[i] == &p) return i;
    ADD_FAILURE() << "unknown parameter " << p.name;
    return std::size_t{0};
  };
  std::vector<GradientEvent> order;
  model->storage().set_grad_placement_hook([&](nn::Parameter& p) {
    order.push_back({false, index_of(p)});
    return Tensor::zeros(p.shape(), model->grad_dtype());
  });
  model->storage().set_grad_ready_hook([&](nn::Parameter& p) { order.push_back({true, index_of(p)}); });
  const testing::Batch b = batch(kind, 2);
  nn::CrossEntropyLoss loss;
  loss.forward(model->forward(b.x), b.y);
  model->backward(loss.grad());
  model->storage().set_grad_placement_hook({});
  model->storage().set_grad_ready_hook({});
  return order;
}

struct Case {
  Model model;
  int stage;
  bool bf16;
  int ranks;
  double bucket_mb;  // small: several buckets (ZeRO-3 cuts by group anyway)
  bool deterministic = false;
  std::string str() const {
    return std::string(model == Model::gpt ? "gpt" : "mlp") + " zero " + std::to_string(stage) +
           (bf16 ? " bf16" : " f32") + " ranks " + std::to_string(ranks) + " buckets " + std::to_string(bucket_mb) +
           (deterministic ? " deterministic" : "");
  }
};

void expect_predicted(const Case& k) {
  SCOPED_TRACE(k.str());
  kernels::set_cpu_threads(1);
  const amp::Policy policy = k.bf16 ? amp::Policy::bf16() : amp::Policy::fp32();
  DdpOptions options;
  options.bucket_cap_mb = options.first_bucket_cap_mb = k.bucket_mb;
  options.sharding = sharding_of_stage(k.stage, k.model == Model::gpt ? models::Gpt::gather_group : nullptr);
  if (k.deterministic) options.deterministic = DeterministicOptions{};
  MemoryInputs in;
  {
    const std::unique_ptr<nn::Module> like = make_model(k.model);
    amp::apply(policy, *like);
    in.params = nn::plan_params(like->parameters());
    in.compute = like->compute_dtype();
    in.grad = like->grad_dtype();
    in.grad_comm = like->grad_comm_dtype();
  }
  in.world_size = k.ranks;
  in.optimizer_states = 2;  // AdamW
  in.backward_order = backward_order(k.model, policy);
  const MemoryPrediction predicted = predict_memory(options, in);

  std::vector<DdpMemory> measured(static_cast<std::size_t>(k.ranks));
  std::vector<std::int64_t> totals(static_cast<std::size_t>(k.ranks));
  ThreadGroup group(k.ranks);
  group.run([&](int rank) {
    const std::unique_ptr<nn::Module> model = make_model(k.model);
    amp::apply(policy, *model);
    model->init(3);
    DistributedDataParallel ddp(group.communicator(rank), *model, options);
    optim::AdamW opt(model->parameters(), {.lr = 1e-3f});
    ddp.attach(opt);
    const testing::Batch b = batch(k.model, kBatch);
    nn::CrossEntropyLoss loss;
    for (int step = 0; step < 2; ++step) {  // the second step allocates nothing new
      loss.forward(ddp.forward(b.x), b.y);
      ASSERT_TRUE(ddp.backward(loss.grad()));
      opt.step();
      ddp.zero_grad();
    }
    measured[static_cast<std::size_t>(rank)] = ddp.memory();
    totals[static_cast<std::size_t>(rank)] = ddp.reducer().plan().total;
  });
  EXPECT_EQ(predicted.plan.total, totals[0]) << "the plan DDP made";
  EXPECT_EQ(predicted.sharded, k.stage > 0);
  for (const DdpMemory& m : measured) {
    EXPECT_EQ(predicted.bytes.parameters, m.parameters) << predicted.lines[0].detail;
    EXPECT_EQ(predicted.bytes.master_weights, m.master_weights) << predicted.lines[1].detail;
    EXPECT_EQ(predicted.bytes.gathered, m.gathered) << predicted.lines[2].detail;
    EXPECT_EQ(predicted.bytes.gradients, m.gradients) << predicted.lines[3].detail;
    EXPECT_EQ(predicted.bytes.optimizer_state, m.optimizer_state) << predicted.lines[4].detail;
    EXPECT_EQ(predicted.bytes.communication, m.communication) << predicted.lines[5].detail;
  }
  std::int64_t lines = 0;
  for (const MemoryLine& l : predicted.lines) lines += l.bytes;
  EXPECT_EQ(lines, predicted.bytes.total()) << "the lines are the components";
}

TEST(PredictMemory, EqualsWhatEachShardingAllocates) {
  for (Model model : {Model::mlp, Model::gpt})
    for (int stage = 0; stage <= 3; ++stage)
      for (bool bf16 : {false, true})
        for (int ranks : {1, 3}) expect_predicted({model, stage, bf16, ranks, 3e-4});
}

TEST(PredictMemory, EqualsWithOneBucketAndTwoRanks) {
  for (int stage = 0; stage <= 3; ++stage) expect_predicted({Model::gpt, stage, true, 2, 25.0});
}

TEST(PredictMemory, CountsTheExactSumOfTheDeterministicMode) {
  for (int stage : {0, 1}) expect_predicted({Model::mlp, stage, false, 2, 3e-4, true});
}

TEST(PredictMemory, RefusesWhatTheConstructorRefuses) {
  MemoryInputs in;
  in.params = {{"0.weight", {4, 4}, true}, {"0.bias", {4}, false}};
  DdpOptions options;
  options.sharding = ShardParameters{};
  try {
    predict_memory(options, in);
    ADD_FAILURE() << "a frozen parameter under ShardParameters was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'0.bias'"), std::string::npos) << e.what();
  }
  in.world_size = 0;
  options.sharding = Replicate{};
  EXPECT_THROW(predict_memory(options, in), InvalidArgument);
}

}  // namespace
}  // namespace tutti::ddp
