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

// Every forwarder finds its function (a misspelt name would throw): calls that need a handle get
// none and must say so, GPU or not; creating a handle succeeds only where there is a GPU.
TEST(CublasLoader, EveryForwarderFindsItsFunction) {
  cublasHandle_t handle = nullptr;
  const cublasStatus_t created = cublasCreate(&handle);
  if (created == CUBLAS_STATUS_SUCCESS) {
    EXPECT_EQ(cublasDestroy(handle), CUBLAS_STATUS_SUCCESS);
  } else {
    EXPECT_STRNE(cublasGetStatusName(created), "") << "no GPU: cublasCreate fails with a status";
  }
  cublasLtHandle_t lt = nullptr;
  const cublasStatus_t lt_created = cublasLtCreate(&lt);
  if (lt_created == CUBLAS_STATUS_SUCCESS) EXPECT_NE(lt, nullptr);
  const float one = 1.0f;
  EXPECT_NE(cublasSetStream(nullptr, nullptr), CUBLAS_STATUS_SUCCESS);
  EXPECT_NE(cublasDestroy(nullptr), CUBLAS_STATUS_SUCCESS);
  EXPECT_NE(cublasGemmEx(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, nullptr, CUDA_R_32F, 1, nullptr, CUDA_R_32F,
                         1, &one, nullptr, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_NE(cublasGemmStridedBatchedEx(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, nullptr, CUDA_R_32F, 1, 1,
                                       nullptr, CUDA_R_32F, 1, 1, &one, nullptr, CUDA_R_32F, 1, 1, 1,
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_NE(cublasLtMatmul(nullptr, nullptr, &one, nullptr, nullptr, nullptr, nullptr, &one, nullptr, nullptr, nullptr,
                           nullptr, nullptr, nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  // The heuristic reads its descriptors before it looks at the handle: real ones, no handle.
  cublasLtMatrixLayout_t layout = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_32F, 2, 2, 2), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&preference), CUBLAS_STATUS_SUCCESS);
  int found = 0;
  cublasLtMatmulHeuristicResult_t result{};
  EXPECT_NE(
      cublasLtMatmulAlgoGetHeuristic(nullptr, desc, layout, layout, layout, layout, preference, 1, &result, &found),
      CUBLAS_STATUS_SUCCESS);
  cublasLtMatmulPreferenceDestroy(preference);
  cublasLtMatmulDescDestroy(desc);
  cublasLtMatrixLayoutDestroy(layout);
  EXPECT_STRNE(cublasGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED), "");
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
