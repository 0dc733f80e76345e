// CUDA convolution through cuDNN, and 2x2 max-pooling kernels.
//
// Convolution: cuDNN's convolution forward / backward-data / backward-filter with fp32 compute
// for every storage dtype (tensor cores for f16/bf16, plain FMA for f32 so that results keep
// fp32 accuracy). Algorithms come from cuDNN's heuristics (cudnnGet*_v7) once per shape and
// dtype and are cached; workspaces are stream-ordered allocations (cudaMallocAsync) freed on
// the same stream. One cuDNN handle per device and host thread, bound to the call's stream.
// The bias gradient is a small kernel of our own, so it can be f32 for half inputs; so is the
// add that accumulates a half dw into f32 gradient buffers. A build without cuDNN
// (TUTTI_WITH_CUDNN off) throws a BackendError from the convolution launchers; max-pooling
// needs no cuDNN.
#include "kernels/cuda/conv.h"

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "kernels/cuda/common.cuh"
#include "kernels/validate.h"

#if TUTTI_WITH_CUDNN
#include <cudnn.h>

#include "core/cudnn_check.h"
#endif

namespace tutti::kernels::cuda {
namespace {

using std::int64_t;

constexpr int kBlock = 256;

// ---- max-pooling ----

// The window's max, the first one on ties; a nan wins over numbers (as on the CPU).
template <typename T>
__device__ __forceinline__ int argmax4(const T (&v)[4]) {
  int best = 0;
  float bv = load_f32(v[0]);
#pragma unroll
  for (int i = 1; i < 4; ++i) {
    const float x = load_f32(v[i]);
    if (x > bv || (isnan(x) && !isnan(bv))) {
      best = i;
      bv = x;
    }
  }
  return best;
}

template <typename T>
__global__ void maxpool_forward_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t outputs, int64_t w,
                                       int64_t wo, int64_t ho) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < outputs; o += stride) {
    const int64_t j = o % wo, i = (o / wo) % ho, plane = o / (wo * ho);
    const T* r0 = x + (plane * 2 * ho + 2 * i) * w + 2 * j;
    const T v[4] = {r0[0], r0[1], r0[w], r0[w + 1]};
    y[o] = v[argmax4(v)];
  }
}

// Writes all four dx entries of each window: dy at the argmax, zero elsewhere.
template <typename T>
__global__ void maxpool_backward_kernel(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
                                        int64_t outputs, int64_t w, int64_t wo, int64_t ho) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const T zero = store_as<T>(0.0f);
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < outputs; o += stride) {
    const int64_t j = o % wo, i = (o / wo) % ho, plane = o / (wo * ho);
    const int64_t base = (plane * 2 * ho + 2 * i) * w + 2 * j;
    const T v[4] = {x[base], x[base + 1], x[base + w], x[base + w + 1]};
    const int a = argmax4(v);
    const T g = dy[o];
    dx[base] = a == 0 ? g : zero;
    dx[base + 1] = a == 1 ? g : zero;
    dx[base + w] = a == 2 ? g : zero;
    dx[base + w + 1] = a == 3 ? g : zero;
  }
}

#if TUTTI_WITH_CUDNN

// ---- kernels beside cuDNN ----

// db[k] = (accumulate ? db[k] : 0) + sum over n, p, q of dy[n, k, p, q]; one block per k, the
// sum in a fixed order (deterministic).
template <typename T, typename D>
__global__ void bias_grad_kernel(const T* __restrict__ dy, D* __restrict__ db, int64_t n, int64_t k, int64_t pq,
                                 bool accumulate) {
  const int64_t c = blockIdx.x;
  float acc = 0.0f;
  for (int64_t img = 0; img < n; ++img) {
    const T* row = dy + (img * k + c) * pq;
    for (int64_t i = threadIdx.x; i < pq; i += blockDim.x) acc += load_f32(row[i]);
  }
  acc = block_reduce_sum(acc);
  if (threadIdx.x == 0) db[c] = store_as<D>(accumulate ? load_f32(db[c]) + acc : acc);
}

// dst (f32) = (accumulate ? dst : 0) + src (a half dw computed by cuDNN in the input dtype).
template <typename T>
__global__ void add_into_f32_kernel(const T* __restrict__ src, float* __restrict__ dst, int64_t n, bool accumulate) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = accumulate ? dst[i] + load_f32(src[i]) : load_f32(src[i]);
  }
}

// ---- cuDNN plumbing ----

cudnnDataType_t cudnn_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    default: break;
  }
  TUTTI_THROW(InvalidArgument, "conv2d: dtype ", name_of(dtype), " has no cuDNN equivalent");
}

// The calling thread's handle for the current device, bound to `stream`. Handles live as long
// as the thread (destroying them at exit could run after the CUDA driver has shut down).
cudnnHandle_t handle_for(int device, cudaStream_t stream) {
  thread_local std::unordered_map<int, cudnnHandle_t> handles;
  auto it = handles.find(device);
  if (it == handles.end()) {
    cudnnHandle_t h = nullptr;
    TUTTI_CUDNN_CHECK(cudnnCreate(&h));
    it = handles.emplace(device, h).first;
  }
  TUTTI_CUDNN_CHECK(cudnnSetStream(it->second, stream));
  return it->second;
}

// Descriptors of one call, created and destroyed with it (host-side objects, cheap).
struct ConvDescriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr, bias = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;

  ConvDescriptors(const Tensor& xt, const Tensor& wt, const Conv2dParams& params) {
    try {
      set(xt, wt, params);
    } catch (...) {
      destroy();  // the destructor does not run for a constructor that throws
      throw;
    }
  }
  ~ConvDescriptors() { destroy(); }
  ConvDescriptors(const ConvDescriptors&) = delete;
  ConvDescriptors& operator=(const ConvDescriptors&) = delete;

 private:
  void set(const Tensor& xt, const Tensor& wt, const Conv2dParams& params) {
    const cudnnDataType_t dt = cudnn_dtype(xt.dtype());
    const int n = static_cast<int>(xt.dim(0)), c = static_cast<int>(xt.dim(1));
    const int h = static_cast<int>(xt.dim(2)), wd = static_cast<int>(xt.dim(3));
    const int k = static_cast<int>(wt.dim(0)), r = static_cast<int>(wt.dim(2)), s = static_cast<int>(wt.dim(3));
    const int p = (h + 2 * params.padding - r) / params.stride + 1;
    const int q = (wd + 2 * params.padding - s) / params.stride + 1;
    TUTTI_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    TUTTI_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    TUTTI_CUDNN_CHECK(cudnnCreateTensorDescriptor(&bias));
    TUTTI_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    TUTTI_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    TUTTI_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, dt, n, c, h, wd));
    TUTTI_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, dt, n, k, p, q));
    TUTTI_CUDNN_CHECK(cudnnSetTensor4dDescriptor(bias, CUDNN_TENSOR_NCHW, dt, 1, k, 1, 1));
    TUTTI_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, dt, CUDNN_TENSOR_NCHW, k, c, r, s));
    TUTTI_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, params.padding, params.padding, params.stride,
                                                      params.stride, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    // f32 stays f32 (no TF32): the CPU twin and the tests expect fp32 accuracy.
    TUTTI_CUDNN_CHECK(
        cudnnSetConvolutionMathType(conv, xt.dtype() == DType::f32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
  }
  void destroy() noexcept {
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (bias) cudnnDestroyTensorDescriptor(bias);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
    conv = nullptr, w = nullptr, bias = nullptr, y = nullptr, x = nullptr;
  }
};

// A shape, dtype and device: the key of the algorithm cache.
using ConvKey = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int>;
ConvKey key_of(const Tensor& x, const Tensor& w, const Conv2dParams& p) {
  return {x.device().index, static_cast<int>(x.dtype()),
          x.dim(0),         x.dim(1),
          x.dim(2),         x.dim(3),
          w.dim(0),         w.dim(2),
          w.dim(3),         p.stride,
          p.padding};
}

struct Algos {
  cudnnConvolutionFwdAlgo_t fwd;
  cudnnConvolutionBwdDataAlgo_t bwd_data;
  cudnnConvolutionBwdFilterAlgo_t bwd_filter;
  std::size_t fwd_ws = 0, bwd_data_ws = 0, bwd_filter_ws = 0;
};

// The first algorithm of cuDNN's ranked list that reports success.
template <typename Perf>
const Perf& first_usable(const Perf* perf, int count, const char* what) {
  for (int i = 0; i < count; ++i) {
    if (perf[i].status == CUDNN_STATUS_SUCCESS) return perf[i];
  }
  TUTTI_THROW(BackendError, "conv2d: cuDNN offers no usable ", what, " algorithm for this shape");
}

// Heuristic choice of the three algorithms, once per shape (cached for the process).
const Algos& algos_for(cudnnHandle_t handle, const ConvDescriptors& d, const ConvKey& key) {
  static std::mutex mutex;
  static std::map<ConvKey, Algos> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  Algos a{};
  constexpr int kMax = 16;
  int count = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[kMax];
  TUTTI_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(handle, d.x, d.w, d.conv, d.y, kMax, &count, fwd));
  a.fwd = first_usable(fwd, count, "forward").algo;
  TUTTI_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(handle, d.x, d.w, d.conv, d.y, a.fwd, &a.fwd_ws));
  cudnnConvolutionBwdDataAlgoPerf_t bd[kMax];
  TUTTI_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, d.w, d.y, d.conv, d.x, kMax, &count, bd));
  a.bwd_data = first_usable(bd, count, "backward-data").algo;
  TUTTI_CUDNN_CHECK(
      cudnnGetConvolutionBackwardDataWorkspaceSize(handle, d.w, d.y, d.conv, d.x, a.bwd_data, &a.bwd_data_ws));
  cudnnConvolutionBwdFilterAlgoPerf_t bf[kMax];
  TUTTI_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, d.x, d.y, d.conv, d.w, kMax, &count, bf));
  a.bwd_filter = first_usable(bf, count, "backward-filter").algo;
  TUTTI_CUDNN_CHECK(
      cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, d.x, d.y, d.conv, d.w, a.bwd_filter, &a.bwd_filter_ws));
  return cache.emplace(key, a).first->second;
}

// cuDNN's fast kernels want 16-byte aligned tensors, and views into flat parameter buffers
// need not be. An unaligned input is copied into stream-ordered scratch first.
const void* aligned_input(const Tensor& t, std::unique_ptr<StreamScratch>& holder, cudaStream_t s) {
  if (!t.defined()) return nullptr;
  if (is_aligned(t.data(), 16)) return t.data();
  holder = std::make_unique<StreamScratch>(t.nbytes(), s);
  TUTTI_CUDA_CHECK(cudaMemcpyAsync(holder->as<void>(), t.data(), t.nbytes(), cudaMemcpyDeviceToDevice, s));
  return holder->as<void>();
}

// An output cuDNN writes: the tensor itself when aligned, else scratch (holding the old values
// when the op reads them, beta != 0) that finish() copies back.
class AlignedOutput {
 public:
  AlignedOutput(const Tensor& t, bool keep_old, cudaStream_t s) : t_(t), stream_(s) {
    if (is_aligned(t.data(), 16)) {
      ptr_ = t.data();
      return;
    }
    scratch_ = std::make_unique<StreamScratch>(t.nbytes(), s);
    ptr_ = scratch_->as<void>();
    if (keep_old) TUTTI_CUDA_CHECK(cudaMemcpyAsync(ptr_, t.data(), t.nbytes(), cudaMemcpyDeviceToDevice, s));
  }
  void* get() const { return ptr_; }
  void finish() {
    if (scratch_) TUTTI_CUDA_CHECK(cudaMemcpyAsync(t_.data(), ptr_, t_.nbytes(), cudaMemcpyDeviceToDevice, stream_));
  }

 private:
  const Tensor& t_;
  cudaStream_t stream_;
  void* ptr_ = nullptr;
  std::unique_ptr<StreamScratch> scratch_;
};

#endif  // TUTTI_WITH_CUDNN

}  // namespace

#if TUTTI_WITH_CUDNN

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Conv2dParams& params,
                    const Stream& stream) {
  ErrorContext context("conv2d_forward on " + x.str() + " with " + w.str());
  DeviceGuard guard(x.device());
  const cudaStream_t s = native(stream);
  cudnnHandle_t handle = handle_for(x.device().index, s);
  const ConvDescriptors d(x, w, params);
  const Algos& a = algos_for(handle, d, key_of(x, w, params));
  std::unique_ptr<StreamScratch> x_copy, w_copy, b_copy;
  const void* xp = aligned_input(x, x_copy, s);
  const void* wp = aligned_input(w, w_copy, s);
  const void* bp = aligned_input(bias, b_copy, s);
  AlignedOutput yp(y, /*keep_old=*/false, s);
  StreamScratch workspace(a.fwd_ws, s);
  const float one = 1.0f, zero = 0.0f;
  TUTTI_CUDNN_CHECK(cudnnConvolutionForward(handle, &one, d.x, xp, d.w, wp, d.conv, a.fwd, workspace.as<void>(),
                                            a.fwd_ws, &zero, d.y, yp.get()));
  if (bias.defined()) TUTTI_CUDNN_CHECK(cudnnAddTensor(handle, &one, d.bias, bp, &one, d.y, yp.get()));
  yp.finish();
}

void conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx, const Tensor& dw,
                     const Tensor& db, bool accumulate_params, const Conv2dParams& params, const Stream& stream) {
  ErrorContext context("conv2d_backward on " + x.str() + " with " + w.str());
  DeviceGuard guard(x.device());
  const cudaStream_t s = native(stream);
  if (dy.numel() == 0 || x.numel() == 0) {
    // An empty batch (cuDNN refuses zero sizes): dx is empty or zero, gradients add nothing.
    if (dx.defined()) TUTTI_CUDA_CHECK(cudaMemsetAsync(dx.data(), 0, dx.nbytes(), s));
    if (!accumulate_params) {
      TUTTI_CUDA_CHECK(cudaMemsetAsync(dw.data(), 0, dw.nbytes(), s));
      if (db.defined()) TUTTI_CUDA_CHECK(cudaMemsetAsync(db.data(), 0, db.nbytes(), s));
    }
    return;
  }
  cudnnHandle_t handle = handle_for(x.device().index, s);
  const ConvDescriptors d(x, w, params);
  const Algos& a = algos_for(handle, d, key_of(x, w, params));
  const float one = 1.0f, zero = 0.0f;
  std::unique_ptr<StreamScratch> x_copy, w_copy, dy_copy;
  const void* xp = aligned_input(x, x_copy, s);
  const void* dyp = aligned_input(dy, dy_copy, s);
  if (dx.defined()) {
    const void* wp = aligned_input(w, w_copy, s);
    AlignedOutput dxp(dx, /*keep_old=*/false, s);
    StreamScratch workspace(a.bwd_data_ws, s);
    TUTTI_CUDNN_CHECK(cudnnConvolutionBackwardData(handle, &one, d.w, wp, d.y, dyp, d.conv, a.bwd_data,
                                                   workspace.as<void>(), a.bwd_data_ws, &zero, d.x, dxp.get()));
    dxp.finish();
  }
  {
    StreamScratch workspace(a.bwd_filter_ws, s);
    if (dw.dtype() == x.dtype()) {
      const float beta = accumulate_params ? 1.0f : 0.0f;
      AlignedOutput dwp(dw, /*keep_old=*/accumulate_params, s);
      TUTTI_CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle, &one, d.x, xp, d.y, dyp, d.conv, a.bwd_filter,
                                                       workspace.as<void>(), a.bwd_filter_ws, &beta, d.w, dwp.get()));
      dwp.finish();
    } else {
      // f32 gradient buffers for half inputs: cuDNN writes dw in the input dtype (fp32
      // compute, one rounding), then one pass adds it into the f32 buffer.
      StreamScratch scratch(w.nbytes(), s);
      TUTTI_CUDNN_CHECK(cudnnConvolutionBackwardFilter(handle, &one, d.x, xp, d.y, dyp, d.conv, a.bwd_filter,
                                                       workspace.as<void>(), a.bwd_filter_ws, &zero, d.w,
                                                       scratch.as<void>()));
      detail::dispatch_floating("conv2d_backward", x.dtype(), [&](auto tag) {
        using T = device_t<decltype(tag)>;
        add_into_f32_kernel<T><<<grid_for(dw.numel(), kBlock), kBlock, 0, s>>>(
            scratch.as<const T>(), dw.data_as<float>(), dw.numel(), accumulate_params);
        TUTTI_CUDA_CHECK_LAUNCH("add_into_f32_kernel");
      });
    }
  }
  if (db.defined()) {
    const int64_t n = x.dim(0), k = w.dim(0), pq = dy.dim(2) * dy.dim(3);
    detail::dispatch_floating("conv2d_backward", x.dtype(), [&](auto tag) {
      using Host = decltype(tag);
      using T = device_t<Host>;
      const T* dy_typed = ptr<Host>(dy);
      const auto grid = static_cast<unsigned>(k);
      if (db.dtype() == DType::f32) {
        bias_grad_kernel<T, float><<<grid, kBlock, 0, s>>>(dy_typed, db.data_as<float>(), n, k, pq, accumulate_params);
      } else {
        bias_grad_kernel<T, T><<<grid, kBlock, 0, s>>>(dy_typed, ptr<Host>(db), n, k, pq, accumulate_params);
      }
      TUTTI_CUDA_CHECK_LAUNCH("bias_grad_kernel");
    });
  }
}

#else  // no cuDNN in this build: the one place that says so.

void conv2d_forward(const Tensor& x, const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&, const Stream&) {
  TUTTI_THROW(BackendError, "conv2d_forward on ", x.str(),
              ": this build has no cuDNN (TUTTI_WITH_CUDNN=OFF); run convolutions on the CPU or rebuild with cuDNN");
}

void conv2d_backward(const Tensor& x, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool,
                     const Conv2dParams&, const Stream&) {
  TUTTI_THROW(BackendError, "conv2d_backward on ", x.str(),
              ": this build has no cuDNN (TUTTI_WITH_CUDNN=OFF); run convolutions on the CPU or rebuild with cuDNN");
}

#endif  // TUTTI_WITH_CUDNN

void maxpool2x2_forward(const Tensor& x, const Tensor& y, const Stream& stream) {
  DeviceGuard guard(x.device());
  const cudaStream_t s = native(stream);
  const int64_t outputs = y.numel(), w = x.dim(3), wo = y.dim(3), ho = y.dim(2);
  detail::dispatch_floating("maxpool2x2_forward", x.dtype(), [&](auto tag) {
    using Host = decltype(tag);
    maxpool_forward_kernel<<<grid_for(outputs, kBlock), kBlock, 0, s>>>(ptr<Host>(x), ptr<Host>(y), outputs, w, wo, ho);
    TUTTI_CUDA_CHECK_LAUNCH("maxpool_forward_kernel");
  });
}

void maxpool2x2_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, const Stream& stream) {
  DeviceGuard guard(x.device());
  const cudaStream_t s = native(stream);
  const int64_t outputs = dy.numel(), w = x.dim(3), wo = dy.dim(3), ho = dy.dim(2);
  detail::dispatch_floating("maxpool2x2_backward", x.dtype(), [&](auto tag) {
    using Host = decltype(tag);
    maxpool_backward_kernel<<<grid_for(outputs, kBlock), kBlock, 0, s>>>(ptr<Host>(x), ptr<Host>(dy), ptr<Host>(dx),
                                                                         outputs, w, wo, ho);
    TUTTI_CUDA_CHECK_LAUNCH("maxpool_backward_kernel");
  });
}

}  // namespace tutti::kernels::cuda
