// cuBLAS and cuBLASLt, loaded at their first call instead of at program start.
//
// Why: libcublasLt (540 MB) costs every process that links it about 80 ms of CPU at start-up
// (relocations and page faults), GPU or not. A CPU rank never calls cuBLAS, and the test suite
// starts ~800 processes of tutti's programs. So libtutti does not link cuBLAS: it defines, with
// hidden visibility (the kernels' references bind to them; nothing is exported), the cuBLAS and
// cuBLASLt functions that tutti calls, each a forwarder that finds the real one with dlsym in the
// library that it dlopens on first use.
//
// The declarations come from the toolkit's headers, so a forwarder whose parameters drift from
// the real function's does not compile. A function tutti starts to call and this file lacks
// fails the link of every program (an undefined reference in libtutti).
#include "core/cublas_loader.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "tutti/core/error.h"

// The toolkit's declarations, hidden (the forwarders below take their visibility from them).
#pragma GCC visibility push(hidden)
#include <cublasLt.h>
#include <cublas_v2.h>
#pragma GCC visibility pop

#define TUTTI_STR_(x) #x
#define TUTTI_STR(x) TUTTI_STR_(x)

namespace tutti::detail {
namespace {

std::string soname(const char* stem) { return std::string(stem) + ".so." + TUTTI_STR(CUBLAS_VER_MAJOR); }

// The library, by its soname (the loader's search: LD_LIBRARY_PATH, libtutti's RUNPATH, the
// system's cache), else in the toolkit's library folder that the build used.
void* open_library(const std::string& name) {
  if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  const std::string first_error = dlerror();
#ifdef TUTTI_CUDA_LIBRARY_DIR
  const std::string beside = std::string(TUTTI_CUDA_LIBRARY_DIR) + "/" + name;
  if (void* h = dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
#endif
  TUTTI_THROW(BackendError, "cannot load ", name,
              " (tutti loads cuBLAS at its first GPU matrix product): ", first_error);
}

}  // namespace

void* cublas_symbol(const char* library, const char* name) {
  // Each forwarder resolves its function once; dlopen of a library already loaded returns it
  // again (these stay open until the process ends).
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  void* handle = open_library(library);
  void* symbol = dlsym(handle, name);
  if (symbol == nullptr) {
    const char* why = dlerror();
    TUTTI_THROW(BackendError, "cannot find ", name, " in ", library, ": ", why != nullptr ? why : "no such symbol");
  }
  return symbol;
}

const std::string& cublas_library() {
  static const std::string name = soname("libcublas");
  return name;
}

const std::string& cublas_lt_library() {
  static const std::string name = soname("libcublasLt");
  return name;
}

}  // namespace tutti::detail

// A forwarder: `name` as the header declares it (a macro such as cublasCreate -> cublasCreate_v2
// expands in both places), the real function resolved once, on the first call. The pointer's type
// is spelled out: cublas_api.h adds C++ overloads of some names (cublasGemmEx with a cudaDataType
// compute type), so decltype(&name) would be ambiguous.
#define TUTTI_FORWARD(library, ret, name, params, args)                                       \
  ret name params {                                                                           \
    static const auto real = reinterpret_cast<ret(*) params>(                                 \
        ::tutti::detail::cublas_symbol(::tutti::detail::library().c_str(), TUTTI_STR(name))); \
    return real args;                                                                         \
  }

extern "C" {
#pragma GCC visibility push(hidden)

// cuBLAS
TUTTI_FORWARD(cublas_library, cublasStatus_t, cublasCreate, (cublasHandle_t * handle), (handle))
TUTTI_FORWARD(cublas_library, cublasStatus_t, cublasDestroy, (cublasHandle_t handle), (handle))
TUTTI_FORWARD(cublas_library, cublasStatus_t, cublasSetStream, (cublasHandle_t handle, cudaStream_t stream),
              (handle, stream))
TUTTI_FORWARD(cublas_library, const char*, cublasGetStatusName, (cublasStatus_t status), (status))
TUTTI_FORWARD(cublas_library, const char*, cublasGetStatusString, (cublasStatus_t status), (status))
TUTTI_FORWARD(cublas_library, cublasStatus_t, cublasGemmEx,
              (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
               const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B, cudaDataType Btype,
               int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
               cublasGemmAlgo_t algo),
              (handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, computeType,
               algo))
TUTTI_FORWARD(cublas_library, cublasStatus_t, cublasGemmStridedBatchedEx,
              (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
               const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA, const void* B,
               cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C, cudaDataType Ctype,
               int ldc, long long int strideC, int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo),
              (handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype,
               ldc, strideC, batchCount, computeType, algo))

// cuBLASLt
TUTTI_FORWARD(cublas_lt_library, cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * handle), (handle))
TUTTI_FORWARD(cublas_lt_library, cublasStatus_t, cublasLtMatmul,
              (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
               cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
               const void* C, cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
               const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspaceSize, cudaStream_t stream),
              (handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace, workspaceSize,
               stream))
TUTTI_FORWARD(cublas_lt_library, cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,
              (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
               cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
               cublasLtMatmulPreference_t preference, int requestedAlgoCount,
               cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount),
              (handle, desc, Adesc, Bdesc, Cdesc, Ddesc, preference, requestedAlgoCount, heuristicResultsArray,
               returnAlgoCount))
TUTTI_FORWARD(cublas_lt_library, cublasStatus_t, cublasLtMatmulDescCreate,
              (cublasLtMatmulDesc_t * desc, cublasComputeType_t computeType, cudaDataType_t scaleType),
              (desc, computeType, scaleType))
TUTTI_FORWARD(cublas_lt_library, cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
TUTTI_FORWARD(cublas_lt_library, cublasStatus_t, cublasLtMatmulDescSetAttribute,
              (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t size),
              (desc, attr, buf, size))
TUTTI_FORWARD(cublas_lt_library, cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref),
              (pref))
TUTTI_FORWARD(cublas_lt_library, cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref),
              (pref))
TUTTI_FORWARD(cublas_lt_library, cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,
              (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
               size_t size),
              (pref, attr, buf, size))
TUTTI_FORWARD(cublas_lt_library, cublasStatus_t, cublasLtMatrixLayoutCreate,
              (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),
              (layout, type, rows, cols, ld))
TUTTI_FORWARD(cublas_lt_library, cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))

#pragma GCC visibility pop
}  // extern "C"
