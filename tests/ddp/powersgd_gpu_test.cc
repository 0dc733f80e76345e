// PowerSGD's GPU path (PowerSgdHook on a GPU buffer: kernels::matmul on the device,
// P copied to the host for the orthonormalization and back, the collectives on the job's
// communicator, nccl where each rank has a GPU) against its CPU path on the same gradients
// (a CPU reducer over an mpi communicator): the same reduced gradients, step after step, with
// error feedback and warm start carried across steps, and across a checkpoint of the GPU
// reducer's PowerSGD state loaded into a fresh one.
//
// Where it runs: powersgd_gpu_test on a GPU machine (skipped elsewhere), its _emu twin on the
// emulated CUDA device in every CI run (TUTTI_EMU_DEVICES=4: a GPU per rank).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>

#include "ddp_world.h"
#include "tutti/ddp/powersgd.h"
#include "tutti/ddp/reducer.h"

namespace tutti::ddp {
namespace {

using testing::world;

std::vector<nn::PlanParam> specs() { return {{"w1", {24, 10}}, {"b1", {7}}, {"w2", {3, 4, 6}}, {"w3", {16, 20}}}; }

std::vector<float> gradient(std::size_t i, std::int64_t numel, int step) {
  std::mt19937 rng(static_cast<unsigned>(1000 * i + 17 * world().rank() + 7919 * step));
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> v(static_cast<std::size_t>(numel));
  for (float& x : v) x = normal(rng);
  return v;
}

// One step on `red` (its buffer on any device): the reduced flat buffer.
std::vector<float> step_of(Reducer& red, int step, const Stream& stream) {
  red.prepare(true, stream);
  for (std::size_t i = 0; i < red.size(); ++i) {
    Tensor g = red.grad(i);
    g.copy_from(Tensor::from_floats(gradient(i, g.numel(), step), g.shape()), stream);
    red.mark_ready(i);
  }
  red.finish();
  stream.synchronize();
  std::vector<float> out = red.buffer().to_floats();
  red.zero();
  return out;
}

double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (std::size_t k = 0; k < got.size() && k < want.size(); ++k) {
    num += (static_cast<double>(got[k]) - want[k]) * (static_cast<double>(got[k]) - want[k]);
    den += static_cast<double>(want[k]) * want[k];
  }
  EXPECT_EQ(got.size(), want.size());
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Every rank's error in one state, as rank 0's powersgd_state_dict() holds it (this rank's
// holds its own): each error entry all-gathered over `comm` (CPU).
StateDict with_every_error(StateDict state, Communicator& comm) {
  const std::string mine = "rank" + std::to_string(comm.rank()) + ".error.";
  std::vector<std::pair<std::string, Tensor>> own;
  for (const auto& [key, t] : state)
    if (key.rfind(mine, 0) == 0) own.emplace_back(key.substr(mine.size()), t);
  for (const auto& [name, t] : own) {
    const Tensor all = Tensor::empty({comm.size() * t.numel()}, DType::f32);
    comm.allgather(t.view(0, {t.numel()}), all).wait();
    for (int k = 0; k < comm.size(); ++k)
      state["rank" + std::to_string(k) + ".error." + name] = all.view(k * t.numel(), t.shape()).clone();
  }
  return state;
}

// The GPU reducer is checkpointed at step 3 (compressing since step 1: Q warm, the error kept):
// its state (saved on the device: copies, the all-gather of the errors over nccl) matches the CPU
// reducer's, and a fresh GPU reducer that loads it goes on like the CPU path; one that does not
// (PowerSGD restarts: a plain allreduce) does not.
TEST(PowerSgdGpu, EqualsTheCpuPathAcrossACheckpoint) {
  if (!world().device().is_cuda()) GTEST_SKIP() << "no GPU visible: PowerSGD's GPU path not run";
  static std::shared_ptr<Communicator> cpu_comm =
      world().new_communicator({.timeout = std::chrono::seconds(60)}, "mpi");
  const PowerSgdOptions ro{.rank = 2, .start_step = 1};
  nn::FlatPlanOptions po;
  po.first_bucket_cap_mb = 300 * 4 / 1048576.0;  // two buckets
  const nn::FlatPlan plan = nn::make_flat_plan(specs(), po);
  // A reducer with its own PowerSGD hook.
  auto reducer = [&](Communicator& comm, Device device) {
    auto r = std::make_unique<Reducer>(comm, plan, DType::f32, device);
    r->register_comm_hook(std::make_shared<PowerSgdHook>(ro));
    return r;
  };
  auto hook_of = [](Reducer& r) -> CommHook& { return *r.comm_hook(); };
  auto gpu = reducer(world().communicator(), world().device());
  const auto cpu_owner = reducer(*cpu_comm, Device::cpu());
  Reducer& cpu = *cpu_owner;
  ASSERT_EQ(dynamic_cast<PowerSgdHook&>(hook_of(*gpu)).compressed_count(), 3);
  const Stream stream = Stream::create(world().device());
  std::vector<float> restarted;  // step 3 of a fresh GPU reducer that did not load the state
  for (int step = 0; step < 6; ++step) {
    if (step == 3) {
      const StateDict want = hook_of(cpu).state_dict(Stream());
      const StateDict got = hook_of(*gpu).state_dict(stream);
      ASSERT_EQ(got.size(), want.size());
      for (const auto& [key, t] : want) {
        ASSERT_TRUE(got.count(key)) << key;
        ASSERT_TRUE(got.at(key).device().is_cpu()) << key;
        EXPECT_EQ(got.at(key).shape(), t.shape()) << key;
        if (t.dtype() == DType::f32 && t.numel() > 1)
          EXPECT_LT(rel_l2(got.at(key).to_floats(), t.to_floats()), 1e-3) << key;
        if (t.dtype() == DType::i64) EXPECT_EQ(got.at(key).to_ints(), t.to_ints()) << key;
      }
      restarted = step_of(*reducer(world().communicator(), world().device()), step, stream);
      gpu = reducer(world().communicator(), world().device());
      EXPECT_EQ(hook_of(*gpu).load_state_dict(with_every_error(got, *cpu_comm), stream), "");
    }
    const std::vector<float> want = step_of(cpu, step, Stream());
    const std::vector<float> got = step_of(*gpu, step, stream);
    EXPECT_LT(rel_l2(got, want), 1e-4) << "step " << step;
    EXPECT_GT(rel_l2(want, std::vector<float>(want.size(), 0.f)), 0.0);
    if (step == 3) EXPECT_GT(rel_l2(restarted, want), 0.05) << "without the state the GPU path follows anyway";
  }
}

}  // namespace
}  // namespace tutti::ddp

int main(int argc, char** argv) { return tutti::testing::run_world_tests(argc, argv, "auto"); }
