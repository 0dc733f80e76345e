// PowerSGD's GPU path (ReducerOptions::powersgd on a GPU buffer: kernels::matmul on the device,
// P copied to the host for the orthonormalization and back, the collectives on the job's
// communicator, nccl where each rank has a GPU) against its CPU path on the same gradients
// (a CPU reducer over an mpi communicator): the same reduced gradients, step after step, with
// error feedback and warm start carried across steps.
//
// Where it runs: powersgd_gpu_test on a GPU machine (skipped elsewhere), its _emu twin on the
// emulated CUDA device in every CI run (TUTTI_EMU_DEVICES=4: a GPU per rank).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ddp_world.h"
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

TEST(PowerSgdGpu, EqualsTheCpuPath) {
  if (!world().device().is_cuda()) GTEST_SKIP() << "no GPU visible: PowerSGD's GPU path not run";
  static std::shared_ptr<Communicator> cpu_comm =
      world().new_communicator({.timeout = std::chrono::seconds(60)}, "mpi");
  ReducerOptions ro;
  ro.powersgd = PowerSgdOptions{.rank = 2, .start_step = 1};
  nn::FlatPlanOptions po;
  po.first_bucket_cap_mb = 300 * 4 / 1048576.0;  // two buckets
  const nn::FlatPlan plan = nn::make_flat_plan(specs(), po);
  Reducer gpu(world().communicator(), plan, DType::f32, world().device(), ro);
  Reducer cpu(*cpu_comm, plan, DType::f32, Device::cpu(), ro);
  ASSERT_EQ(gpu.powersgd_compressed_count(), 3);
  const Stream stream = Stream::create(world().device());
  for (int step = 0; step < 4; ++step) {
    const std::vector<float> want = step_of(cpu, step, Stream());
    const std::vector<float> got = step_of(gpu, step, stream);
    ASSERT_EQ(got.size(), want.size());
    double num = 0, den = 0;
    for (std::size_t k = 0; k < got.size(); ++k) {
      num += (static_cast<double>(got[k]) - want[k]) * (static_cast<double>(got[k]) - want[k]);
      den += static_cast<double>(want[k]) * want[k];
    }
    EXPECT_LT(std::sqrt(num / den), 1e-4) << "step " << step;
    EXPECT_GT(den, 0.0);
  }
}

}  // namespace
}  // namespace tutti::ddp

int main(int argc, char** argv) { return tutti::testing::run_world_tests(argc, argv, "auto"); }
