// DdpState::model_state_views / optimizer_state_views (ddp.state()): the same entries as
// model_state_dict / optimizer_state_dict, bit for bit, without a copy (views of the live
// tensors), so that io::CheckpointWriter writes the same file from either; refused under ZeRO.
// Ranks are threads (tutti::ThreadGroup).
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "ddp_test_util.h"
#include "tutti/amp/policy.h"
#include "tutti/comm/thread_group.h"
#include "tutti/ddp/ddp.h"
#include "tutti/io/checkpoint_writer.h"
#include "tutti/kernels/threads.h"
#include "tutti/nn/layers.h"
#include "tutti/nn/loss.h"
#include "tutti/optim/adamw.h"

namespace tutti::ddp {
namespace {

constexpr std::int64_t kIn = 12;

std::unique_ptr<nn::Sequential> make_model() {
  auto m = std::make_unique<nn::Sequential>();
  m->add<nn::Linear>(kIn, 16).add<nn::ReLU>().add<nn::Dropout>(0.1f).add<nn::Linear>(16, testing::kClasses);
  return m;
}

std::vector<unsigned char> bytes_of(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<unsigned char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Trains `steps` steps at 2 thread ranks, then gives rank 0's state both ways to `check`.
void train_then(int zero, amp::Policy policy,
                const std::function<void(DistributedDataParallel&, optim::Optimizer&, int rank)>& check) {
  kernels::set_cpu_threads(1);
  ThreadGroup group(2, {.timeout = std::chrono::seconds(20)});
  group.run([&](int rank) {
    auto model = make_model();
    amp::apply(policy, *model);
    model->init(77);
    DdpOptions o;
    o.sharding = sharding_of_stage(zero);
    o.bucket_cap_mb = o.first_bucket_cap_mb = 3e-4;  // several buckets
    DistributedDataParallel ddp(group.communicator(rank), *model, o);
    optim::AdamW opt(model->parameters(), {.lr = 1e-2f});
    ddp.attach(opt);
    nn::CrossEntropyLoss loss;
    for (int step = 0; step < 3; ++step) {
      const testing::Batch b = testing::rows(testing::global_batch({kIn}, 8, 10 + step), rank * 4, 4);
      loss.forward(ddp.forward(b.x), b.y, 1.0f);
      ASSERT_TRUE(ddp.backward(loss.grad()));
      opt.step();
      ddp.zero_grad();
    }
    check(ddp, opt, rank);
  });
}

void expect_same(const StateDict& views, const StateDict& copies, Device device) {
  ASSERT_EQ(views.size(), copies.size());
  for (const auto& [name, copy] : copies) {
    ASSERT_EQ(views.count(name), 1u) << name;
    const Tensor& v = views.at(name);
    EXPECT_EQ(v.shape(), copy.shape()) << name;
    ASSERT_EQ(v.dtype(), copy.dtype()) << name;
    const Tensor host = v.device().is_cpu() ? v : v.to(Device::cpu());
    EXPECT_EQ(std::memcmp(host.data(), copy.data(), copy.nbytes()), 0) << name;
    // Parameters and optimizer state are the live tensors on the model's device.
    if (copy.numel() > 1) EXPECT_TRUE(v.device() == device) << name;
  }
}

TEST(StateViews, SameEntriesAsTheStateDictsAndTheSameFile) {
  for (amp::Policy policy : {amp::Policy::fp32(), amp::Policy::bf16()}) {
    train_then(0, policy, [&](DistributedDataParallel& ddp, optim::Optimizer& opt, int rank) {
      const StateDict model_views = ddp.state().model_state_views(),
                      optim_views = ddp.state().optimizer_state_views(opt);
      const StateDict model_copy = ddp.state().model_state_dict(), optim_copy = ddp.state().optimizer_state_dict(opt);
      expect_same(model_views, model_copy, ddp.module().device());
      expect_same(optim_views, optim_copy, ddp.module().device());
      // A view is the live tensor: it shares the storage the optimizer updates.
      const nn::Parameter* first = ddp.module().parameters().front();
      EXPECT_TRUE(model_views.at(first->name).shares_storage_with(first->value));
      if (rank != 0) return;
      StateDict from_views, from_copies;
      io::add_prefixed(from_views, "model.", model_views);
      io::add_prefixed(from_views, "optim.", optim_views);
      io::add_prefixed(from_copies, "model.", model_copy);
      io::add_prefixed(from_copies, "optim.", optim_copy);
      const auto dir = std::filesystem::temp_directory_path() / ("tutti_state_views_" + std::to_string(::getpid()));
      std::filesystem::create_directories(dir);
      io::CheckpointWriter writer;
      writer.save((dir / "views").string(), 3, from_views, {}, ddp.module().stream());
      writer.finish();
      io::save_checkpoint((dir / "copies").string(), from_copies);
      EXPECT_EQ(bytes_of((dir / "views").string()), bytes_of((dir / "copies").string()));
      std::filesystem::remove_all(dir);
    });
  }
}

TEST(StateViews, RefusedWhereThisRankHoldsOnlyAShard) {
  train_then(1, amp::Policy::fp32(), [&](DistributedDataParallel& ddp, optim::Optimizer& opt, int) {
    EXPECT_THROW(ddp.state().model_state_views(), InvalidArgument);
    EXPECT_THROW(ddp.state().optimizer_state_views(opt), InvalidArgument);
  });
}

}  // namespace
}  // namespace tutti::ddp
