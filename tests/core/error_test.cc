#include "tutti/core/error.h"

#include <gtest/gtest.h>

#include <string>

#include "core/mpi_check.h"

namespace tutti {
namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Error, CheckNamesConditionFileAndMessage) {
  try {
    const int n = -3;
    TUTTI_CHECK(n > 0, "batch size must be positive, got ", n);
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "check failed: n > 0")) << msg;
    EXPECT_TRUE(contains(msg, "got -3")) << msg;
    EXPECT_TRUE(contains(msg, "error_test.cc:")) << msg;
    EXPECT_TRUE(contains(e.where(), "error_test.cc:")) << e.where();
  }
}

TEST(Error, EnforcePrintsBothValues) {
  try {
    const long rows = 12, cols = 10;
    TUTTI_ENFORCE_EQ(rows, cols, "matmul inner dimensions");
    FAIL();
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "expected rows == cols (12 vs 10)")) << msg;
    EXPECT_TRUE(contains(msg, "matmul inner dimensions")) << msg;
  }
  EXPECT_NO_THROW(TUTTI_ENFORCE_LE(1, 2, "fine"));
  EXPECT_THROW(TUTTI_ENFORCE_GT(1, 2, "not fine"), InvalidArgument);
}

TEST(Error, CarriesTheRank) {
  const int saved = error_rank();
  set_error_rank(3);
  try {
    TUTTI_THROW(BackendError, "something broke");
  } catch (const BackendError& e) {
    EXPECT_EQ(e.rank(), 3);
    EXPECT_TRUE(contains(e.what(), "[rank 3]")) << e.what();
    EXPECT_EQ(e.message(), "something broke");
  }
  set_error_rank(saved);
}

TEST(Error, ContextSaysWhatWasGoingOn) {
  try {
    ErrorContext outer("step 17");
    ErrorContext inner("allreduce #5 of 4096 x f32");
    TUTTI_THROW(TimeoutError, "waited 30 s");
  } catch (const TimeoutError& e) {
    EXPECT_TRUE(contains(e.what(), "(while allreduce #5 of 4096 x f32; while step 17)")) << e.what();
  }
  EXPECT_EQ(current_error_context(), "");  // popped on unwinding
}

TEST(Error, FamilyDerivesFromError) {
  EXPECT_THROW(TUTTI_THROW(InvalidArgument, "x"), Error);
  EXPECT_THROW(TUTTI_THROW(TimeoutError, "x"), Error);
  EXPECT_THROW(TUTTI_THROW(BackendError, "x"), std::runtime_error);
}

TEST(Error, MpiCheckNamesTheCallAndTheError) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) MPI_Init(nullptr, nullptr);  // finalized at exit by MpiFinalizer
  try {
    TUTTI_MPI_CHECK(MPI_ERR_COUNT);
    FAIL();
  } catch (const BackendError& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "MPI_ERR_COUNT failed")) << msg;
    EXPECT_TRUE(contains(msg, "count")) << msg;
    EXPECT_TRUE(contains(msg, "error_test.cc:")) << msg;
  }
}

// Finalizes MPI if a test initialized it.
struct MpiFinalizer {
  ~MpiFinalizer() {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Finalize();
  }
} mpi_finalizer;

}  // namespace
}  // namespace tutti
