// cuBLAS of the emulated CUDA device: the calls tutti makes, computed on the CPU with OpenBLAS
// in fp32 (CUBLAS_COMPUTE_32F: inputs widened exactly, one rounding of the result), queued on
// the handle's stream like the real library's kernels.
#pragma once

#include <cstdint>

#include "cuda_runtime.h"
#include "library_types.h"

typedef struct cublasContext* cublasHandle_t;

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_MAPPING_ERROR = 11,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
  CUBLAS_STATUS_LICENSE_ERROR = 16,
};

enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };

enum cublasComputeType_t {
  CUBLAS_COMPUTE_16F = 64,
  CUBLAS_COMPUTE_32F = 68,
  CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
  CUBLAS_COMPUTE_64F = 70,
};

enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };

const char* cublasGetStatusName(cublasStatus_t status);
const char* cublasGetStatusString(cublasStatus_t status);

cublasStatus_t cublasCreate(cublasHandle_t* handle);
cublasStatus_t cublasDestroy(cublasHandle_t handle);
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream);

// Column-major C[m, n] = alpha · op(A) · op(B) + beta · C; with beta == 0, C is not read.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType_t a_type, int lda, const void* B,
                            cudaDataType_t b_type, int ldb, const void* beta, void* C, cudaDataType_t c_type, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo);

// Column-major C_i = alpha · op(A_i) · op(B_i) + beta · C_i for i < batch_count, where A_i =
// A + i · stride_a elements (likewise B_i, C_i); batch_count 0 does nothing. Each product is
// one cublasGemmEx.
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType_t a_type,
                                          int lda, long long stride_a, const void* B, cudaDataType_t b_type, int ldb,
                                          long long stride_b, const void* beta, void* C, cudaDataType_t c_type, int ldc,
                                          long long stride_c, int batch_count, cublasComputeType_t compute,
                                          cublasGemmAlgo_t algo);
