// quantize_blocks and dequantize_blocks: the format checked value by value against a reference
// in double, the exact edge cases, the round-trip quality of issue 23 ("Compression quality"),
// error feedback against its control, bad arguments, and the CUDA twins against the CPU, bit
// for bit.
#include "tutti/kernels/compress.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/kernel_test_util.h"
#include "tutti/core/device.h"

namespace tutti::kernels {
namespace {

using std::int64_t;

int qmax_of(int bits) { return bits == 8 ? 127 : 7; }

// Gaussian values (mean 0, deviation sigma) from seed.
std::vector<float> gaussian(int64_t n, std::uint32_t seed, float sigma = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, sigma);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

Tensor f32(const std::vector<float>& v) { return Tensor::from_floats(v, {static_cast<int64_t>(v.size())}); }

// The payload of n values, on the CPU, with q filled with 0xff bytes (so unwritten bytes show).
struct Payload {
  Tensor q, scales;
  Payload(int64_t n, int bits, int64_t block, Device device = Device::cpu())
      : q(Tensor::from_ints(std::vector<int64_t>(static_cast<std::size_t>(quantized_words(n, bits)), -1),
                            {quantized_words(n, bits)}, DType::i32)
              .to(device)),
        scales(testing::poisoned({quantized_blocks(n, block)}, DType::f32, device)) {}
};

// The bytes of a CPU i32 tensor, in memory order.
std::vector<unsigned char> bytes_of(const Tensor& q) {
  std::vector<unsigned char> b(static_cast<std::size_t>(q.nbytes()));
  std::memcpy(b.data(), q.data(), b.size());
  return b;
}

// The codes of n values, decoded from the bytes as the header describes them.
std::vector<int> codes_of(const Tensor& q, int64_t n, int bits) {
  const std::vector<unsigned char> b = bytes_of(q);
  std::vector<int> c(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (bits == 8) {
      c[i] = static_cast<signed char>(b[i]);
    } else {
      const int nib = (b[i / 2] >> (4 * (i % 2))) & 0xf;
      c[i] = nib >= 8 ? nib - 16 : nib;
    }
  }
  return c;
}

double rel_l2(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}
double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  return rel_l2(got, std::vector<double>(want.begin(), want.end()));
}

std::vector<float> round_trip(const std::vector<float>& x, int bits, int64_t block) {
  const auto n = static_cast<int64_t>(x.size());
  Payload p(n, bits, block);
  Tensor out = Tensor::empty({n}, DType::f32);
  quantize_blocks(f32(x), bits, block, p.q, p.scales);
  dequantize_blocks(p.q, p.scales, bits, block, out);
  return out.to_floats();
}

TEST(Compress, CodesScalesAndPackingFollowTheFormat) {
  for (int bits : {8, 4}) {
    for (int64_t block : {int64_t{2}, int64_t{6}, int64_t{64}}) {
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{13}, int64_t{1001}}) {
        const std::vector<float> x = gaussian(n, static_cast<std::uint32_t>(n + block + bits), 0.3f);
        Payload p(n, bits, block);
        quantize_blocks(f32(x), bits, block, p.q, p.scales);
        const std::vector<float> s = p.scales.to_floats();
        const std::vector<int> c = codes_of(p.q, n, bits);
        const std::string what =
            "bits " + std::to_string(bits) + " block " + std::to_string(block) + " n " + std::to_string(n);
        for (int64_t b = 0; b < quantized_blocks(n, block); ++b) {
          float absmax = 0.f;
          for (int64_t i = b * block; i < std::min(n, (b + 1) * block); ++i) absmax = std::max(absmax, std::fabs(x[i]));
          ASSERT_EQ(s[b], absmax / static_cast<float>(qmax_of(bits))) << what << " block " << b;
        }
        for (int64_t i = 0; i < n; ++i) {
          const double ratio = static_cast<double>(x[i]) / s[i / block];
          ASSERT_LE(std::abs(c[i]), qmax_of(bits)) << what;
          // Away from a tie, the code is the nearest integer (a tie may go either way by an ulp).
          if (std::fabs(std::fabs(ratio - std::floor(ratio)) - 0.5) > 1e-4) {
            ASSERT_EQ(c[i], static_cast<int>(std::lround(ratio))) << what << " element " << i;
          }
        }
        // Bytes past the last value (and the high nibble of an odd count's last byte) are zero.
        const std::vector<unsigned char> b = bytes_of(p.q);
        const int64_t used = bits == 8 ? n : (n + 1) / 2;
        for (std::size_t k = static_cast<std::size_t>(used); k < b.size(); ++k) EXPECT_EQ(b[k], 0) << what;
        if (bits == 4 && n % 2 == 1) EXPECT_EQ(b[used - 1] >> 4, 0) << what;
        // Dequantized: q · s, each within half a step of the input.
        Tensor out = Tensor::empty({n}, DType::f32);
        dequantize_blocks(p.q, p.scales, bits, block, out);
        const std::vector<float> d = out.to_floats();
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(d[i], static_cast<float>(c[i]) * s[i / block]) << what;
          ASSERT_LE(std::fabs(d[i] - x[i]), 0.5 * s[i / block] * (1 + 1e-5)) << what;
        }
      }
    }
  }
}

TEST(Compress, EdgeCasesAreExact) {
  for (int bits : {8, 4}) {
    const float qmax = static_cast<float>(qmax_of(bits));
    const float huge = 3.0e38f;
    // Block 0 all zeros, block 1 one huge value among small ones, block 2 a tail of 3 (n = 11).
    const std::vector<float> x = {0.f, 0.f, 0.f, 0.f, huge, 1.f, -1e-3f, 1e30f, 2.f, -4.f, 1.f};
    const int64_t n = 11, block = 4;
    Payload p(n, bits, block);
    Tensor residual = Tensor::zeros({n}, DType::f32);
    quantize_blocks(f32(x), bits, block, p.q, p.scales, residual);
    const std::vector<float> s = p.scales.to_floats();
    EXPECT_EQ(s[0], 0.f);
    EXPECT_EQ(s[1], huge / qmax);
    EXPECT_EQ(s[2], 4.f / qmax);  // the tail's own absmax, not a padded block's
    const std::vector<int> c = codes_of(p.q, n, bits);
    EXPECT_EQ(std::vector<int>(c.begin(), c.begin() + 8), (std::vector<int>{0, 0, 0, 0, bits == 8 ? 127 : 7, 0, 0, 0}));
    EXPECT_EQ(c[9], -qmax_of(bits));
    Tensor out = Tensor::empty({n}, DType::f32);
    dequantize_blocks(p.q, p.scales, bits, block, out);
    const std::vector<float> d = out.to_floats();
    const std::vector<float> r = residual.to_floats();
    for (int i = 0; i < 4; ++i) EXPECT_EQ(d[i], 0.f) << "an all-zero block comes back as zeros";
    for (int i = 0; i < 4; ++i) EXPECT_EQ(r[i], 0.f) << "and leaves no residual";
    EXPECT_EQ(d[4], qmax * (huge / qmax));
    EXPECT_NEAR(d[4] / huge, 1.0, 1e-6);
    // The small values of the huge block are lost to its scale, and carried whole as residual.
    for (int i = 5; i < 8; ++i) EXPECT_EQ(d[i], 0.f);
    for (int i = 5; i < 8; ++i) EXPECT_EQ(r[i], x[i]);
    // The tail's largest value comes back as -qmax · s, within an ulp or two of -4, and the
    // residual holds exactly the difference.
    EXPECT_EQ(d[9], -qmax * s[2]);
    EXPECT_NEAR(d[9], -4.f, 1e-6);
    EXPECT_EQ(r[9], x[9] - d[9]);
  }
}

// Values halfway between two codes round to the even one (the scale is 1 exactly: absmax = qmax).
std::vector<float> ties(int bits) {
  const float qmax = static_cast<float>(qmax_of(bits));
  return {qmax, 0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 3.5f, -3.5f};
}
const std::vector<int> kTieCodes = {0, 2, 2, 0, -2, 4, -4};

TEST(Compress, TiesRoundToEven) {
  for (int bits : {8, 4}) {
    Payload p(8, bits, 8);
    quantize_blocks(f32(ties(bits)), bits, 8, p.q, p.scales);
    EXPECT_EQ(p.scales.to_floats(), std::vector<float>{1.f});
    const std::vector<int> c = codes_of(p.q, 8, bits);
    EXPECT_EQ(c[0], qmax_of(bits));
    EXPECT_EQ(std::vector<int>(c.begin() + 1, c.end()), kTieCodes) << bits << " bits";
  }
}

// Issue 23's targets for one round trip: int8 within 1% relative L2 of the input. 4 bits cannot
// reach 5% on Gaussian values in one trip: the best 16-level quantizer (Lloyd-Max) leaves 9.7%,
// no code at 4 bits per value beats 2^-4 = 6.25% (the rate-distortion bound), and absmax scaling
// with uniform steps is near 10%; the 5% target holds for the sum over steps of what was sent
// with error feedback (ErrorFeedbackMakesTheSumOfWhatWasSentConverge).
TEST(Compress, RoundTripQualityOnGaussianValues) {
  const int64_t n = 1 << 16;
  const std::vector<float> x = gaussian(n, 7, 0.01f);
  for (int64_t block : {int64_t{32}, int64_t{64}, int64_t{256}}) {
    const double e8 = rel_l2(round_trip(x, 8, block), x);
    const double e4 = rel_l2(round_trip(x, 4, block), x);
    std::printf("[ measured ] block %4lld: int8 %.4f%%, 4-bit %.3f%% relative L2\n", static_cast<long long>(block),
                100 * e8, 100 * e4);
    EXPECT_LT(e8, 0.01) << "block " << block;
    // Uniform steps of absmax / 7: the error's rms is step / sqrt(12); absmax of 256 Gaussians is
    // under 4 sigma, so under 4 / 7 / sqrt(12) = 16.5%.
    EXPECT_LT(e4, 0.165) << "block " << block;
  }
}

// Summing several nodes' int8 contributions with accumulate: the sum of what was sent is within
// 1% of the sum of the inputs (4 nodes), and the sum equals adding the single dequantized outputs.
TEST(Compress, AccumulatedContributionsOfNodesSumWithinOnePercent) {
  const int64_t n = 10'000, block = 128;
  Tensor sum = Tensor::zeros({n}, DType::f32);
  std::vector<double> exact(n, 0.0);
  std::vector<float> by_hand(n, 0.f);
  for (std::uint32_t node = 0; node < 4; ++node) {
    const std::vector<float> x = gaussian(n, 100 + node, 0.02f);
    for (int64_t i = 0; i < n; ++i) exact[i] += x[i];
    Payload p(n, 8, block);
    quantize_blocks(f32(x), 8, block, p.q, p.scales);
    dequantize_blocks(p.q, p.scales, 8, block, sum, /*accumulate=*/true);
    const std::vector<float> one = round_trip(x, 8, block);
    for (int64_t i = 0; i < n; ++i) by_hand[i] += one[i];
  }
  EXPECT_EQ(sum.to_floats(), by_hand);
  const double e = rel_l2(sum.to_floats(), exact);
  std::printf("[ measured ] int8, sum of 4 nodes: %.4f%% relative L2\n", 100 * e);
  EXPECT_LT(e, 0.01);
}

// Error feedback: K steps of updates that share a direction (as a worker's successive
// pseudo-gradients do). With the residual carried, sum(sent) = sum(x) - residual_K: the
// difference stays one step's quantization error, not K of them; without it (the control) the
// same per-step bias adds up K times.
TEST(Compress, ErrorFeedbackMakesTheSumOfWhatWasSentConverge) {
  const int64_t n = 4096, block = 64, steps = 32;
  const std::vector<float> common = gaussian(n, 11, 1e-2f);
  for (int bits : {8, 4}) {
    Tensor residual = Tensor::zeros({n}, DType::f32);
    Tensor sent_ef = Tensor::zeros({n}, DType::f32), sent_plain = Tensor::zeros({n}, DType::f32);
    std::vector<double> exact(n, 0.0);
    double worst_step_error = 0, worst_residual = 0;
    for (int64_t k = 0; k < steps; ++k) {
      std::vector<float> x = gaussian(n, 1000 + static_cast<std::uint32_t>(k), 2e-5f);
      for (int64_t i = 0; i < n; ++i) x[i] += common[i];
      for (int64_t i = 0; i < n; ++i) exact[i] += x[i];
      Payload p(n, bits, block);
      quantize_blocks(f32(x), bits, block, p.q, p.scales, residual);
      dequantize_blocks(p.q, p.scales, bits, block, sent_ef, true);
      quantize_blocks(f32(x), bits, block, p.q, p.scales);
      dequantize_blocks(p.q, p.scales, bits, block, sent_plain, true);
      const std::vector<float> one = round_trip(x, bits, block);
      double step_err = 0, res = 0;
      for (int64_t i = 0; i < n; ++i) step_err += (one[i] - x[i]) * (one[i] - x[i]);
      for (float r : residual.to_floats()) res += static_cast<double>(r) * r;
      worst_step_error = std::max(worst_step_error, std::sqrt(step_err));
      worst_residual = std::max(worst_residual, std::sqrt(res));
    }
    double norm = 0;
    for (double e : exact) norm += e * e;
    norm = std::sqrt(norm);
    const double diff_ef = rel_l2(sent_ef.to_floats(), exact) * norm;
    const double diff_plain = rel_l2(sent_plain.to_floats(), exact) * norm;
    std::printf(
        "[ measured ] %d bits, %lld steps: |sum sent - sum x| / |sum x| = %.4f%% with error feedback, "
        "%.3f%% without; one step's error %.3f%% of one step\n",
        bits, static_cast<long long>(steps), 100 * diff_ef / norm, 100 * diff_plain / norm,
        100 * worst_step_error / (norm / steps));
    // The residual stays bounded by one step's error (plus its own rounding), and so does the
    // difference of the sums, which it equals.
    EXPECT_LE(worst_residual, 1.5 * worst_step_error) << bits;
    EXPECT_LE(diff_ef, 1.5 * worst_step_error) << bits;
    EXPECT_LT(diff_ef / norm, bits == 8 ? 0.01 : 0.05) << bits;
    // Control: without error feedback the errors do not cancel.
    EXPECT_GT(diff_plain, 5 * diff_ef) << bits;
  }
}

TEST(Compress, BadArgumentsAreRefusedNamingTheCall) {
  const int64_t n = 10;
  Tensor x = Tensor::zeros({n}, DType::f32);
  Payload p8(n, 8, 4), p4(n, 4, 4);
  using testing::expect_invalid_argument;
  expect_invalid_argument([&] { quantize_blocks(x, 5, 4, p8.q, p8.scales); }, "quantize_blocks: bits");
  expect_invalid_argument([&] { quantize_blocks(x, 8, 0, p8.q, p8.scales); }, "quantize_blocks: block");
  expect_invalid_argument([&] { quantize_blocks(x, 4, 3, p4.q, p4.scales); }, "even");
  expect_invalid_argument([&] { quantize_blocks(x, 4, 4, p8.q, p8.scales); }, "quantize_blocks: q must hold");
  expect_invalid_argument([&] { quantize_blocks(x, 8, 2, p8.q, p8.scales); }, "quantize_blocks: scales must hold");
  expect_invalid_argument([&] { quantize_blocks(Tensor::zeros({n}, DType::bf16), 8, 4, p8.q, p8.scales); },
                          "quantize_blocks: x must be f32");
  expect_invalid_argument([&] { quantize_blocks(x, 8, 4, p8.scales, p8.scales); }, "quantize_blocks: q must be i32");
  expect_invalid_argument([&] { quantize_blocks(x, 8, 4, p8.q, p8.scales, Tensor::zeros({n + 1}, DType::f32)); },
                          "quantize_blocks");
  expect_invalid_argument([&] { quantize_blocks(x, 8, 4, p8.q, p8.scales, x); }, "residual may not alias x");
  expect_invalid_argument([&] { quantize_blocks(x, 8, 4, testing::fake_gpu_tensor(p8.q), p8.scales); },
                          "quantize_blocks: tensors on different devices");
  expect_invalid_argument([&] { dequantize_blocks(p8.q, p8.scales, 4, 4, x); }, "dequantize_blocks: q must hold");
  expect_invalid_argument([&] { dequantize_blocks(p8.q, p8.scales, 8, 4, Tensor::zeros({n}, DType::f16)); },
                          "dequantize_blocks: out must be f32");
  expect_invalid_argument([&] { dequantize_blocks(p4.q, p4.scales, 4, 5, x); },
                          "dequantize_blocks: block must be even");
  expect_invalid_argument([&] { (void)quantized_words(-1, 8); }, "quantized_words");
  expect_invalid_argument([&] { (void)quantized_blocks(4, 0); }, "quantized_blocks");
}

TEST(Compress, CudaMatchesCpuBitForBit) {
  TUTTI_REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Stream stream = Stream::create(gpu);
  const int64_t big = testing::on_emulated_device() ? 5'003 : 3'000'017;
  for (int bits : {8, 4}) {
    for (int64_t block : {int64_t{2}, int64_t{6}, int64_t{64}, int64_t{130}}) {
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{200}, big}) {
        const std::string what =
            "bits " + std::to_string(bits) + " block " + std::to_string(block) + " n " + std::to_string(n);
        std::vector<float> xv = gaussian(n, static_cast<std::uint32_t>(n * 3 + block + bits), 0.1f);
        for (int64_t i = 0; i < std::min<int64_t>(n, block); ++i) xv[i] = 0.f;  // an all-zero block
        if (n >= 2 * block + 8) {                                               // the ties, in one block of their own
          std::vector<float> t = ties(bits);
          t.resize(static_cast<std::size_t>(block), 0.f);
          std::copy(t.begin(), t.end(), xv.begin() + 2 * block);
        }
        Tensor x = f32(xv), x_gpu = x.to(gpu);
        Tensor residual = f32(gaussian(n, 5, 1e-3f)), residual_gpu = residual.to(gpu);
        Payload p(n, bits, block), p_gpu(n, bits, block, gpu);
        Tensor out = f32(gaussian(n, 6)), out_gpu = out.to(gpu);
        for (bool feedback : {false, true}) {
          const Tensor& r = feedback ? residual : Tensor();
          const Tensor& r_gpu = feedback ? residual_gpu : Tensor();
          quantize_blocks(x, bits, block, p.q, p.scales, r);
          quantize_blocks(x_gpu, bits, block, p_gpu.q, p_gpu.scales, r_gpu, stream);
          dequantize_blocks(p.q, p.scales, bits, block, out, /*accumulate=*/feedback);
          dequantize_blocks(p_gpu.q, p_gpu.scales, bits, block, out_gpu, feedback, stream);
          stream.synchronize();
          EXPECT_EQ(p_gpu.q.to(Device::cpu()).to_ints(), p.q.to_ints()) << what << " feedback " << feedback;
          EXPECT_EQ(p_gpu.scales.to(Device::cpu()).to_floats(), p.scales.to_floats()) << what;
          EXPECT_EQ(residual_gpu.to(Device::cpu()).to_floats(), residual.to_floats()) << what;
          EXPECT_EQ(out_gpu.to(Device::cpu()).to_floats(), out.to_floats()) << what << " feedback " << feedback;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tutti::kernels
