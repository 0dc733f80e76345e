// Communication hooks (ddp/comm_hook.h) with thread ranks: a hook that allreduces each bucket
// itself, and is active on every other step only, trains an MLP bit for bit as plain DDP does,
// and the reducer calls it as the header promises (one launch per bucket in bucket order, one
// finish per active step, one end_step per step); its bytes count as the reducer's
// communication bytes; the refusals name the call.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "ddp_test_util.h"
#include "tutti/comm/thread_group.h"
#include "tutti/ddp/comm_hook.h"
#include "tutti/ddp/ddp.h"
#include "tutti/ddp/reducer.h"
#include "tutti/kernels/elementwise.h"
#include "tutti/kernels/threads.h"
#include "tutti/nn/loss.h"
#include "tutti/optim/sgd.h"

namespace tutti::ddp {
namespace {

using testing::refusal;
using testing::Values;

// Allreduces each bucket of the buffer in launch() and waits in finish(): what the reducer does
// without a hook, so the sums are the same bits. Active on even steps only.
class AllreduceHook final : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  void bind(const CommHookContext& context) override {
    comm_ = &context.comm;
    plan_ = context.plan;
    buffer_ = context.buffer;
  }
  bool active() const override { return steps % 2 == 0; }
  std::int64_t launch(int bucket, const Stream& stream) override {
    EXPECT_EQ(bucket, next_bucket) << "buckets are launched in bucket order";
    next_bucket = bucket + 1;
    const nn::PlanBucket& pb = plan_->buckets[static_cast<std::size_t>(bucket)];
    Tensor grads = buffer_.view(pb.begin, {pb.numel()});
    if (!sum) {
      kernels::scale(grads, static_cast<float>(comm_->size()), grads, stream);  // as if every rank's were these
    } else {
      CallOptions call;
      call.stream = stream;
      works_.push_back(comm_->allreduce(grads, ReduceOp::sum, call));
    }
    ++launches;
    return pb.numel() * 4;
  }
  std::int64_t finish(const Stream& stream, double* /*run_ms*/) override {
    EXPECT_EQ(next_bucket, static_cast<int>(plan_->buckets.size())) << "finish() after every bucket";
    for (const Work& w : works_) w.wait(stream);
    works_.clear();
    ++finishes;
    return 0;
  }
  void end_step() override {
    ++steps;
    next_bucket = 0;
  }
  std::int64_t bytes() const override { return 4096; }

  int launches = 0, finishes = 0, steps = 0, next_bucket = 0;
  bool sum = true;

 private:
  Communicator* comm_ = nullptr;
  std::shared_ptr<const nn::FlatPlan> plan_;
  Tensor buffer_;
  std::vector<Work> works_;
};

constexpr int kSteps = 6;

// An MLP trained for kSteps steps on 2 ranks, with the hook or without; every rank's values.
// sum false: the hook's launch() leaves the bucket as it is (each rank keeps its own gradients).
std::vector<Values> train(bool hooked, std::vector<std::shared_ptr<AllreduceHook>>* hooks = nullptr, bool sum = true) {
  kernels::set_cpu_threads(1);
  ThreadGroup group(2, CommOptions{.timeout = std::chrono::seconds(20)});
  const testing::Batch all = testing::global_batch({12}, 64, 5);
  std::vector<Values> out(2);
  if (hooks) hooks->resize(2);
  group.run([&](int rank) {
    auto model = testing::make_mlp();
    model->init(testing::kSeed);
    // Small buckets: several per step.
    DistributedDataParallel ddp(group.communicator(rank), *model, {.bucket_cap_mb = 1e-4, .first_bucket_cap_mb = 1e-4});
    EXPECT_GT(ddp.reducer().plan().buckets.size(), 2U);
    const std::int64_t before = ddp.memory().communication;
    if (hooked) {
      auto hook = std::make_shared<AllreduceHook>();
      hook->sum = sum;
      ddp.register_comm_hook(hook);
      EXPECT_EQ(ddp.reducer().comm_hook(), hook.get());
      EXPECT_EQ(ddp.memory().communication, before + 4096) << "the hook's bytes are the reducer's";
      if (hooks) (*hooks)[static_cast<std::size_t>(rank)] = hook;
    }
    optim::SGD opt(model->parameters(), optim::SgdOptions{.lr = 0.1f, .momentum = 0.9f});
    ddp.attach(opt);
    nn::CrossEntropyLoss loss;
    for (int step = 0; step < kSteps; ++step) {
      const testing::Batch mb = testing::rows(all, (step % 2) * 32 + rank * 16, 16);
      loss.forward(ddp.forward(mb.x), mb.y);
      EXPECT_TRUE(ddp.backward(loss.grad()));
      opt.step();
      ddp.zero_grad();
    }
    out[static_cast<std::size_t>(rank)] = testing::values_of(*model);
  });
  return out;
}

TEST(CommHook, AHookThatAllreducesTrainsAsPlainDdpAndIsCalledAsPromised) {
  const std::vector<Values> plain = train(false);
  std::vector<std::shared_ptr<AllreduceHook>> hooks;
  const std::vector<Values> hooked = train(true, &hooks);
  EXPECT_EQ(hooked[0], plain[0]) << "the hook's sums are the reducer's, bit for bit";
  EXPECT_EQ(hooked[1], hooked[0]);
  // The control: a hook that leaves the buckets unsummed makes the ranks drift apart.
  const std::vector<Values> broken = train(true, nullptr, /*sum=*/false);
  EXPECT_NE(broken[0], broken[1]);
  for (const auto& hook : hooks) {
    ASSERT_NE(hook, nullptr);
    EXPECT_EQ(hook->steps, kSteps) << "end_step after every step";
    EXPECT_EQ(hook->finishes, kSteps / 2) << "finish on the active (even) steps only";
    EXPECT_EQ(hook->launches % (kSteps / 2), 0);
    EXPECT_GT(hook->launches, 2 * (kSteps / 2)) << "a launch per bucket of each active step";
  }
}

TEST(CommHook, RegistrationIsRefusedWhereItCannotApply) {
  ThreadGroup group(1);
  group.run([&](int rank) {
    Communicator& comm = group.communicator(rank);
    const nn::FlatPlan plan = nn::make_flat_plan({{"w", {4, 4}}, {"b", {4}}});
    Reducer reducer(comm, plan, DType::f32, Device::cpu());
    EXPECT_NE(refusal([&] { reducer.register_comm_hook(nullptr); }).find("null"), std::string::npos);
    reducer.register_comm_hook(std::make_shared<AllreduceHook>());
    EXPECT_NE(refusal([&] {
                reducer.register_comm_hook(std::make_shared<AllreduceHook>());
              }).find("a hook ('allreduce') is registered already"),
              std::string::npos);
    // Mid-step: an accumulating pass is open.
    Reducer open(comm, plan, DType::f32, Device::cpu());
    open.prepare(false);
    try {
      open.register_comm_hook(std::make_shared<AllreduceHook>());
      ADD_FAILURE() << "registered within a pass";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("only between steps"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
}  // namespace tutti::ddp
