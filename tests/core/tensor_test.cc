#include "tutti/core/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numeric>

namespace tutti {
namespace {

std::vector<float> iota_floats(std::size_t n, float start = 1.0f) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(Tensor, EmptyHasShapeDtypeDeviceAndAlignedData) {
  Tensor t = Tensor::empty({2, 3, 5}, DType::bf16);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.ndim(), 3);
  EXPECT_EQ(t.numel(), 30);
  EXPECT_EQ(t.nbytes(), 60u);
  EXPECT_EQ(t.dim(-1), 5);
  EXPECT_EQ(t.dim(0), 2);
  EXPECT_EQ(t.dtype(), DType::bf16);
  EXPECT_EQ(t.device(), Device::cpu());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % 64, 0u);
  EXPECT_EQ(t.str(), "Tensor[2, 3, 5] bf16 cpu");
  EXPECT_THROW(t.dim(3), InvalidArgument);
}

TEST(Tensor, ZerosAreZero) {
  Tensor t = Tensor::zeros({7, 3}, DType::f32);
  for (float v : t.to_floats()) EXPECT_EQ(v, 0.0f);
}

TEST(Tensor, ScalarAndEmptyShapes) {
  EXPECT_EQ(Tensor::empty({}, DType::f32).numel(), 1);
  Tensor z = Tensor::empty({4, 0}, DType::f32);
  EXPECT_EQ(z.numel(), 0);
  EXPECT_EQ(z.nbytes(), 0u);
  EXPECT_THROW(Tensor::empty({2, -1}, DType::f32), InvalidArgument);
}

TEST(Tensor, CopiesShareStorage) {
  Tensor a = Tensor::from_floats(iota_floats(6), {2, 3});
  Tensor b = a;  // a handle, not a deep copy
  b.data_as<float>()[4] = -7.0f;
  EXPECT_EQ(a.to_floats()[4], -7.0f);
  EXPECT_TRUE(a.shares_storage_with(b));
  Tensor c = a.clone();
  c.data_as<float>()[0] = 100.0f;
  EXPECT_EQ(a.to_floats()[0], 1.0f);
  EXPECT_FALSE(a.shares_storage_with(c));
}

TEST(Tensor, ViewsWriteThroughToTheBuffer) {
  // A flat bucket with two "gradients" placed in it, as the reducer will do.
  Tensor bucket = Tensor::zeros({10}, DType::f32);
  Tensor g1 = bucket.view(0, {2, 2});
  Tensor g2 = bucket.view(4, {3, 2});
  EXPECT_TRUE(g1.shares_storage_with(bucket));
  EXPECT_EQ(g2.storage_offset_bytes(), 16u);
  for (int i = 0; i < 4; ++i) g1.data_as<float>()[i] = 1.0f + i;
  for (int i = 0; i < 6; ++i) g2.data_as<float>()[i] = 10.0f + i;
  EXPECT_EQ(bucket.to_floats(), (std::vector<float>{1, 2, 3, 4, 10, 11, 12, 13, 14, 15}));
  // A view of a view counts from the inner view's start.
  Tensor g2b = g2.view(2, {2});
  EXPECT_EQ(g2b.to_floats(), (std::vector<float>{12, 13}));
  // Views may not reach past the end of their parent.
  EXPECT_THROW(g2.view(5, {2}), InvalidArgument);
  EXPECT_THROW(bucket.view(-1, {1}), InvalidArgument);
}

TEST(Tensor, ReshapeKeepsDataAndChecksCount) {
  Tensor a = Tensor::from_floats(iota_floats(12), {3, 4});
  Tensor b = a.reshape({2, 6});
  EXPECT_TRUE(b.shares_storage_with(a));
  EXPECT_EQ(b.to_floats(), a.to_floats());
  EXPECT_EQ(a.flatten().shape(), (Shape{12}));
  try {
    (void)a.reshape({5, 2});
    FAIL() << "reshape to a different count must throw";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("10 vs 12"), std::string::npos) << msg;
    EXPECT_NE(msg.find("Tensor[3, 4] f32 cpu"), std::string::npos) << msg;
  }
}

TEST(Tensor, CopyFromChecksDtypeAndCount) {
  Tensor a = Tensor::from_floats(iota_floats(4), {4});
  Tensor b = Tensor::empty({2, 2}, DType::f32);
  b.copy_from(a);
  EXPECT_EQ(b.to_floats(), a.to_floats());
  Tensor h = Tensor::empty({4}, DType::f16);
  EXPECT_THROW(h.copy_from(a), InvalidArgument);
  Tensor small = Tensor::empty({3}, DType::f32);
  EXPECT_THROW(small.copy_from(a), InvalidArgument);
}

TEST(Tensor, HalfTensorsHoldRoundedValues) {
  Tensor h = Tensor::from_floats({1.0f, 0.1f, 65504.0f, 1e6f}, {4}, DType::f16);
  const auto back = h.to_floats();
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_NEAR(back[1], 0.1f, 1e-4f);
  EXPECT_EQ(back[2], 65504.0f);
  EXPECT_TRUE(std::isinf(back[3]));
  Tensor b = Tensor::from_floats({3.14159f}, {1}, DType::bf16);
  EXPECT_NEAR(b.to_floats()[0], 3.14159f, 0.01f);
}

TEST(Tensor, IntegerTensors) {
  Tensor l = Tensor::from_ints({3, 1, 4, 1, 5}, {5}, DType::i64);
  EXPECT_EQ(l.to_ints(), (std::vector<std::int64_t>{3, 1, 4, 1, 5}));
  EXPECT_EQ(l.data_as<std::int64_t>()[2], 4);
  EXPECT_THROW(l.data_as<float>(), InvalidArgument);
  EXPECT_THROW(l.to_floats(), InvalidArgument);
  EXPECT_THROW(Tensor::from_ints({1}, {1}, DType::f32), InvalidArgument);
}

TEST(Tensor, WrapUsesCallerMemory) {
  float buffer[6] = {1, 2, 3, 4, 5, 6};
  Tensor t = Tensor::wrap(buffer, {2, 3}, DType::f32);
  t.data_as<float>()[5] = 60.f;
  EXPECT_EQ(buffer[5], 60.f);
}

TEST(Tensor, PeakBytesRemembersTheMostLiveSinceTheReset) {
  const Device cpu = Device::cpu();
  Storage::reset_peak_bytes(cpu);
  const std::int64_t base = Storage::live_bytes(cpu);
  EXPECT_EQ(Storage::peak_bytes(cpu), base);
  {
    const Tensor a = Tensor::empty({1 << 18}, DType::f32);  // 1 MiB
    const Tensor b = Tensor::empty({1 << 16}, DType::f32);  // 256 KiB
    EXPECT_EQ(Storage::live_bytes(cpu), base + (5 << 18));
  }
  const Tensor c = Tensor::empty({1 << 10}, DType::f32);
  // Both freed, c smaller: the peak is still the two together.
  EXPECT_EQ(Storage::live_bytes(cpu), base + 4096);
  EXPECT_EQ(Storage::peak_bytes(cpu), base + (5 << 18));
  Storage::reset_peak_bytes(cpu);
  EXPECT_EQ(Storage::peak_bytes(cpu), base + 4096);
}

TEST(Tensor, UndefinedTensorThrows) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_THROW((void)t.data(), InvalidArgument);
  EXPECT_EQ(t.str(), "Tensor(undefined)");
}

TEST(Device, ParseAndPrint) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
  EXPECT_THROW(Device::parse("cuda:"), InvalidArgument);
  EXPECT_THROW(Device::parse("cuda:x"), InvalidArgument);
  EXPECT_THROW(Device::parse("tpu"), InvalidArgument);
}

TEST(Device, MissingGpuIsAClearError) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present; this test covers machines without one";
  EXPECT_EQ(cuda_device_count(), 0);
  try {
    (void)Tensor::empty({4}, DType::f32, Device::cuda(0));
    FAIL() << "allocating on a missing GPU must throw";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("no GPU") != std::string::npos || msg.find("without CUDA") != std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
  }
  // CPU streams and events are no-ops that still answer.
  Stream s;
  Event e;
  e.record(s);
  EXPECT_TRUE(e.query());
  s.synchronize();
}

TEST(TensorGpu, RoundTripThroughTheGpu) {
  if (!cuda_available()) GTEST_SKIP() << "no GPU visible: GPU tensor copies not exercised";
  Stream stream = Stream::create(Device::cuda(0));
  Tensor a = Tensor::from_floats(iota_floats(1000), {1000});
  Tensor g = a.to(Device::cuda(0), stream);
  EXPECT_EQ(g.device(), Device::cuda(0));
  Tensor g2 = g.view(10, {20}).clone(stream);
  Tensor back = g2.to(Device::cpu(), stream);
  stream.synchronize();
  const std::vector<float> all = a.to_floats();
  EXPECT_EQ(back.to_floats(), std::vector<float>(all.begin() + 10, all.begin() + 30));
  Tensor z = Tensor::zeros({33}, DType::bf16, Device::cuda(0));
  for (float v : z.to_floats()) EXPECT_EQ(v, 0.f);
}

}  // namespace
}  // namespace tutti
