// Helpers for the communication tests: the job every test shares, per-rank inputs that every
// rank can recompute (so each rank builds the reference of all ranks' arithmetic itself), and
// comparisons.
//
// Multi-rank rule for tests: every rank must issue the same collectives whatever its own
// checks found, so checks use EXPECT_* (not ASSERT_*) between collectives.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tutti/comm/communicator.h"
#include "tutti/comm/job.h"
#include "tutti/core/device.h"
#include "tutti/core/error.h"
#include "tutti/core/tensor.h"

namespace tutti::testing {

// The job of the test binary (made by its main).
Job& job();

// v rounded to a float dtype (to nearest even), as a tensor of that dtype holds it.
inline double round_to(DType dtype, double v) {
  const float f = static_cast<float>(v);
  if (dtype == DType::f16) return half_bits_to_float(float_to_half_bits(f));
  if (dtype == DType::bf16) return bf16_bits_to_float(float_to_bf16_bits(f));
  return f;
}

// Deterministic value of element i of rank r's input for test case `seed`: floats uniform in
// [-1, 1) rounded to `dtype`; integers in [-1000, 1000] (i64: plus 2^40, to use the upper bits).
inline double input_value(DType dtype, int rank, std::int64_t i, std::uint32_t seed) {
  std::uint64_t h = (static_cast<std::uint64_t>(seed) << 40) ^ (static_cast<std::uint64_t>(rank) << 32) ^
                    static_cast<std::uint64_t>(i);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  if (dtype == DType::i32) return static_cast<double>(static_cast<std::int64_t>(h % 2001) - 1000);
  if (dtype == DType::i64)
    return static_cast<double>(static_cast<std::int64_t>(h % 2001) - 1000 + (std::int64_t{1} << 40));
  const float u = static_cast<float>(static_cast<double>(h >> 11) / static_cast<double>(1ULL << 53) * 2.0 - 1.0);
  return round_to(dtype, u);
}

// Rank r's input of n elements as a CPU tensor.
inline Tensor make_input(DType dtype, int rank, std::int64_t n, std::uint32_t seed) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = input_value(dtype, rank, i, seed);
  if (is_floating(dtype)) return Tensor::from_floats(std::vector<float>(v.begin(), v.end()), {n}, dtype);
  return Tensor::from_ints(std::vector<std::int64_t>(v.begin(), v.end()), {n}, dtype);
}

inline std::vector<double> values_of(const Tensor& t) {
  if (is_floating(t.dtype())) {
    const auto f = t.to_floats();
    return std::vector<double>(f.begin(), f.end());
  }
  const auto v = t.to_ints();
  return std::vector<double>(v.begin(), v.end());
}

// Relative tolerance of a result stored in `dtype` (one rounding of an fp32 result, or a few
// for backends that reduce halves in their own type).
inline double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f32: return 1e-6;
    case DType::f16: return 2e-3;
    case DType::bf16: return 1.6e-2;
    default: return 0;  // integers: exact
  }
}

// Expects actual == expected elementwise, exactly for integers and `exact`, else within the
// dtype's tolerance: relative, with an absolute floor for sums that cancel (the inputs are at
// most 1 in magnitude and there are at most a few ranks, so the rounding error of a partial
// sum is a few times the dtype's epsilon).
inline void expect_values(const std::vector<double>& actual, const std::vector<double>& expected, DType dtype,
                          bool exact, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  const double rtol = exact ? 0.0 : tolerance(dtype);
  const double atol = exact ? 0.0 : rtol * 4;
  int reported = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    if (!(std::fabs(a - e) <= atol + rtol * std::fabs(e)) && reported++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " is " << a << ", expected " << e;
    }
  }
}

// Waits for `work`, expecting a collective-mismatch error (InvalidArgument) that contains every
// piece of `expected`.
inline void expect_mismatch(const Work& work, const std::vector<std::string>& expected) {
  try {
    work.wait();
    ADD_FAILURE() << "no mismatch reported";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("collective mismatch"), std::string::npos) << what;
    for (const auto& piece : expected)
      EXPECT_NE(what.find(piece), std::string::npos) << "'" << piece << "' in " << what;
  }
}

}  // namespace tutti::testing

// Skips a test (on every rank alike) where the process sees no GPU.
#define TUTTI_COMM_REQUIRE_GPU()                                                                        \
  do {                                                                                                  \
    if (!::tutti::cuda_available()) GTEST_SKIP() << "no GPU visible to this process: GPU path not run"; \
  } while (0)

namespace tutti::testing {

// Tests of one data path, the parameter: "cpu" (the job's CPU communicator, mpi), "gpu" (the
// job's communicator on the device: nccl with a GPU per rank) or "staging" (mpi on device
// tensors, through the host). comm_ and device_ are the path's.
class DataPathTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "cpu") {
      comm_ = &job().cpu_communicator();
      device_ = Device::cpu();
      return;
    }
    TUTTI_COMM_REQUIRE_GPU();
    if (!job().device().is_cuda()) GTEST_SKIP() << "the job runs on the CPU: GPU path not run";
    device_ = job().device();
    if (GetParam() == "gpu") {
      comm_ = &job().communicator();
    } else {
      // Created on every rank in the same test, so collectively.
      static std::shared_ptr<Communicator> staging = job().new_communicator({}, "mpi");
      comm_ = staging.get();
    }
    ASSERT_EQ(comm_->backend() == "nccl", GetParam() == "gpu" && job().backend() == "nccl");
  }
  Communicator* comm_ = nullptr;
  Device device_ = Device::cpu();
};

}  // namespace tutti::testing
