// Helpers for the kernel tests: random tensors, comparisons with a tolerance, poisoned
// outputs, central finite differences, and the GPU-skip rule.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/gpu_runtime.h"
#include "tutti/core/tensor.h"

namespace tutti::testing {

// The floating dtypes every kernel is tested in (each against its own tolerance).
inline constexpr DType kFloatDtypes[] = {DType::f32, DType::f16, DType::bf16};

// A CPU tensor of `dtype` with values uniform in [lo, hi) (never all zeros), from `seed`.
inline Tensor random_tensor(const Shape& shape, DType dtype, std::uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(numel_of(shape)));
  for (auto& x : v) x = dist(rng);
  return Tensor::from_floats(v, shape, dtype);
}

// Integer labels in [0, classes).
inline Tensor random_labels(std::int64_t n, std::int64_t classes, DType dtype, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::int64_t> dist(0, classes - 1);
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = dist(rng);
  return Tensor::from_ints(v, {n}, dtype);
}

// A tensor of `shape` on `device` filled with nan, so that elements a kernel forgets to
// write show up in a comparison.
inline Tensor poisoned(const Shape& shape, DType dtype, Device device = Device::cpu()) {
  std::vector<float> v(static_cast<std::size_t>(numel_of(shape)), std::numeric_limits<float>::quiet_NaN());
  return Tensor::from_floats(v, shape, dtype).to(device);
}

// Tolerance for comparing results stored in `dtype` (relative, with an absolute floor).
inline double default_rtol(DType dtype) {
  switch (dtype) {
    case DType::f32: return 1e-5;
    case DType::f16: return 2e-3;
    case DType::bf16: return 1.6e-2;
    default: return 0;
  }
}

// Expects |actual - expected| <= atol + rtol · |expected| elementwise; nan never matches.
inline void expect_close(const std::vector<float>& actual, const std::vector<float>& expected, double rtol, double atol,
                         const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int reported = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    const bool ok = std::isfinite(a) == std::isfinite(e) &&
                    (std::isfinite(e) ? std::fabs(a - e) <= atol + rtol * std::fabs(e) : a == e);
    if (!ok && reported++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " is " << a << ", expected " << e << " (rtol " << rtol << ", atol "
                    << atol << ")";
    }
  }
}
inline void expect_close(const Tensor& actual, const Tensor& expected, double rtol, double atol,
                         const std::string& what) {
  expect_close(actual.to_floats(), expected.to_floats(), rtol, atol, what);
}

// Central finite differences of a scalar function of the elements of x (a CPU f32 tensor):
// grad[i] = (f(x + h e_i) - f(x - h e_i)) / 2h. f is evaluated in double by the caller's
// reference; x is restored afterwards.
inline std::vector<double> numeric_gradient(const Tensor& x, const std::function<double()>& f, double h = 1e-3) {
  std::vector<double> grad(static_cast<std::size_t>(x.numel()));
  float* p = x.data_as<float>();
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const float saved = p[i];
    p[i] = static_cast<float>(saved + h);
    const double plus = f();
    p[i] = static_cast<float>(saved - h);
    const double minus = f();
    p[i] = saved;
    grad[static_cast<std::size_t>(i)] = (plus - minus) / (2 * h);
  }
  return grad;
}

// True where the CUDA twins run on the emulated device (kernels_*_test_emu: CPU fibers, with the
// hazard detector checking every access), where a few tests take smaller shapes that still go
// through every code path of the kernel.
inline bool on_emulated_device() {
  return ::tutti::cuda_available() && ::tutti::gpu::device_name(0).find("emulated") != std::string::npos;
}

// Skips the calling test when no GPU is visible, with a message that says so.
#define TUTTI_REQUIRE_GPU()                                                                      \
  do {                                                                                           \
    if (!::tutti::cuda_available())                                                              \
      GTEST_SKIP() << "no GPU visible: the CUDA kernel is compiled but not run on this machine"; \
  } while (0)

// Expects f() to throw tutti::InvalidArgument whose message contains `needle` (the op's
// name, say), so that a bad input is refused with a message that says where.
template <typename F>
void expect_invalid_argument(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected InvalidArgument mentioning '" << needle << "', nothing was thrown";
  } catch (const ::tutti::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << "message: " << e.what();
  }
}

// A tensor that claims to live on cuda:0 over host memory that `backing` keeps alive: lets a
// machine without a GPU test that a device mismatch is refused (validation never touches
// the data).
inline Tensor fake_gpu_tensor(const Tensor& backing) {
  return Tensor::wrap(backing.data(), backing.shape(), backing.dtype(), Device::cuda(0));
}

}  // namespace tutti::testing
