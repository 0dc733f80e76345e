// The Job of a DDP test binary: one per process, made by the test's main before any test.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "tutti/comm/job.h"

namespace tutti::testing {

inline std::unique_ptr<Job>& world_job() {
  static std::unique_ptr<Job> job;
  return job;
}
inline Job& world() { return *world_job(); }

// main() for a multi-rank test: the Job lives across all tests and ends after them, so MPI
// is finalized once. Every rank prints its own results; a failure on any rank fails the
// mpiexec run.
// `device` as JobOptions::device ("cpu", or "auto" for the tests of the GPU paths).
inline int run_world_tests(int argc, char** argv, const std::string& device = "cpu") {
  ::testing::InitGoogleTest(&argc, argv);
  world_job() = std::make_unique<Job>(argc, argv, JobOptions{.device = device});
  const int rc = RUN_ALL_TESTS();
  world_job().reset();
  return rc;
}

}  // namespace tutti::testing
