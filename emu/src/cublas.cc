// cuBLAS and cuBLASLt on the emulated device: each GEMM is queued on the handle's (or the
// call's) stream and computed there with OpenBLAS in fp32, inputs widened exactly and the
// result rounded once to the output type, as CUBLAS_COMPUTE_32F specifies.
#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "cublasLt.h"
#include "elements.h"
#include "runtime.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
};
struct cublasLtContext {
  int unused = 0;
};
struct cublasLtMatmulDescOpaque {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  cudaDataType_t bias_type = CUDA_R_32F;
  bool bias_type_set = false;
};
struct cublasLtMatrixLayoutOpaque {
  cudaDataType_t type;
  std::int64_t rows, cols, ld;
};
struct cublasLtMatmulPreferenceOpaque {
  int unused = 0;
};

namespace tutti::emu {
namespace {

bool supported(cudaDataType_t t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

Element element(cudaDataType_t t) {
  return t == CUDA_R_16F ? Element::f16 : t == CUDA_R_16BF ? Element::bf16 : Element::f32;
}

// A column-major matrix in device memory.
struct Matrix {
  const void* data;
  cudaDataType_t type;
  std::int64_t rows, cols, ld;
};

std::vector<float> widen(const Matrix& m) {
  std::vector<float> out(static_cast<std::size_t>(m.rows * m.cols));
  for (std::int64_t j = 0; j < m.cols; ++j)
    for (std::int64_t i = 0; i < m.rows; ++i) {
      out[static_cast<std::size_t>(j * m.rows + i)] =
          load(m.data, element(m.type), static_cast<std::size_t>(j * m.ld + i));
    }
  return out;
}

// D[m, n] = alpha · op(A) · op(B) + beta · C (+ bias[i] on row i), one rounding into D.
struct Gemm {
  bool ta, tb;
  std::int64_t m, n, k;
  float alpha, beta;
  Matrix a, b, c;
  void* d;
  std::int64_t ldd;
  cudaDataType_t d_type;
  const void* bias = nullptr;
  cudaDataType_t bias_type = CUDA_R_32F;

  void run() const {
    std::vector<float> acc(static_cast<std::size_t>(m * n), 0.0f);
    if (beta != 0.0f) {
      acc = widen(c);
      if (beta != 1.0f)
        for (auto& v : acc) v *= beta;
    }
    if (k > 0 && alpha != 0.0f) {
      const std::vector<float> af = widen(a), bf = widen(b);
      cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(m),
                  static_cast<int>(n), static_cast<int>(k), alpha, af.data(), static_cast<int>(a.rows), bf.data(),
                  static_cast<int>(b.rows), 1.0f, acc.data(), static_cast<int>(m));
    }
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t i = 0; i < m; ++i) {
        float v = acc[static_cast<std::size_t>(j * m + i)];
        if (bias != nullptr) v += load(bias, element(bias_type), static_cast<std::size_t>(i));
        store(d, element(d_type), static_cast<std::size_t>(j * ldd + i), v);
      }
  }
};

cublasStatus_t queue(cudaStream_t handle_stream, const Gemm& g) {
  if (sticky_error() != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
  auto s = stream_of(handle_stream);
  if (!s) return CUBLAS_STATUS_INVALID_VALUE;
  if (g.m == 0 || g.n == 0) return CUBLAS_STATUS_SUCCESS;
  enqueue(s, [g] { g.run(); });
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace
}  // namespace tutti::emu

using namespace tutti::emu;

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
  }
  return "unknown status";
}

constexpr const char* kGemmNotice =
    "cuBLAS/cuBLASLt GEMMs run as a CPU reference (OpenBLAS sgemm in fp32, one rounding), not as GPU code";

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  notice_once(kGemmNotice);
  *handle = new cublasContext{};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void* alpha, const void* A, cudaDataType_t a_type, int lda, const void* B,
                            cudaDataType_t b_type, int ldb, const void* beta, void* C, cudaDataType_t c_type, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (compute != CUBLAS_COMPUTE_32F || !supported(a_type) || a_type != b_type ||
      (c_type != CUDA_R_32F && c_type != a_type)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  const int a_rows = ta ? k : m, b_rows = tb ? n : k;
  if (m < 0 || n < 0 || k < 0 || lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) || ldc < std::max(1, m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const Gemm g{ta,
               tb,
               m,
               n,
               k,
               *static_cast<const float*>(alpha),
               *static_cast<const float*>(beta),
               Matrix{A, a_type, a_rows, ta ? m : k, lda},
               Matrix{B, b_type, b_rows, tb ? k : n, ldb},
               Matrix{C, c_type, m, n, ldc},
               C,
               ldc,
               c_type};
  return queue(handle->stream, g);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType_t a_type,
                                          int lda, long long stride_a, const void* B, cudaDataType_t b_type, int ldb,
                                          long long stride_b, const void* beta, void* C, cudaDataType_t c_type, int ldc,
                                          long long stride_c, int batch_count, cublasComputeType_t compute,
                                          cublasGemmAlgo_t) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (compute != CUBLAS_COMPUTE_32F || !supported(a_type) || a_type != b_type ||
      (c_type != CUDA_R_32F && c_type != a_type)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  const int a_rows = ta ? k : m, b_rows = tb ? n : k;
  if (m < 0 || n < 0 || k < 0 || batch_count < 0 || lda < std::max(1, a_rows) || ldb < std::max(1, b_rows) ||
      ldc < std::max(1, m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  const std::size_t a_size = a_type == CUDA_R_32F ? 4 : 2, c_size = c_type == CUDA_R_32F ? 4 : 2;
  for (int i = 0; i < batch_count; ++i) {
    const auto* a = static_cast<const unsigned char*>(A) + static_cast<std::size_t>(i * stride_a) * a_size;
    const auto* b = static_cast<const unsigned char*>(B) + static_cast<std::size_t>(i * stride_b) * a_size;
    auto* c = static_cast<unsigned char*>(C) + static_cast<std::size_t>(i * stride_c) * c_size;
    const Gemm g{ta,
                 tb,
                 m,
                 n,
                 k,
                 *static_cast<const float*>(alpha),
                 *static_cast<const float*>(beta),
                 Matrix{a, a_type, a_rows, ta ? m : k, lda},
                 Matrix{b, b_type, b_rows, tb ? k : n, ldb},
                 Matrix{c, c_type, m, n, ldc},
                 c,
                 ldc,
                 c_type};
    const cublasStatus_t st = queue(handle->stream, g);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  notice_once(kGemmNotice);
  *handle = new cublasLtContext{};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale_type) {
  if (compute != CUBLAS_COMPUTE_32F || scale_type != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  *desc = new cublasLtMatmulDescOpaque{};
  (*desc)->compute = compute;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

namespace {
template <typename T>
cublasStatus_t read_attribute(T& out, const void* buf, std::size_t size) {
  if (buf == nullptr || size != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&out, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}
}  // namespace

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, std::size_t size) {
  if (desc == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return read_attribute(desc->transa, buf, size);
    case CUBLASLT_MATMUL_DESC_TRANSB: return read_attribute(desc->transb, buf, size);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return read_attribute(desc->epilogue, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return read_attribute(desc->bias, buf, size);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      desc->bias_type_set = true;
      return read_attribute(desc->bias_type, buf, size);
  }
  return CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type, std::uint64_t rows,
                                          std::uint64_t cols, std::int64_t ld) {
  if (!supported(type) || ld < static_cast<std::int64_t>(std::max<std::uint64_t>(rows, 1))) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  *layout = new cublasLtMatrixLayoutOpaque{type, static_cast<std::int64_t>(rows), static_cast<std::int64_t>(cols), ld};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = new cublasLtMatmulPreferenceOpaque{};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t, const void* buf,
                                                    std::size_t) {
  return pref == nullptr || buf == nullptr ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_SUCCESS;
}

namespace {
// The shapes of a matmul, or false when they do not fit together.
bool matmul_shapes(const cublasLtMatmulDescOpaque& desc, const cublasLtMatrixLayoutOpaque& a,
                   const cublasLtMatrixLayoutOpaque& b, const cublasLtMatrixLayoutOpaque& c,
                   const cublasLtMatrixLayoutOpaque& d, std::int64_t& m, std::int64_t& n, std::int64_t& k) {
  const bool ta = desc.transa != CUBLAS_OP_N, tb = desc.transb != CUBLAS_OP_N;
  m = d.rows, n = d.cols, k = ta ? a.rows : a.cols;
  const std::int64_t a_m = ta ? a.cols : a.rows, b_k = tb ? b.cols : b.rows, b_n = tb ? b.rows : b.cols;
  return a_m == m && b_k == k && b_n == n && c.rows == m && c.cols == n && a.type == b.type &&
         (d.type == CUDA_R_32F || d.type == a.type) && c.type == d.type &&
         (desc.epilogue == CUBLASLT_EPILOGUE_DEFAULT || desc.epilogue == CUBLASLT_EPILOGUE_BIAS);
}
}  // namespace

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t* results, int* returned) {
  if (handle == nullptr || desc == nullptr || pref == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  std::int64_t m = 0, n = 0, k = 0;
  *returned = 0;
  if (!matmul_shapes(*desc, *a, *b, *c, *d, m, n, k)) return CUBLAS_STATUS_NOT_SUPPORTED;
  results[0] = cublasLtMatmulHeuristicResult_t{};
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta,
                              const void* C, cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t*, void*, std::size_t, cudaStream_t stream) {
  if (handle == nullptr || desc == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  std::int64_t m = 0, n = 0, k = 0;
  if (!matmul_shapes(*desc, *a, *b, *c, *d, m, n, k)) return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool bias = desc->epilogue == CUBLASLT_EPILOGUE_BIAS;
  if (bias && desc->bias == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  Gemm g{desc->transa != CUBLAS_OP_N,
         desc->transb != CUBLAS_OP_N,
         m,
         n,
         k,
         *static_cast<const float*>(alpha),
         *static_cast<const float*>(beta),
         Matrix{A, a->type, a->rows, a->cols, a->ld},
         Matrix{B, b->type, b->rows, b->cols, b->ld},
         Matrix{C, c->type, c->rows, c->cols, c->ld},
         D,
         d->ld,
         d->type};
  if (bias) {
    g.bias = desc->bias;
    g.bias_type = desc->bias_type_set ? desc->bias_type : d->type;
  }
  return queue(stream, g);
}
