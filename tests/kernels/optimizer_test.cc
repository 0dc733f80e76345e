// sgd_update and adamw_update: several steps against the closed-form updates computed here in
// double (PyTorch's SGD and AdamW); the CUDA twins against the CPU.
#include "tutti/kernels/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/kernel_test_util.h"
#include "tutti/core/device.h"

namespace tutti::kernels {
namespace {

using testing::expect_close;
using testing::random_tensor;

std::vector<float> to_f(const std::vector<double>& v) { return {v.begin(), v.end()}; }
std::vector<double> to_d(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Rounds the values to `dt` (what the kernel reads from a half gradient).
std::vector<float> rounded(const std::vector<float>& v, DType dt) {
  return Tensor::from_floats(v, {static_cast<std::int64_t>(v.size())}, dt).to_floats();
}

struct SgdCase {
  SgdParams p;
  const char* name;
};

class OptimizerGradDtypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(OptimizerGradDtypeTest, SgdMatchesClosedForm) {
  const DType gdt = GetParam();
  const std::vector<SgdCase> cases = {
      {{.lr = 0.1f}, "plain"},
      {{.lr = 0.05f, .momentum = 0.9f}, "momentum"},
      {{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = true}, "nesterov+wd"},
      {{.lr = 0.02f, .momentum = 0.5f, .weight_decay = 0.1f, .grad_scale = 0.25f}, "wd+grad_scale"},
      {{.lr = 0.1f, .momentum = 0.0f, .weight_decay = 0.05f, .nesterov = false, .grad_scale = 2.0f}, "no momentum"},
  };
  for (const std::int64_t n : {1, 13, 1000}) {
    for (const SgdCase& c : cases) {
      for (DType half_dt : {DType::f32, DType::f16, DType::bf16}) {  // f32 = no half copy
        Tensor w = random_tensor({n}, DType::f32, 1);
        Tensor buf = testing::poisoned({n}, DType::f32);  // first_step must not read it
        Tensor half = half_dt == DType::f32 ? Tensor() : testing::poisoned({n}, half_dt);
        std::vector<double> rw = to_d(w.to_floats()), rbuf(static_cast<std::size_t>(n), 0.0);
        for (int step = 0; step < 4; ++step) {
          Tensor g = random_tensor({n}, gdt, static_cast<std::uint32_t>(10 + step), -2.f, 2.f);
          const auto gv = g.to_floats();
          sgd_update(w, g, c.p.momentum != 0 ? buf : Tensor(), half, c.p, /*first_step=*/step == 0);
          for (std::size_t i = 0; i < rw.size(); ++i) {
            const double gi =
                static_cast<double>(c.p.grad_scale) * gv[i] + static_cast<double>(c.p.weight_decay) * rw[i];
            double d = gi;
            if (c.p.momentum != 0) {
              rbuf[i] = step == 0 ? gi : c.p.momentum * rbuf[i] + gi;
              d = c.p.nesterov ? gi + c.p.momentum * rbuf[i] : rbuf[i];
            }
            rw[i] -= c.p.lr * d;
          }
          const std::string what = std::string("sgd ") + c.name + " n=" + std::to_string(n) + " step " +
                                   std::to_string(step) + " grad " + std::string(name_of(gdt));
          expect_close(w.to_floats(), to_f(rw), 1e-5, 1e-6, what + " w");
          if (c.p.momentum != 0) expect_close(buf.to_floats(), to_f(rbuf), 1e-5, 1e-6, what + " buf");
          if (half.defined())
            expect_close(half.to_floats(), rounded(w.to_floats(), half_dt), 0, 0, what + " half copy");
        }
      }
    }
  }
}

TEST_P(OptimizerGradDtypeTest, AdamWMatchesClosedForm) {
  const DType gdt = GetParam();
  const std::vector<AdamWParams> cases = {
      {},  // defaults: lr 1e-3, weight decay 0.01
      {.lr = 0.01f, .beta1 = 0.8f, .beta2 = 0.95f, .eps = 1e-6f, .weight_decay = 0.1f},
      {.lr = 0.005f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.0f, .grad_scale = 0.5f},
  };
  for (const std::int64_t n : {1, 17, 1000}) {
    for (std::size_t ci = 0; ci < cases.size(); ++ci) {
      for (DType half_dt : {DType::f32, DType::bf16, DType::f16}) {
        AdamWParams p = cases[ci];
        Tensor w = random_tensor({n}, DType::f32, 2);
        Tensor m = Tensor::zeros({n}, DType::f32), v = Tensor::zeros({n}, DType::f32);
        Tensor half = half_dt == DType::f32 ? Tensor() : testing::poisoned({n}, half_dt);
        std::vector<double> rw = to_d(w.to_floats()), rm(rw.size(), 0.0), rv(rw.size(), 0.0);
        for (std::int64_t step = 1; step <= 5; ++step) {
          Tensor g = random_tensor({n}, gdt, static_cast<std::uint32_t>(20 + step), -1.f, 1.f);
          const auto gv = g.to_floats();
          p.step = step;
          adamw_update(w, g, m, v, half, p);
          const double bc1 = 1 - std::pow(static_cast<double>(p.beta1), step);
          const double bc2 = 1 - std::pow(static_cast<double>(p.beta2), step);
          for (std::size_t i = 0; i < rw.size(); ++i) {
            const double gi = static_cast<double>(p.grad_scale) * gv[i];
            rm[i] = p.beta1 * rm[i] + (1 - static_cast<double>(p.beta1)) * gi;
            rv[i] = p.beta2 * rv[i] + (1 - static_cast<double>(p.beta2)) * gi * gi;
            rw[i] -= p.lr * (p.weight_decay * rw[i] + (rm[i] / bc1) / (std::sqrt(rv[i] / bc2) + p.eps));
          }
          const std::string what = "adamw case " + std::to_string(ci) + " n=" + std::to_string(n) + " step " +
                                   std::to_string(step) + " grad " + std::string(name_of(gdt));
          expect_close(w.to_floats(), to_f(rw), 1e-5, 1e-6, what + " w");
          expect_close(m.to_floats(), to_f(rm), 1e-5, 1e-7, what + " m");
          expect_close(v.to_floats(), to_f(rv), 1e-5, 1e-9, what + " v");
          if (half.defined())
            expect_close(half.to_floats(), rounded(w.to_floats(), half_dt), 0, 0, what + " half copy");
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(GradDtypes, OptimizerGradDtypeTest, ::testing::ValuesIn(testing::kFloatDtypes),
                         [](const auto& info) { return std::string(name_of(info.param)); });

TEST(Optimizer, BadInputThrowsBeforeWriting) {
  Tensor w = random_tensor({10}, DType::f32, 1);
  const auto w0 = w.to_floats();
  Tensor g = random_tensor({10}, DType::f32, 2);
  Tensor g_short = random_tensor({9}, DType::f32, 2);
  testing::expect_invalid_argument([&] { sgd_update(w, g_short, Tensor(), Tensor(), {}, true); }, "sgd_update");
  testing::expect_invalid_argument([&] { sgd_update(w, g, Tensor(), Tensor(), {.momentum = 0.9f}, true); },
                                   "sgd_update");
  testing::expect_invalid_argument([&] { sgd_update(w, g, Tensor(), Tensor::empty({10}, DType::f32), {}, true); },
                                   "sgd_update");
  Tensor w_half = random_tensor({10}, DType::f16, 1);
  testing::expect_invalid_argument([&] { sgd_update(w_half, g, Tensor(), Tensor(), {}, true); }, "sgd_update");
  Tensor m = Tensor::zeros({10}, DType::f32), v = Tensor::zeros({10}, DType::f32);
  testing::expect_invalid_argument([&] { adamw_update(w, g, m, Tensor(), Tensor(), {}); }, "adamw_update");
  testing::expect_invalid_argument([&] { adamw_update(w, g, m, v, Tensor(), {.step = 0}); }, "adamw_update");
  testing::expect_invalid_argument([&] { adamw_update(w, g, m, Tensor::zeros({10}, DType::bf16), Tensor(), {}); },
                                   "adamw_update");
  EXPECT_EQ(w.to_floats(), w0) << "w was written before the check";
  for (float x : m.to_floats()) EXPECT_EQ(x, 0.f);
}

// ---- CUDA twins ----

// A copy of t on the GPU that starts `offset` elements into its allocation, so that 16-byte
// vector loads see a misaligned buffer (the kernels must fall back to their scalar path).
Tensor to_gpu_at(const Tensor& t, std::int64_t offset) {
  Tensor room = Tensor::empty({t.numel() + offset}, t.dtype(), Device::cuda(0));
  Tensor out = room.view(offset, {t.numel()});
  out.copy_from(t);
  return out;
}

TEST_P(OptimizerGradDtypeTest, CudaMatchesCpu) {
  TUTTI_REQUIRE_GPU();
  const DType gdt = GetParam();
  const Device gpu = Device::cuda(0);
  Stream stream = Stream::create(gpu);
  // The largest size takes many grid-stride passes of the vector loop and a scalar tail. On the
  // emulated device (4 SMs: grids of 32 blocks of 256 threads) 100,003 still takes 3 vector
  // passes (4 elements a thread), 12 scalar ones when misaligned and a tail, at a tenth of the
  // hazard detector's time (1,000,003 made this test ~17 s there); a GPU runs the million.
  const std::int64_t large = testing::on_emulated_device() ? 100'003 : 1'000'003;
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{7}, std::int64_t{1001}, large}) {
    for (std::int64_t offset : {0, 1}) {  // an offset view misaligns the vector loads
      if (offset >= n) continue;
      const std::int64_t len = n - offset;
      for (DType half_dt : {DType::f32, DType::f16, DType::bf16}) {
        const std::string what = "n=" + std::to_string(len) + " offset " + std::to_string(offset) + " grad " +
                                 std::string(name_of(gdt)) + " half " + std::string(name_of(half_dt));
        // SGD with momentum and nesterov, two steps (first_step, then not).
        Tensor w = random_tensor({len}, DType::f32, 1);
        Tensor buf = Tensor::zeros({len}, DType::f32);
        Tensor w_gpu = to_gpu_at(w, offset), buf_gpu = to_gpu_at(testing::poisoned({len}, DType::f32), offset);
        Tensor half = half_dt == DType::f32 ? Tensor() : Tensor::empty({len}, half_dt);
        Tensor half_gpu = half_dt == DType::f32 ? Tensor() : testing::poisoned({n}, half_dt, gpu).view(offset, {len});
        const SgdParams sp{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = true, .grad_scale = 0.5f};
        for (int step = 0; step < 2; ++step) {
          Tensor g = random_tensor({len}, gdt, static_cast<std::uint32_t>(5 + step));
          sgd_update(w, g, buf, half, sp, step == 0);
          sgd_update(w_gpu, to_gpu_at(g, offset), buf_gpu, half_gpu, sp, step == 0, stream);
        }
        stream.synchronize();
        expect_close(w_gpu.to_floats(), w.to_floats(), 1e-5, 1e-6, "cuda sgd w " + what);
        expect_close(buf_gpu.to_floats(), buf.to_floats(), 1e-5, 1e-6, "cuda sgd buf " + what);
        // The half copy is the GPU's own w rounded to nearest even (w itself may differ from the
        // CPU's in the last bit, which could flip a rounding).
        if (half.defined())
          expect_close(half_gpu.to_floats(), rounded(w_gpu.to_floats(), half_dt), 0, 0, "cuda sgd half " + what);
        // Plain SGD (no momentum buffer).
        Tensor g0 = random_tensor({len}, gdt, 9);
        sgd_update(w, g0, Tensor(), Tensor(), {.lr = 0.1f}, false);
        sgd_update(w_gpu, to_gpu_at(g0, offset), Tensor(), Tensor(), {.lr = 0.1f}, false, stream);
        stream.synchronize();
        expect_close(w_gpu.to_floats(), w.to_floats(), 1e-5, 1e-6, "cuda sgd plain " + what);
        // AdamW, three steps.
        Tensor aw = random_tensor({len}, DType::f32, 3), m = Tensor::zeros({len}, DType::f32),
               v = Tensor::zeros({len}, DType::f32);
        Tensor aw_gpu = to_gpu_at(aw, offset), m_gpu = to_gpu_at(m, offset), v_gpu = to_gpu_at(v, offset);
        for (std::int64_t step = 1; step <= 3; ++step) {
          Tensor g = random_tensor({len}, gdt, static_cast<std::uint32_t>(30 + step));
          const AdamWParams ap{.lr = 0.01f, .weight_decay = 0.1f, .step = step, .grad_scale = 0.8f};
          adamw_update(aw, g, m, v, half, ap);
          adamw_update(aw_gpu, to_gpu_at(g, offset), m_gpu, v_gpu, half_gpu, ap, stream);
        }
        stream.synchronize();
        expect_close(aw_gpu.to_floats(), aw.to_floats(), 1e-5, 1e-6, "cuda adamw w " + what);
        expect_close(m_gpu.to_floats(), m.to_floats(), 1e-5, 1e-7, "cuda adamw m " + what);
        expect_close(v_gpu.to_floats(), v.to_floats(), 1e-5, 1e-9, "cuda adamw v " + what);
        if (half.defined())
          expect_close(half_gpu.to_floats(), rounded(aw_gpu.to_floats(), half_dt), 0, 0, "cuda adamw half " + what);
      }
    }
  }
}

}  // namespace
}  // namespace tutti::kernels
