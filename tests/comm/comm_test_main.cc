// main of the communication tests: one Job for the whole binary (MPI allows one), GoogleTest
// output on rank 0 and failures from every rank.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "comm/comm_test_util.h"

namespace tutti::testing {
namespace {
Job* the_job = nullptr;

// Prints failed assertions of ranks > 0 (their full output would interleave with rank 0's).
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
    }
  }

 private:
  int rank_;
};
}  // namespace

Job& job() { return *the_job; }

}  // namespace tutti::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // A collective that some rank skipped (a bug in a test) ends the job in 60 s with a report
  // instead of hanging until ctest's timeout.
  tutti::JobOptions options;
  options.comm.timeout = std::chrono::seconds(60);
  tutti::Job job(argc, argv, options);
  tutti::testing::the_job = &job;
  if (job.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new tutti::testing::FailurePrinter(job.rank()));
  }
  const int result = RUN_ALL_TESTS();
  tutti::testing::the_job = nullptr;
  return result;
}
