// The CUDA, cuBLAS, NCCL and cuDNN check macros turn failures into messages that name the
// call and the error. These need the libraries, not a GPU.
#include <gtest/gtest.h>

#include <string>

#include <cublasLt.h>

#include "core/cublas_loader.h"
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

// cuBLAS is loaded at its first call (core/cublas_loader.cc). cuBLASLt's descriptors need no GPU:
// creating and destroying them goes through the forwarders to the real library.
TEST(CublasLoader, ForwardsToTheRealLibrary) {
  cublasLtMatrixLayout_t layout = nullptr;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, 4, 3, 4), CUBLAS_STATUS_SUCCESS);
  EXPECT_NE(layout, nullptr);
  EXPECT_EQ(cublasLtMatrixLayoutDestroy(layout), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulDesc_t desc = nullptr;
  ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  const cublasOperation_t transpose = CUBLAS_OP_T;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescDestroy(desc), CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreference_t preference = nullptr;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&preference), CUBLAS_STATUS_SUCCESS);
  const std::size_t workspace = 1 << 20;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                 sizeof workspace),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulPreferenceDestroy(preference), CUBLAS_STATUS_SUCCESS);
  EXPECT_STREQ(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
}

TEST(CublasLoader, AMissingLibraryOrFunctionIsAClearError) {
  try {
    detail::cublas_symbol("libtutti_no_such_library.so.1", "cublasCreate_v2");
    FAIL();
  } catch (const BackendError& e) {
    EXPECT_TRUE(contains(e.what(), "cannot load libtutti_no_such_library.so.1 (tutti loads cuBLAS at its first GPU"))
        << e.what();
  }
  try {
    detail::cublas_symbol(detail::cublas_library().c_str(), "cublasNoSuchFunction");
    FAIL();
  } catch (const BackendError& e) {
    EXPECT_TRUE(contains(e.what(), "cannot find cublasNoSuchFunction in " + detail::cublas_library())) << e.what();
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
