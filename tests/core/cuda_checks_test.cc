// The CUDA, cuBLAS, NCCL and cuDNN check macros turn failures into messages that name the
// call and the error. These need the libraries, not a GPU.
#include <gtest/gtest.h>

#include <string>

#include "core/cuda_check.h"
#if TUTTI_WITH_NCCL
#include "core/nccl_check.h"
#endif
#if TUTTI_WITH_CUDNN
#include "core/cudnn_check.h"
#endif

namespace tutti {
namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

cudaError_t failing_cuda_call() { return cudaErrorInvalidValue; }

TEST(CudaChecks, CudaErrorHasCallNameAndText) {
  try {
    TUTTI_CUDA_CHECK(failing_cuda_call());
    FAIL();
  } catch (const BackendError& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "failing_cuda_call() failed")) << msg;
    EXPECT_TRUE(contains(msg, "cudaErrorInvalidValue")) << msg;
    EXPECT_TRUE(contains(msg, "cuda_checks_test.cc:")) << msg;
  }
}

TEST(CudaChecks, CublasStatusHasName) {
  try {
    TUTTI_CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE);
    FAIL();
  } catch (const BackendError& e) {
    EXPECT_TRUE(contains(e.what(), "CUBLAS_STATUS_INVALID_VALUE")) << e.what();
  }
}

#if TUTTI_WITH_NCCL
TEST(CudaChecks, NcclResultHasName) {
  try {
    TUTTI_NCCL_CHECK(ncclInvalidArgument);
    FAIL();
  } catch (const BackendError& e) {
    EXPECT_TRUE(contains(e.what(), "ncclInvalidArgument")) << e.what();
  }
}
#endif

#if TUTTI_WITH_CUDNN
TEST(CudaChecks, CudnnStatusHasName) {
  try {
    TUTTI_CUDNN_CHECK(CUDNN_STATUS_BAD_PARAM);
    FAIL();
  } catch (const BackendError& e) {
    EXPECT_TRUE(contains(e.what(), "CUDNN_STATUS_BAD_PARAM")) << e.what();
  }
}
#endif

}  // namespace
}  // namespace tutti
