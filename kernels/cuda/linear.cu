// CUDA linear algebra: cuBLAS (cublasGemmEx) for matmul and the backward GEMMs, cuBLASLt
// with its bias epilogue for linear_forward (one pass over y instead of two). Every GEMM
// computes in fp32 (CUBLAS_COMPUTE_32F) whatever the storage dtype, so no TF32 or fp16
// accumulation.
//
// Row-major to column-major: cuBLAS sees a row-major [r, c] matrix as its transpose, a
// column-major c × r matrix with leading dimension c. So the row-major product
// C[M, N] = op(A) · op(B) is computed as the column-major C^T = op(B)^T · op(A)^T: B goes
// first, with the same transpose flag, and m = N, n = M.
//
// Handles: one cuBLAS and one cuBLASLt handle per (thread, device), created on first use,
// bound to the call's stream for each call. cuBLASLt gets a workspace per (thread, device,
// stream), so two streams never share one, of the size the chosen algorithm asks for (up to
// 32 MiB; many need none), grown when a later call's algorithm asks for more. Handles and
// workspaces live until the process ends: destroying them from thread-exit or static
// destructors can run after the CUDA context is gone.
#include "kernels/cuda/linear.h"

#include <cublasLt.h>

#include <map>
#include <utility>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cublas.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/validate.h"

namespace tutti::kernels::cuda {

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: break;
  }
  TUTTI_THROW(InvalidArgument, "cuBLAS: dtype ", name_of(d), " is not a floating dtype");
}

cublasHandle_t cublas_handle(int device) {
  thread_local std::map<int, cublasHandle_t> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasHandle_t h = nullptr;
  TUTTI_CUBLAS_CHECK(cublasCreate(&h));
  handles.emplace(device, h);
  return h;
}

namespace {

using std::int64_t;

constexpr std::size_t kLtWorkspaceBytes = 32u << 20;

cublasLtHandle_t cublaslt_handle(int device) {
  thread_local std::map<int, cublasLtHandle_t> handles;
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  cublasLtHandle_t h = nullptr;
  TUTTI_CUBLAS_CHECK(cublasLtCreate(&h));
  handles.emplace(device, h);
  return h;
}

struct LtWorkspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

// At least `bytes` of workspace for cuBLASLt calls on (device, stream); nullptr for none.
// Why not always kLtWorkspaceBytes: each stream that ever ran a GEMM kept 32 MiB, and a
// program (or test) that makes streams as it goes paid that per stream.
void* lt_workspace(int device, cudaStream_t stream, std::size_t bytes) {
  thread_local std::map<std::pair<int, cudaStream_t>, LtWorkspace> workspaces;
  if (bytes == 0) return nullptr;
  LtWorkspace& w = workspaces[std::make_pair(device, stream)];
  if (w.bytes >= bytes) return w.data;
  // cudaFree waits for the device, so no GEMM in flight still uses the old one.
  if (w.data != nullptr) TUTTI_CUDA_CHECK(cudaFree(w.data));
  w = LtWorkspace{};
  TUTTI_CUDA_CHECK(cudaMalloc(&w.data, bytes));
  w.bytes = bytes;
  return w.data;
}

int to_int(int64_t v, const char* what) {
  TUTTI_CHECK_ARG(v <= INT32_MAX, "cuBLAS GEMM: ", what, " = ", v, " exceeds the 32-bit limit");
  return static_cast<int>(v);
}

// Row-major C[M, N] = alpha · op(A) · op(B) + beta · C. A is stored [M, K] (or [K, M] when
// transposed), B [K, N] (or [N, K]); their rows are contiguous (ld = stored row length).
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, const void* B, DType ab_dtype,
          float beta, void* C, DType c_dtype, const Tensor& c_tensor, int device, const Stream& stream) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // an empty sum: C = beta · C
    if (beta == 0.0f)
      fill(c_tensor, 0.0f, stream);
    else if (beta != 1.0f)
      scale(c_tensor, beta, c_tensor, stream);
    return;
  }
  const cublasHandle_t h = cublas_handle(device);
  TUTTI_CUBLAS_CHECK(cublasSetStream(h, native(stream)));
  const int lda = to_int(ta ? M : K, "lda"), ldb = to_int(tb ? K : N, "ldb"), ldc = to_int(N, "ldc");
  TUTTI_CUBLAS_CHECK(cublasGemmEx(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, to_int(N, "N"),
                                  to_int(M, "M"), to_int(K, "K"), &alpha, B, cuda_type(ab_dtype), ldb, A,
                                  cuda_type(ab_dtype), lda, &beta, C, cuda_type(c_dtype), ldc, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
}

// The largest power of two (up to 256) that divides the address: cuBLASLt's heuristic picks
// only kernels whose alignment needs the pointers meet (its default assumes 256).
std::uint32_t alignment_of(const void* p) {
  std::uint32_t a = 256;
  while (a > 1 && reinterpret_cast<std::uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

// Owns the cuBLASLt descriptors of one call.
struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// y[rows, O] = x[rows, I] · w[O, I]^T + bias through cuBLASLt's bias epilogue. Returns false
// (having written nothing) when cuBLASLt offers no kernel for this case.
bool linear_forward_lt(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, int64_t rows, int64_t O,
                       int64_t I, int device, const Stream& stream) {
  const cudaDataType_t t = cuda_type(x.dtype());
  LtDescriptors d;
  // Column-major: D (O × rows) = op(w) (O × I, w seen as I × O, transposed) · x (I × rows).
  TUTTI_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
  TUTTI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)));
  TUTTI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof(no_trans)));
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  TUTTI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  const void* bias_ptr = bias.data();
  TUTTI_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof(bias_ptr)));
  TUTTI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof(t)));
  TUTTI_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&d.a, t, static_cast<std::uint64_t>(I), static_cast<std::uint64_t>(O), I));
  TUTTI_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&d.b, t, static_cast<std::uint64_t>(I), static_cast<std::uint64_t>(rows), I));
  TUTTI_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&d.c, t, static_cast<std::uint64_t>(O), static_cast<std::uint64_t>(rows), O));
  TUTTI_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
  const std::size_t ws_bytes = kLtWorkspaceBytes;
  TUTTI_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                          sizeof(ws_bytes)));
  const std::uint32_t align_a = alignment_of(w.data()), align_b = alignment_of(x.data()),
                      align_c = alignment_of(y.data());
  TUTTI_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                          sizeof(align_a)));
  TUTTI_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                          sizeof(align_b)));
  TUTTI_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                          sizeof(align_c)));
  TUTTI_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                                          sizeof(align_c)));
  // The bias is read as a vector; keep the epilogue to biases aligned like the output.
  if (alignment_of(bias_ptr) < 16) return false;

  const cublasLtHandle_t lt = cublaslt_handle(device);
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heuristic, &found);
  if (hs != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  const float alpha = 1.0f, beta = 0.0f;
  const cudaStream_t s = native(stream);
  const std::size_t need = heuristic.workspaceSize;
  const cublasStatus_t st = cublasLtMatmul(lt, d.op, &alpha, w.data(), d.a, x.data(), d.b, &beta, y.data(), d.c,
                                           y.data(), d.c, &heuristic.algo, lt_workspace(device, s, need), need, s);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  TUTTI_CUBLAS_CHECK(st);
  return true;
}

}  // namespace

void matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, const Tensor& c, float alpha,
            float beta, const Stream& stream) {
  DeviceGuard guard(c.device());
  const int64_t M = c.dim(0), N = c.dim(1), K = transpose_a ? a.dim(0) : a.dim(1);
  gemm(transpose_a, transpose_b, M, N, K, alpha, a.data(), b.data(), a.dtype(), beta, c.data(), c.dtype(), c,
       c.device().index, stream);
}

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Stream& stream) {
  DeviceGuard guard(y.device());
  const int64_t O = w.dim(0), I = w.dim(1), rows = y.numel() / (O > 0 ? O : 1);
  if (rows == 0 || O == 0) return;
  const int device = y.device().index;
  if (bias.defined() && I > 0 && linear_forward_lt(x, w, bias, y, rows, O, I, device, stream)) return;
  // cuBLASLt declined or there is no bias: y = x · w^T (+ y holding the broadcast bias, so
  // that the sum is rounded once, in the GEMM's fp32 epilogue, as on the CPU).
  if (bias.defined()) {
    fill(y, 0.0f, stream);
    bias_add(y, bias, rows, O, 1, y, stream);
  }
  gemm(false, true, rows, O, I, 1.0f, x.data(), w.data(), x.dtype(), bias.defined() ? 1.0f : 0.0f, y.data(), y.dtype(),
       y, device, stream);
}

void linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw,
                     const Tensor& db, bool accumulate_params, const Stream& stream) {
  DeviceGuard guard(x.device());
  const int64_t O = w.dim(0), I = w.dim(1), rows = dy.numel() / (O > 0 ? O : 1);
  const int device = x.device().index;
  const DType t = x.dtype();
  if (O == 0) {  // dy is empty: dx = 0, dw and db are empty
    if (dx.defined()) fill(dx, 0.0f, stream);
    return;
  }
  // dx[rows, I] = dy[rows, O] · w[O, I]
  if (dx.defined())
    gemm(false, false, rows, I, O, 1.0f, dy.data(), w.data(), t, 0.0f, dx.data(), t, dx, device, stream);
  // dw[O, I] (+)= dy^T · x
  gemm(true, false, O, I, rows, 1.0f, dy.data(), x.data(), t, accumulate_params ? 1.0f : 0.0f, dw.data(), dw.dtype(),
       dw, device, stream);
  // db[O] (+)= column sums of dy
  if (db.defined()) bias_backward(dy, rows, O, 1, db, accumulate_params, stream);
}

}  // namespace tutti::kernels::cuda
