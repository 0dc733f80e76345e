// Check macros for the CUDA libraries: each turns a failed call into a tutti::BackendError
// that carries the call's text, the error's name and description, file:line and the rank.
//
//   TUTTI_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream));
//   TUTTI_CUDA_CHECK_LAUNCH("relu_forward");   // after a <<<...>>> launch
//   TUTTI_CUBLAS_CHECK(cublasGemmEx(...));
//   TUTTI_CUDNN_CHECK(cudnnConvolutionForward(...));   // needs TUTTI_WITH_CUDNN
//
// Internal header (CUDA builds only): include it from .cu files and CUDA-only .cc files.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "tutti/core/error.h"

namespace tutti::detail {
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line);
}  // namespace tutti::detail

#define TUTTI_CUDA_CHECK(call)                                                  \
  do {                                                                          \
    const cudaError_t tutti_err_ = (call);                                      \
    if (tutti_err_ != cudaSuccess) [[unlikely]]                                 \
      ::tutti::detail::throw_cuda_error(tutti_err_, #call, __FILE__, __LINE__); \
  } while (0)

// Checks that the last kernel launch was accepted (bad configuration, no kernel image).
#define TUTTI_CUDA_CHECK_LAUNCH(kernel_name)                                                       \
  do {                                                                                             \
    const cudaError_t tutti_err_ = cudaGetLastError();                                             \
    if (tutti_err_ != cudaSuccess) [[unlikely]]                                                    \
      ::tutti::detail::throw_cuda_error(tutti_err_, "launch of " kernel_name, __FILE__, __LINE__); \
  } while (0)

#define TUTTI_CUBLAS_CHECK(call)                                                 \
  do {                                                                           \
    const cublasStatus_t tutti_st_ = (call);                                     \
    if (tutti_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                         \
      ::tutti::detail::throw_cublas_error(tutti_st_, #call, __FILE__, __LINE__); \
  } while (0)
