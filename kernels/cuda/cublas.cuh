// cuBLAS pieces shared by the families that call it (linear, attention). Internal header for
// .cu files only.
#pragma once

#include <cublas_v2.h>

#include "tutti/core/dtype.h"

namespace tutti::kernels::cuda {

// CUDA_R_32F / 16F / 16BF for f32 / f16 / bf16; InvalidArgument for another dtype.
cudaDataType_t cuda_type(DType d);

// The cuBLAS handle of (this thread, device), created on first use and kept until the
// process ends (destroying it from thread-exit or static destructors can run after the CUDA
// context is gone). Bind it to the call's stream (cublasSetStream) before each use.
cublasHandle_t cublas_handle(int device);

}  // namespace tutti::kernels::cuda
