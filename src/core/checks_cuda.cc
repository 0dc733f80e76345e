#include "core/cuda_check.h"

namespace tutti::detail {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  throw_error<BackendError>(file, line, str(call, " failed: ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  throw_error<BackendError>(file, line,
                            str(call, " failed: ", cublasGetStatusName(status), ": ", cublasGetStatusString(status)));
}

}  // namespace tutti::detail
